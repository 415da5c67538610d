"""``run`` and ``demo``: the sub-commands that start a streaming query and wait for it.

``run`` starts the query a job file describes (`streaming.jobs.runner.start`;
``--value-format`` sets every log's ``value_format``) and, when it ends, closes each sink so
its background cleaner finishes the pass in flight. Ctrl-C (SIGINT) stops the query in order
and exits 130 (128 + SIGINT, the shell's convention) with one line; a second Ctrl-C exits
at once. ``demo`` streams keyed updates into a local lake on an embedded session; it refuses
``--remote``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sinks.errors import ConfigError, QueryFailedError
from streaming.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    add_remote,
    err,
    out,
    python_cause,
    remote_url,
    session,
)


def add_run(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser("run", help="run the streaming job a TOML file describes")
    run.add_argument("job", help="job file (TOML)")
    run.add_argument(
        "--value-format",
        metavar="FORMAT",
        help="what the topic's values hold, for every log of the job: debezium-json "
        "(Debezium's change events); default: each log's [sink] value_format",
    )
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
    from streaming.jobs import InFlightHook, load_job, start

    job = load_job(args.job)
    if args.value_format is not None:
        job = with_value_format(job, args.value_format)
    spark = session(f"compacted-sink-run-{job.file.stem}", args)
    for key, value in job.spark.items():
        spark.conf.set(key, value)
    from contextlib import nullcontext

    from sinks.spark_session import is_connect
    from streaming.status import query_progress

    if not args.verbose:
        _quiet_query_failures(spark)
    tracked: list[InFlightHook] = []

    def track(hook):
        tracked.append(InFlightHook(hook))
        return tracked[-1]

    query, sinks = start(spark, job, out=err, wrap=track)
    err(f"run: query {query.name} started ({len(sinks)} log(s)); {args.job}")
    # Under Spark Connect the hook prints in the server's foreachBatch worker; Spark's
    # progress of each micro-batch is printed here instead.
    follow = query_progress(query, out=err) if is_connect(spark) else nullcontext()
    with follow, _interruptible() as interrupted:
        try:
            while not interrupted.is_set() and not query.awaitTermination(_WAIT_S):
                pass
        except Exception as e:  # a failed query: its root cause, in one line
            cause = root_cause(str(e))
            if cause is None:
                raise
            raise QueryFailedError(f"query {query.name} failed: {cause}") from e
        if interrupted.is_set():
            _stop_between_batches(query, tracked[0])
    for sink in sinks:
        sink.close()  # the background cleaner finishes its pass in flight
        out(f"{sink.path}: {_dirty(sink)}")
    if interrupted.is_set():
        err(f"run: interrupted (Ctrl-C); query {query.name} stopped between batches, sinks closed")
        return EXIT_INTERRUPTED
    return 0


def with_value_format(job, value_format: str):
    """``job`` with every log's ``value_format`` set to ``value_format`` (``run
    --value-format``, which wins over the job file's ``[sink] value_format``); a name not
    known is `ConfigError` naming the option. Pure."""
    from dataclasses import replace

    from sinks.produce import check_value_format

    try:
        check_value_format(value_format)
    except ConfigError as e:
        raise ConfigError(f"--value-format: {e}") from e
    return replace(job, logs=tuple(replace(log, value_format=value_format) for log in job.logs))


_BATCH_GRACE_S = 60.0  # how long a stop waits for the micro-batch in flight to end


def _stop_between_batches(query, hook) -> None:
    """Stop the query once no micro-batch is inside its hook (or after a grace period).

    ``stop()`` cancels the Spark jobs of a batch inside the sink's ``foreachBatch``
    call, and the failed call's long error overflows Spark's stack on stderr. So the
    hook refuses new batches (one short error, nothing written, the batch runs again
    on the next start), the batch in flight ends, and then the query stops.
    """
    hook.refuse_new()
    deadline = time.monotonic() + _BATCH_GRACE_S
    while hook.busy and query.isActive and time.monotonic() < deadline:
        time.sleep(0.01)
    query.stop()


def root_cause(text: str) -> str | None:
    """The innermost cause a Spark error's text names (``Caused by: …``), without its class;
    None when the failure is the sink's own (its message already says what), or names no
    cause. Pure.

    A source that cannot read its files fails the query with ~60 lines (a streaming
    error around a task failure around the reader's exception); the last ``Caused by``
    line holds what went wrong, e.g. ``file:/in/part-0.json is not a Parquet file``.
    A Python error (in the foreachBatch function or a Python worker) is named by its
    class and message (`python_cause`), never by py4j's "Return Message: Traceback".
    """
    from streaming.cli import _SINK_ERRORS

    if any(f"{name}: " in text for name in _SINK_ERRORS):
        return None
    python = python_cause(text)
    if python is not None:
        return python
    causes = [line.strip() for line in text.splitlines() if line.strip().startswith("Caused by: ")]
    if not causes:
        return None
    cause = causes[-1].removeprefix("Caused by: ")
    head, _, message = cause.partition(": ")
    if message and " " not in head:  # drop the exception's class name
        cause = message
    return cause


_WAIT_S = 1  # the main thread waits on the query in steps, so that Ctrl-C is seen between them


@contextmanager
def _interruptible() -> Iterator[threading.Event]:
    """Ctrl-C (SIGINT) sets the event instead of raising `KeyboardInterrupt`.

    pyspark's own handler cancels every job through the py4j connection the main thread
    is blocked on, and raises inside that call: py4j then logs its broken connection
    (three tracebacks) and the query is left half-stopped. Here the wait sees the event
    between two steps and stops the query in order. A second Ctrl-C exits at once
    (the log stays consistent: a killed append or pass is recovered on the next open).
    """
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted  # signal handlers belong to the main thread
        return

    def on_sigint(signum, frame) -> None:
        if interrupted.is_set():
            err(f"run: interrupted twice; exiting now (exit {EXIT_INTERRUPTED})")
            os._exit(EXIT_INTERRUPTED)
        interrupted.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def _dirty(sink) -> str:
    """The log's dirty ratio, or that no log exists yet (the query appended no batch)."""
    try:
        return f"dirty ratio {sink.dirty_ratio():.2f}"
    except FileNotFoundError:
        return "no log yet (no batch was appended)"


_FAILURE_LOGGERS = (
    "org.apache.spark.sql.execution.streaming",  # the query's failure, stack and all
    "org.apache.spark.executor.Executor",  # "Exception in task", with the reader's stack
    "org.apache.spark.scheduler.TaskSetManager",  # "Lost task", "aborting job"
)


def _quiet_query_failures(spark) -> None:
    """Leave a failed query's report to `main`'s one line: py4j and Spark's streaming
    engine each log the whole Python traceback and JVM stack (about 200 lines, the
    useful one repeated) when a foreachBatch function raises, and a task that fails to
    read the source logs its stack twice more; ``--verbose`` keeps them."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    from sinks.spark_session import is_connect

    if is_connect(spark):
        return
    try:
        log4j = spark.sparkContext._jvm.org.apache.logging.log4j
        for logger in _FAILURE_LOGGERS:
            log4j.core.config.Configurator.setLevel(logger, log4j.Level.OFF)
    except Exception:  # another logging backend: its lines stay
        pass


def _demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from streaming.jobs.demo import DemoSettings, check_lake, run

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
