"""Export and verification without Spark: a state snapshot to Avro, on the driver alone.

The same files as `sinks.reading.replay.export_state` writes (Avro object
container files with the schema in every header, ``_manifest.json`` naming the
files, the key count, the log and its version, and the Spark schema that
`read_export` and ``replay`` read back), written from `read_state_batches`
instead of Spark tasks: no session to start, so a small log exports in about a
second instead of Spark's start-up. One file per export; records stream through
batch by batch, so memory is bounded as for `read_state_batches`.

An export holds what ``state()`` holds: the key columns and ``value``.
`verify_export_arrow` compares an export with `read_state` at the version it was
taken from, row for row (as a multiset of records); it holds both in memory.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

import fastavro
import pyarrow as pa
from pyspark.sql import types as T

from sinks.log.log_keys import log_keys
from sinks.log.log_table import AsOf, LogTable
from sinks.log.records import VALUE
from sinks.log.storage import arrow_filesystem, normalize_uri
from sinks.reading.arrow_state import read_state_batches
from sinks.reading.replay import (
    MANIFEST,
    SPARK_SCHEMA_METADATA,
    Codec,
    ExportReport,
    Progress,
    ReplayError,
    Verification,
    avro_schema,
    avro_value,
    check_codec,
    read_manifest,
)

PROGRESS_EVERY_S = 2.0


def export_state_arrow(
    log_path: str,
    directory: str,
    *,
    codec: Codec = "deflate",
    as_of: AsOf | None = None,
    storage_options: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> ExportReport:
    """Write the state of the log at ``log_path`` (``as_of``, default now, pinned) to Avro.

    ``directory`` must not hold an export already. Not idempotent: a second call into
    another directory writes another copy. Raises `ReplayError` for a type Avro
    cannot carry, an unknown codec, or no log at ``log_path``.
    """
    say = progress or (lambda _line: None)
    started = time.monotonic()
    check_codec(codec)
    uri = normalize_uri(log_path)
    snapshot = LogTable(uri, storage_options).snapshot(as_of, repair=False)
    if snapshot is None:
        raise ReplayError(f"no compacted log at {log_path}")
    keys = log_keys(snapshot).key_columns
    spark_schema = state_spark_schema(snapshot.spark_schema, keys)
    schema = avro_schema(spark_schema)
    target = normalize_uri(directory)
    fs, root = arrow_filesystem(target)
    if fs.get_file_info(f"{root}/{MANIFEST}").type != pa.fs.FileType.NotFound:
        raise ReplayError(f"{target} already holds an export ({MANIFEST} exists)")
    fs.create_dir(root, recursive=True)
    say(f"export: state of {uri} at Delta v{snapshot.version} -> {target} ({codec})")
    columns = spark_schema.names
    batches = read_state_batches(uri, snapshot.version, storage_options)
    name = f"part-{uuid.uuid4().hex}.avro"
    records = 0
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
        for batch in batches:
            for row in batch.select(columns).to_pylist():
                writer.write(avro_value(row))
            records += batch.num_rows
            if time.monotonic() - shown >= PROGRESS_EVERY_S:
                shown = time.monotonic()
                say(f"export: {records} keys written, {shown - started:.0f} s")
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
        key_columns=keys,
        codec=codec,
        files=files,
        keys=records,
        bytes=size,
        duration_ms=int((time.monotonic() - started) * 1000),
        avro_schema=schema,
    )
    manifest = {**asdict(report), "spark_schema": json.loads(spark_schema.json())}
    with fs.open_output_stream(f"{root}/{MANIFEST}") as out:
        out.write(json.dumps(manifest, indent=2).encode())
    return report


def state_spark_schema(log_schema: T.StructType, key_columns: Iterable[str]) -> T.StructType:
    """The schema of ``state()``: the key columns and ``value`` as the log types them. Pure."""
    fields = {f.name: f for f in log_schema.fields}
    return T.StructType([*(fields[k] for k in key_columns), fields[VALUE]])


def verify_export_arrow(
    log_path: str, directory: str, *, storage_options: Mapping[str, str] | None = None
) -> Verification:
    """Compare an export with `read_state` at the version it was taken from, row for row."""
    manifest = read_manifest(directory)
    columns = [f["name"] for f in manifest["spark_schema"]["fields"]]
    state = read_state_batches(log_path, manifest["log_version"], storage_options)
    in_state = Counter(
        canonical({c: row[c] for c in columns})
        for batch in state
        for row in batch.select(columns).to_pylist()
    )
    exported = Counter(canonical(r) for r in read_export_records(directory))
    return Verification(
        keys_exported=manifest["keys"],
        keys_in_state=sum(in_state.values()),
        missing_from_export=sum((in_state - exported).values()),
        not_in_state=sum((exported - in_state).values()),
    )


def read_export_records(directory: str) -> Iterable[dict[str, Any]]:
    """Every record of a complete export, decoded by fastavro (no Spark)."""
    manifest = read_manifest(directory)
    fs, root = arrow_filesystem(normalize_uri(directory))
    for name in manifest["files"]:
        with fs.open_input_stream(f"{root}/{name}") as f:
            yield from fastavro.reader(f)


def canonical(record: Mapping[str, Any]) -> str:
    """A record as comparable text: Arrow's and Avro's Python values alike (maps as dicts)."""
    return json.dumps(avro_value(dict(record)), sort_keys=True, default=str)
