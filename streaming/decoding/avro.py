"""Avro values in Confluent's wire format, decoded with fastavro on the executors.

A Confluent-serialized value is a magic byte 0, a 4-byte big-endian schema id, and
the Avro binary body written with that (writer) schema. `ConfluentAvroDecoder` finds
the schema ids of a batch (one small Spark job), fetches the writer schemas on the
driver (from a `streaming.decoding.schema_registry.SchemaStore`: a local directory or file,
or a schema registry over HTTP), and ships them to a ``mapInArrow`` task that
decodes each value with its writer schema and resolves it to the reader schema (Avro
schema resolution, fastavro's). The reader schema is chosen again for every batch:
the subject's newest registered schema, or one the user pins. So when a producer
moves to a v2 schema with a new optional field, the batch's struct gains the field
(the sink's additive schema evolution takes it into the log) and v1 records read its
default. The batch's Spark type is the reader schema's (`streaming.decoding.avro_types`).

Invariants: a null value (a tombstone) stays null and is not an error; a value
that cannot be decoded becomes null *and* gets a reason in the ``_decode_error``
column (the column the sink's dead-letter path reads), so it is never mistaken
for a tombstone. `DecodingHook` applies design.md §12: it fails the batch saying
how many rows and why, or, when the sink quarantines, lets the sink send them to
its dead-letter table. With ``keep_raw`` the original bytes stay in ``value_raw``.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import fastavro
import pyarrow as pa
from fastavro.read import SchemaResolutionError
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sinks.errors import BadInputError
from sinks.log import DECODE_ERROR
from sinks.python_tasks import freeze_imports
from sinks.spark_compat import utc_arrow_schema
from streaming.decoding.avro_types import avro_to_spark
from streaming.decoding.schema_registry import SchemaStore, as_schema

RAW_SUFFIX = "_raw"
MAGIC_BYTE = 0
_HEADER = struct.Struct(">bI")
_DETAIL_CHARS = 160


class ConfluentAvroDecoder:
    """Decodes the ``column`` of a DataFrame from Confluent Avro into the reader schema's type.

    Each value is read with its writer schema (by the schema id in its header) and
    resolved to the reader schema, chosen anew for every batch: the pinned
    ``reader_schema`` when given, else the store's newest schema of ``subject``
    (`SchemaStore.latest_id`). With the newest schema, a v2 producer's new field
    reaches the batch's struct and v1 records read the field's default; with a
    pinned schema the output type stays the same. A writer schema that does not
    resolve to the reader schema (a field's type changed, a new field without a
    default) makes a bad row with the reason in ``_decode_error``.
    """

    def __init__(
        self,
        store: SchemaStore,
        *,
        reader_schema: Any | None = None,
        subject: str | None = None,
        column: str = "value",
        keep_raw: bool = False,
    ) -> None:
        self.store = store
        self.pinned = as_schema(reader_schema) if reader_schema is not None else None
        self.subject = subject
        self.column = column
        self.keep_raw = keep_raw
        self.reader_schema: Any = self.pinned
        self.reader_label = "the pinned reader schema"
        if self.pinned is not None:
            avro_to_spark(self.pinned)  # fails now, not at the first batch, when unmappable

    @property
    def data_type(self) -> T.DataType:
        """The Spark type of the current reader schema (the last batch's)."""
        if self.reader_schema is None:
            self.choose_reader_schema()
        return avro_to_spark(self.reader_schema)

    def choose_reader_schema(self) -> Any:
        """The reader schema for the next batch: the pinned one, or the subject's newest."""
        if self.pinned is None:
            schema_id = self.store.latest_id(self.subject)
            self.reader_schema = self.store.get(schema_id)
            of = f" of subject {self.subject!r}" if self.subject else ""
            self.reader_label = f"schema id {schema_id}, the newest{of}"
        return self.reader_schema

    def output_schema(self, input_schema: T.StructType) -> T.StructType:
        """``input_schema`` with ``column`` as the reader schema's type and ``_decode_error``."""
        data_type = self.data_type
        fields = []
        for f in input_schema.fields:
            if f.name == self.column:
                fields.append(T.StructField(self.column, data_type, True))
                if self.keep_raw:
                    fields.append(T.StructField(self.column + RAW_SUFFIX, T.BinaryType(), True))
            else:
                fields.append(f)
        fields.append(T.StructField(DECODE_ERROR, T.StringType(), True))
        return T.StructType(fields)

    def decode(self, df: DataFrame) -> DataFrame:
        """``df`` with ``column`` decoded and ``_decode_error`` added; runs one job to find ids.

        The writer schemas are fetched before the reader schema is chosen, so without
        a subject a batch's new writer id is already known to the store.
        """
        writers = self._writer_schemas(df)
        self.choose_reader_schema()
        schema = self.output_schema(df.schema)
        task = _DecodeTask(
            column=self.column,
            keep_raw=self.keep_raw,
            writer_schemas=json.dumps({str(k): v for k, v in writers.items()}),
            reader_schema=json.dumps(self.reader_schema),
            reader_label=self.reader_label,
            output_schema=schema.json(),
        )
        return df.mapInArrow(task, schema)

    def _writer_schemas(self, df: DataFrame) -> dict[int, Any]:
        value = F.col(self.column)
        headers = (
            df.filter(value.isNotNull() & (F.octet_length(value) >= _HEADER.size))
            .select(F.substring(value, 1, _HEADER.size).alias("h"))
            .distinct()
            .collect()
        )
        writers = {}
        for row in headers:
            magic, schema_id = _HEADER.unpack(bytes(row["h"]))
            if magic == MAGIC_BYTE:
                schema = self.store.get(schema_id)
                if schema is not None:
                    writers[schema_id] = schema
        return writers


@dataclass(frozen=True)
class _DecodeTask:
    """The picklable function each task runs: Confluent bytes in, reader-schema structs out."""

    column: str
    keep_raw: bool
    writer_schemas: str
    reader_schema: str
    reader_label: str
    output_schema: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_imports()
        reader = fastavro.parse_schema(json.loads(self.reader_schema))
        writers = {
            int(k): fastavro.parse_schema(v) for k, v in json.loads(self.writer_schemas).items()
        }
        out_schema = utc_arrow_schema(T.StructType.fromJson(json.loads(self.output_schema)))
        value_type = out_schema.field(self.column).type
        for batch in batches:
            decoded, errors = [], []
            raw = batch.column(self.column).to_pylist()
            for payload in raw:
                record, error = _decode(payload, writers, reader, self.reader_label)
                decoded.append(_arrow_value(record))
                errors.append(error)
            columns = []
            for name in out_schema.names:
                if name == self.column:
                    columns.append(pa.array(decoded, type=value_type))
                elif name == self.column + RAW_SUFFIX and self.keep_raw:
                    columns.append(pa.array(raw, type=pa.binary()))
                elif name == DECODE_ERROR:
                    columns.append(pa.array(errors, type=pa.string()))
                else:
                    columns.append(batch.column(name))
            yield pa.RecordBatch.from_arrays(columns, schema=out_schema)


def _decode(
    payload: bytes | None, writers: Mapping[int, Any], reader: Any, reader_label: str
) -> tuple[Any, str | None]:
    if payload is None:
        return None, None  # a tombstone stays a tombstone
    if len(payload) < _HEADER.size:
        return None, f"value of {len(payload)} bytes is shorter than the Confluent header"
    magic, schema_id = _HEADER.unpack_from(payload)
    if magic != MAGIC_BYTE:
        return None, f"magic byte {magic} is not Confluent's 0"
    writer = writers.get(schema_id)
    if writer is None:
        return None, f"unknown schema id {schema_id}"
    try:
        body = io.BytesIO(payload[_HEADER.size :])
        record = fastavro.schemaless_reader(body, writer, reader)
    except SchemaResolutionError as e:
        return None, _unresolvable(schema_id, reader_label, e)
    except Exception as e:  # fastavro raises many types for a corrupt body
        return None, f"Avro body does not decode with schema id {schema_id}: {type(e).__name__}"
    if body.tell() != len(payload) - _HEADER.size:
        return None, f"Avro body has trailing bytes after schema id {schema_id}'s record"
    return record, None


def _unresolvable(schema_id: int, reader_label: str, error: Exception) -> str:
    """The reason for a writer schema that Avro resolution cannot read as the reader schema."""
    detail = str(error)
    if len(detail) > _DETAIL_CHARS:  # fastavro prints whole schemas for a record name mismatch
        detail = detail[:_DETAIL_CHARS] + "..."
    return (
        f"writer schema id {schema_id} does not resolve to the reader schema "
        f"({reader_label}): {detail}; make the producer's schema backward compatible "
        "(new fields with defaults, no type changes) or pin a reader_schema it resolves to"
    )


def _arrow_value(value: Any) -> Any:
    """fastavro's Python values as pyarrow takes them (UUIDs become text)."""
    if isinstance(value, dict):
        return {k: _arrow_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_arrow_value(v) for v in value]
    if type(value).__name__ == "UUID":
        return str(value)
    return value


class DecodingHook:
    """A foreachBatch hook: decode the batch, apply design.md §12, then hand it to ``hook``.

    When rows are undecodable and ``quarantine`` is False the batch fails with
    `BadInputError` saying how many and why, and nothing is written; with
    ``quarantine`` (the sink has a dead-letter table) the ``_decode_error``
    column goes to the sink, which sends those rows to its dead-letter table.
    """

    def __init__(
        self,
        hook: Callable[[DataFrame, int], None],
        decoder: ConfluentAvroDecoder,
        *,
        quarantine: bool = False,
    ) -> None:
        self.hook = hook
        self.decoder = decoder
        self.quarantine = quarantine

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        decoded = self.decoder.decode(batch_df).persist()
        try:
            reasons = (
                decoded.filter(F.col(DECODE_ERROR).isNotNull())
                .groupBy(DECODE_ERROR)
                .count()
                .collect()
            )
            bad = sum(r["count"] for r in reasons)
            if bad and not self.quarantine:
                total = decoded.count()
                why = "; ".join(
                    f"{r['count']}: {r[DECODE_ERROR]}"
                    for r in sorted(reasons, key=lambda r: -r["count"])[:5]
                )
                raise BadInputError(
                    f"batch {batch_id}: {bad} of {total} rows have an undecodable Avro "
                    f"'{self.decoder.column}' ({why}); nothing was written"
                )
            self.hook(decoded if bad else decoded.drop(DECODE_ERROR), batch_id)
        finally:
            decoded.unpersist()
