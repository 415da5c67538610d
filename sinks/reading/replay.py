"""Replay for disaster recovery: export a state snapshot to Avro, restore it into a new log.

The compacted log *is* the state; these functions move it out of the lakehouse
and back in. `export_state` pins one Delta version of the log, resolves
``state()`` at that version, and has the executors write Avro object container
files with fastavro (schema in every file's header, codec chosen by the
caller); the driver then writes ``_manifest.json`` naming the files, the key
count, the log and its version. An export without a manifest is incomplete.
`verify_export` compares an export with ``state(as_of=<its version>)`` row for
row. `restore` appends an export (or another log's state) to a new log as one
batch, exactly once: calling it again with the same batch id writes nothing.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

import fastavro
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from sinks.errors import CompactedSinkError
from sinks.log.log_table import AsOf, LogTable
from sinks.log.storage import arrow_filesystem, normalize_uri
from sinks.spark_compat import utc_arrow_schema
from sinks.spark_session import active_session


class StateLog(Protocol):
    """What export, verification and restore need of a log: `CompactedStateSink` is one.

    A protocol, so this module stays below the sink that calls it (reading sits under
    the front in the layers).
    """

    path: str
    key_columns: tuple[str, ...]
    log_table: LogTable
    last_append: Any

    def state(self, as_of: AsOf | None = None) -> DataFrame: ...

    def __call__(self, batch: DataFrame, batch_id: int) -> None: ...


Codec = Literal["null", "deflate", "snappy", "zstandard", "bzip2", "xz", "lz4"]
MANIFEST = "_manifest.json"
SPARK_SCHEMA_METADATA = "compacted.sink.spark.schema"
_WRITTEN_DDL = "path string, records long, bytes long"
_RECORD_NAME = "CompactedState"

Progress = Callable[[str], None]


class ReplayError(CompactedSinkError):
    """Raised when an export cannot be written, read or verified, or a restore cannot start."""


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote: files, key count, and the log version it is a snapshot of."""

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

    def summary(self) -> str:
        return (
            f"exported {self.keys} keys of {self.log_path} (Delta v{self.log_version}) to "
            f"{self.directory}: {len(self.files)} Avro file(s), {self.bytes} B, codec "
            f"{self.codec}, in {self.duration_ms / 1000:.1f} s"
        )


@dataclass(frozen=True)
class Verification:
    """An export compared with ``state()``: counts, and rows present on one side only."""

    keys_exported: int
    keys_in_state: int
    missing_from_export: int
    not_in_state: int

    @property
    def ok(self) -> bool:
        return (
            self.keys_exported == self.keys_in_state
            and self.missing_from_export == 0
            and self.not_in_state == 0
        )

    def summary(self) -> str:
        verdict = "matches" if self.ok else "DOES NOT match"
        return (
            f"export {verdict} state(): {self.keys_exported} keys exported, "
            f"{self.keys_in_state} in state(), {self.missing_from_export} missing from the "
            f"export, {self.not_in_state} not in state()"
        )


def export_state(
    sink: StateLog,
    directory: str,
    *,
    codec: Codec = "deflate",
    as_of: AsOf | None = None,
    progress: Progress | None = None,
) -> ExportReport:
    """Write ``state(as_of)`` (default: the current version, pinned) as Avro container files.

    ``directory`` must not hold an export already. Not idempotent: a second call
    into another directory writes another copy. Raises `ReplayError` for a type
    Avro cannot carry or an unknown codec.
    """
    say = progress or (lambda _line: None)
    started = time.monotonic()
    check_codec(codec)
    snapshot = sink.log_table.snapshot(as_of)
    if snapshot is None:
        raise ReplayError(f"no compacted log at {sink.path}")
    target = normalize_uri(directory)
    fs, root = arrow_filesystem(target)
    if fs.get_file_info(f"{root}/{MANIFEST}").type != pa.fs.FileType.NotFound:
        raise ReplayError(f"{target} already holds an export ({MANIFEST} exists)")
    fs.create_dir(root, recursive=True)
    state = sink.state(as_of=snapshot.version)
    schema = avro_schema(state.schema)
    say(f"export: state() of {sink.path} at Delta v{snapshot.version} -> {target} ({codec})")
    writer = AvroFileWriter(
        directory=target,
        avro_schema=schema,
        codec=codec,
        metadata={
            SPARK_SCHEMA_METADATA: state.schema.json(),
            "compacted.sink.log": sink.path,
            "compacted.sink.version": str(snapshot.version),
        },
    )
    written = [r.asDict() for r in state.mapInArrow(writer, _WRITTEN_DDL).collect()]
    written.sort(key=lambda w: w["path"])
    report = ExportReport(
        directory=target,
        log_path=sink.path,
        log_version=snapshot.version,
        key_columns=sink.key_columns,
        codec=codec,
        files=tuple(w["path"] for w in written),
        keys=sum(w["records"] for w in written),
        bytes=sum(w["bytes"] for w in written),
        duration_ms=int((time.monotonic() - started) * 1000),
        avro_schema=schema,
    )
    manifest = {**asdict(report), "spark_schema": json.loads(state.schema.json())}
    with fs.open_output_stream(f"{root}/{MANIFEST}") as out:
        out.write(json.dumps(manifest, indent=2).encode())
    say(report.summary())
    return report


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


def read_export(spark: SparkSession, directory: str) -> DataFrame:
    """An export's records as a DataFrame with the exported schema (executors decode the files)."""
    manifest = read_manifest(directory)
    schema = T.StructType.fromJson(manifest["spark_schema"])
    target = normalize_uri(directory)
    files = spark.createDataFrame([(f,) for f in manifest["files"]], "file string")
    partitions = max(1, len(manifest["files"]))
    reader = AvroFileReader(directory=target, spark_schema_json=schema.json())
    return files.repartition(partitions).mapInArrow(reader, schema)


def verify_export(sink: StateLog, directory: str) -> Verification:
    """Compare an export with ``sink.state()`` at the version it was taken from, row for row.

    Runs Spark jobs (two anti-joins); column types that Spark cannot compare
    (maps) are not supported.
    """
    manifest = read_manifest(directory)
    spark = active_session()
    exported = read_export(spark, directory)
    state = sink.state(as_of=manifest["log_version"])
    return Verification(
        keys_exported=manifest["keys"],
        keys_in_state=state.count(),
        missing_from_export=state.exceptAll(exported).count(),
        not_in_state=exported.exceptAll(state).count(),
    )


@dataclass(frozen=True)
class RestoreReport:
    """What a restore appended to the target log (nothing when the batch was already there)."""

    source: str
    target: str
    batch_id: int
    records: int
    skipped: bool
    duration_ms: int

    def summary(self) -> str:
        if self.skipped:
            return f"replay into {self.target}: batch {self.batch_id} already committed, skipped"
        return (
            f"restored {self.records} keys from {self.source} into {self.target} "
            f"in {self.duration_ms / 1000:.1f} s"
        )


def restore(
    source: DataFrame,
    target: StateLog,
    *,
    source_name: str,
    batch_id: int = 0,
    progress: Progress | None = None,
) -> RestoreReport:
    """Append a state (key columns + value) to ``target`` as one batch, exactly once.

    ``source`` is `read_export(...)` or another log's ``state(as_of=...)``. Keys get
    offsets from the target's log end. Idempotent per (target sink id, batch id).
    """
    say = progress or (lambda _line: None)
    started = time.monotonic()
    say(f"replay: appending {source_name} to {target.path} as batch {batch_id}")
    target(source, batch_id)
    appended = target.last_append
    report = RestoreReport(
        source=source_name,
        target=target.path,
        batch_id=batch_id,
        records=appended.records if appended else 0,
        skipped=bool(appended and appended.skipped),
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    say(report.summary())
    return report


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
        records = 0
        with fs.open_output_stream(f"{root}/{name}") as out:
            writer = fastavro.write.Writer(out, parsed, codec=self.codec, metadata=self.metadata)
            for batch in batches:
                for row in batch.to_pylist():
                    writer.write(avro_value(row))
                    records += 1
            writer.flush()
        size = fs.get_file_info(f"{root}/{name}").size
        if records == 0:
            fs.delete_file(f"{root}/{name}")
            return
        yield pa.RecordBatch.from_pylist(
            [{"path": name, "records": records, "bytes": size}],
            schema=pa.schema(
                [("path", pa.string()), ("records", pa.int64()), ("bytes", pa.int64())]
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
