"""Export for disaster recovery: a log's latest records out to Avro, with Spark.

`export_state` pins one Delta version and has the executors write Avro object
container files with the codec the caller chose; the driver then writes the manifest:
the files, the counts, the config and the offsets (`sinks.reading.export_format`).
`read_export` reads the records back as a DataFrame; `verify_export` compares an
export with the log version it was taken from, every record and column.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from sinks.cleaner.rules import latest_records
from sinks.log.filesystems import arrow_filesystem
from sinks.log.log_table import (
    AsOf,
    LogSnapshot,
    LogTable,
)
from sinks.log.uris import normalize_uri
from sinks.reading.export_format import (
    EXPORT_FORMAT,
    MANIFEST,
    SPARK_SCHEMA_METADATA,
    AvroFileReader,
    AvroFileWriter,
    CarriedConfig,
    Codec,
    PartitionOffsets,
    Progress,
    ReplayError,
    avro_schema,
    check_codec,
    offsets_to_json,
    partition_offsets,
    read_manifest,
    write_manifest,
)
from sinks.reading.log_image import (
    Comparison,
)
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


_WRITTEN_DDL = "path string, records long, tombstones long, bytes long"


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
    snapshot = sink.log_table.snapshot(as_of)
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
    records = log.read(spark, snapshot)
    return latest_records(records, config.keys.partitioned()).select(*snapshot.spark_schema.names)


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

    return verify_export_arrow(sink.log_table, directory, max_examples=max_examples)
