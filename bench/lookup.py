"""``python -m bench.lookup``: point lookups on a compacted log, at 1e6 and 1e7 live keys.

For each size, a log of that many live keys (4 partitions, ~16-byte keys, 48-byte values,
keys in random order against offsets, as a topic's are) is built without Spark by the
sink's own segment writer (`SegmentWriterTask`, the code an append's Python task and a
pass run) and committed by the log's own commit, as a pass leaves it: one record per key,
every partition cleaned to its end. Then a dirty region of 10 % of the keys is appended
(batches of 50,000 records, a file per partition each, 10 % of them tombstones) and
everything is measured again. Measured, one key and 1,000 keys at a time:

- ``lookup``: `sinks.lookup` (pyarrow + delta-rs, the key filter), one call after
  another in one process (what it keeps of the files serves the next call), and as a
  process's first (``first_lookup``: nothing kept);
- ``read_state_filter``: `sinks.read_state_batches`, each batch filtered to the keys;
- ``duckdb``: DuckDB's ``delta_scan`` with the state's window query and the keys as a
  filter (DuckDB reads Parquet bloom filters and min/max statistics itself);
- ``spark_state``: ``CompactedStateSink.state()`` filtered to the keys, collected.

Every answer is checked against ``read_state``'s rows for the same keys. Then the key
filter's cost to the writers: the same rows written with and without it, alternating,
by the Python segment writer at an append's size (50,000 records, 4 partitions) and at
a pass's (1e6 records of one partition), and by Spark's Parquet writer (a 1e6-record
batch). Then the page index's cost to the same writers: the Python segment writer with and
without it (and its small pages), alternating, the key filter on in both.
``--lookup-only`` measures only ``lookup`` (its answers still checked against
``read_state``); ``--writers-only`` only the writers' costs. Writes ``--out`` (default
``bench/lookup.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from bench.measure import load_average, machine_description
from sinks import CleanerConfig, lookup, read_state_batches
from sinks.log.history_window import table_properties
from sinks.log.key_filter import spark_key_filter_options
from sinks.log.log_config import topic_table_properties
from sinks.log.log_format import CLEANER_OFFSET_TXN, LOG_END_OFFSET_TXN, PARTITIONS_TXN
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogTable, log_arrow_schema
from sinks.log.segment_writer import SegmentWriterTask, WrittenSegment, stats_columns
from sinks.reading.delta_sql import state_query
from sinks.reading.lookup_files import LOOKUP_FILES

PARTITIONS = 4
VALUE_BYTES = 48
APPEND_RECORDS = 50_000
SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType()),
        T.StructField("value", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("delete_horizon_ms", T.LongType()),
    ]
)
KEYS = LogKeys(key_columns=("key",))


def key_names(ids: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(
        "user-", pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), 10, "0"), ""
    )


def records(ids: np.ndarray, partition: int, first_offset: int, tag: str, tombstones=None):
    n = len(ids)
    values = pc.binary_join_element_wise(
        pc.utf8_rpad(
            pc.cast(pa.array(ids * 2654435761 % 10**12), pa.string()), VALUE_BYTES - 8, "."
        ),
        tag,
        "",
    )
    if tombstones is not None:
        values = pc.if_else(pa.array(tombstones), pa.nulls(n, pa.string()), values)
    return pa.table(
        {
            "key": key_names(ids),
            "value": values,
            "partition": pa.array(np.full(n, partition, np.int32)),
            "offset": pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
            "timestamp": pa.array(np.full(n, 1_764_000_000_000_000, np.int64)).cast(
                pa.timestamp("us", "UTC")
            ),
            "delete_horizon_ms": pa.nulls(n, pa.int64()),
        }
    )


def writer(
    path: str, schema: pa.Schema, *, filters: bool, max_file_bytes: int
) -> SegmentWriterTask:
    return SegmentWriterTask(
        table_uri=path,
        schema=schema,
        stats_columns=tuple(stats_columns(SCHEMA, KEYS)),
        max_file_bytes=max_file_bytes,
        group_column=None,
        storage_options={},
        key_columns=KEYS.key_columns if filters else (),
    )


def write(task: SegmentWriterTask, tables: Sequence[pa.Table]) -> list[WrittenSegment]:
    batches = (b for t in tables for b in t.cast(task.schema).to_batches(max_chunksize=131_072))
    out = list(task(batches))
    return [WrittenSegment(**r) for b in out for r in b.to_pylist()]


def build_clean(path: str, live: int, seed: int) -> dict[str, Any]:
    """A log of ``live`` keys, one record each, cleaned to its end in every partition."""
    started = time.monotonic()
    config = CleanerConfig()
    log = LogTable(path)
    snapshot = log.create(
        SCHEMA,
        {
            **table_properties(config.file_delete_delay_ms),
            **KEYS.to_properties(),
            **topic_table_properties(config),
        },
    )
    task = writer(path, snapshot.arrow_schema, filters=True, max_file_bytes=config.segment_bytes)
    rng = np.random.default_rng(seed)
    written, ends = [], {}
    for p in range(PARTITIONS):
        ids = rng.permutation(live // PARTITIONS) * PARTITIONS + p  # random against offsets
        tables = [records(ids[i : i + 1_000_000], p, i, "c") for i in range(0, len(ids), 1_000_000)]
        written += write(task, tables)
        ends[p] = len(ids)
    transactions = {LOG_END_OFFSET_TXN.format(p): e for p, e in ends.items()}
    transactions.update({CLEANER_OFFSET_TXN.format(p): e for p, e in ends.items()})
    transactions[PARTITIONS_TXN] = PARTITIONS
    snapshot.commit(
        adds=written, data_change=True, transactions=transactions, info={"operation": "append"}
    )
    return {"seconds": time.monotonic() - started, "files": len(written), "ends": ends}


def add_dirty(path: str, live: int, ends: dict[int, int], seed: int) -> dict[str, Any]:
    """Append 10 % of ``live`` records (updates of random keys, 10 % tombstones) in batches."""
    started = time.monotonic()
    rng = np.random.default_rng(seed)
    log = LogTable(path)
    total, files = live // 10, 0
    for start in range(0, total, APPEND_RECORDS):
        snapshot = log.snapshot()
        assert snapshot is not None
        task = writer(path, snapshot.arrow_schema, filters=True, max_file_bytes=1 << 30)
        ids = rng.integers(0, live, min(APPEND_RECORDS, total - start))
        tables = []
        for p in range(PARTITIONS):
            mine = ids[ids % PARTITIONS == p]
            tables.append(records(mine, p, ends[p], "d", rng.random(len(mine)) < 0.1))
            ends[p] += len(mine)
        written = write(task, tables)
        files += len(written)
        transactions = {LOG_END_OFFSET_TXN.format(p): e for p, e in ends.items()}
        snapshot.commit(
            adds=written, data_change=True, transactions=transactions, info={"operation": "append"}
        )
    return {"seconds": time.monotonic() - started, "files": files, "records": total}


def pct(runs: list[float], q: float) -> float:
    ordered = sorted(runs)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timed(fn: Callable[[], Any], runs: int) -> tuple[dict[str, Any], list[Any]]:
    """Wall time per run (p50, p99) and this process's CPU time (p50): on a loaded machine
    the CPU time says what the work costs, the wall time what a caller waited."""
    seconds, cpu, answers = [], [], []
    for _ in range(runs):
        started, started_cpu = time.perf_counter(), time.process_time()
        answers.append(fn())
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    summary = {
        "p50_ms": round(statistics.median(seconds) * 1000, 1),
        "p99_ms": round(pct(seconds, 0.99) * 1000, 1),
        "cpu_p50_ms": round(statistics.median(cpu) * 1000, 1),
        "runs": runs,
    }
    return summary, answers


def first_lookup(path: str, keys: Any) -> pa.Table:
    """`lookup` as a process's first: what lookups keep of the files is forgotten first."""
    LOOKUP_FILES.clear()
    return lookup(path, keys)


def as_rows(table: pa.Table) -> set[tuple[str, str]]:
    return set(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))


def state_of(path: str, keys: list[str]) -> set[tuple[str, str]]:
    wanted = pa.array(keys)
    rows = set()
    for batch in read_state_batches(path):
        rows |= as_rows(
            pa.Table.from_batches([batch]).filter(pc.is_in(batch.column("key"), wanted))
        )
    return rows


def duckdb_connection():
    import duckdb
    import duckdb_ext

    root = list(duckdb_ext.__path__)[0]
    extension = sorted(
        os.path.join(d, f)
        for d, _, fs in os.walk(root)
        for f in fs
        if f == "delta.duckdb_extension"
    )[0]
    connection = duckdb.connect()
    connection.execute(f"LOAD '{extension}'")
    return connection


def duckdb_lookup(connection, path: str, keys: list[str]) -> set[tuple[str, str]]:
    listed = ", ".join("'" + k.replace("'", "''") + "'" for k in keys)
    source = f"(SELECT * FROM delta_scan('{path}') WHERE key IN ({listed}))"
    return set(connection.execute(f"SELECT key, value FROM ({state_query(source)})").fetchall())


def measure_log(
    path: str, live: int, spark, runs: dict[str, int], seed: int, lookup_only: bool = False
) -> dict[str, Any]:
    rng = random.Random(seed)
    pick = [f"user-{rng.randrange(live + live // 100):010d}" for _ in range(runs["one"])]
    sets = [
        [f"user-{rng.randrange(live + live // 100):010d}" for _ in range(1000)]
        for _ in range(runs["thousand"])
    ]
    result: dict[str, Any] = {}
    keys_iter = iter(pick * 3)
    one, _ = timed(lambda: lookup(path, next(keys_iter)), len(pick))
    sets_iter = iter(sets * 3)
    thousand, answers = timed(lambda: lookup(path, next(sets_iter)), len(sets))
    result["lookup"] = {"one_key": one, "1000_keys": thousand}
    # A process's first lookup: nothing kept of the files yet (footers, filters, pages).
    keys_iter = iter(pick * 3)
    first_one, _ = timed(lambda: first_lookup(path, next(keys_iter)), max(len(pick) // 5, 1))
    sets_iter = iter(sets * 3)
    first_k, _ = timed(lambda: first_lookup(path, next(sets_iter)), max(len(sets) // 3, 1))
    result["first_lookup"] = {"one_key": first_one, "1000_keys": first_k}
    expected = state_of(path, sets[0])
    if lookup_only:
        result["checks"] = {"lookup_equals_read_state": as_rows(answers[0]) == expected}
        result["live_keys_in_1000"] = len(expected)
        return result
    sets_iter = iter(sets * 3)
    rs, _ = timed(lambda: state_of(path, next(sets_iter)), runs["read_state"])
    result["read_state_filter"] = {"one_key": rs, "1000_keys": rs, "note": "same scan either way"}
    checks = {"lookup_equals_read_state": as_rows(answers[0]) == expected}
    connection = duckdb_connection()
    keys_iter = iter(pick * 3)
    d_one, _ = timed(lambda: duckdb_lookup(connection, path, [next(keys_iter)]), runs["duckdb_one"])
    sets_iter = iter(sets * 3)
    d_k, d_answers = timed(lambda: duckdb_lookup(connection, path, next(sets_iter)), runs["duckdb"])
    result["duckdb"] = {"one_key": d_one, "1000_keys": d_k}
    checks["duckdb_equals_read_state"] = d_answers[0] == expected
    connection.close()
    if spark is not None:
        from pyspark.sql import functions as F

        from sinks import CompactedStateSink

        sink = CompactedStateSink(path)
        keys_iter = iter(pick * 3)

        def spark_one():
            key = next(keys_iter)
            return sink.state().filter(F.col("key") == key).collect()

        def spark_many(keys=sets[0]):
            return sink.state().filter(F.col("key").isin(keys)).collect()

        s_one, _ = timed(spark_one, runs["spark"])
        s_k, s_answers = timed(spark_many, runs["spark"])
        result["spark_state"] = {"one_key": s_one, "1000_keys": s_k}
        checks["spark_equals_read_state"] = {
            (r["key"], r["value"]) for r in s_answers[0]
        } == expected
    result["checks"] = checks
    result["live_keys_in_1000"] = len(expected)
    return result


def writer_rounds(
    work: str, schema: pa.Schema, tables: Sequence[pa.Table], rounds: int, pages: bool = False
) -> tuple[dict[bool, list[float]], dict[bool, list[float]], dict[bool, int]]:
    """The segment writer over ``tables`` with and without the key filter (``pages``: with
    and without the page index, the filter on), alternating for ``rounds`` rounds: wall
    seconds, CPU seconds and bytes written, keyed by on/off."""
    from sinks.log.key_filter import PAGE_INDEX_OFF_ENV

    seconds: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    sizes: dict[bool, int] = {}
    for r in range(rounds):
        for filters in (r % 2 == 0, r % 2 == 1):
            target = f"{work}-{r}-{filters}"
            task = writer(target, schema, filters=filters or pages, max_file_bytes=128 << 20)
            if pages and not filters:
                os.environ[PAGE_INDEX_OFF_ENV] = "1"
            started, started_cpu = time.perf_counter(), time.process_time()
            try:
                written = write(task, tables)
            finally:
                os.environ.pop(PAGE_INDEX_OFF_ENV, None)
            seconds[filters].append(time.perf_counter() - started)
            cpu[filters].append(time.process_time() - started_cpu)
            sizes[filters] = sum(w.size_bytes for w in written)
            shutil.rmtree(target)
    return seconds, cpu, sizes


def writer_cost(work: str, rounds: int, pages: bool = False) -> dict[str, Any]:
    """The Python segment writer with and without the key filter (``pages``: the page
    index), alternating."""
    arrow_schema = log_arrow_schema(SCHEMA)
    rng = np.random.default_rng(5)
    append = [
        records(rng.integers(0, 10**7, APPEND_RECORDS // PARTITIONS) * PARTITIONS + p, p, 0, "a")
        for p in range(PARTITIONS)
    ]
    pass_ = [records(rng.permutation(10**6) * PARTITIONS, 0, 0, "p")]
    result = {}
    for name, tables in (("append_50k", append), ("pass_1e6", pass_)):
        seconds, cpu, sizes = writer_rounds(
            os.path.join(work, f"w-{name}"), arrow_schema, tables, rounds, pages
        )
        with_, without = statistics.median(seconds[True]), statistics.median(seconds[False])
        cpu_with, cpu_without = statistics.median(cpu[True]), statistics.median(cpu[False])
        result[name] = {
            "with_filter_s": round(with_, 4),
            "without_s": round(without, 4),
            "time_ratio": round(with_ / without, 3),
            "cpu_with_s": round(cpu_with, 4),
            "cpu_without_s": round(cpu_without, 4),
            "cpu_ratio": round(cpu_with / cpu_without, 3),
            "bytes_with": sizes[True],
            "bytes_without": sizes[False],
            "bytes_ratio": round(sizes[True] / sizes[False], 4),
            "rounds": rounds,
        }
    return result


def spark_writer_cost(spark, work: str, rounds: int) -> dict[str, Any]:
    """Spark's Parquet writer (parquet-mr) with and without the key filter's options."""
    from pyspark.sql import functions as F

    rows = (
        spark.range(0, 10**6, 1, 2)
        .select(
            F.format_string("user-%010d", (F.col("id") * 7919) % 10**7).alias("key"),
            F.rpad(F.col("id").cast("string"), VALUE_BYTES, ".").alias("value"),
            F.lit(0).cast("int").alias("partition"),
            F.col("id").alias("offset"),
        )
        .cache()
    )
    rows.count()
    seconds: dict[bool, list[float]] = {True: [], False: []}
    sizes: dict[bool, int] = {}
    for r in range(rounds):
        for filters in (r % 2 == 0, r % 2 == 1):
            target = os.path.join(work, f"spark-{r}-{filters}")
            w = rows.write.mode("overwrite").option("compression", "zstd")
            if filters:
                w = w.options(**spark_key_filter_options(log_arrow_schema(SCHEMA), ["key"]))
            started = time.perf_counter()
            w.parquet(target)
            seconds[filters].append(time.perf_counter() - started)
            sizes[filters] = sum(
                os.path.getsize(os.path.join(d, f))
                for d, _, fs in os.walk(target)
                for f in fs
                if f.endswith(".parquet")
            )
            shutil.rmtree(target)
    rows.unpersist()
    with_, without = statistics.median(seconds[True]), statistics.median(seconds[False])
    return {
        "spark_writer_1e6": {
            "with_filter_s": round(with_, 3),
            "without_s": round(without, 3),
            "time_ratio": round(with_ / without, 3),
            "bytes_with": sizes[True],
            "bytes_without": sizes[False],
            "bytes_ratio": round(sizes[True] / sizes[False], 4),
            "rounds": rounds,
        }
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--out", default="bench/lookup.json")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--no-spark", action="store_true", help="leave Spark's state out")
    parser.add_argument("--quick", action="store_true", help="fewer runs (a smoke test)")
    parser.add_argument("--lookup-only", action="store_true", help="only lookup's own figures")
    parser.add_argument("--writers-only", action="store_true", help="only the writers' costs")
    args = parser.parse_args()
    if args.lookup_only or args.writers_only:
        args.no_spark = True
    runs = {"one": 50, "thousand": 9, "read_state": 2, "duckdb_one": 9, "duckdb": 3, "spark": 2}
    if args.quick:
        runs = {"one": 10, "thousand": 3, "read_state": 1, "duckdb_one": 2, "duckdb": 2, "spark": 1}
    work = args.work or tempfile.mkdtemp(prefix="bench-lookup-")
    started = time.monotonic()
    report: dict[str, Any] = {
        "machine": machine_description(),
        "load_before": load_average(),
        "note": "one run on a shared, loaded machine (other engineers' Spark tests running)",
        "runs": runs,
        "sizes": {},
    }
    spark = None
    if not args.no_spark:
        from bench.session import bench_session

        spark = bench_session()
    try:
        for live in [] if args.writers_only else [int(s) for s in args.sizes.split(",")]:
            path = os.path.join(work, f"log-{live}")
            built = build_clean(path, live, seed=live)
            entry: dict[str, Any] = {"build_clean": built}
            if live >= 10_000_000:
                runs = {**runs, "spark": 1, "read_state": 1}  # a run takes minutes when loaded
            entry["cleaned"] = measure_log(path, live, spark, runs, 1, args.lookup_only)
            entry["add_dirty"] = add_dirty(path, live, dict(built["ends"]), seed=2)
            entry["dirty_10pct"] = measure_log(path, live, spark, runs, 3, args.lookup_only)
            del built["ends"]
            report["sizes"][str(live)] = entry
            print(json.dumps({str(live): entry}, indent=1), flush=True)
            shutil.rmtree(path)
        if not args.lookup_only:
            report["writer_cost"] = writer_cost(work, 9 if not args.quick else 2)
            report["page_index_cost"] = writer_cost(work, 9 if not args.quick else 2, pages=True)
        if spark is not None:
            report["writer_cost"].update(spark_writer_cost(spark, work, 6 if not args.quick else 2))
    finally:
        if spark is not None:
            spark.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    report["load_after"] = load_average()
    report["seconds"] = round(time.monotonic() - started, 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: report.get(k) for k in ("writer_cost", "page_index_cost")}, indent=1))


if __name__ == "__main__":
    main()
