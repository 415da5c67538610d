"""``export`` and ``replay``: a log out to Avro files, and back into a new log, as it was.

Disaster recovery (`sinks.reading.export`, `sinks.reading.replay`): ``export`` writes
each (partition, key)'s latest record, every column, tombstones included, as Avro
container files with a manifest that carries the log's config and offsets (delta-rs,
pyarrow and fastavro: no Spark session); ``replay`` restores an export, or another log
at a Delta version, into a new log at the same partitions and offsets, with
``--batch-id`` as its exactly-once id. ``--lossy-new-offsets`` is the old, lossy replay
(one partition, new offsets), only by that name. Both verify on Arrow with ``--verify``,
name the first differences, and exit 1 when anything differs.
"""

from __future__ import annotations

import argparse
import time

from sinks.errors import ConfigError
from streaming.cli.common import EXIT_FAILED, add_remote, as_of, err, out, session


def add_export(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export",
        help="export a log's latest records (every column, partitions, offsets, config) to "
        "Avro container files",
    )
    export.add_argument("log", help="the log's path")
    export.add_argument("--to", required=True, help="output directory (must hold no export)")
    export.add_argument("--codec", default="deflate", help="Avro codec (default deflate)")
    export.add_argument("--as-of", help="a Delta version or timestamp (default: now)")
    export.add_argument(
        "--verify", action="store_true", help="compare the export with the log, every column"
    )
    export.add_argument(
        "--config", help=argparse.SUPPRESS
    )  # accepted as before; the log records its key columns
    export.set_defaults(handler=_export)


def add_replay(commands: argparse._SubParsersAction) -> None:
    replay = commands.add_parser(
        "replay",
        help="restore a log into a new log, from an export or another log, at the same "
        "partitions and offsets",
    )
    replay.add_argument("source", help="an export directory, or a log path")
    replay.add_argument("--to", required=True, help="the new log's path (must hold no records)")
    replay.add_argument("--as-of", help="read a source log at this Delta version or timestamp")
    replay.add_argument("--batch-id", type=int, default=0, help="exactly-once id (default 0)")
    replay.add_argument(
        "--verify",
        action="store_true",
        help="compare the new log with the source: records, every column, config, offsets",
    )
    replay.add_argument(
        "--lossy-new-offsets",
        action="store_true",
        help="LOSSY: append the live records into partition 0 with new offsets (tombstones, "
        "partitions and offsets not kept; consumers' offsets lose their meaning)",
    )
    replay.add_argument(
        "--append",
        action="store_true",
        help="with --lossy-new-offsets: append to a --to log that already holds records",
    )
    replay.add_argument(
        "--key-columns",
        help="with --lossy-new-offsets: comma-separated key columns (default: the source's)",
    )
    add_remote(replay)
    replay.set_defaults(handler=_replay)


def _export(args: argparse.Namespace) -> int:
    """Export with delta-rs, pyarrow and fastavro: no Spark session (`sinks.read_state`)."""
    from sinks.log import LogTable, normalize_uri
    from sinks.reading import export_state_arrow, verify_export_arrow

    log = LogTable(normalize_uri(args.log))
    report = export_state_arrow(
        log, args.to, codec=args.codec, as_of=as_of(args.as_of), progress=err
    )
    out(report.summary())
    if args.verify:
        started = time.monotonic()
        comparison = verify_export_arrow(log, args.to)
        err(f"export: verified in {time.monotonic() - started:.1f} s")
        for line in comparison.lines():
            out(line)
        return 0 if comparison.ok else EXIT_FAILED
    return 0


def _replay(args: argparse.Namespace) -> int:
    """Restore exactly (the default) or, asked by name, with new offsets; Spark writes."""
    import dataclasses

    from pyspark.sql import types as T

    from sinks.log import LogKeys, LogLocation, LogTable, normalize_uri
    from sinks.log.log_keys import log_keys
    from sinks.produce import committed
    from sinks.reading import (
        EXACT,
        NEW_OFFSETS,
        RESTORE_APP_ID,
        CarriedConfig,
        RestoreSource,
        check_target,
        is_faithful,
        read_manifest,
    )
    from sinks.reading.replay import replay  # the package's ``replay`` may be the module
    from streaming.status import spark_progress

    mode = NEW_OFFSETS if args.lossy_new_offsets else EXACT
    if mode == EXACT and (args.append or args.key_columns):
        flag = "--append" if args.append else "--key-columns"
        raise ConfigError(
            f"{flag} only goes with --lossy-new-offsets: an exact replay keeps the source's "
            "keys, partitions and offsets, which only an empty log can take"
        )
    source_path = normalize_uri(args.source)
    target_path = normalize_uri(args.to)
    version = as_of(args.as_of)
    # Everything that can refuse the replay is checked before Spark starts.
    source_snapshot = LogTable(source_path).snapshot(version)
    if source_snapshot is not None:
        keys = log_keys(source_snapshot, read_only=True).key_columns
        schema: T.StructType = source_snapshot.spark_schema
    else:
        manifest = read_manifest(source_path)
        keys = tuple(manifest["key_columns"])
        schema = T.StructType.fromJson(manifest["spark_schema"])
        if mode == EXACT and not is_faithful(manifest):
            raise ConfigError(
                f"{source_path} was written by an older export that kept only the key columns "
                "and value of live keys, not their partitions and offsets; replay it with "
                "--lossy-new-offsets, or export the log again"
            )
    if args.key_columns:
        keys = tuple(k.strip() for k in args.key_columns.split(","))
    target = LogTable(target_path).snapshot()
    if target is not None and committed(target, RESTORE_APP_ID, args.batch_id):
        out(f"replay into {target_path}: batch {args.batch_id} already committed, skipped")
        return _verify_replay(source_path, version, target_path, mode) if args.verify else 0
    check_target(
        target,
        LogKeys(key_columns=keys),
        schema if mode == EXACT else None,
        allow_records=args.append,
        location=LogLocation(target_path),
    )
    spark = session("compacted-sink-replay", args)
    if source_snapshot is not None:
        source = RestoreSource.of_log(spark, source_path, version)
    else:
        source = RestoreSource.of_export(spark, source_path)
    if args.key_columns:
        carried = LogKeys(key_columns=keys).to_properties()
        properties = {**source.config.properties, **carried}
        source = dataclasses.replace(source, config=CarriedConfig(keys, None, properties))
    with spark_progress(spark, "replay", out=err):
        report = replay(
            source,
            target_path,
            mode=mode,
            batch_id=args.batch_id,
            append=args.append,
            progress=err,
        )
    out(report.summary())
    if args.verify:
        return _verify_replay(source_path, version, target_path, mode)
    return 0


def _verify_replay(source: str, version, target: str, mode) -> int:
    """Compare the new log with the source, on Arrow (no Spark job)."""
    from sinks.log import LogTable
    from sinks.reading import verify_restore_arrow

    started = time.monotonic()
    comparison = verify_restore_arrow(source, LogTable(target), as_of=version, mode=mode)
    err(f"replay: verified in {time.monotonic() - started:.1f} s")
    for line in comparison.lines():
        out(line)
    return 0 if comparison.ok else EXIT_FAILED
