"""``python -m bench.scale``: the pass, the append and ``state()`` as a log grows (issue #20).

For each size (records, value bytes, partitions) a never-cleaned log is built through
the public API (the hook with cleaning off, batches of 1,000,000 records, keys =
records / 2, each key written twice, 2% tombstones), then:

- **pass**: a copy of the log, opened (recovered) by a new sink, cleaned once with
  ``clean(force=True)``; against the floor (`bench.cleaner_bench.io_floor`: Spark
  reading the same files and writing the kept fraction as Parquet); efficiency =
  floor / pass. Peak RSS of the Python driver, the Spark JVM and the largest Python
  worker over the pass (`bench.measure.PeakRss`);
- **state**: ``sink.state()`` of the cleaned log materialized (a ``noop`` write)
  against Spark reading the log's live files the same way.

With ``--state-live N``, ``state()`` over N *live* keys (a log of N records, each key
written once, no tombstones) in three shapes, each against Spark reading the live files:
all dirty (never cleaned: ``state()`` aggregates it all), all clean (after one
``clean(force=True)``: ``state()`` streams the clean section) and clean plus a dirty tail
(N / 10 more records rewriting existing keys, 2% of them tombstones, not cleaned). A shape
where ``state()`` takes over 1.5× Spark is run once more and profiled into
``state_profile.txt``.

Then the append: batches of 50,000 and 1,000,000 records through the hook (cleaning
off) against Spark writing the same batch as plain Parquet, each batch read from the
same Parquet file; the driver's profile of the sink's batches goes to
``append_profile.txt``. Writes ``scale.json`` and ``scale.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import tempfile
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.cleaner_bench import io_floor
from bench.measure import PeakRss, delta_table_size, load_average, machine_description
from bench.session import bench_session
from sinks import CleanerConfig, CompactedStateSink
from sinks.cleaner.pass_planning import RoundRequest
from sinks.cleaner.throttler import TaskBudget
from sinks.reading.state_reader import log_sections

BATCH = 1_000_000
TOMBSTONES = 0.02
_SPREAD = 2_654_435_761  # Knuth's multiplicative constant: keys scattered over the batches


def records(
    spark: SparkSession,
    start: int,
    count: int,
    *,
    total: int,
    partitions: int,
    value_bytes: int,
    writes_per_key: int = 2,
    tombstones: float = TOMBSTONES,
) -> DataFrame:
    """Records ``start .. start + count`` of a log of ``total``: key ``(id * spread) mod
    total/writes_per_key`` (every key ``writes_per_key`` times; any ``total``
    consecutive ids past the first ``total`` rewrite distinct keys, the spread being
    prime), its partition ``key mod partitions``, a random value or, for a
    ``tombstones`` fraction, none."""
    keys = max(1, total // writes_per_key)
    key = F.pmod(F.col("id") * F.lit(_SPREAD), F.lit(keys))
    return spark.range(start, start + count).select(
        F.format_string("key-%012d", key).alias("key"),
        F.when(F.rand(start) < tombstones, F.lit(None))
        .otherwise(F.randstr(F.lit(value_bytes), F.lit(start)))
        .cast("binary")
        .alias("value"),
        F.pmod(key, F.lit(partitions)).cast("int").alias("partition"),
    )


def open_sink(path: str, **config: Any) -> CompactedStateSink:
    """The sink over ``path``; cleaning off unless forced (a dirty ratio never passes 1.0)."""
    return CompactedStateSink(
        path,
        key_columns=("key",),
        config=CleanerConfig(min_cleanable_dirty_ratio=1.0, **config),
        cleaning="inline",
    )


def build_log(
    spark: SparkSession,
    path: str,
    *,
    total: int,
    partitions: int,
    value_bytes: int,
    writes_per_key: int = 2,
    tombstones: float = TOMBSTONES,
) -> None:
    sink = open_sink(path)
    for batch_id, start in enumerate(range(0, total, BATCH)):
        count = min(BATCH, total - start)
        sink(
            records(
                spark,
                start,
                count,
                total=total,
                partitions=partitions,
                value_bytes=value_bytes,
                writes_per_key=writes_per_key,
                tombstones=tombstones,
            ),
            batch_id,
        )


def materialize(df: DataFrame) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def one_size(
    spark: SparkSession,
    work: str,
    *,
    total: int,
    partitions: int,
    value_bytes: int,
    rss: PeakRss,
    repeats: int = 2,
    max_tasks: int | None = None,
) -> dict[str, Any]:
    name = f"{total}-{partitions}p-{value_bytes}B-{max_tasks}"
    source = os.path.join(work, name, "log")
    started = time.perf_counter()
    build_log(spark, source, total=total, partitions=partitions, value_bytes=value_bytes)
    built_s = time.perf_counter() - started
    pass_runs, floor_runs, cleaner_runs = [], [], []
    peaks: dict[str, float] = {}
    for _ in range(repeats):  # pass, floor, pass, floor: a change of load weighs on both
        copy = os.path.join(work, name + "-pass", "log")
        shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
        shutil.copytree(source, copy)
        sink = open_sink(copy)
        sink.recover()  # what opening the log costs, once per sink object: not the pass's
        inputs = [os.path.join(copy, s.path) for s in sink.log_table.snapshot().all_segments()]
        rss.reset()
        started = time.perf_counter()
        forced = RoundRequest(force=True, budget=TaskBudget(max_tasks))
        passes = [sink.cleaner.run_pass(spark, forced)]
        while passes[-1] is not None and passes[-1].work_left:  # the dedupe buffer cut it
            passes.append(sink.cleaner.run_pass(spark, forced))
        pass_runs.append(time.perf_counter() - started)
        cleaner_runs.append(sum(p.duration_ms for p in passes if p is not None) / 1000)
        peaks = {k: max(v, peaks.get(k, 0.0)) for k, v in rss.read().items()}
        stats = passes[0]
        assert stats is not None, "the log had nothing to clean"
        records_written = sum(s.num_records for s in sink.log_table.snapshot().all_segments())
        keep = records_written / stats.records_read
        floor_runs.append(io_floor(spark, inputs, keep, os.path.join(work, name + "-floor")))
    pass_s, floor_s = min(pass_runs), min(floor_runs)
    live = delta_table_size(copy).paths
    state_s = materialize(sink.state())
    live_s = materialize(spark.read.parquet(*live))
    shutil.rmtree(os.path.join(work, name + "-floor"), ignore_errors=True)
    shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
    shutil.rmtree(os.path.dirname(source), ignore_errors=True)
    row = {
        "records": total,
        "value_bytes": value_bytes,
        "partitions": partitions,
        "pass_s": round(pass_s, 2),
        "floor_s": round(floor_s, 2),
        "efficiency": round(floor_s / pass_s, 3),
        "records_per_s": round(total / pass_s),
        "driver_peak_rss_mb": round(peaks["driver"]),
        "jvm_peak_rss_mb": round(peaks["jvm"]),
        "worker_peak_rss_mb": round(peaks["workers"]),
        "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written,
        "records_written": records_written,
        "passes": len([p for p in passes if p is not None]),
        "segments_read": stats.segments_read,
        "segments_written": stats.segments_written,
        "pass_runs_s": [round(x, 2) for x in pass_runs],
        "floor_runs_s": [round(x, 2) for x in floor_runs],
        "cleaner_runs_s": [round(x, 2) for x in cleaner_runs],  # Cleaner.clean alone
        "max_tasks": max_tasks,
        "state_s": round(state_s, 2),
        "state_live_files_s": round(live_s, 2),
        "build_s": round(built_s, 1),
        "load": load_average(),
    }
    print(json.dumps(row), flush=True)
    return row


def live_state(
    spark: SparkSession,
    work: str,
    *,
    live_keys: int,
    partitions: int,
    value_bytes: int,
    rss: PeakRss,
    repeats: int = 2,
) -> tuple[list[dict[str, Any]], str]:
    """``state()`` over ``live_keys`` live keys, all dirty, all clean, then clean with a tail.

    The log holds each key once (no tombstones); the tail is ``live_keys / 10`` records
    rewriting distinct existing keys (2% tombstones), appended after the pass and left
    dirty. The log is shaped in place, in that order. Returns the rows and, for a shape
    where ``state()`` took more than 1.5× Spark on the live files, one more run's profile
    (`last_execution_profile` and the driver's cProfile)."""
    path = os.path.join(work, f"state-{live_keys}-{partitions}p", "log")
    options = {"partitions": partitions, "value_bytes": value_bytes, "repeats": repeats}
    started = time.perf_counter()
    build_log(
        spark,
        path,
        total=live_keys,
        partitions=partitions,
        value_bytes=value_bytes,
        writes_per_key=1,
        tombstones=0.0,
    )
    built_s = time.perf_counter() - started
    sink = open_sink(path)
    rows, profiles = [], []

    def measure(name: str) -> None:
        row, profile = _state_against_live_files(spark, sink, path, rss=rss, **options)
        # prepare_s: what making the shape took (the build, the pass, the tail's append)
        rows.append({"live_keys": live_keys, "shape": name, **row, "prepare_s": round(built_s, 1)})
        print(json.dumps(rows[-1]), flush=True)
        if profile:
            profiles.append(f"== {live_keys} live keys, {name} ==\n{profile}")

    measure("all dirty")
    started = time.perf_counter()
    forced = RoundRequest(force=True)
    passes = [sink.cleaner.run_pass(spark, forced)]
    while passes[-1] is not None and passes[-1].work_left:  # the dedupe buffer cut it
        passes.append(sink.cleaner.run_pass(spark, forced))
    built_s = time.perf_counter() - started
    assert not log_sections(sink.log_table.snapshot()).dirty, "the pass left a dirty section"
    measure("all clean")
    tail = live_keys // 10
    started = time.perf_counter()
    open_sink(path)(
        records(
            spark,
            live_keys,
            tail,
            total=live_keys,
            partitions=partitions,
            value_bytes=value_bytes,
            writes_per_key=1,
        ),
        len(range(0, live_keys, BATCH)),
    )
    built_s = time.perf_counter() - started
    measure("clean + 10% dirty tail")
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return rows, "\n".join(profiles)


def _state_against_live_files(
    spark: SparkSession,
    sink: CompactedStateSink,
    path: str,
    *,
    partitions: int,
    value_bytes: int,
    rss: PeakRss,
    repeats: int,
) -> tuple[dict[str, Any], str]:
    """Best of ``repeats``: ``sink.state()`` and Spark on the live files, alternated."""
    snapshot = sink.log_table.snapshot()
    assert snapshot is not None
    sections = log_sections(snapshot)
    live = delta_table_size(path).paths
    counted = sink.state().count()
    state_runs, spark_runs, state_calls, spark_calls = [], [], [], []
    peaks: dict[str, float] = {}
    for _ in range(repeats):  # state, Spark, state, Spark: a change of load weighs on both
        rss.reset()
        started = time.perf_counter()
        state = sink.state()  # reads the Delta log, splits it, plans: part of the cost
        state_calls.append(time.perf_counter() - started)
        state_runs.append(materialize(state))
        peaks = {k: max(v, peaks.get(k, 0.0)) for k, v in rss.read().items()}
        started = time.perf_counter()
        files = spark.read.parquet(*live)
        spark_calls.append(time.perf_counter() - started)
        spark_runs.append(materialize(files))
    state_s, spark_s = min(state_runs), min(spark_runs)
    row = {
        "partitions": partitions,
        "value_bytes": value_bytes,
        "live_keys_counted": counted,
        "log_records": sum(f.num_records for f in snapshot.data_files()),
        "clean_files": len(sections.clean),
        "dirty_files": len(sections.dirty),
        "dirty_records": sections.dirty_records,
        "live_files": len(live),
        "state_s": round(state_s, 2),
        "spark_live_files_s": round(spark_s, 2),
        "ratio": round(state_s / spark_s, 2),
        "state_call_s": round(min(state_calls), 2),  # sink.state() itself, before the write
        "spark_read_call_s": round(min(spark_calls), 2),
        "driver_peak_rss_mb": round(peaks["driver"]),
        "jvm_peak_rss_mb": round(peaks["jvm"]),
        "worker_peak_rss_mb": round(peaks["workers"]),
        "state_runs_s": [round(x, 2) for x in state_runs],
        "spark_live_files_runs_s": [round(x, 2) for x in spark_runs],
        "load": load_average(),
    }
    if state_s <= 1.5 * spark_s:
        return row, ""
    profile = cProfile.Profile()
    profile.enable()
    materialize(sink.state())
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(8)
    return row, f"{last_execution_profile(spark)}\n== the driver ==\n{text.getvalue()}"


_METRIC_WORDS = ("time", "duration", "rows", "size", "written", "memory", "build", "probes")


def last_execution_profile(spark: SparkSession) -> str:
    """The last SQL execution's final (adaptive) plan, its operators' metrics and its stages'
    times, from Spark's status stores (kept with the UI off)."""
    sql = spark._jsparkSession.sharedState().statusStore()  # type: ignore[union-attr]
    executions = sql.executionsList()
    execution = executions.apply(executions.size() - 1)
    values = sql.executionMetrics(execution.executionId())
    lines = [execution.physicalPlanDescription().split("\n\n")[0], "", "== operators =="]
    nodes = sql.planGraph(execution.executionId()).allNodes()
    for i in range(nodes.size()):
        node = nodes.apply(i)
        shown = []
        for j in range(node.metrics().size()):
            metric = node.metrics().apply(j)
            value = values.get(metric.accumulatorId())
            if not value.isDefined() or not any(w in metric.name() for w in _METRIC_WORDS):
                continue
            text = " ".join(str(value.get()).split())
            if text not in ("0", "0 ms", "0.0 B"):
                shown.append(f"{metric.name()}: {text}")
        lines.append(f"{node.id()} {node.name()}: {'; '.join(shown)}")
    lines.append("== stages (wall s, summed task run s, tasks) ==")
    ids = execution.stages().toSeq()
    wanted = {ids.apply(i) for i in range(ids.size())}
    jvm, gateway = spark.sparkContext._jvm, spark.sparkContext._gateway  # type: ignore[attr-defined]
    store = spark.sparkContext._jsc.sc().statusStore()  # type: ignore[union-attr]
    stages = store.stageList(
        jvm.java.util.ArrayList(),
        False,
        False,
        gateway.new_array(jvm.double, 0),
        jvm.java.util.ArrayList(),
    )
    for i in range(stages.size()):
        stage = stages.apply(i)
        if stage.stageId() not in wanted or not stage.completionTime().isDefined():
            continue
        wall = stage.completionTime().get().getTime() - stage.submissionTime().get().getTime()
        run = stage.executorRunTime() / 1000
        lines.append(
            f"stage {stage.stageId()}: {wall / 1000:.2f} s, {run:.2f} s, {stage.numTasks()}"
        )
    return "\n".join(lines)


def append(
    spark: SparkSession,
    work: str,
    *,
    per_batch: int,
    batches: int,
    value_bytes: int,
    kafka: bool = False,
) -> tuple[dict[str, Any], str]:
    """Median seconds a batch takes through the hook and as Spark's plain Parquet write.

    ``kafka``: the batch is shaped as Spark's Kafka source hands it over, with ``offset``
    (increasing per partition, as Kafka's) and each input file one Kafka partition;
    otherwise it has no offsets and the sink assigns them.
    """
    root = os.path.join(work, f"append-{per_batch}-{'kafka' if kafka else 'assigned'}")
    inputs = []
    for b in range(batches):
        path = os.path.join(root, "batches", f"{b}")
        total = per_batch * batches
        batch = records(
            spark, b * per_batch, per_batch, total=total, partitions=4, value_bytes=value_bytes
        )
        if kafka:
            batch = (
                # increasing within a batch, and every batch above the one before
                batch.withColumn("offset", F.monotonically_increasing_id() + b * 2**40)
                .repartitionByRange(4, "partition")
                .sortWithinPartitions("partition", "offset")
            )
        batch.write.parquet(path)
        inputs.append(path)
    sink = open_sink(os.path.join(root, "log"))
    profile = cProfile.Profile()
    sink_s, spark_s = [], []
    for b, path in enumerate(inputs):  # alternate, so a change of load weighs on both
        started = time.perf_counter()
        profile.enable()
        sink(spark.read.parquet(path), b)
        profile.disable()
        sink_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        spark.read.parquet(path).write.mode("append").parquet(os.path.join(root, "parquet"))
        spark_s.append(time.perf_counter() - started)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats("sinks/", 40)
    shutil.rmtree(root, ignore_errors=True)
    row = {
        "records_per_batch": per_batch,
        "input": "kafka" if kafka else "assigned offsets",
        "batches": batches,
        "sink_median_s": round(statistics.median(sink_s[1:]), 3),
        "spark_parquet_median_s": round(statistics.median(spark_s[1:]), 3),
        "sink_runs_s": [round(x, 3) for x in sink_s],
        "spark_parquet_runs_s": [round(x, 3) for x in spark_s],
    }
    row["ratio"] = round(row["sink_median_s"] / row["spark_parquet_median_s"], 2)
    print(json.dumps(row), flush=True)
    return row, f"== {per_batch} records a batch, {row['input']} ==\n{text.getvalue()}"


def plot(passes: list[dict[str, Any]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (eff, mem) = plt.subplots(1, 2, figsize=(11, 4))
    for p, vb in sorted({(r["partitions"], r["value_bytes"]) for r in passes}):
        rows = sorted(
            (r for r in passes if (r["partitions"], r["value_bytes"]) == (p, vb)),
            key=lambda r: r["records"],
        )
        xs = [r["records"] for r in rows]
        eff.plot(xs, [r["efficiency"] for r in rows], marker="o", label=f"{p} partitions, {vb} B")
        mem.plot(
            xs, [r["driver_peak_rss_mb"] for r in rows], marker="o", label=f"driver, {p}p {vb} B"
        )
        mem.plot(
            xs,
            [r["worker_peak_rss_mb"] for r in rows],
            marker="x",
            ls="--",
            label=f"worker, {p}p {vb} B",
        )
    eff.axhline(0.8, color="grey", ls=":", label="goal 0.8")
    eff.set(
        xscale="log", xlabel="records in the log", ylabel="floor / pass", title="pass efficiency"
    )
    mem.set(xscale="log", xlabel="records in the log", ylabel="peak RSS (MiB)", title="memory")
    eff.legend(fontsize=7)
    mem.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench")
    parser.add_argument("--work", default=None)
    parser.add_argument(
        "--sizes", default="1e6,3e6,1e7", help="records, comma-separated; none: no passes"
    )
    parser.add_argument("--partitions", default="4,16")
    parser.add_argument("--value-bytes", default="35")
    parser.add_argument("--append-batches", default="50000:8,1000000:4", help="size:count,...")
    parser.add_argument("--skip-append", action="store_true")
    parser.add_argument("--repeats", type=int, default=2, help="passes and floors, best counts")
    parser.add_argument(
        "--state-live",
        default=None,
        help="live keys (= records) for state() all dirty, all clean, clean + tail; 4 partitions",
    )
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="bench-scale-")
    os.makedirs(args.out, exist_ok=True)
    spark = bench_session()
    rss = PeakRss(spark)
    result: dict[str, Any] = {
        "machine": machine_description(),
        "passes": [],
        "append": [],
        "state": [],
    }
    out = os.path.join(args.out, "scale.json")
    previous = json.load(open(out)) if os.path.exists(out) else {}
    one_size(
        spark, work, total=100_000, partitions=4, value_bytes=35, rss=rss, repeats=1
    )  # warm-up
    for value_bytes in [int(v) for v in args.value_bytes.split(",")]:
        for total in [int(float(s)) for s in args.sizes.split(",") if s not in ("", "none")]:
            for partitions in [int(p) for p in args.partitions.split(",")]:
                result["passes"].append(
                    one_size(
                        spark,
                        work,
                        total=total,
                        partitions=partitions,
                        value_bytes=value_bytes,
                        rss=rss,
                        repeats=args.repeats,
                    )
                )
                _save(out, previous, result)
    if args.state_live:
        rows, profile = live_state(
            spark,
            work,
            live_keys=int(float(args.state_live)),
            partitions=4,
            value_bytes=35,
            rss=rss,
            repeats=args.repeats,
        )
        result["state"] += rows
        _save(out, previous, result)
        if profile:
            with open(os.path.join(args.out, "state_profile.txt"), "w") as f:
                f.write(profile)
    profiles = []
    if not args.skip_append:
        for spec in args.append_batches.split(","):
            per_batch, count = (int(float(x)) for x in spec.split(":"))
            for kafka in (True, False):
                row, profile = append(
                    spark, work, per_batch=per_batch, batches=count, value_bytes=35, kafka=kafka
                )
                result["append"].append(row)
                profiles.append(profile)
                _save(out, previous, result)
        with open(os.path.join(args.out, "append_profile.txt"), "w") as f:
            f.write("\n".join(profiles))
    merged = _save(out, previous, result)
    plot(merged["passes"], os.path.join(args.out, "scale.png"))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


def _save(path: str, previous: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Rows measured now replace rows of the same size from an earlier run; others stay."""

    def merge(name: str, key) -> list[dict[str, Any]]:
        fresh = {key(r): r for r in result[name]}
        kept = [r for r in previous.get(name, []) if key(r) not in fresh]
        return sorted([*kept, *fresh.values()], key=key)

    merged = {
        "machine": result["machine"],
        "passes": merge("passes", lambda r: (r["value_bytes"], r["partitions"], r["records"])),
        "append": merge(
            "append", lambda r: (r["records_per_batch"], r.get("input", "assigned offsets"))
        ),
        "state": merge("state", lambda r: (r["live_keys"], r["shape"], r["partitions"])),
        "split": result.get("split", previous.get("split", [])),
    }
    with open(path, "w") as f:
        json.dump(merged, f, indent=1)
    return merged


if __name__ == "__main__":
    main()
