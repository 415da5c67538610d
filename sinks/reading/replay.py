"""Replay for disaster recovery: a log's latest records out to Avro, and back into a new log.

Kafka's answer to losing a cluster is a mirror of the topic: the same records at the
same partitions and offsets, with the topic's configs, so that every consumer's
committed offset still means the same record. The compacted log *is* the state, so
an export here is the log as a full cleaning pass would leave it: each (partition,
key)'s latest record, tombstones included (a consumer behind them must still see the
delete), with every column the log stores (key columns, ``value``, ``partition``,
``offset``, ``timestamp``, payload columns such as Kafka's ``topic`` and ``headers``,
and a tombstone's ``delete_horizon_ms``), plus what a record does not say: the log's
config (`CarriedConfig`: key columns, sequence column, the properties stored on the log)
and each partition's offsets (`PartitionOffsets`: log start, log end, where cleaning
ended). The log end offset is carried on its own because the records do not give it:
the last records of a partition may have been cleaned away, or Kafka's offsets end
in a gap.

- `export_state` pins one Delta version and has the executors write Avro object
  container files with fastavro (the schema in every header, the codec the caller
  chose); the driver then writes ``_manifest.json`` (`MANIFEST`): the files, the
  counts, the config and the offsets. An export without a manifest is incomplete.
  `sinks.reading.arrow_export` writes the same files without Spark.
- `replay` writes a `RestoreSource` (an export, or another log at a version) into
  a log that holds nothing yet, in one Delta commit that carries the records at
  their own partitions and offsets and each partition's log start and end offsets,
  so the next append continues after the source's log end. The new log is created
  with the source's schema and carried properties. Exactly once per batch id; a log
  that already holds records is refused (`RestoreTargetError`). ``mode="new-offsets"``
  (`NEW_OFFSETS`), the lossy restore, appends the live records through the produce
  path instead: one partition, offsets numbered from the target's log end, tombstones
  left out; only when asked for by that name.
- `compare_images` is the verification both ways use, pure: two `LogImage`s (records
  with their config and offsets) compared column by column, each difference named
  (`Comparison`).
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import fastavro
import pyarrow as pa
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sinks.cleaner.rules import latest_records
from sinks.config import CleanerConfig
from sinks.errors import CompactedSinkError, ConfigError
from sinks.log.append_batch import SparkRecords
from sinks.log.append_task import APPEND_TASK_DDL, AppendTask, read_task_output
from sinks.log.foreign_commits import COMMIT_INFO_KEY
from sinks.log.history_window import table_properties
from sinks.log.log_append import LogAppender, committed
from sinks.log.log_commit import discard
from sinks.log.log_keys import (
    KEY_COLUMNS_PROPERTY,
    SEQUENCE_COLUMN_PROPERTY,
    LogKeys,
    log_keys,
)
from sinks.log.log_table import (
    CLEANER_OFFSET_TXN,
    LOG_END_OFFSET_TXN,
    LOG_START_OFFSET_TXN,
    PARTITIONS_TXN,
    AsOf,
    LogSnapshot,
    LogTable,
    log_arrow_schema,
)
from sinks.log.ownership import check_new_log_location
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, TIMESTAMP, VALUE
from sinks.log.segment_writer import SegmentWriterTask, stats_columns
from sinks.log.storage import arrow_filesystem, normalize_uri
from sinks.spark_compat import utc_arrow_schema
from sinks.spark_session import active_session


class StateLog(Protocol):
    """What export and verification need of a log: `CompactedStateSink` is one.

    A protocol, so this module stays below the sink that calls it (reading sits under
    the front in the layers).
    """

    path: str
    key_columns: tuple[str, ...]
    log_table: LogTable

    def state(self, as_of: AsOf | None = None) -> DataFrame: ...


Codec = Literal["null", "deflate", "snappy", "zstandard", "bzip2", "xz", "lz4"]
RestoreMode = Literal["exact", "new-offsets"]
EXACT: RestoreMode = "exact"
NEW_OFFSETS: RestoreMode = "new-offsets"
"""The lossy restore: live records only, one partition, offsets numbered anew."""

MANIFEST = "_manifest.json"
EXPORT_FORMAT = 2
"""Version 2 carries every column, tombstones, the config and the offsets; version 1
(no ``format`` key) carried the key columns and ``value`` of live keys only."""
SPARK_SCHEMA_METADATA = "compacted.sink.spark.schema"
RESTORE_APP_ID = "compacted-sink/replay"
"""The ``txn`` app id a restore commits its batch id under (exactly once per target)."""
_WRITTEN_DDL = "path string, records long, tombstones long, bytes long"
_RECORD_NAME = "CompactedState"
_NOT_CARRIED = (DELETE_HORIZON_MS,)

CARRIED_PREFIX = "compacted.sink."
KAFKA_TOPIC_CONFIGS = frozenset(
    {
        "cleanup.policy",
        "compression.type",
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "index.interval.bytes",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.difference.max.ms",
        "message.timestamp.type",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.storage.enable",
        "retention.bytes",
        "retention.ms",
        "segment.bytes",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
        "message.max.bytes",
    }
)
"""Kafka's topic-level config names: a table property named by one (alone or as the tail of
a dotted name) is topic config stored on the log, and travels with it."""

Progress = Callable[[str], None]


class ReplayError(CompactedSinkError):
    """Raised when an export cannot be written, read or verified, or a restore cannot start."""


class RestoreTargetError(ReplayError, ConfigError):
    """Raised when a restore's target already holds records, or another log than the source's."""


# -- what travels beside the records -------------------------------------------------------


def carried_properties(configuration: Mapping[str, str | None]) -> dict[str, str]:
    """The table properties an export carries: the sink's own (``compacted.sink.*``), topic
    configs by Kafka's names, and the history window the sink sets (``delta.*``). Pure."""
    history = set(table_properties(0))
    carried = {}
    for name, value in configuration.items():
        if value is None:
            continue
        kafka = name in KAFKA_TOPIC_CONFIGS or (
            not name.startswith("delta.")
            and any(name.endswith("." + c) for c in KAFKA_TOPIC_CONFIGS)
        )
        if name.startswith(CARRIED_PREFIX) or kafka or name in history:
            carried[name] = value
    return dict(sorted(carried.items()))


@dataclass(frozen=True)
class CarriedConfig:
    """A log's config as an export carries it: its keys and the properties stored on it."""

    key_columns: tuple[str, ...]
    sequence_column: str | None
    properties: Mapping[str, str]

    @classmethod
    def of(cls, snapshot: LogSnapshot) -> CarriedConfig:
        keys = log_keys(snapshot)
        properties = carried_properties(snapshot.table.metadata().configuration)
        if not keys.recorded:  # a log older than the key properties: record them now
            properties = {**properties, **keys.to_properties()}
        return cls(keys.key_columns, keys.sequence_column, properties)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CarriedConfig:
        return cls(
            tuple(data["key_columns"]), data.get("sequence_column"), dict(data["properties"])
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key_columns": list(self.key_columns),
            "sequence_column": self.sequence_column,
            "properties": dict(self.properties),
        }


@dataclass(frozen=True)
class PartitionOffsets:
    """One partition's offsets: records lie in [log start, log end); cleaned below ``cleaned``."""

    log_start_offset: int
    log_end_offset: int
    cleaner_offset: int | None = None


def partition_offsets(snapshot: LogSnapshot) -> dict[int, PartitionOffsets]:
    """Every partition the log has written, with its offsets (no data file read)."""
    return {
        p: PartitionOffsets(
            snapshot.log_start_offset(p), snapshot.log_end_offset(p), snapshot.cleaner_offset(p)
        )
        for p in snapshot.partitions
    }


def offsets_from_json(data: Mapping[str, Mapping[str, Any]]) -> dict[int, PartitionOffsets]:
    return {int(p): PartitionOffsets(**o) for p, o in data.items()}


def offsets_to_json(offsets: Mapping[int, PartitionOffsets]) -> dict[str, dict[str, Any]]:
    return {str(p): asdict(o) for p, o in sorted(offsets.items())}


# -- export --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote: files, counts, and the log version it is a snapshot of.

    ``keys`` counts live keys; ``records`` every record written, ``tombstones`` included.
    """

    directory: str
    log_path: str
    log_version: int
    key_columns: tuple[str, ...]
    codec: str
    files: tuple[str, ...]
    keys: int
    bytes: int
    duration_ms: int
    avro_schema: dict
    records: int = 0
    tombstones: int = 0
    config: CarriedConfig | None = None
    partitions: Mapping[int, PartitionOffsets] = field(default_factory=dict)

    def summary(self) -> str:
        ends = ", ".join(f"p{p} {o.log_end_offset}" for p, o in sorted(self.partitions.items()))
        return (
            f"exported {self.keys} keys ({self.records} records: {self.keys} live, "
            f"{self.tombstones} tombstones; every column, at their partitions and offsets) of "
            f"{self.log_path} (Delta v{self.log_version}; log end offsets {ends or 'none'}; "
            f"{len(self.config.properties) if self.config else 0} config properties) to "
            f"{self.directory}: {len(self.files)} Avro file(s), {self.bytes} B, codec "
            f"{self.codec}, in {self.duration_ms / 1000:.1f} s"
        )

    def manifest(self, spark_schema: T.StructType) -> dict[str, Any]:
        """The ``_manifest.json`` of this export."""
        apart = ("config", "partitions", "avro_schema")
        body = {k: v for k, v in asdict(self).items() if k not in apart}
        return {
            "format": EXPORT_FORMAT,
            **body,
            "sequence_column": self.config.sequence_column if self.config else None,
            "config": self.config.to_json() if self.config else None,
            "partitions": offsets_to_json(self.partitions),
            "avro_schema": self.avro_schema,
            "spark_schema": json.loads(spark_schema.json()),
        }


def export_state(
    sink: StateLog,
    directory: str,
    *,
    codec: Codec = "deflate",
    as_of: AsOf | None = None,
    progress: Progress | None = None,
) -> ExportReport:
    """Write the log's latest record per (partition, key), every column, as Avro files.

    At ``as_of`` (default: the current version, pinned). ``directory`` must not hold an
    export already. Not idempotent: a second call into another directory writes another
    copy. Runs a Spark job (a shuffle of the log by key). Raises `ReplayError` for a
    type Avro cannot carry or an unknown codec.
    """
    say = progress or (lambda _line: None)
    started = time.monotonic()
    check_codec(codec)
    snapshot = sink.log_table.snapshot(as_of, repair=False)
    if snapshot is None:
        raise ReplayError(f"no compacted log at {sink.path}")
    target = _new_export_directory(directory)
    config = CarriedConfig.of(snapshot)
    spark = active_session()
    records = latest_log_records(spark, sink.log_table, snapshot, config)
    schema = avro_schema(snapshot.spark_schema)
    say(f"export: {sink.path} at Delta v{snapshot.version} -> {target} ({codec})")
    writer = AvroFileWriter(
        directory=target,
        avro_schema=schema,
        codec=codec,
        metadata=_file_metadata(snapshot, sink.path),
    )
    written = [r.asDict() for r in records.mapInArrow(writer, _WRITTEN_DDL).collect()]
    written.sort(key=lambda w: w["path"])
    total = sum(w["records"] for w in written)
    tombstones = sum(w["tombstones"] for w in written)
    report = ExportReport(
        directory=target,
        log_path=sink.path,
        log_version=snapshot.version,
        key_columns=config.key_columns,
        codec=codec,
        files=tuple(w["path"] for w in written),
        keys=total - tombstones,
        bytes=sum(w["bytes"] for w in written),
        duration_ms=int((time.monotonic() - started) * 1000),
        avro_schema=schema,
        records=total,
        tombstones=tombstones,
        config=config,
        partitions=partition_offsets(snapshot),
    )
    write_manifest(target, report.manifest(snapshot.spark_schema))
    say(report.summary())
    return report


def latest_log_records(
    spark: SparkSession, log: LogTable, snapshot: LogSnapshot, config: CarriedConfig
) -> DataFrame:
    """Each (partition, key)'s latest record in ``snapshot``, tombstones included, every column
    in the log's order: what an export carries (a shuffle of ``log()`` by key)."""
    group = [PARTITION, *(k for k in config.key_columns if k != PARTITION)]
    records = log.read(spark, snapshot)
    return latest_records(records, group, config.sequence_column).select(
        *snapshot.spark_schema.names
    )


def _new_export_directory(directory: str) -> str:
    target = normalize_uri(directory)
    fs, root = arrow_filesystem(target)
    if fs.get_file_info(f"{root}/{MANIFEST}").type != pa.fs.FileType.NotFound:
        raise ReplayError(f"{target} already holds an export ({MANIFEST} exists)")
    fs.create_dir(root, recursive=True)
    return target


def _file_metadata(snapshot: LogSnapshot, log_path: str) -> dict[str, str]:
    return {
        SPARK_SCHEMA_METADATA: snapshot.spark_schema.json(),
        "compacted.sink.log": log_path,
        "compacted.sink.version": str(snapshot.version),
    }


def write_manifest(directory: str, manifest: Mapping[str, Any]) -> None:
    """Write ``_manifest.json`` last: its presence says the export is complete."""
    fs, root = arrow_filesystem(normalize_uri(directory))
    with fs.open_output_stream(f"{root}/{MANIFEST}") as out:
        out.write(json.dumps(manifest, indent=2, default=str).encode())


def check_codec(codec: str) -> None:
    """Raise `ReplayError` unless fastavro can write ``codec`` here (some need extra libraries)."""
    probe = fastavro.parse_schema({"type": "record", "name": "probe", "fields": []})
    try:
        fastavro.writer(io.BytesIO(), probe, [{}], codec=codec)
    except ValueError as e:
        raise ReplayError(f"Avro codec {codec!r} cannot be used: {e}") from None


def read_manifest(directory: str) -> dict[str, Any]:
    """The manifest of a complete export; `ReplayError` when there is none."""
    fs, root = arrow_filesystem(normalize_uri(directory))
    try:
        with fs.open_input_stream(f"{root}/{MANIFEST}") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        raise ReplayError(f"{directory} holds no complete export (no {MANIFEST})") from None


def is_faithful(manifest: Mapping[str, Any]) -> bool:
    """True for an export that carries partitions, offsets, every column and the config."""
    return manifest.get("format", 1) >= EXPORT_FORMAT


def read_export(spark: SparkSession, directory: str) -> DataFrame:
    """An export's records as a DataFrame with the exported schema (executors decode the files)."""
    manifest = read_manifest(directory)
    schema = T.StructType.fromJson(manifest["spark_schema"])
    target = normalize_uri(directory)
    if not manifest["files"]:
        return spark.createDataFrame([], schema)
    files = spark.createDataFrame([(f,) for f in manifest["files"]], "file string")
    partitions = max(1, len(manifest["files"]))
    reader = AvroFileReader(directory=target, spark_schema_json=schema.json())
    return files.repartition(partitions).mapInArrow(reader, schema)


def verify_export(sink: StateLog, directory: str, *, max_examples: int = 10) -> Comparison:
    """Compare an export with the log at the version it was taken from: every record and
    column, the config and the offsets (`compare_images`, on Arrow; both held in memory)."""
    from sinks.reading.arrow_export import verify_export_arrow

    return verify_export_arrow(
        sink.path,
        directory,
        storage_options=getattr(sink.log_table, "storage_options", None),
        max_examples=max_examples,
    )


# -- restore -------------------------------------------------------------------------------


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
        log = LogTable(normalize_uri(path), storage_options)
        snapshot = log.snapshot(as_of, repair=False)
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
    path = normalize_uri(target if isinstance(target, str) else target.path)
    if not isinstance(target, str):
        storage_options = storage_options or getattr(target.log_table, "storage_options", None)
    log = LogTable(path, storage_options)
    if mode == EXACT and not source.faithful:
        raise ReplayError(
            f"{source.name} was written by an older export that kept only the key columns and "
            "value of live keys, not their partitions and offsets: it cannot be restored "
            f"exactly; restore it with mode={NEW_OFFSETS!r} (--lossy-new-offsets)"
        )
    snapshot = log.snapshot()
    if snapshot is not None and committed(snapshot, RESTORE_APP_ID, batch_id):
        say(f"replay: batch {batch_id} already committed to {path}")
        return RestoreReport(source.name, path, mode, batch_id, 0, True, 0)
    check_target(
        snapshot,
        source.config.key_columns,
        source.schema if mode == EXACT else None,
        allow_records=mode == NEW_OFFSETS and append,
        uri=path,
        storage_options=storage_options,
    )
    if snapshot is None and source.faithful:
        snapshot = log.create(source.schema, _creation_properties(source.config))
    elif snapshot is not None and not append and set_carried_properties(log, source.config):
        snapshot = log.snapshot()
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
    key_columns: Sequence[str],
    schema: T.StructType | None,
    *,
    allow_records: bool = False,
    uri: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> None:
    """Raise `RestoreTargetError` unless the target log is absent, or empty and alike.

    Absent: no Delta table at ``uri``, and no file there the sink did not write
    (`NotACompactedLogError` otherwise, as for a Delta table that is not a compacted log).
    Empty: no live file and no offset ever given out (a log whose records all went by
    retention still numbers from its log end). Alike: the source's key columns, and its
    columns and types when ``schema`` is given (an exact restore). With ``allow_records``
    (a lossy append) only the key columns count.
    """
    if snapshot is None:
        if uri is not None:
            check_new_log_location(uri, storage_options)  # someone else's files: refuse
        return
    keys = log_keys(snapshot)  # refuses a Delta table that is not a compacted log
    if keys.recorded and keys.key_columns != tuple(key_columns):
        raise RestoreTargetError(
            f"--to {snapshot.uri} is a log keyed by {list(keys.key_columns)}, the source by "
            f"{list(key_columns)}; choose a new --to"
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
    limits = CleanerConfig()
    task = AppendTask(
        writer=SegmentWriterTask(
            table_uri=log.uri,
            schema=log_arrow_schema(schema),
            stats_columns=tuple(stats_columns(schema, config.key_columns, config.sequence_column)),
            max_file_bytes=limits.segment_bytes,
            group_column=None,
            storage_options=log.storage_options,
        ),
        log_end_offsets={},
        key_columns=config.key_columns,
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
    problems = report.problems(key_columns=config.key_columns, message_max_bytes=2**62)
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
    except CommitFailedError as e:
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
    dropped = [c for c in (PARTITION, OFFSET, *_NOT_CARRIED) if c in live.columns]
    batch = live.orderBy(*order).drop(*dropped)
    appender = LogAppender(
        log,
        key_columns=config.key_columns,
        sequence_column=config.sequence_column,
        config=CleanerConfig(),
    )
    info = appender.append(SparkRecords(batch), app_id=RESTORE_APP_ID, batch_id=batch_id)
    return sum(w.num_records for w in info.written)


def set_carried_properties(log: LogTable, config: CarriedConfig) -> bool:
    """Set the carried properties on an existing log where they differ; True when committed."""
    snapshot = log.snapshot()
    if snapshot is None:
        return False
    current = snapshot.table.metadata().configuration
    wanted = {k: v for k, v in config.properties.items() if current.get(k) != v}
    if not wanted:
        return False
    snapshot.table.alter.set_table_properties(
        wanted,
        raise_if_not_exists=False,  # topic configs are not Delta's keys
        commit_properties=CommitProperties(
            custom_metadata={COMMIT_INFO_KEY: {"operation": "replay-config"}}
        ),
    )
    return True


# -- verification ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogImage:
    """One side of a verification: records (dicts of ``columns``) and what travels beside them."""

    name: str
    columns: tuple[str, ...]
    records: Iterable[Mapping[str, Any]]
    config: CarriedConfig
    partitions: Mapping[int, PartitionOffsets]


@dataclass(frozen=True)
class Comparison:
    """Two `LogImage`s compared: counts, and each difference named (the first few in full).

    ``differing`` counts records whose (partition, key) both sides hold, per column that
    differs. ``not_compared`` names what the mode does not keep.
    """

    source: str
    target: str
    mode: RestoreMode
    source_records: int
    target_records: int
    live_keys: int
    tombstones: int
    missing: int
    unexpected: int
    differing: Mapping[str, int]
    config_differences: tuple[str, ...]
    offset_differences: tuple[str, ...]
    examples: tuple[str, ...]
    compared: tuple[str, ...]
    not_compared: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (
            self.missing
            or self.unexpected
            or self.differing
            or self.config_differences
            or self.offset_differences
        )

    @property
    def differences(self) -> int:
        return (
            self.missing
            + self.unexpected
            + sum(self.differing.values())
            + len(self.config_differences)
            + len(self.offset_differences)
        )

    def summary(self) -> str:
        verdict = "matches" if self.ok else "DOES NOT match"
        scope = f"{self.source_records} records ({self.live_keys} live keys"
        scope += f", {self.tombstones} tombstones)" if self.mode == EXACT else ")"
        columns = ", ".join(f"{c} {n}" for c, n in sorted(self.differing.items())) or "none"
        text = (
            f"{self.target} {verdict} {self.source}: {scope} against {self.target_records}; "
            f"compared {', '.join(self.compared)}, config"
            + (", log start and end offsets" if self.mode == EXACT else "")
            + f"; {self.missing} missing, {self.unexpected} unexpected, differing columns: "
            f"{columns}; config differences {len(self.config_differences)}"
        )
        if self.mode == EXACT:
            text += f"; offset differences {len(self.offset_differences)}"
        if self.not_compared:
            text += f"; not compared ({self.mode} mode): {', '.join(self.not_compared)}"
        return text

    def lines(self) -> list[str]:
        """The summary, then the first differences in full."""
        more = self.differences - len(self.examples)
        tail = [f"  … and {more} more difference(s)"] if more > 0 else []
        return [self.summary(), *(f"  {e}" for e in self.examples), *tail]


def compare_images(
    source: LogImage, target: LogImage, *, mode: RestoreMode = EXACT, max_examples: int = 10
) -> Comparison:
    """Compare two images record by record, column by column; pure.

    Exact: records are matched by (partition, key columns) and every column is compared
    (``partition`` and ``offset`` included), then the carried config and each partition's
    log start and end offsets. New-offsets: only the source's live records, matched by
    key columns, without ``partition``, ``offset``, ``delete_horizon_ms``, nor the offsets.
    Holds the target's records in memory.
    """
    keys = source.config.key_columns
    exact = mode == EXACT
    ignored = () if exact else (PARTITION, OFFSET, *_NOT_CARRIED)
    compared = tuple(c for c in source.columns if c not in ignored)
    group = (PARTITION, *keys) if exact else keys
    examples: list[str] = []

    def note(text: str) -> None:
        if len(examples) < max_examples:
            examples.append(text)

    def key_of(record: Mapping[str, Any]) -> str:
        return canonical({k: record.get(k) for k in group})

    theirs: dict[str, dict[str, Any]] = {}
    target_records = 0
    for record in target.records:
        target_records += 1
        theirs[key_of(record)] = dict(record)
    source_records = live = tombstones = missing = 0
    differing: dict[str, int] = {}
    for record in source.records:
        if record.get(VALUE) is None:
            tombstones += 1
            if not exact:
                continue
        else:
            live += 1
        source_records += 1
        key = key_of(record)
        other = theirs.pop(key, None)
        if other is None:
            missing += 1
            note(f"missing from {target.name}: {key} (offset {record.get(OFFSET)})")
            continue
        for column in compared:
            a, b = canonical_value(record.get(column)), canonical_value(other.get(column))
            if a != b:
                differing[column] = differing.get(column, 0) + 1
                note(
                    f"{key}: {column} differs: {source.name} {_short(a)}, {target.name} {_short(b)}"
                )
    for key, record in theirs.items():
        note(f"not in {source.name}: {key} (offset {record.get(OFFSET)})")
    config = _config_differences(source, target)
    for line in config:
        note(line)
    offsets = _offset_differences(source, target) if exact else []
    for line in offsets:
        note(line)
    return Comparison(
        source=source.name,
        target=target.name,
        mode=mode,
        source_records=source_records,
        target_records=target_records,
        live_keys=live,
        tombstones=tombstones,
        missing=missing,
        unexpected=len(theirs),
        differing=differing,
        config_differences=tuple(config),
        offset_differences=tuple(offsets),
        examples=tuple(examples),
        compared=compared,
        not_compared=tuple(c for c in ignored if c in source.columns)
        + (() if exact else ("tombstones", "log start and end offsets")),
    )


def _config_differences(source: LogImage, target: LogImage) -> list[str]:
    found = []
    a, b = source.config, target.config
    if a.key_columns != b.key_columns:
        found.append(f"config: key columns {list(a.key_columns)} vs {list(b.key_columns)}")
    if a.sequence_column != b.sequence_column:
        found.append(f"config: sequence column {a.sequence_column!r} vs {b.sequence_column!r}")
    ignored = {KEY_COLUMNS_PROPERTY, SEQUENCE_COLUMN_PROPERTY}
    for name in sorted((set(a.properties) | set(b.properties)) - ignored):
        if a.properties.get(name) != b.properties.get(name):
            found.append(
                f"config: {name} is {a.properties.get(name)!r} in {source.name}, "
                f"{b.properties.get(name)!r} in {target.name}"
            )
    return found


def _offset_differences(source: LogImage, target: LogImage) -> list[str]:
    found = []
    for p in sorted(set(source.partitions) | set(target.partitions)):
        a, b = source.partitions.get(p), target.partitions.get(p)
        if a is None or b is None:
            found.append(f"partition {p}: only in {source.name if b is None else target.name}")
            continue
        for name in ("log_start_offset", "log_end_offset"):
            if getattr(a, name) != getattr(b, name):
                found.append(
                    f"partition {p}: {name.replace('_', ' ')} {getattr(a, name)} in "
                    f"{source.name}, {getattr(b, name)} in {target.name}"
                )
    return found


def canonical(record: Mapping[str, Any]) -> str:
    """A record as comparable text: Arrow's and Avro's Python values alike (maps as dicts)."""
    return json.dumps(avro_value(dict(record)), sort_keys=True, default=str)


def canonical_value(value: Any) -> str:
    return json.dumps(avro_value(value), sort_keys=True, default=str)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- Spark types as Avro -------------------------------------------------------------


def avro_schema(schema: T.StructType, name: str = _RECORD_NAME) -> dict:
    """The Avro record schema of a Spark schema; nullable fields become ``["null", T]``."""
    names = iter(range(1, 1_000_000))
    return _record(schema, name, names)


def _record(schema: T.StructType, name: str, names: Iterator[int]) -> dict:
    fields = []
    for f in schema.fields:
        avro = _avro_type(f.dataType, f"{name}_{f.name}", names)
        if f.nullable:
            fields.append({"name": f.name, "type": ["null", avro], "default": None})
        else:
            fields.append({"name": f.name, "type": avro})
    return {"type": "record", "name": name, "namespace": "compacted_sink", "fields": fields}


def _avro_type(data_type: T.DataType, name: str, names: Iterator[int]) -> Any:
    simple = {
        T.StringType: "string",
        T.BinaryType: "bytes",
        T.BooleanType: "boolean",
        T.ByteType: "int",
        T.ShortType: "int",
        T.IntegerType: "int",
        T.LongType: "long",
        T.FloatType: "float",
        T.DoubleType: "double",
    }
    for spark_type, avro in simple.items():
        if isinstance(data_type, spark_type):
            return avro
    if isinstance(data_type, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(data_type, T.TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(data_type, T.TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(data_type, T.DecimalType):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": data_type.precision,
            "scale": data_type.scale,
        }
    if isinstance(data_type, T.StructType):
        return _record(data_type, f"{name}_{next(names)}", names)
    if isinstance(data_type, T.ArrayType):
        items = _avro_type(data_type.elementType, name, names)
        return {"type": "array", "items": ["null", items] if data_type.containsNull else items}
    if isinstance(data_type, T.MapType) and isinstance(data_type.keyType, T.StringType):
        values = _avro_type(data_type.valueType, name, names)
        return {
            "type": "map",
            "values": ["null", values] if data_type.valueContainsNull else values,
        }
    raise ReplayError(f"column type {data_type.simpleString()} has no Avro equivalent here")


# -- executor-side writers and readers -----------------------------------------------


@dataclass(frozen=True)
class AvroFileWriter:
    """The picklable function each export task runs: its rows into one Avro container file."""

    directory: str
    avro_schema: dict
    codec: str
    metadata: dict[str, str]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parsed = fastavro.parse_schema(self.avro_schema)
        fs, root = arrow_filesystem(self.directory)
        name = f"part-{uuid.uuid4().hex}.avro"
        records = tombstones = 0
        with fs.open_output_stream(f"{root}/{name}") as out:
            writer = fastavro.write.Writer(out, parsed, codec=self.codec, metadata=self.metadata)
            for batch in batches:
                tombstones += batch.column(VALUE).null_count
                for row in batch.to_pylist():
                    writer.write(avro_value(row))
                    records += 1
            writer.flush()
        size = fs.get_file_info(f"{root}/{name}").size
        if records == 0:
            fs.delete_file(f"{root}/{name}")
            return
        yield pa.RecordBatch.from_pylist(
            [{"path": name, "records": records, "tombstones": tombstones, "bytes": size}],
            schema=pa.schema(
                [
                    ("path", pa.string()),
                    ("records", pa.int64()),
                    ("tombstones", pa.int64()),
                    ("bytes", pa.int64()),
                ]
            ),
        )


@dataclass(frozen=True)
class AvroFileReader:
    """The picklable function that decodes the Avro files named in its rows into Arrow."""

    directory: str
    spark_schema_json: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = utc_arrow_schema(T.StructType.fromJson(json.loads(self.spark_schema_json)))
        fs, root = arrow_filesystem(self.directory)
        for batch in batches:
            for name in batch.column("file").to_pylist():
                with fs.open_input_stream(f"{root}/{name}") as f:
                    rows: list[dict] = []
                    for record in fastavro.reader(f):
                        rows.append(record)
                        if len(rows) >= 10_000:
                            yield pa.RecordBatch.from_pylist(rows, schema=schema)
                            rows = []
                    if rows:
                        yield pa.RecordBatch.from_pylist(rows, schema=schema)


def avro_value(value: Any) -> Any:
    """Arrow's Python values as fastavro takes them: maps arrive as lists of pairs."""
    if isinstance(value, dict):
        return {k: avro_value(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {k: avro_value(v) for k, v in value}
        return [avro_value(v) for v in value]
    return value


__all__ = [
    "EXACT",
    "MANIFEST",
    "NEW_OFFSETS",
    "Comparison",
    "ExportReport",
    "CarriedConfig",
    "LogImage",
    "PartitionOffsets",
    "ReplayError",
    "RestoreReport",
    "RestoreSource",
    "RestoreTargetError",
    "compare_images",
    "export_state",
    "read_export",
    "read_manifest",
    "replay",
    "verify_export",
]
