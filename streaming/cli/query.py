"""``run`` and ``demo``: the sub-commands that start a streaming query and wait for it.

``run`` starts the query a job file describes (`streaming.runner.start`) and, when it
ends, closes each sink so its background cleaner finishes the pass in flight. ``demo``
streams keyed updates into a local lake on an embedded session; it refuses
``--remote``.
"""

from __future__ import annotations

import argparse
import logging

from sinks.errors import ConfigError
from streaming.cli.common import EXIT_FAILED, add_remote, err, out, remote_url, session


def add_run(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser("run", help="run the streaming job a TOML file describes")
    run.add_argument("job", help="job file (TOML)")
    add_remote(run)
    run.set_defaults(handler=_run)


def add_demo(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser("demo", help="stream keyed updates into a local compacted log")
    demo.add_argument(
        "--lake",
        default="lake-demo",
        help="lake directory: missing, empty, or an earlier demo's lake (wiped first); "
        "any other directory is refused",
    )
    demo.add_argument("--batches", type=int, default=30)
    demo.add_argument("--rows-per-batch", type=int, default=1_000)
    demo.add_argument("--keys", type=int, default=2_000)
    demo.add_argument("--partitions", type=int, default=4)
    demo.add_argument("--remote", help=argparse.SUPPRESS)  # refused: the demo is local
    demo.set_defaults(handler=_demo)


def _run(args: argparse.Namespace) -> int:
    from streaming.job import load_job
    from streaming.runner import start

    job = load_job(args.job)
    spark = session(f"compacted-sink-run-{job.file.stem}", args)
    for key, value in job.spark.items():
        spark.conf.set(key, value)
    from contextlib import nullcontext

    from sinks.spark_session import is_connect
    from streaming.progress import query_progress

    if not args.verbose:
        _quiet_query_failures(spark)
    query, sinks = start(spark, job, out=err)
    err(f"run: query {query.name} started ({len(sinks)} log(s)); {args.job}")
    # Under Spark Connect the hook prints in the server's foreachBatch worker; Spark's
    # progress of each micro-batch is printed here instead.
    follow = query_progress(query, out=err) if is_connect(spark) else nullcontext()
    with follow:
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
    for sink in sinks:
        sink.close()  # the background cleaner finishes its pass in flight
        out(f"{sink.path}: dirty ratio {sink.dirty_ratio():.2f}")
    return 0


def _quiet_query_failures(spark) -> None:
    """Leave a failed query's report to `main`'s one line: py4j and Spark's streaming
    engine each log the whole Python traceback and JVM stack (about 200 lines, the
    useful one repeated) when a foreachBatch function raises; ``--verbose`` keeps them."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    from sinks.spark_session import is_connect

    if is_connect(spark):
        return
    try:
        log4j = spark.sparkContext._jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming", log4j.Level.OFF
        )
    except Exception:  # noqa: BLE001 - another logging backend: its lines stay
        pass


def _demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from streaming.demo import DemoSettings, check_lake, run

    if remote_url(args):
        raise ConfigError(
            "demo runs on an embedded local Spark session and writes a local lake; it does "
            "not take --remote or SPARK_REMOTE (unset it). To run on a Spark Connect server, "
            "describe the query in a job file and use: compacted-sink run JOB.toml --remote URL"
        )

    check_lake(Path(args.lake))  # refuse someone else's directory before Spark starts
    settings = DemoSettings(
        lake=args.lake,
        batches=args.batches,
        rows_per_batch=args.rows_per_batch,
        keys=args.keys,
        partitions=args.partitions,
    )
    ok = run(session("compacted-sink-demo"), settings, out=out)
    return 0 if ok else EXIT_FAILED
