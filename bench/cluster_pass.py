"""``python -m bench.cluster_pass``: one pass on a two-worker standalone cluster (issue #20).

Starts a standalone master and two workers on loopback (`bench.standalone_cluster`, the
cluster tests' harness; each worker 1 core), and a driver whose executors take 1 core
each, so the application holds two executors, one per worker. Through the public API it
builds a never-cleaned log (`bench.scale.build_log`: batches of 1,000,000 records, keys =
records / 2, 2 % tombstones, cleaning off), then, on a copy of it, opens a new sink and
runs one ``sink.clean(force=True)``. The application's monitoring REST API
(`bench.task_placement`) tells which executor ran each task of the pass's Spark jobs and
the workers tell which of them launched each executor: the run fails unless both
executors, on two different workers, ran tasks of the pass. Then the same pass on a
copy of the same log with ``local[2]``, for comparison, and for each Spark's I/O floor
(`bench.cleaner_bench.io_floor`: reading the same files, writing the kept fraction).

How many tasks a pass runs is Spark's ``defaultParallelism`` (`sinks.spark_session.
default_parallelism`): on a standalone cluster the cores of the executors registered
when the pass plans (at least 2), so the pass's partitions are packed into one task per
executor core (`sinks.cleaner.recopy_task.packed`).

Writes ``cluster_pass.json`` to ``--out`` and prints a summary. Every process it started
(daemons, executors, their Python workers) is ended on the way out, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from inspect import getsourcefile, getsourcelines
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import SparkSession

from bench.cleaner_bench import io_floor
from bench.measure import load_average, machine_description
from bench.scale import build_log, open_sink
from bench.standalone_cluster import StandaloneCluster, free_port
from bench.task_placement import (
    SparkRest,
    executor_workers,
    tasks_of_jobs,
    tasks_per_executor,
)
from sinks.cleaner.cleaner import Cleaner
from sinks.cleaner.recopy_task import PartitionToClean, packed
from streaming.jobs.session import local_session

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "1536m"
EXECUTOR_MEMORY = "1g"
EXECUTORS_TIMEOUT_S = 120
JOB_GROUP = "bench-cluster-pass"

SESSION_CONF = {  # as bench.session's, with the UI on: the REST API is served by it
    "spark.ui.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.compression.codec": "zstd",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.driver.memory": "2g",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.pyspark.python": sys.executable,
}


def in_recopy(stage_name: str) -> bool:
    """Whether a stage runs the pass's recopy: PySpark names a stage by its call site,
    ``<action> at <file>:<line>``, and the recopy's one action is in `Cleaner.recopy`."""
    lines, first = getsourcelines(Cleaner.recopy)
    where = f"{getsourcefile(Cleaner.recopy)}:"
    _, _, site = stage_name.rpartition(" at ")
    if not site.startswith(where) or not site[len(where) :].isdigit():
        return False
    return first <= int(site[len(where) :]) < first + len(lines)


def cluster_conf(cluster: StandaloneCluster) -> dict[str, str]:
    """One 1-core executor per worker; ``spark.default.parallelism`` left to Spark."""
    return {
        **SESSION_CONF,
        "spark.ui.port": str(free_port()),
        "spark.executor.cores": "1",
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.cores.max": str(WORKERS * WORKER_CORES),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{EXECUTORS_TIMEOUT_S}s",
        # The executors' Python workers import this checkout's packages, as the driver does.
        "spark.executorEnv.PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }


def wait_for_executors(rest: SparkRest, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + EXECUTORS_TIMEOUT_S
    while True:
        active = [e for e in rest.executors() if e["id"] != "driver" and e["isActive"]]
        if len(active) >= count:
            return active
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(active)} of {count} executors registered")
        time.sleep(0.5)


def where_python_runs(spark: SparkSession, slices: int) -> list[dict[str, Any]]:
    """Each Python worker of a small job: pid, working directory, where it imports sinks from."""
    import pyarrow as pa

    def probe(batches):  # runs in an executor's Python worker
        import sinks

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist(
            [{"pid": os.getpid(), "cwd": os.getcwd(), "sinks": os.path.dirname(sinks.__file__)}]
        )

    rows = spark.range(0, slices, 1, slices).mapInArrow(probe, "pid long, cwd string, sinks string")
    return sorted((r.asDict() for r in rows.collect()), key=lambda r: r["pid"])


def one_pass(
    spark: SparkSession,
    rest: SparkRest,
    source: str,
    work: str,
    run: str,
    workers: dict[str, dict[str, Any]] | None,
) -> dict[str, Any]:
    """``sink.clean(force=True)`` from a new sink over a copy of ``source``, its tasks placed."""
    copy = os.path.join(work, run, "log")
    shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
    shutil.copytree(source, copy)
    sink = open_sink(copy)
    started = time.perf_counter()
    sink.recover()  # what opening the log costs, once per sink object: not the pass's
    recover_s = time.perf_counter() - started
    segments = sink.log_table.snapshot().all_segments()
    inputs = [os.path.join(copy, s.path) for s in segments]
    sc = spark.sparkContext
    slots = sc.defaultParallelism
    bins = expected_bins(segments, slots)
    before = rest.last_job_id()
    sc.setJobGroup(JOB_GROUP, f"{run}: sink.clean(force=True)", interruptOnCancel=False)
    try:
        started = time.perf_counter()
        stats = sink.clean(force=True)
        pass_s = time.perf_counter() - started
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    assert stats is not None, "the log had nothing to clean"
    assert not stats.work_left, "the dedupe buffer cut the pass short: not one pass"
    jobs = rest.jobs_after(before)
    tasks = tasks_of_jobs(rest, [j["jobId"] for j in jobs])
    recopy = [t for t in tasks if in_recopy(t["stage_name"])]
    for t in recopy:  # the recopy stage's task i cleans bin i (one bin a Spark partition)
        t["partitions"] = bins[t["index"]] if t["index"] < len(bins) else None
    records_written = sum(s.num_records for s in sink.log_table.snapshot().all_segments())
    keep = records_written / stats.records_read
    floor_s = io_floor(spark, inputs, keep, os.path.join(work, run, "floor"))
    shutil.rmtree(os.path.join(work, run), ignore_errors=True)
    row: dict[str, Any] = {
        "run": run,
        "pass_s": round(pass_s, 2),
        "cleaner_clean_s": round(stats.duration_ms / 1000, 2),  # Cleaner.clean alone
        "recover_s": round(recover_s, 2),
        "floor_s": round(floor_s, 2),
        "efficiency": round(floor_s / pass_s, 3),
        "records_read": stats.records_read,
        "records_written": stats.records_written,
        "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written,
        "segments_read": stats.segments_read,
        "segments_written": stats.segments_written,
        "partitions": stats.partitions,
        "default_parallelism": slots,
        "bins": bins,
        "jobs": [
            {
                "job_id": j["jobId"],
                "name": j["name"],
                "job_group": j.get("jobGroup"),
                "status": j["status"],
                "stage_ids": j["stageIds"],
                "num_tasks": j["numTasks"],
            }
            for j in jobs
        ],
        "recopy_stage_ids": sorted({t["stage_id"] for t in recopy}),
        "recopy_tasks": len(recopy),
        "tasks_per_executor": tasks_per_executor(tasks),
        "recopy_tasks_per_executor": tasks_per_executor(recopy),
        "tasks": tasks,
        "load": load_average(),
    }
    if workers is not None:
        row["tasks_per_worker"] = _per_worker(tasks, workers)
        row["recopy_tasks_per_worker"] = _per_worker(recopy, workers)
    print(json.dumps({k: v for k, v in row.items() if k not in ("tasks", "jobs")}), flush=True)
    return row


def expected_bins(segments: list[Any], slots: int) -> list[list[int]]:
    """The partitions each of the pass's tasks cleans, as the planner packs them: the
    library's `packed` over each partition's bytes (a forced pass over a never-cleaned log
    recopies every file), ``slots`` being ``defaultParallelism``."""
    sizes = Counter()
    for s in segments:
        sizes[s.partition] += s.size_bytes
    tasks = [PartitionToClean(p, (), (), size) for p, size in sorted(sizes.items())]
    return [sorted(tasks[i].partition for i in b) for b in packed(tasks, slots)]


def _per_worker(tasks: list[dict[str, Any]], workers: dict[str, dict[str, Any]]) -> dict:
    counts = Counter(workers[t["executor_id"]]["worker_id"] for t in tasks)
    return dict(sorted(counts.items()))


def on_both_workers(row: dict[str, Any], workers: dict[str, dict[str, Any]]) -> str | None:
    """None when both executors, on two different workers, ran tasks of the pass's recopy
    stage; else what is wrong."""
    if row["recopy_tasks"] == 0:
        return f"{row['run']}: no recopy stage among the pass's jobs: {row['jobs']}"
    executors = set(row["recopy_tasks_per_executor"])
    if executors != set(workers):
        return (
            f"{row['run']}: recopy tasks ran on executors {sorted(executors)}, "
            f"the application had {sorted(workers)}"
        )
    if len({workers[e]["worker_id"] for e in executors}) != WORKERS:
        return f"{row['run']}: the executors were not on {WORKERS} workers: {workers}"
    return None


def versions(spark: SparkSession) -> dict[str, str]:
    import deltalake
    import numpy
    import pyarrow

    jvm = spark.sparkContext._jvm
    return {
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "spark": spark.version,
        "pyarrow": pyarrow.__version__,
        "deltalake": deltalake.__version__,
        "numpy": numpy.__version__,
        "java": str(jvm.java.lang.System.getProperty("java.vm.name"))  # type: ignore[union-attr]
        + " "
        + str(jvm.java.lang.System.getProperty("java.runtime.version")),  # type: ignore[union-attr]
    }


def git_commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def on_cluster(
    cluster: StandaloneCluster, work: str, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, str], str]:
    """Build the log on the cluster and run the passes there; the figures, versions, log."""
    started = time.perf_counter()
    spark = local_session("bench-cluster-pass", cluster.url, conf=cluster_conf(cluster))
    try:
        session_s = time.perf_counter() - started
        sc = spark.sparkContext
        rest = SparkRest(sc.uiWebUrl, sc.applicationId)
        wait_for_executors(rest, WORKERS * WORKER_CORES)
        workers = executor_workers(rest, cluster.started)
        assert len(workers) == WORKERS, workers
        python_workers = where_python_runs(spark, WORKERS)
        source = os.path.join(work, "source", "log")
        started = time.perf_counter()
        build_log(
            spark,
            source,
            total=args.records,
            partitions=args.partitions,
            value_bytes=args.value_bytes,
        )
        build_s = time.perf_counter() - started
        passes = []
        for i in range(args.repeats):
            row = one_pass(spark, rest, source, work, f"cluster-{i}", workers)
            row["not_on_both_workers"] = on_both_workers(row, workers)
            passes.append(row)
        figures = {
            "master": cluster.url,
            "app_id": sc.applicationId,
            "ui": sc.uiWebUrl,
            "session_start_s": round(session_s, 1),
            "build_s": round(build_s, 1),
            "executors": workers,
            "python_workers": python_workers,
            "passes": passes,
        }
        return figures, versions(spark), source
    finally:
        _stop(spark)


def _stop(spark: SparkSession) -> None:
    try:
        spark.stop()
    except Exception as e:  # py4j broken by an interrupt: `stop_driver_jvm` ends the JVM
        print(f"spark.stop() failed: {e!r}", file=sys.stderr)


def on_local(source: str, work: str, repeats: int) -> dict[str, Any]:
    conf = {**SESSION_CONF, "spark.ui.port": str(free_port())}
    started = time.perf_counter()
    spark = local_session("bench-cluster-pass-local", "local[2]", conf=conf)
    try:
        session_s = time.perf_counter() - started
        rest = SparkRest(spark.sparkContext.uiWebUrl, spark.sparkContext.applicationId)
        # The cluster's Python workers are warm from building the log: start these too.
        python_workers = where_python_runs(spark, 2)
        passes = [one_pass(spark, rest, source, work, f"local-{i}", None) for i in range(repeats)]
        return {
            "master": "local[2]",
            "session_start_s": round(session_s, 1),
            "python_workers": python_workers,
            "passes": passes,
        }
    finally:
        _stop(spark)


def summary(result: dict[str, Any]) -> str:
    cluster, local = result["cluster"], result.get("local")
    best = min(cluster["passes"], key=lambda r: r["pass_s"])
    lines = [
        f"{result['records']:,} records, {result['partitions']} partitions, "
        f"{result['value_bytes']} B values; {WORKERS} workers x {WORKER_CORES} core",
        "executors: "
        + ", ".join(
            f"{e} on worker {w['worker_index']} ({w['worker_id']})"
            for e, w in cluster["executors"].items()
        ),
    ]
    for r in cluster["passes"]:
        lines.append(
            f"cluster {r['run']}: pass {r['pass_s']} s (floor {r['floor_s']} s), "
            f"{r['recopy_tasks']} recopy tasks (defaultParallelism {r['default_parallelism']}), "
            f"recopy tasks per executor {r['recopy_tasks_per_executor']}, "
            f"all of the pass's tasks per executor {r['tasks_per_executor']}"
        )
        for t in sorted(r["tasks"], key=lambda t: (t["stage_id"], t["index"])):
            worker = cluster["executors"][t["executor_id"]]
            lines.append(
                f"  stage {t['stage_id']} task {t['index']}: executor {t['executor_id']} on "
                f"worker {worker['worker_index']}, partitions {t.get('partitions')}, "
                f"{t['duration_ms']} ms"
            )
    for r in local["passes"] if local else []:
        lines.append(
            f"local[2] {r['run']}: pass {r['pass_s']} s (floor {r['floor_s']} s), "
            f"{r['recopy_tasks']} recopy tasks"
        )
    lines.append(
        f"best cluster pass {best['pass_s']} s"
        + (f", best local[2] pass {min(r['pass_s'] for r in local['passes'])} s" if local else "")
    )
    return "\n".join(lines)


def stop_driver_jvm(timeout_s: float = 15) -> list[int]:
    """End the driver's JVM (pyspark's gateway) now rather than after this process exits:
    it exits when its stdin closes. Returns its pid if it is still alive."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return []
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return [proc.pid]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench")
    parser.add_argument("--records", type=lambda s: int(float(s)), default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=35)
    parser.add_argument("--repeats", type=int, default=2, help="passes on each, best counts")
    parser.add_argument("--skip-local", action="store_true", help="no local[2] comparison")
    parser.add_argument("--work", default=None, help="kept when given")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the cluster's processes are ended on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = args.work or tempfile.mkdtemp(prefix="bench-cluster-")
    os.makedirs(args.out, exist_ok=True)
    cluster = StandaloneCluster(
        Path(work) / "cluster",
        workers=WORKERS,
        worker_cores=WORKER_CORES,
        worker_memory=WORKER_MEMORY,
    )
    result: dict[str, Any] = {
        "machine": machine_description(),
        "commit": git_commit(),
        "load_start": load_average(),
        "records": args.records,
        "partitions": args.partitions,
        "value_bytes": args.value_bytes,
        "topology": {
            "workers": WORKERS,
            "worker_cores": WORKER_CORES,
            "worker_memory": WORKER_MEMORY,
            "executor_cores": 1,
            "executor_memory": EXECUTOR_MEMORY,
            "driver_memory": SESSION_CONF["spark.driver.memory"],
        },
    }
    survivors: list[int] = []
    try:
        started = time.perf_counter()
        cluster.start()
        result["cluster_start_s"] = round(time.perf_counter() - started, 1)
        result["cluster"], result["versions"], source = on_cluster(cluster, work, args)
        survivors = cluster.stop()
        if not args.skip_local:
            result["local"] = on_local(source, work, args.repeats)
    finally:
        survivors += cluster.stop()
        survivors += stop_driver_jvm()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    result["load_end"] = load_average()
    with open(os.path.join(args.out, "cluster_pass.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(summary(result))
    assert not survivors, f"processes still alive: {survivors}"
    problems = [r["not_on_both_workers"] for r in result["cluster"]["passes"]]
    assert not any(problems), problems
    return 0


if __name__ == "__main__":
    sys.exit(main())
