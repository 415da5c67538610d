"""Export and verification without Spark: a log's latest records to Avro, on the driver alone.

The same files as `sinks.reading.export.export_state` writes (Avro object container
files with the schema in every header, and ``_manifest.json`` naming the files, the
counts, the log's config and each partition's offsets), written from the state
reader's plan (`sinks.reading.arrow_state.StatePlan.latest`) instead of Spark tasks:
no session to start, so a small log exports in about a second instead of Spark's
start-up. One file per export; records stream through batch by batch, so memory is
bounded as for `read_state_batches`.

An export holds each (partition, key)'s latest record, tombstones included, with
every column of the log (`sinks.reading.export_format` says why). `verify_export_arrow`
compares an export with the log at the version it was taken from, and
`verify_restore_arrow` a restored log with its source (an export, or a log at a
version), both through `compare_images`: every record and column, the config and the
offsets. Both hold the compared side in memory.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import fastavro
import pyarrow as pa

from sinks.log.filesystems import arrow_filesystem
from sinks.log.location import LogLocation
from sinks.log.log_table import AsOf, LogSnapshot, LogTable
from sinks.log.records import VALUE
from sinks.log.segment_writer import nullable_schema
from sinks.log.uris import normalize_uri
from sinks.reading.arrow_state import StatePlan
from sinks.reading.export import (
    ExportReport,
)
from sinks.reading.export_format import (
    EXACT,
    MANIFEST,
    SPARK_SCHEMA_METADATA,
    CarriedConfig,
    Codec,
    Progress,
    ReplayError,
    RestoreMode,
    avro_schema,
    avro_value,
    check_codec,
    is_faithful,
    offsets_from_json,
    partition_offsets,
    read_manifest,
    write_manifest,
)
from sinks.reading.log_image import (
    Comparison,
    LogImage,
    canonical,
    compare_images,
)

PROGRESS_EVERY_S = 2.0
__all__ = [
    "canonical",
    "export_state_arrow",
    "log_image",
    "export_image",
    "read_export_records",
    "verify_export_arrow",
    "verify_restore_arrow",
]


def export_state_arrow(
    log: LogTable,
    directory: str,
    *,
    codec: Codec = "deflate",
    as_of: AsOf | None = None,
    progress: Progress | None = None,
) -> ExportReport:
    """Write the latest record per (partition, key) of ``log`` to Avro.

    At ``as_of`` (default now, pinned). ``directory`` must not hold an export already.
    Not idempotent: a second call into another directory writes another copy. Raises
    `ReplayError` for a type Avro cannot carry, an unknown codec, or no log at ``log.uri``.
    """
    say = progress or (lambda _line: None)
    started = time.monotonic()
    check_codec(codec)
    uri = log.uri
    snapshot = _snapshot(log, as_of)
    config = CarriedConfig.of(snapshot)
    spark_schema = snapshot.spark_schema
    schema = avro_schema(spark_schema)
    target = normalize_uri(directory)
    fs, root = arrow_filesystem(target)
    if fs.get_file_info(f"{root}/{MANIFEST}").type != pa.fs.FileType.NotFound:
        raise ReplayError(f"{target} already holds an export ({MANIFEST} exists)")
    fs.create_dir(root, recursive=True)
    say(f"export: {uri} at Delta v{snapshot.version} -> {target} ({codec})")
    name = f"part-{uuid.uuid4().hex}.avro"
    records = tombstones = 0
    shown = time.monotonic()
    with fs.open_output_stream(f"{root}/{name}") as out:
        writer = fastavro.write.Writer(
            out,
            fastavro.parse_schema(schema),
            codec=codec,
            metadata={
                SPARK_SCHEMA_METADATA: spark_schema.json(),
                "compacted.sink.log": uri,
                "compacted.sink.version": str(snapshot.version),
            },
        )
        for table in _latest(snapshot):
            for row in table.to_pylist():
                writer.write(avro_value(row))
            records += table.num_rows
            tombstones += table.column(VALUE).null_count
            if time.monotonic() - shown >= PROGRESS_EVERY_S:
                shown = time.monotonic()
                say(f"export: {records} records written, {shown - started:.0f} s")
        writer.flush()
    files: tuple[str, ...] = (name,)
    size = fs.get_file_info(f"{root}/{name}").size or 0
    if records == 0:
        fs.delete_file(f"{root}/{name}")
        files, size = (), 0
    report = ExportReport(
        directory=target,
        log_path=uri,
        log_version=snapshot.version,
        key_columns=config.key_columns,
        codec=codec,
        files=files,
        keys=records - tombstones,
        bytes=size,
        duration_ms=int((time.monotonic() - started) * 1000),
        avro_schema=schema,
        records=records,
        tombstones=tombstones,
        config=config,
        partitions=partition_offsets(snapshot),
    )
    write_manifest(target, report.manifest(spark_schema))
    return report


def _snapshot(log: LogTable, as_of: AsOf | None) -> LogSnapshot:
    snapshot = log.snapshot(as_of)
    if snapshot is None:
        raise ReplayError(f"no compacted log at {log.uri}")
    return snapshot


def _latest(snapshot: LogSnapshot) -> Iterator[pa.Table]:
    """Each (partition, key)'s latest record, every column in the log's order."""
    plan = StatePlan.of(snapshot)
    # As the files are written: a tombstone's null struct holds nulls in required fields,
    # and a file from before a field was added reads it as null.
    schema = nullable_schema(snapshot.arrow_schema)
    for table in plan.latest(schema):
        yield table.select(schema.names)


# -- verification ----------------------------------------------------------------------------


def log_image(log: LogTable, as_of: AsOf | None = None, *, name: str | None = None) -> LogImage:
    """``log`` (at ``as_of``) as a verification sees it: latest records and all."""
    snapshot = _snapshot(log, as_of)
    records = (row for table in _latest(snapshot) for row in table.to_pylist())
    return LogImage(
        name=name or f"log {log.uri} (Delta v{snapshot.version})",
        columns=tuple(snapshot.spark_schema.names),
        records=records,
        config=CarriedConfig.of(snapshot),
        partitions=partition_offsets(snapshot),
    )


def export_image(directory: str, *, name: str | None = None) -> LogImage:
    """A complete export as a verification sees it. An export written before exports carried
    partitions and offsets (format 1) has its key columns and ``value`` only."""
    manifest = read_manifest(directory)
    columns = tuple(f["name"] for f in manifest["spark_schema"]["fields"])
    if is_faithful(manifest):
        config = CarriedConfig.from_json(manifest["config"])
    else:
        config = CarriedConfig(tuple(manifest["key_columns"]), None, {})
    return LogImage(
        name=name or f"export {normalize_uri(directory)}",
        columns=columns,
        records=read_export_records(directory),
        config=config,
        partitions=offsets_from_json(manifest.get("partitions") or {}),
    )


def verify_export_arrow(log: LogTable, directory: str, *, max_examples: int = 10) -> Comparison:
    """Compare an export with ``log`` at the version it was taken from: every record and
    column, the config, each partition's log start and end offsets (`compare_images`)."""
    manifest = read_manifest(directory)
    if not is_faithful(manifest):
        raise ReplayError(
            f"{directory} was written by an older export (key columns and value of live "
            "keys only); export the log again to verify it"
        )
    image = log_image(log, manifest["log_version"])
    exported = export_image(directory)
    return compare_images(image, exported, mode=EXACT, max_examples=max_examples)


def verify_restore_arrow(
    source: str,
    target: LogTable,
    *,
    as_of: AsOf | None = None,
    mode: RestoreMode = EXACT,
    max_examples: int = 10,
) -> Comparison:
    """Compare the restored log ``target`` with its source: an export directory, or a log
    (at ``as_of``, read with the target's storage options).

    ``mode`` is the restore's: new-offsets compares only what that mode keeps, and says so.
    """
    source_log = LogTable(LogLocation.at(source, target.location.storage_options))
    is_log = source_log.snapshot() is not None
    if is_log:
        image = log_image(source_log, as_of)
    else:
        image = export_image(source)
        if mode == EXACT and not is_faithful(read_manifest(source)):
            raise ReplayError(f"{source} is an older export: verify it in new-offsets mode")
    restored = log_image(target)
    if not is_log and not is_faithful(read_manifest(source)):
        restored = LogImage(
            restored.name, image.columns, restored.records, image.config, restored.partitions
        )
    return compare_images(image, restored, mode=mode, max_examples=max_examples)


def read_export_records(directory: str) -> Iterable[dict[str, Any]]:
    """Every record of a complete export, decoded by fastavro (no Spark)."""
    manifest = read_manifest(directory)
    fs, root = arrow_filesystem(normalize_uri(directory))
    for name in manifest["files"]:
        with fs.open_input_stream(f"{root}/{name}") as f:
            yield from fastavro.reader(f)
