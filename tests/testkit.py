"""Helpers of the tests: a replay oracle, checks on a log's files and offsets, batch frames,
Confluent Avro values."""

from __future__ import annotations

import io
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import types as T

from sinks.log.log_table import LogTable
from sinks.log.segment import Segment
from sinks.maintenance.recovery import list_data_files, referenced_paths
from sinks.produce.append_batch import ArrowRecords
from streaming.decoding.avro import MAGIC_BYTE


class Oracle:
    """What ``state()`` must be: the latest value per key, tombstones removing the key."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}
        self.records = 0

    def apply(self, rows: Iterable[tuple[str, str | None]]) -> None:
        for key, value in rows:
            self.records += 1
            if value is None:
                self.state.pop(key, None)
            else:
                self.state[key] = value


def state_of(sink) -> dict[str, str]:
    """``sink.state()`` as a dict; fails on a key that appears twice."""
    rows = sink.state().collect()
    result = {r["key"]: r["value"] for r in rows}
    assert len(result) == len(rows), "state() holds a key twice"
    return result


def live_offsets(path: str) -> dict[int, list[int]]:
    """Every live record's offset per partition, read straight from the Delta table's files."""
    table = DeltaTable(path).to_pyarrow_table(columns=["partition", "offset"])
    by_partition: dict[int, list[int]] = {}
    for p, o in zip(
        table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True
    ):
        by_partition.setdefault(p, []).append(o)
    return {p: sorted(o) for p, o in by_partition.items()}


def assert_offsets_unique(path: str) -> int:
    """No offset appears twice in a partition; returns how many records were checked."""
    checked = 0
    for partition, offsets in live_offsets(path).items():
        assert len(offsets) == len(set(offsets)), f"partition {partition} repeats an offset"
        checked += len(offsets)
    return checked


def unreferenced_files(path: str) -> list[str]:
    """Data files in the table directory that no commit of the Delta log names."""
    log = LogTable(path)
    snapshot = log.snapshot()
    assert snapshot is not None
    referenced = referenced_paths(log, snapshot)
    return sorted(f.path for f in list_data_files(log) if f.path not in referenced)


_DDL_TYPES = {  # a DDL type name: (Spark's type, Arrow's type Spark hands a task)
    "string": (T.StringType(), pa.string()),
    "int": (T.IntegerType(), pa.int32()),
    "long": (T.LongType(), pa.int64()),
    "bigint": (T.LongType(), pa.int64()),
    "double": (T.DoubleType(), pa.float64()),
    "timestamp": (T.TimestampType(), pa.timestamp("us", tz="UTC")),
    "binary": (T.BinaryType(), pa.binary()),
}


def checkpoint_and_trim(path: str) -> int:
    """Another writer's Delta checkpoint of the latest version of the table at ``path``, and
    its trim of every commit file before it (as a log's segment deleter trims them once they
    are out of its window). Returns the checkpoint's version."""
    table = DeltaTable(path)
    table.create_checkpoint()
    for version in range(table.version()):
        (Path(path) / "_delta_log" / f"{version:020d}.json").unlink()
    return table.version()


def ddl_schemas(ddl: str) -> tuple[T.StructType, pa.Schema]:
    """A flat DDL string (``"key string, value string, partition int"``) as Spark's and
    Arrow's schemas, without a SparkSession (atomic types only: `_DDL_TYPES`)."""
    fields = [(name, _DDL_TYPES[kind.lower()]) for name, kind in map(str.split, ddl.split(","))]
    return (
        T.StructType([T.StructField(name, spark) for name, (spark, _) in fields]),
        pa.schema([(name, arrow) for name, (_, arrow) in fields]),
    )


def arrow_append(sink, rows, schema: str, batch_id: int, spark=None) -> None:
    """``sink(frame_of(rows), batch_id)`` without Spark feeding the rows: the same
    `LogAppender.append` (the Python segment writer, which a small batch takes through
    Spark too), under the app id a direct call uses, then the same hand-over to the
    cleaner (a pass it runs, or ``cleaning="background"``'s worker, needs ``spark``).
    For tests whose subject is the log, not Spark's input; one test per subject keeps
    feeding through ``sink(...)``. Sets ``sink.last_append`` as a call does."""
    struct, arrow = ddl_schemas(schema)
    table = pa.Table.from_pylist([dict(zip(struct.names, row, strict=True)) for row in rows], arrow)
    sink._append(
        spark,
        ArrowRecords(table, struct),
        app_id=sink.transactional_id.app_id(None),
        batch_id=batch_id,
        background=sink.cleaning == "background",
        started=time.monotonic(),
    )


def kv_frame(spark, rows, *, partition: bool = False):
    schema = "key string, value string" + (", partition int" if partition else "")
    return spark.createDataFrame(rows, schema).coalesce(1)


def batch_rows(
    batch_id: int, *, size: int = 24, keys: int = 11
) -> list[tuple[str, str | None, int]]:
    """Deterministic rows of one batch: (key, value or None for a tombstone, partition).

    Keys repeat across and within batches; every 7th row is a tombstone; a key
    always lands in the same partition of two.
    """
    rows = []
    for j in range(size):
        n = (batch_id * 5 + j * 3) % keys
        value = None if (batch_id + j) % 7 == 6 else f"v{batch_id}.{j}"
        rows.append((f"k{n}", value, n % 2))
    return rows


def batch_frame(spark, batch_id: int):
    return spark.createDataFrame(
        batch_rows(batch_id), "key string, value string, partition int"
    ).coalesce(1)


def replay(batch_ids: Iterable[int]) -> Oracle:
    """The oracle after the given batches, in order."""
    oracle = Oracle()
    for b in batch_ids:
        oracle.apply((k, v) for k, v, _ in batch_rows(b))
    return oracle


def bad_rows_frame(spark, batch_id: int):
    """Batch ``batch_id`` plus two rows without a key (bad input)."""
    nulls = spark.createDataFrame(
        [(None, "x", 0), (None, "y", 1)], "key string, value string, partition int"
    )
    return batch_frame(spark, batch_id).union(nulls)


def segment(
    partition: int,
    base: int,
    last: int,
    *,
    size: int = 100,
    records: int | None = None,
    min_ts: int | None = None,
    max_ts: int | None = None,
    horizon: int | None = None,
    path: str | None = None,
) -> Segment:
    """A log segment for planning tests (no file behind it): offsets ``base`` to ``last`` of
    ``partition``, every offset a record unless ``records`` says fewer; timestamps and
    the tombstone horizon unknown unless given. The tests' one `Segment` factory."""
    return Segment(
        partition=partition,
        base_offset=base,
        last_offset=last,
        path=path or f"partition-{partition}/{base:020d}.parquet",
        size_bytes=size,
        num_records=last - base + 1 if records is None else records,
        min_timestamp_ms=min_ts,
        max_timestamp_ms=max_ts,
        min_delete_horizon_ms=horizon,
    )


def encode_confluent(schema_id: int, schema: Any, record: Any) -> bytes:
    """One value in Confluent's wire format: magic byte, 4-byte big-endian schema id, Avro body.

    Written here, apart from `streaming.decoding.avro`'s decoder, so the tests encode the format
    as the producers do rather than with the decoder's own header.
    """
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return struct.pack(">bI", MAGIC_BYTE, schema_id) + body.getvalue()


def vacuum_config():
    """The crash tests' deletion scenario (reliability/driver.py commits with it, or
    test_crash.py for it): every batch cleaned, removed files expire at once."""
    from sinks import CleanerConfig

    return CleanerConfig(
        min_cleanable_dirty_ratio=0.0,
        file_delete_delay_ms=0,
        log_retention_check_interval_ms=3_600_000,
    )
