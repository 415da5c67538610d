"""An export on disk, and what travels beside its records.

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

This module is the format both ways share: the ``_manifest.json`` (`MANIFEST`, written
last: an export without one is incomplete), Spark types as Avro, and the picklable
functions executors run to write and read Avro object container files (fastavro, the
schema in every header). `sinks.reading.export` writes an export,
`sinks.reading.arrow_export` the same files without Spark, `sinks.reading.replay`
restores one, and `sinks.reading.log_image` compares two.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import fastavro
import pyarrow as pa
from pyspark.sql import types as T

from sinks.errors import ReplayError
from sinks.log.filesystems import arrow_filesystem
from sinks.log.history_window import table_properties
from sinks.log.log_keys import (
    LogKeys,
    log_keys,
)
from sinks.log.log_table import (
    LogSnapshot,
)
from sinks.log.records import DELETE_HORIZON_MS, VALUE
from sinks.log.uris import normalize_uri
from sinks.python_tasks import freeze_imports
from sinks.spark_compat import utc_arrow_schema

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


_RECORD_NAME = "CompactedState"


NOT_CARRIED = (DELETE_HORIZON_MS,)


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

    @property
    def keys(self) -> LogKeys:
        """The log's keys (`LogKeys`), as the export carries them."""
        return LogKeys(key_columns=self.key_columns, sequence_column=self.sequence_column)

    @classmethod
    def of(cls, snapshot: LogSnapshot) -> CarriedConfig:
        keys = log_keys(snapshot, read_only=True)
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


@dataclass(frozen=True)
class AvroFileWriter:
    """The picklable function each export task runs: its rows into one Avro container file."""

    directory: str
    avro_schema: dict
    codec: str
    metadata: dict[str, str]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_imports()
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
        freeze_imports()
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
