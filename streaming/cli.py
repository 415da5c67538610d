"""The console entry point ``compacted-sink``: jobs, the cleaner loop, status, export, replay, demo.

Usable as a Databricks python-wheel task (entry point ``compacted-sink``, the
subcommand and its options as parameters): inside a cluster the active
SparkSession is used; with ``--remote sc://…`` (or ``SPARK_REMOTE``) a Spark
Connect session (Databricks Connect too); elsewhere a local one is started. Results go to stdout,
progress lines to stderr. Exit codes: 0 done, 1 failed (or a verification did
not match), 2 bad configuration (the message names the key and the file). A
failing command prints one line, ``compacted-sink <command>: <what went wrong>``;
``--verbose`` adds the traceback.

Commands that only read Delta metadata or the state (``status``, ``export``,
``clean --once`` when nothing is cleanable) start no Spark session: they use
delta-rs and pyarrow (`sinks.read_state`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from collections.abc import Sequence

from sinks.errors import CompactedSinkError, ConfigError

EXIT_FAILED = 1
EXIT_CONFIG = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return EXIT_FAILED
    except Exception as e:  # noqa: BLE001 - every failure ends as one line (and an exit code)
        print(f"compacted-sink {args.command}: {failure_message(e)}", file=sys.stderr)
        if args.verbose:
            traceback.print_exc()
        return EXIT_CONFIG if isinstance(e, ConfigError) else EXIT_FAILED


def failure_message(error: BaseException) -> str:
    """One line for ``error``: the sink's own message, or the first line of anything else.

    Spark's errors carry their logical plan and JVM stack after the first line;
    an error a Spark job raised from this package's code is reported by that
    error's own message (the class name and text Spark quotes in its first lines).
    """
    if isinstance(error, ConfigError):
        return f"configuration error: {error}"
    if isinstance(error, CompactedSinkError):
        return f"{type(error).__name__}: {error}"
    text = str(error).strip()
    for line in text.splitlines():
        for name in _SINK_ERRORS:
            marker = f"{name}: "
            if marker in line:
                return f"{name}: {line.split(marker, 1)[1].strip()}"
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _sink_error_names() -> tuple[str, ...]:
    import sinks

    return tuple(
        name
        for name in sinks.__all__
        if isinstance(getattr(sinks, name), type)
        and issubclass(getattr(sinks, name), CompactedSinkError)
    )


_SINK_ERRORS = _sink_error_names()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compacted-sink",
        description="Run, clean, inspect, export and replay compacted logs.",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print the traceback of a failure too"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the streaming job a TOML file describes")
    run.add_argument("job", help="job file (TOML)")
    _remote(run)
    run.set_defaults(handler=_run)

    clean = commands.add_parser(
        "clean", help="clean the filthiest logs, then back off (Kafka's CleanerThread)"
    )
    _log_selection(clean)
    clean.add_argument("--once", action="store_true", help="clean each cleanable log once, exit")
    clean.add_argument("--force", action="store_true", help="clean any cleanable bytes")
    clean.add_argument(
        "--vacuum", action="store_true", help="delete expired files now, not only when due"
    )
    clean.add_argument(
        "--backoff-ms",
        type=int,
        default=None,
        help="log.cleaner.backoff.ms (default: each log's, 15000)",
    )
    _remote(clean)
    clean.set_defaults(handler=_clean)

    vacuum = commands.add_parser(
        "vacuum", help="delete files out of the log longer than file.delete.delay.ms, now"
    )
    _log_selection(vacuum)
    vacuum.set_defaults(handler=_vacuum)

    accept = commands.add_parser(
        "accept", help="accept another engine's change to a log's records, and go on"
    )
    accept.add_argument("log", help="the log's path")
    accept.add_argument(
        "--through-version", type=int, help="the last version to accept (default: the current)"
    )
    accept.set_defaults(handler=_accept)

    restore = commands.add_parser(
        "restore", help="restore a log to a Delta version, undoing every later commit"
    )
    restore.add_argument("log", help="the log's path")
    restore.add_argument("--to-version", type=int, required=True, help="the version to restore")
    restore.set_defaults(handler=_restore)

    consumers = commands.add_parser(
        "consumers", help="a log's registered consumers: lag, tombstones held; reset, delete"
    )
    consumers.add_argument("log", help="the log's path")
    consumers.add_argument("--checkpoint-table", help="default: beside the log")
    consumers.add_argument("--consumer", metavar="ID", help="the consumer to reset or delete")
    what = consumers.add_mutually_exclusive_group()
    what.add_argument("--reset", metavar="OFFSETS", help="earliest, latest, or JSON per partition")
    what.add_argument("--delete", action="store_true", help="unregister the consumer")
    consumers.set_defaults(handler=_consumers)

    status = commands.add_parser("status", help="cleaner gauges per log and partition")
    _log_selection(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--plot", metavar="FILE.png", help="draw dirty ratio and size over time")
    _remote(status)
    status.set_defaults(handler=_status)

    export = commands.add_parser("export", help="export a log's state to Avro container files")
    export.add_argument("log", help="the log's path")
    export.add_argument("--to", required=True, help="output directory (must hold no export)")
    export.add_argument("--codec", default="deflate", help="Avro codec (default deflate)")
    export.add_argument("--as-of", help="a Delta version or timestamp (default: now)")
    export.add_argument("--verify", action="store_true", help="compare the export with state()")
    export.add_argument(
        "--config", help=argparse.SUPPRESS
    )  # accepted as before; the log records its key columns
    export.set_defaults(handler=_export)

    replay = commands.add_parser(
        "replay", help="rebuild a log's state into a new log, from an export or another log"
    )
    replay.add_argument("source", help="an export directory, or a log path")
    replay.add_argument("--to", required=True, help="the new log's path")
    replay.add_argument("--as-of", help="read a source log at this Delta version or timestamp")
    replay.add_argument("--key-columns", help="comma-separated (default: from the source)")
    replay.add_argument("--batch-id", type=int, default=0, help="exactly-once id (default 0)")
    replay.add_argument(
        "--verify", action="store_true", help="compare the new state with the source"
    )
    replay.add_argument(
        "--append",
        action="store_true",
        help="append to a --to log that already holds records (refused otherwise)",
    )
    _remote(replay)
    replay.set_defaults(handler=_replay)

    demo = commands.add_parser("demo", help="stream keyed updates into a local compacted log")
    demo.add_argument("--lake", default="lake-demo", help="lake directory (wiped first)")
    demo.add_argument("--batches", type=int, default=30)
    demo.add_argument("--rows-per-batch", type=int, default=1_000)
    demo.add_argument("--keys", type=int, default=2_000)
    demo.add_argument("--partitions", type=int, default=4)
    demo.add_argument("--remote", help=argparse.SUPPRESS)  # refused: the demo is local
    demo.set_defaults(handler=_demo)
    return parser


def _log_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="*", help="log paths")
    parser.add_argument(
        "--config", action="append", default=[], help="job file(s) naming logs and their settings"
    )
    parser.add_argument(
        "--checkpoint-table",
        action="append",
        default=[],
        help="every log registered in this cleaner-offset checkpoint table",
    )


def _remote(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--remote",
        metavar="URL",
        help="a Spark Connect server, sc://host:port (Databricks Connect: "
        "sc://<workspace>:443/;token=…;x-databricks-cluster-id=…); default: $SPARK_REMOTE",
    )


def _remote_url(args: argparse.Namespace) -> str | None:
    import os

    from streaming.session import REMOTE_ENV

    return getattr(args, "remote", None) or os.environ.get(REMOTE_ENV) or None


def _session(app: str, args: argparse.Namespace | None = None):
    """A Spark Connect session (--remote, SPARK_REMOTE); else the active one; else local."""
    url = _remote_url(args) if args is not None else None
    if url:
        from streaming.session import remote_session

        try:
            return remote_session(url, app)
        except (ImportError, ValueError) as e:
            raise ConfigError(f"--remote {url}: {e}") from e
    from sinks.spark_session import active_session

    try:
        return active_session()
    except RuntimeError:
        pass
    from streaming.session import local_session

    return local_session(app)


def _out(line: str) -> None:
    print(line, flush=True)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    from streaming.job import load_job
    from streaming.runner import start

    job = load_job(args.job)
    spark = _session(f"compacted-sink-run-{job.file.stem}", args)
    for key, value in job.spark.items():
        spark.conf.set(key, value)
    from contextlib import nullcontext

    from sinks.spark_session import is_connect
    from streaming.progress import query_progress

    if not args.verbose:
        _quiet_query_failures(spark)
    query, sinks = start(spark, job, out=_err)
    _err(f"run: query {query.name} started ({len(sinks)} log(s)); {args.job}")
    # Under Spark Connect the hook prints in the server's foreachBatch worker; Spark's
    # progress of each micro-batch is printed here instead.
    follow = query_progress(query, out=_err) if is_connect(spark) else nullcontext()
    with follow:
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
    for sink in sinks:
        sink.close()  # the background cleaner finishes its pass in flight
        _out(f"{sink.path}: dirty ratio {sink.dirty_ratio():.2f}")
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


def _refs(args: argparse.Namespace):
    from streaming.registry import discover_logs

    return discover_logs(
        paths=args.logs, job_files=args.config, checkpoint_tables=args.checkpoint_table
    )


def _clean(args: argparse.Namespace) -> int:
    from streaming.cleaner_thread import CleanerThread

    refs = _refs(args)
    for ref in refs:
        if ref.inferred:
            _err(
                f"clean: {ref.spec.path}: no job file given; key columns "
                f"{list(ref.spec.key_columns)} as the log records them, default cleaner settings"
            )
    thread = CleanerThread(
        refs, force=args.force, vacuum=args.vacuum, backoff_ms=args.backoff_ms, out=_out
    )
    if args.once and thread.grab_filthiest() is None:
        # Measuring needs Delta metadata only: no Spark session for a round with no pass.
        thread.delete_expired_files()
        for line in thread.idle_reasons():
            _out(line)
        return 0
    _session("compacted-sink-clean", args)
    if args.once:
        thread.run_once()
        return 0
    _err(f"clean: cleaning {len(refs)} log(s); backing off {thread.backoff_ms} ms when idle")
    try:
        thread.run()
    except KeyboardInterrupt:
        pass
    return 0


def _vacuum(args: argparse.Namespace) -> int:
    """Delete every expired file of each log and its checkpoint table, bounded call by call."""
    for ref in _refs(args):
        sink = ref.sink()
        if sink.log_table.snapshot() is None:
            continue
        while True:
            report = sink.vacuum()
            _out(report.summary())
            if not report.left_for_next_call:
                break
    return 0


def _accept(args: argparse.Namespace) -> int:
    """Accept the log's records as another engine left them (`accept_foreign_changes`)."""
    from sinks import CompactedStateSink

    version = CompactedStateSink(args.log).accept_foreign_changes(args.through_version)
    _out(f"accept: {args.log}: commits through version {version} accepted as they are")
    return 0


def _restore(args: argparse.Namespace) -> int:
    """Bring the log back to ``--to-version`` (`CompactedStateSink.restore`)."""
    from sinks import CompactedStateSink

    version = CompactedStateSink(args.log).restore(args.to_version)
    _out(
        f"restore: {args.log}: back at version {args.to_version}'s records (now version {version})"
    )
    return 0


def _consumers(args: argparse.Namespace) -> int:
    """List a log's registered consumers, or reset or delete one (Kafka's consumer-groups)."""
    from streaming.consumers import consumer_report, delete_consumer, reset_offsets

    if (args.reset or args.delete) and not args.consumer:
        raise ConfigError("--reset and --delete need --consumer ID")
    if args.delete:
        deleted = delete_consumer(args.log, args.consumer, args.checkpoint_table)
        _out(f"consumers: {args.consumer} deleted ({deleted} row(s)); it holds nothing now")
    elif args.reset:
        positions = reset_offsets(args.log, args.consumer, args.reset, args.checkpoint_table)
        _out(f"consumers: {args.consumer} reset to {positions}")
    else:
        report = consumer_report(args.log, args.checkpoint_table)
        for consumer in report:
            _out(consumer.line())
        if not report:
            _out(f"consumers: no registered consumer reads {args.log}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from streaming.status import history, log_status, plot_history, render_json, render_table

    refs = _refs(args)
    statuses = []
    for ref in refs:
        status = log_status(ref.sink(), settings_inferred=ref.inferred)
        if status is not None:
            statuses.append(status)
    _out(render_json(statuses) if args.json else render_table(statuses))
    if args.plot:
        series = {ref.spec.path: history(ref.sink()) for ref in refs}
        ratios = {ref.spec.config.min_cleanable_dirty_ratio for ref in refs}
        plot_history(series, args.plot, threshold=ratios.pop() if len(ratios) == 1 else None)
        _err(f"status: plot written to {args.plot}")
    return 0


def _as_of(text: str | None):
    if text is None:
        return None
    return int(text) if text.isdigit() else text


def _export(args: argparse.Namespace) -> int:
    """Export with delta-rs, pyarrow and fastavro: no Spark session (`sinks.read_state`)."""
    from sinks.log.storage import normalize_uri
    from sinks.reading.arrow_export import export_state_arrow, verify_export_arrow

    path = normalize_uri(args.log)
    report = export_state_arrow(
        path, args.to, codec=args.codec, as_of=_as_of(args.as_of), progress=_err
    )
    _out(report.summary())
    if args.verify:
        started = time.monotonic()
        verification = verify_export_arrow(path, args.to)
        _err(f"export: verified in {time.monotonic() - started:.1f} s")
        _out(verification.summary())
        return 0 if verification.ok else EXIT_FAILED
    return 0


def _replay(args: argparse.Namespace) -> int:
    from sinks import CompactedStateSink
    from sinks.log.log_table import LogTable
    from sinks.log.storage import normalize_uri
    from sinks.reading.replay import read_export, read_manifest, restore
    from streaming.progress import spark_progress
    from streaming.registry import infer_log

    source_path = normalize_uri(args.source)
    target_path = normalize_uri(args.to)
    as_of = _as_of(args.as_of)
    source_log = infer_log(source_path)
    if source_log is not None:
        keys = source_log.spec.key_columns
        name = f"{source_path} (state as of {args.as_of or 'now'})"
        LogTable(source_path).snapshot(as_of)  # time travel fails here, before Spark starts
    else:
        manifest = read_manifest(source_path)
        keys = tuple(manifest["key_columns"])
        name = f"export {source_path} ({manifest['keys']} keys, Delta v{manifest['log_version']})"
    if args.key_columns:
        keys = tuple(k.strip() for k in args.key_columns.split(","))
    if not args.append:
        _refuse_a_log_with_data(target_path)
    spark = _session("compacted-sink-replay", args)
    if source_log is not None:
        source = source_log.sink().state(as_of=as_of)
    else:
        source = read_export(spark, source_path)
    target = CompactedStateSink(target_path, key_columns=keys)
    with spark_progress(spark, "replay", out=_err):
        report = restore(source, target, source_name=name, batch_id=args.batch_id, progress=_err)
    _out(report.summary())
    if args.verify:
        return _verify_replay(source_path, as_of, source_log is not None, target_path)
    return 0


def _refuse_a_log_with_data(path: str) -> None:
    """Raise `ConfigError` when the log at ``path`` holds records (replay would mix states)."""
    from sinks.log.log_table import LogTable

    snapshot = LogTable(path).snapshot()
    if snapshot is None:
        return
    records = sum(s.num_records for s in snapshot.all_segments())
    ends = snapshot.log_end_offsets()
    if records or any(ends.values()):
        raise ConfigError(
            f"--to {path} already holds a log ({records} records in {len(ends)} partition(s), "
            f"Delta v{snapshot.version}); replaying into it would mix two states, and a batch "
            "id it has committed would be skipped. Choose a new --to, or pass --append to "
            "append the state to it"
        )


def _verify_replay(source: str, as_of, from_log: bool, target: str) -> int:
    """Compare the new log's state with the source's, on Arrow (no Spark job)."""
    from collections import Counter

    from sinks import read_state
    from sinks.reading.arrow_export import canonical, read_export_records
    from sinks.reading.replay import read_manifest

    started = time.monotonic()
    restored = read_state(target)
    if from_log:
        source_state = read_state(source, as_of=as_of)
        columns = [c for c in source_state.schema.names if c in restored.schema.names]
        records = source_state.select(columns).to_pylist()
    else:
        columns = [f["name"] for f in read_manifest(source)["spark_schema"]["fields"]]
        records = read_export_records(source)
    expected = Counter(canonical(r) for r in records)
    got = Counter(canonical(r) for r in restored.select(columns).to_pylist())
    missing = sum((expected - got).values())
    extra = sum((got - expected).values())
    verdict = "matches" if missing == extra == 0 else "DOES NOT match"
    _err(f"replay: verified in {time.monotonic() - started:.1f} s")
    _out(
        f"state of {target} {verdict} the source: {restored.num_rows} keys, "
        f"{missing} missing, {extra} unexpected"
    )
    return 0 if missing == extra == 0 else EXIT_FAILED


def _demo(args: argparse.Namespace) -> int:
    from streaming.demo import DemoSettings, run

    if _remote_url(args):
        raise ConfigError(
            "demo runs on an embedded local Spark session and writes a local lake; it does "
            "not take --remote or SPARK_REMOTE (unset it). To run on a Spark Connect server, "
            "describe the query in a job file and use: compacted-sink run JOB.toml --remote URL"
        )

    settings = DemoSettings(
        lake=args.lake,
        batches=args.batches,
        rows_per_batch=args.rows_per_batch,
        keys=args.keys,
        partitions=args.partitions,
    )
    ok = run(_session("compacted-sink-demo"), settings, out=_out)
    return 0 if ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
