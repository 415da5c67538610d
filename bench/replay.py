"""The recovery drill: from "the state is gone" to "the state is in memory and the consumer
knows where to resume", against the stores a compacted log replaces.

``python -m bench.replay [--keys N] [--out FILE]`` (``make bench-replay``; default 1e6 live
keys x 512 B, ``--keys 10000000`` for 1e7) builds a one-partition log through the sink's
``foreachBatch`` hook: every key inserted, one pass (*after a pass*: nothing dirty), then
batches of 100,000 uniform updates (a tenth of the keys below 1e6 keys) until the dirty
ratio is just below ``min.cleanable.dirty.ratio`` (*dirty*: the most a log holds before a
pass). At each point, after an untimed read by Arrow and by Spark (a process's first reads of
a size run slower than its later ones), each best of ``--runs`` (default 2), the wall time of:

- ``read_state`` into Arrow and into pandas, ``sink.state()`` into Spark (every column
  read: a count and an XOR of ``xxhash64(key, value)``), each with the resume offsets
  (the snapshot's log end offsets), checked against the records appended;
- the floor: pyarrow's and Spark's scan of the same live files (no dedupe);

and, once, for the same live keys and values: a Redis 7 restore (SCAN with pipelined MGET
into a dict, and the RDB file loaded at server start) and PostgreSQL 15 ``COPY state TO
STDOUT`` parsed into Arrow (a throwaway cluster, ``runuser -u postgres``). Needs
``redis-server`` on the PATH, PostgreSQL 15's binaries, and ``redis`` and ``psycopg`` from
PyPI (the Makefile target installs them). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.measure import load_average
from bench.session import bench_session
from sinks import CleanerConfig, CompactedStateSink, read_state, read_state_batches
from sinks.log.log_table import LogTable
from sinks.reading.arrow_state import StatePlan
from sinks.reading.replay import RestoreSource, replay
from sinks.reading.state_reader import spark_state

BATCH = 100_000
VALUE_BYTES = 512
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def values(rng: np.random.Generator, n: int) -> pa.Array:
    raw = rng.integers(0, 256, (n, VALUE_BYTES // 2), dtype=np.uint8)
    return pa.array([r.tobytes().hex() for r in raw], pa.string())


def keys(ids: np.ndarray) -> pa.Array:
    return pa.array([f"key-{i:010d}" for i in ids])


def digest(df: DataFrame) -> tuple[int, int]:
    row = df.agg(F.count(F.lit(1)).alias("n"), F.bit_xor(F.xxhash64("key", "value")).alias("x"))
    first = row.collect()[0]
    return int(first["n"]), int(first["x"] or 0)


def best(runs: int, read: Callable[[], Any]) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(runs):
        result = None  # the previous run's copy is freed before the next run reads another
        started = time.perf_counter()
        result = read()
        times.append(time.perf_counter() - started)
    return round(min(times), 3), result


def resume_offsets(uri: str) -> dict[int, int]:
    """Where a consumer that holds the state resumes: each partition's log end offset."""
    snapshot = LogTable(uri).snapshot()
    assert snapshot is not None
    return {p: snapshot.log_end_offset(p) for p in snapshot.partitions}


class Drill:
    """The rows measured so far, written to ``out`` after each row (a drill cut short keeps
    what it measured), and the time after which no row starts (``stop_at``, epoch seconds):
    a row not run is recorded with the reason instead of its figure."""

    def __init__(self, out: str | None, stop_at: float | None) -> None:
        self.out, self.stop_at, self.result = out, stop_at, {}

    def save(self) -> None:
        if self.out:
            self.result["load_now"] = load_average()
            with open(self.out, "w") as out:
                out.write(json.dumps(self.result, indent=1) + "\n")

    def row(self, point: dict, name: str, measure: Callable[[], Any], estimate_s: float = 0.0):
        """``measure()`` recorded under ``name`` in ``point``; an exception or the time budget
        is recorded as ``name_not_run`` and returns None."""
        if self.stop_at is not None and time.time() + estimate_s > self.stop_at:
            point[f"{name}_not_run"] = "the run's time budget (--stop-at) ended before this row"
            self.save()
            return None
        try:
            value = measure()
        except Exception as error:  # a row that cannot run is recorded, the drill goes on
            point[f"{name}_not_run"] = f"{type(error).__name__}: {error}"[:2000]
            self.save()
            return None
        point[name] = value
        self.save()
        return value


def reads(
    drill: Drill,
    point: dict,
    spark: SparkSession,
    sink: CompactedStateSink,
    appended: int,
    runs: int,
) -> None:
    """The fast rows at one point of the log: the state reads, their peak memory, the floor.
    Only one copy of the state is in memory at a time (each read's result is dropped before
    the next read)."""
    uri = sink.path
    files = [os.path.join(uri, f.path) for f in sink.log_table.snapshot().data_files()]
    point.update({"dirty_ratio": round(sink.dirty_ratio(), 3), "files": len(files)})
    drill.save()
    # A process's first reads of this size run slower than its later ones (its allocator maps
    # and first touches the memory, Spark's JIT compiles the scan): 1.0 s against 0.35 s for
    # `read_state` at 1e6 keys, the pyarrow scan alike. One untimed read of the state by
    # Arrow and one scan by Spark first, so the state reads and the floor measured after them
    # are measured alike. (Not pyarrow's scan too: with a dirty section at 1e7 keys it holds
    # 10 GB, which beside the state's freed 5 GB and Spark's driver does not fit in 24 GiB.)
    read_state(uri)
    digest(spark.read.parquet(*files))

    def arrow() -> tuple[int, int, dict[int, int]]:
        table = read_state(uri)
        offsets = resume_offsets(uri)
        return table.num_rows, table.select(["key", "value"]).nbytes, offsets

    seconds, (live, live_bytes, offsets) = best(runs, arrow)
    assert offsets == {0: appended}, (offsets, appended)
    point.update(read_state_arrow_s=seconds, resume_offsets=offsets, live_keys=live)
    drill.save()

    def pandas() -> float:
        seconds, (frame, _) = best(runs, lambda: (read_state(uri).to_pandas(), resume_offsets(uri)))
        assert len(frame) == live
        return seconds

    drill.row(point, "read_state_pandas_s", pandas)
    # Of `read_state`'s time, what finding the superseded records takes (the narrow columns'
    # read and the weighing, before any value is decoded): the rest is the read of the files.
    drill.row(
        point,
        "read_state_weighing_s",
        lambda: best(runs, lambda: StatePlan.of(LogTable(uri).snapshot()))[0],
    )

    def spark_read(state: Callable[[], DataFrame]) -> Callable[[], float]:
        def measure() -> float:
            seconds, (rows, _) = best(runs, lambda: (digest(state()), resume_offsets(uri))[0])
            assert rows == live
            return seconds

        return measure

    drill.row(point, "state_spark_s", spark_read(sink.state))
    drill.row(point, "state_spark_pass_tasks_s", spark_read(lambda: pass_tasks_state(spark, sink)))
    drill.row(point, "read_state_peak", lambda: peak_memory(uri, streamed=False))
    drill.row(point, "read_state_batches_peak", lambda: peak_memory(uri, streamed=True))

    def arrow_scan() -> float:
        seconds, scanned = best(runs, lambda: pq.read_table(files, columns=["key", "value"]))
        point["scanned_records"] = scanned.num_rows
        return seconds

    drill.row(point, "arrow_scan_s", arrow_scan)
    drill.row(
        point, "spark_scan_s", lambda: best(runs, lambda: digest(spark.read.parquet(*files)))[0]
    )
    point["live_bytes_arrow"] = live_bytes
    drill.save()


def slow_reads(
    drill: Drill, point: dict, spark: SparkSession, uri: str, runs: int, scale: dict[str, float]
) -> None:
    """The rows that take minutes at 1e7 keys: the consumers' bootstrap and ``replay``.
    ``scale`` holds an estimate of each row's time (to skip a row the time budget cannot
    hold)."""
    offsets = point.get("resume_offsets") or resume_offsets(uri)

    def bootstrap() -> float:
        seconds, (records, ends) = best(runs, lambda: consumer_bootstrap(spark, uri))
        assert ends == {str(p): o for p, o in offsets.items()}, (ends, offsets)
        point["consumer_bootstrap_records"] = records
        return seconds

    drill.row(point, "consumer_bootstrap_s", bootstrap, scale.get("consumer_bootstrap_s", 0.0))

    def replayed() -> float:
        seconds, live = best(runs, lambda: replay_into_new_log(spark, uri))
        assert live == point["live_keys"], (live, point["live_keys"])
        return seconds

    drill.row(point, "replay_s", replayed, scale.get("replay_s", 0.0))


def pass_tasks_state(spark: SparkSession, sink: CompactedStateSink) -> DataFrame:
    """``state()`` read as a pass reads it, one task a partition (`partition_state`)."""
    snapshot = sink.log_table.snapshot()
    return spark_state(spark, sink.log_table, snapshot, sink.keys, superseded_first=False)


_PEAK = """
import sys, pyarrow as pa
from sinks import read_state, read_state_batches

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name):
            return int(line.split()[1]) * 1024

base = status("VmRSS:")
if sys.argv[2] == "batches":
    rows, size = sum(b.num_rows for b in read_state_batches(sys.argv[1])), 0
else:
    table = read_state(sys.argv[1])
    rows, size = table.num_rows, table.nbytes
print(rows, size, status("VmHWM:") - base, pa.default_memory_pool().max_memory())
"""


def peak_memory(uri: str, *, streamed: bool) -> dict[str, Any]:
    """``read_state`` (or ``read_state_batches`` consumed and dropped) in a process of its own:
    its peak resident memory above the resident memory after the imports (Linux's VmHWM
    less VmRSS), and Arrow's peak allocation, against the Arrow size of the state."""
    mode = "batches" if streamed else "table"
    line = subprocess.run(
        [sys.executable, "-c", _PEAK, uri, mode], check=True, capture_output=True, text=True
    ).stdout.split()
    rows, size, rss, arrow = (int(x) for x in line[-4:])
    return {"rows": rows, "state_bytes": size, "peak_rss_bytes": rss, "arrow_peak_bytes": arrow}


def consumer_bootstrap(spark: SparkSession, uri: str) -> tuple[int, dict[str, int]]:
    """A streaming job bootstrapped from the consumers' source from ``earliest``: every record
    read (an XOR of ``xxhash64(key, value)`` a batch), until the query stops at the log end
    (``availableNow``). Returns the records read and the last offsets the query processed."""
    from streaming.consumers.datasource import register

    register(spark)
    seen: list[int] = []

    def fold(batch: DataFrame, _batch_id: int) -> None:
        seen.append(digest(batch)[0])

    checkpoint = tempfile.mkdtemp(prefix="bootstrap-")
    try:
        records = (
            spark.readStream.format("compacted-state")
            .option("startingOffsets", "earliest")
            .load(uri)
        )
        query = (
            records.writeStream.foreachBatch(fold)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        ends = (
            json.loads(query.lastProgress["sources"][0]["endOffset"]) if query.lastProgress else {}
        )
        return sum(seen), {str(p): int(o) for p, o in ends.items()}
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)


def replay_into_new_log(spark: SparkSession, uri: str) -> int:
    """``replay`` of the log into a new log (exact: same partitions and offsets); the new
    log's live keys, counted from a stream of its state (memory: a batch)."""
    target = tempfile.mkdtemp(prefix="replayed-")
    try:
        replay(RestoreSource.of_log(spark, uri), os.path.join(target, "log"))
        return sum(b.num_rows for b in read_state_batches(os.path.join(target, "log")))
    finally:
        shutil.rmtree(target, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_server(directory: str, port: int) -> Iterator[Any]:
    import redis

    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            directory,
            "--dbfilename",
            "dump.rdb",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_timeout=3600)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if client.info("persistence")["loading"] == 0:
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("redis-server did not start")
            time.sleep(0.005)
        yield client
    finally:
        server.terminate()
        server.wait()


def state_batches(uri: str) -> Iterator[pa.RecordBatch]:
    """The state's keys and values, a batch at a time (the stores are loaded from a stream:
    no copy of the whole state is held beside the store)."""
    for batch in read_state_batches(uri, batch_rows=BATCH):
        yield pa.RecordBatch.from_arrays(
            [batch.column("key"), batch.column("value")], names=["key", "value"]
        )


def redis_restore(uri: str, directory: str) -> dict[str, Any]:
    """The state's keys loaded into Redis (MSET of 10,000), saved (RDB); then timed: SCAN
    with pipelined MGET into a dict, and the RDB file loaded at server start. Only Redis
    and the restored dict hold the state meanwhile."""
    os.makedirs(directory, exist_ok=True)
    port = free_port()
    with redis_server(directory, port) as client:
        loaded = 0
        for batch in state_batches(uri):
            names, data = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            pipe = client.pipeline(transaction=False)
            for i in range(0, len(names), 10_000):
                pipe.mset(dict(zip(names[i : i + 10_000], data[i : i + 10_000], strict=True)))
            pipe.execute()
            loaded += len(names)
        client.save()
        started = time.perf_counter()
        restored: dict[bytes, bytes] = {}
        cursor = 0
        while True:
            cursor, batch_keys = client.scan(cursor, count=10_000)
            if batch_keys:
                restored.update(zip(batch_keys, client.mget(batch_keys), strict=True))
            if cursor == 0:
                break
        scan_s = time.perf_counter() - started
        assert len(restored) == loaded, (len(restored), loaded)
        del restored
    started = time.perf_counter()
    with redis_server(directory, port) as client:
        rdb_s = time.perf_counter() - started
        assert client.dbsize() == loaded
    return {
        "redis_keys": loaded,
        "redis_scan_mget_s": round(scan_s, 3),
        "redis_rdb_load_s": round(rdb_s, 3),
    }


class _CopyStream(io.RawIOBase):
    """A COPY TO STDOUT's chunks as a readable stream (parsed as they arrive: the CSV text
    is never held whole)."""

    def __init__(self, chunks: Iterator[Any]) -> None:
        self.chunks, self.pending = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.pending = bytes(chunk)
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def postgres_restore(uri: str, root: str) -> dict[str, Any]:
    """The state's keys loaded into a PostgreSQL 15 table (COPY FROM, a batch at a time);
    then timed: ``COPY state TO STDOUT`` parsed into Arrow as it streams."""
    import psycopg

    data, sockets = os.path.join(root, "pg"), os.path.join(root, "pgsock")
    os.makedirs(sockets)
    shutil.chown(root, "postgres")
    shutil.chown(sockets, "postgres")
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_pg, str(PG_BIN / "initdb"), "-A", "trust", "-D", data],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    port = free_port()
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets} -c shared_buffers=1GB"
    ctl = [*as_pg, str(PG_BIN / "pg_ctl"), "-D", data, "-w", "-l", os.path.join(root, "pg.log")]
    subprocess.run([*ctl, "-o", options, "start"], check=True, stdout=subprocess.DEVNULL)
    try:
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE state (key text PRIMARY KEY, value text)")
            loaded = 0
            with conn.cursor().copy("COPY state FROM STDIN (FORMAT csv)") as copy:
                for batch in state_batches(uri):
                    buffer = io.BytesIO()
                    pacsv.write_csv(batch, buffer, pacsv.WriteOptions(include_header=False))
                    copy.write(buffer.getvalue())
                    loaded += batch.num_rows
            conn.execute("VACUUM ANALYZE state")
            started = time.perf_counter()
            with conn.cursor().copy("COPY state TO STDOUT (FORMAT csv)") as copy:
                table = pacsv.read_csv(
                    io.BufferedReader(_CopyStream(iter(copy)), 1 << 20),
                    read_options=pacsv.ReadOptions(column_names=["key", "value"]),
                    convert_options=pacsv.ConvertOptions(
                        column_types={"key": pa.string(), "value": pa.string()}
                    ),
                )
            copy_s = time.perf_counter() - started
            assert table.num_rows == loaded, (table.num_rows, loaded)
            del table
    finally:
        subprocess.run([*ctl, "stop", "-m", "fast"], check=False, stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)
    return {"postgres_rows": loaded, "postgres_copy_out_s": round(copy_s, 3)}


def run(n_keys: int, runs: int, out: str | None, stop_at: float | None) -> dict[str, Any]:
    """The drill, in this order: the log built and passed; the fast rows after the pass;
    Redis and PostgreSQL loaded with that state and restored (each store's files removed
    after its rows); the slow rows after the pass; the updates up to the trigger; the fast
    rows, then the slow rows, on the dirty log."""
    drill = Drill(out, stop_at)
    spark = bench_session()
    root = tempfile.mkdtemp(prefix="replay-drill-")
    os.chmod(root, 0o755)
    try:
        uri = os.path.join(root, "log")
        sink = CompactedStateSink(uri, key_columns=("key",), cleaning="inline")
        rng = np.random.default_rng(5)
        appended, batch_id = 0, 0
        result = drill.result
        result.update(keys=n_keys, value_bytes=VALUE_BYTES, runs=runs)
        started = time.perf_counter()
        for first in range(0, n_keys, BATCH):
            ids = np.arange(first, min(first + BATCH, n_keys))
            batch = pa.table({"key": keys(ids), "value": values(rng, len(ids))})
            sink(spark.createDataFrame(batch), batch_id)
            appended, batch_id = appended + len(ids), batch_id + 1
        sink.clean(force=True)
        result["load_before"] = load_average()
        result["build_s"] = round(time.perf_counter() - started, 1)
        after = result["after_pass"] = {}
        reads(drill, after, spark, sink, appended, runs)
        redis_dir = os.path.join(root, "redis")
        drill.row(result, "redis", lambda: redis_restore(uri, redis_dir))
        shutil.rmtree(redis_dir, ignore_errors=True)
        pg_root = os.path.join(root, "pgroot")
        drill.row(result, "postgres", lambda: postgres_restore(uri, pg_root))
        shutil.rmtree(pg_root, ignore_errors=True)
        slow_reads(drill, after, spark, uri, runs, {})
        ratio = CleanerConfig().min_cleanable_dirty_ratio
        # Updates in batches of at most a tenth of the keys, so that a small drill has a
        # dirty section too (a first batch as large as the log would pass the trigger).
        size = min(BATCH, max(1, n_keys // 10))
        started = time.perf_counter()
        while True:  # stop before the batch that would take the ratio past the trigger
            share = (sink.dirty_ratio() * appended + size) / (appended + size)
            if share >= ratio - 0.02:
                break
            ids = rng.integers(0, n_keys, size)
            batch = pa.table({"key": keys(ids), "value": values(rng, size)})
            sink(spark.createDataFrame(batch), batch_id)
            appended, batch_id = appended + size, batch_id + 1
        result["updates_s"] = round(time.perf_counter() - started, 1)
        dirty = result["dirty"] = {}
        reads(drill, dirty, spark, sink, appended, runs)
        # A dirty row's time from the same row after the pass, scaled as at 1e6 keys.
        estimate = {
            "consumer_bootstrap_s": 0.7 * after.get("consumer_bootstrap_s", 0.0) * runs,
            "replay_s": 2.3 * after.get("replay_s", 0.0) * runs,
        }
        slow_reads(drill, dirty, spark, uri, runs, estimate)
        result["load_after"] = load_average()
        result.pop("load_now", None)
        return result
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument(
        "--stop-at",
        type=float,
        help="epoch seconds after which no row starts (a row not run says so in the JSON)",
    )
    args = parser.parse_args()
    result = run(args.keys, args.runs, args.out, args.stop_at)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
