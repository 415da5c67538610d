"""Replay for disaster recovery: an export, or another log, written back into a new log.

`replay` writes a `RestoreSource` (an export, or another log at a version) into a log
that holds nothing yet, in one Delta commit that carries the records at their own
partitions and offsets and each partition's log start and end offsets, so the next
append continues after the source's log end (Kafka's mirror: every consumer's committed
offset keeps its meaning). The new log is created with the source's schema and carried
properties. Exactly once per batch id; a log that already holds records is refused
(`RestoreTargetError`). ``mode="new-offsets"`` (`NEW_OFFSETS`), the lossy restore,
appends the live records through the produce path instead: one partition, offsets
numbered from the target's log end, tombstones left out; only when asked for by that
name.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sinks.config import CleanerConfig
from sinks.errors import ConcurrentCommitError, ConfigError, RestoreTargetError
from sinks.log.history_window import table_properties
from sinks.log.location import LogLocation
from sinks.log.log_config import log_config
from sinks.log.log_format import (
    CLEANER_OFFSET_TXN,
    COMMIT_INFO_KEY,
    LOG_END_OFFSET_TXN,
    LOG_START_OFFSET_TXN,
    PARTITIONS_TXN,
    RESTORE_APP_ID,
)
from sinks.log.log_keys import (
    LogKeys,
    log_keys,
)
from sinks.log.log_table import AsOf, LogSnapshot, LogTable, log_arrow_schema
from sinks.log.ownership import check_new_log_location
from sinks.log.records import OFFSET, PARTITION, TIMESTAMP, VALUE
from sinks.log.segment_writer import SegmentWriterTask, stats_columns
from sinks.log.uris import normalize_uri
from sinks.produce.append_batch import SparkRecords
from sinks.produce.append_task import APPEND_TASK_DDL, AppendTask, read_task_output
from sinks.produce.log_append import LogAppender, committed
from sinks.produce.log_commit import discard
from sinks.reading.export import (
    StateLog,
    latest_log_records,
    read_export,
)
from sinks.reading.export_format import (
    EXACT,
    NEW_OFFSETS,
    NOT_CARRIED,
    CarriedConfig,
    PartitionOffsets,
    Progress,
    ReplayError,
    RestoreMode,
    is_faithful,
    offsets_from_json,
    partition_offsets,
    read_manifest,
)

"""The ``txn`` app id a restore commits its batch id under (exactly once per target)."""


@dataclass(frozen=True)
class RestoreSource:
    """What a restore writes: latest records (every column), the config, the offsets.

    ``faithful`` is False for an export written before exports carried partitions and
    offsets (format 1): such a source restores only with ``mode="new-offsets"``.
    """

    name: str
    records: DataFrame
    schema: T.StructType
    config: CarriedConfig
    partitions: Mapping[int, PartitionOffsets]
    faithful: bool = True

    @classmethod
    def of_export(cls, spark: SparkSession, directory: str) -> RestoreSource:
        """An export directory's records (decoded by the executors) and what it carried."""
        manifest = read_manifest(directory)
        schema = T.StructType.fromJson(manifest["spark_schema"])
        faithful = is_faithful(manifest)
        if faithful:
            config = CarriedConfig.from_json(manifest["config"])
        else:
            keys = LogKeys(key_columns=tuple(manifest["key_columns"]))
            config = CarriedConfig(keys.key_columns, None, keys.to_properties())
        return cls(
            name=(
                f"export {normalize_uri(directory)} ({manifest.get('records', manifest['keys'])} "
                f"records, Delta v{manifest['log_version']} of {manifest['log_path']})"
            ),
            records=read_export(spark, directory),
            schema=schema,
            config=config,
            partitions=offsets_from_json(manifest.get("partitions") or {}),
            faithful=faithful,
        )

    @classmethod
    def of_log(
        cls,
        spark: SparkSession,
        path: str,
        as_of: AsOf | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> RestoreSource:
        """Another log at ``as_of`` (default now): its latest records, config and offsets."""
        log = LogTable(LogLocation.at(path, storage_options))
        snapshot = log.snapshot(as_of)
        if snapshot is None:
            raise ReplayError(f"no compacted log at {path}")
        config = CarriedConfig.of(snapshot)
        return cls(
            name=f"{log.uri} (Delta v{snapshot.version})",
            records=latest_log_records(spark, log, snapshot, config),
            schema=snapshot.spark_schema,
            config=config,
            partitions=partition_offsets(snapshot),
        )


@dataclass(frozen=True)
class RestoreReport:
    """What a restore wrote into the target log (nothing when its batch was already there)."""

    source: str
    target: str
    mode: RestoreMode
    batch_id: int
    records: int
    skipped: bool
    duration_ms: int
    partitions: Mapping[int, PartitionOffsets] = field(default_factory=dict)
    properties: int = 0

    def summary(self) -> str:
        if self.skipped:
            return f"replay into {self.target}: batch {self.batch_id} already committed, skipped"
        if self.mode == NEW_OFFSETS:
            return (
                f"restored {self.records} keys from {self.source} into {self.target} with NEW "
                f"offsets in partition 0 ({NEW_OFFSETS}: partitions, offsets and tombstones not "
                f"kept) in {self.duration_ms / 1000:.1f} s"
            )
        ends = ", ".join(f"p{p} {o.log_end_offset}" for p, o in sorted(self.partitions.items()))
        return (
            f"restored {self.records} records from {self.source} into {self.target} at their "
            f"partitions and offsets (log end offsets {ends or 'none'}; {self.properties} "
            f"config properties) in {self.duration_ms / 1000:.1f} s"
        )


def replay(
    source: RestoreSource,
    target: str | StateLog,
    *,
    mode: RestoreMode = EXACT,
    batch_id: int = 0,
    append: bool = False,
    storage_options: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> RestoreReport:
    """Write ``source`` into the log at ``target`` (a path, or a sink), exactly once per batch id.

    ``mode="exact"`` (the default): the target must hold no records; it is created with
    the source's schema and carried properties, and one commit adds every record at its
    own partition and offset with each partition's log start and end offsets, so the new
    log's ``log()`` holds the source's latest records as they were and its next append
    continues after the source's log end. ``mode="new-offsets"`` (lossy, by name only):
    the live records are appended through the produce path into partition 0 with new
    offsets; ``append=True`` lets that go into a log that already holds records.
    Raises `RestoreTargetError` for a target that holds records (unless new-offsets with
    ``append``), another schema or other key columns; `ReplayError` for a source that
    cannot be restored exactly.
    """
    if mode not in (EXACT, NEW_OFFSETS):
        raise ConfigError(f"restore mode must be {EXACT!r} or {NEW_OFFSETS!r}, got {mode!r}")
    say = progress or (lambda _line: None)
    started = time.monotonic()
    own = None if isinstance(target, str) else getattr(target.log_table, "location", None)
    if own is not None and not storage_options:  # a sink given no options lends its own
        storage_options = own.storage_options
    log = LogTable(
        LogLocation.at(target if isinstance(target, str) else target.path, storage_options)
    )
    path = log.uri
    if mode == EXACT and not source.faithful:
        raise ReplayError(
            f"{source.name} was written by an older export that kept only the key columns and "
            "value of live keys, not their partitions and offsets: it cannot be restored "
            f"exactly; restore it with mode={NEW_OFFSETS!r} (--lossy-new-offsets)"
        )
    snapshot = log.snapshot(repair=True)
    if snapshot is not None and committed(snapshot, RESTORE_APP_ID, batch_id):
        say(f"replay: batch {batch_id} already committed to {path}")
        return RestoreReport(source.name, path, mode, batch_id, 0, True, 0)
    check_target(
        snapshot,
        source.config.keys,
        source.schema if mode == EXACT else None,
        allow_records=mode == NEW_OFFSETS and append,
        location=log.location,
    )
    if snapshot is None and source.faithful:
        snapshot = log.create(source.schema, _creation_properties(source.config))
    elif snapshot is not None and not append and set_carried_properties(log, source.config):
        snapshot = log.snapshot(repair=True)
    say(f"replay ({mode}): {source.name} -> {path} as batch {batch_id}")
    if mode == EXACT:
        assert snapshot is not None
        records = _write_exact(log, snapshot, source, batch_id)
    else:
        records = _append_new_offsets(log, source, batch_id)
    report = RestoreReport(
        source=source.name,
        target=path,
        mode=mode,
        batch_id=batch_id,
        records=records,
        skipped=False,
        duration_ms=int((time.monotonic() - started) * 1000),
        partitions=source.partitions if mode == EXACT else {},
        properties=len(source.config.properties),
    )
    say(report.summary())
    return report


def check_target(
    snapshot: LogSnapshot | None,
    source_keys: LogKeys,
    schema: T.StructType | None,
    *,
    allow_records: bool = False,
    location: LogLocation | None = None,
) -> None:
    """Raise `RestoreTargetError` unless the target log is absent, or empty and alike.

    Absent: no Delta table at ``location``, and no file there the sink did not write
    (`NotACompactedLogError` otherwise, as for a Delta table that is not a compacted log).
    Empty: no live file and no offset ever given out (a log whose records all went by
    retention still numbers from its log end). Alike: the source's key columns
    (``source_keys``), and its
    columns and types when ``schema`` is given (an exact restore). With ``allow_records``
    (a lossy append) only the key columns count.
    """
    if snapshot is None:
        if location is not None:
            check_new_log_location(location)  # someone else's files: refuse
        return
    keys = log_keys(snapshot)  # refuses a Delta table that is not a compacted log
    if keys.recorded and keys.key_columns != source_keys.key_columns:
        raise RestoreTargetError(
            f"--to {snapshot.uri} is a log keyed by {list(keys.key_columns)}, the source by "
            f"{list(source_keys.key_columns)}; choose a new --to"
        )
    if allow_records:
        return
    records = sum(s.num_records for s in snapshot.data_files())
    ends = {p: e for p, e in snapshot.log_end_offsets().items() if e}
    if records or ends:
        raise RestoreTargetError(
            f"--to {snapshot.uri} already holds a log ({records} records, log end offsets "
            f"{ends or 'none'}, Delta v{snapshot.version}); a restore keeps the source's "
            "partitions and offsets only in an empty log. Choose a new --to, or pass "
            "--lossy-new-offsets --append to append the live state with new offsets"
        )
    if schema is not None and _columns(snapshot.spark_schema) != _columns(schema):
        raise RestoreTargetError(
            f"--to {snapshot.uri} is an empty log with columns "
            f"{snapshot.spark_schema.simpleString()}, the source has "
            f"{schema.simpleString()}; choose a new --to"
        )


def _columns(schema: T.StructType) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def _creation_properties(config: CarriedConfig) -> dict[str, str]:
    keys = LogKeys(key_columns=config.key_columns, sequence_column=config.sequence_column)
    return {
        **table_properties(CleanerConfig().file_delete_delay_ms),
        **config.properties,
        **keys.to_properties(),
    }


def _write_exact(log: LogTable, snapshot: LogSnapshot, source: RestoreSource, batch_id: int) -> int:
    """Write every record at its own partition and offset; one commit with the offsets."""
    config = source.config
    schema = snapshot.spark_schema
    limits = log_config(snapshot).config  # the carried topic config (design.md §69's codec)
    task = AppendTask(
        writer=SegmentWriterTask(
            table_uri=log.location.uri,
            schema=log_arrow_schema(schema),
            stats_columns=tuple(stats_columns(schema, config.keys)),
            max_file_bytes=limits.segment_bytes,
            group_column=None,
            storage_options=dict(log.location.storage_options),
            key_columns=config.keys.key_columns,
            compression=limits.parquet_codec,
        ),
        log_end_offsets={},
        keys=config.keys,
        has_offsets=True,
        # The records passed the source log's own limit when they were appended.
        message_max_bytes=2**62,
    )
    rows = (
        source.records.select(*schema.names)
        .repartition(PARTITION)
        .sortWithinPartitions(PARTITION, OFFSET)
    )
    written, report = read_task_output(
        r.asDict() for r in rows.mapInArrow(task, APPEND_TASK_DDL).collect()
    )
    problems = report.problems(keys=config.keys, message_max_bytes=2**62)
    if problems:
        discard(log, written)
        raise ReplayError(f"{source.name} cannot be restored: " + "; ".join(problems))
    ends = {p: o.log_end_offset for p, o in source.partitions.items()}
    for w in written:
        ends[w.partition] = max(ends.get(w.partition, 0), w.last_offset + 1)
    transactions = {RESTORE_APP_ID: batch_id, PARTITIONS_TXN: max([*ends, -1]) + 1}
    for p, end in ends.items():
        offsets = source.partitions.get(p, PartitionOffsets(0, end))
        transactions[LOG_END_OFFSET_TXN.format(p)] = end
        transactions[LOG_START_OFFSET_TXN.format(p)] = offsets.log_start_offset
        # Below the source's cleaner offset the records were its clean section (one a key,
        # tombstones stamped); none recorded: 0, every segment dirty.
        transactions[CLEANER_OFFSET_TXN.format(p)] = offsets.cleaner_offset or 0
    try:
        snapshot.commit(
            adds=written,
            data_change=True,
            transactions=transactions,
            info={"operation": "replay", "source": source.name, "batchId": batch_id},
        )
    except ConcurrentCommitError as e:
        discard(log, written)
        raise ReplayError(
            f"{log.uri}: another writer committed to the log during the restore ({e}); "
            "nothing was restored, run it again into an empty log"
        ) from e
    return sum(w.num_records for w in written)


def _append_new_offsets(log: LogTable, source: RestoreSource, batch_id: int) -> int:
    """The lossy restore: live records through the produce path, partition 0, new offsets."""
    config = source.config
    live = source.records.filter(F.col(VALUE).isNotNull())
    order = [c for c in (TIMESTAMP, PARTITION, OFFSET) if c in live.columns]
    dropped = [c for c in (PARTITION, OFFSET, *NOT_CARRIED) if c in live.columns]
    batch = live.orderBy(*order).drop(*dropped)
    appender = LogAppender(log, keys=config.keys, config=CleanerConfig())
    info = appender.append(SparkRecords(batch), app_id=RESTORE_APP_ID, batch_id=batch_id)
    return sum(w.num_records for w in info.written)


def set_carried_properties(log: LogTable, config: CarriedConfig) -> bool:
    """Set the carried properties on an existing log where they differ; True when committed."""
    snapshot = log.snapshot(repair=True)
    if snapshot is None:
        return False
    current = snapshot.table.metadata().configuration
    wanted = {k: v for k, v in config.properties.items() if current.get(k) != v}
    if not wanted:
        return False
    snapshot.committer.set_properties(
        snapshot.table_to_change(),
        wanted,
        metadata={COMMIT_INFO_KEY: {"operation": "replay-config"}},
    )
    return True
