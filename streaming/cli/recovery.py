"""``export`` and ``replay``: a log's state out to Avro files, and back into a new log.

Disaster recovery: ``export`` writes `state()` as Avro container files with a
manifest (delta-rs, pyarrow and fastavro: no Spark session); ``replay`` rebuilds a
state into a new log from an export or from another log (at a Delta version), with
``--batch-id`` as its exactly-once id.
Both verify on Arrow with ``--verify`` and exit 1 when the states differ.
"""

from __future__ import annotations

import argparse
import time

from sinks.errors import ConfigError
from streaming.cli.common import EXIT_FAILED, add_remote, as_of, err, out, session


def add_export(commands: argparse._SubParsersAction) -> None:
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


def add_replay(commands: argparse._SubParsersAction) -> None:
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
    add_remote(replay)
    replay.set_defaults(handler=_replay)


def _export(args: argparse.Namespace) -> int:
    """Export with delta-rs, pyarrow and fastavro: no Spark session (`sinks.read_state`)."""
    from sinks.log.storage import normalize_uri
    from sinks.reading.arrow_export import export_state_arrow, verify_export_arrow

    path = normalize_uri(args.log)
    report = export_state_arrow(
        path, args.to, codec=args.codec, as_of=as_of(args.as_of), progress=err
    )
    out(report.summary())
    if args.verify:
        started = time.monotonic()
        verification = verify_export_arrow(path, args.to)
        err(f"export: verified in {time.monotonic() - started:.1f} s")
        out(verification.summary())
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
    version = as_of(args.as_of)
    source_log = infer_log(source_path)
    if source_log is not None:
        keys = source_log.spec.key_columns
        name = f"{source_path} (state as of {args.as_of or 'now'})"
        LogTable(source_path).snapshot(version)  # time travel fails here, before Spark starts
    else:
        manifest = read_manifest(source_path)
        keys = tuple(manifest["key_columns"])
        name = f"export {source_path} ({manifest['keys']} keys, Delta v{manifest['log_version']})"
    if args.key_columns:
        keys = tuple(k.strip() for k in args.key_columns.split(","))
    if not args.append:
        _refuse_a_log_with_data(target_path)
    spark = session("compacted-sink-replay", args)
    if source_log is not None:
        source = source_log.sink().state(as_of=version)
    else:
        source = read_export(spark, source_path)
    target = CompactedStateSink(target_path, key_columns=keys)
    with spark_progress(spark, "replay", out=err):
        report = restore(source, target, source_name=name, batch_id=args.batch_id, progress=err)
    out(report.summary())
    if args.verify:
        return _verify_replay(source_path, version, source_log is not None, target_path)
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


def _verify_replay(source: str, version, from_log: bool, target: str) -> int:
    """Compare the new log's state with the source's, on Arrow (no Spark job)."""
    from collections import Counter

    from sinks import read_state
    from sinks.reading.arrow_export import canonical, read_export_records
    from sinks.reading.replay import read_manifest

    started = time.monotonic()
    restored = read_state(target)
    if from_log:
        source_state = read_state(source, as_of=version)
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
    err(f"replay: verified in {time.monotonic() - started:.1f} s")
    out(
        f"state of {target} {verdict} the source: {restored.num_rows} keys, "
        f"{missing} missing, {extra} unexpected"
    )
    return 0 if missing == extra == 0 else EXIT_FAILED
