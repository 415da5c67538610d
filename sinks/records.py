"""Turning a micro-batch into log records: Kafka's producer-side checks and offset assignment.

A batch arrives with key column(s) and ``value``, and perhaps the other columns of
Spark's Kafka source. `prepare_batch` adds what the log needs (``partition``,
``offset`` when absent, ``timestamp``, ``delete_horizon_ms``); `inspect_batch`
measures in one Spark job what is wrong with it; `assign_offsets` numbers the
records per partition from the log end offset, in input order. All are pure
DataFrame → DataFrame functions apart from the one counting job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sinks.errors import BadInputError, SchemaMismatchError

PARTITION = "partition"
OFFSET = "offset"
TIMESTAMP = "timestamp"
VALUE = "value"
DELETE_HORIZON_MS = "delete_horizon_ms"
INPUT_ORDER = "_input_order"
METADATA_COLUMNS = (PARTITION, OFFSET, TIMESTAMP, DELETE_HORIZON_MS)


@dataclass(frozen=True)
class PreparedBatch:
    """A batch with the log's columns; ``has_offsets`` when offsets came with it (Kafka input)."""

    df: DataFrame
    has_offsets: bool


def prepare_batch(
    batch: DataFrame,
    *,
    key_columns: Sequence[str],
    sequence_column: str | None,
    now_ms: int,
) -> PreparedBatch:
    """Add the log's metadata columns; columns other than keys and metadata are payload.

    Raises `BadInputError` when a key, ``value`` or the sequence column is missing.
    """
    columns = set(batch.columns)
    for name in [*key_columns, VALUE, *([sequence_column] if sequence_column else [])]:
        if name not in columns:
            raise SchemaMismatchError(
                f"batch has no column {name!r}; it has {sorted(columns)}; nothing was written"
            )
    if DELETE_HORIZON_MS in columns:
        raise SchemaMismatchError(f"column {DELETE_HORIZON_MS!r} is reserved for the cleaner")
    has_offsets = OFFSET in columns
    df = batch.withColumn(
        PARTITION,
        F.col(PARTITION).cast("int") if PARTITION in columns else F.lit(0).cast("int"),
    )
    df = df.withColumn(
        TIMESTAMP,
        F.col(TIMESTAMP).cast("timestamp")
        if TIMESTAMP in columns
        else F.timestamp_millis(F.lit(now_ms)),
    )
    df = df.withColumn(DELETE_HORIZON_MS, F.lit(None).cast("long"))
    if has_offsets:
        df = df.withColumn(OFFSET, F.col(OFFSET).cast("long"))
    else:
        df = df.withColumn(OFFSET, F.lit(None).cast("long"))
        df = df.withColumn(INPUT_ORDER, F.monotonically_increasing_id())
    payload = [c for c in batch.columns if c not in (*key_columns, VALUE, *METADATA_COLUMNS)]
    ordered = [*key_columns, VALUE, PARTITION, OFFSET, TIMESTAMP, *payload, DELETE_HORIZON_MS]
    if not has_offsets:
        ordered.append(INPUT_ORDER)
    return PreparedBatch(df.select(*ordered), has_offsets)


def check_schema(batch: T.StructType, log: T.StructType) -> None:
    """Raise `SchemaMismatchError` naming the first column that differs from the log's."""
    expected = {f.name: f.dataType for f in log.fields}
    got = {f.name: f.dataType for f in batch.fields if f.name != INPUT_ORDER}
    for name, data_type in got.items():
        if name not in expected:
            raise SchemaMismatchError(
                f"column {name!r} is not in the log's schema ({', '.join(expected)}); "
                "nothing was written"
            )
        if _strip_nullability(data_type) != _strip_nullability(expected[name]):
            raise SchemaMismatchError(
                f"column {name!r} has type {data_type.simpleString()}, the log has "
                f"{expected[name].simpleString()}; nothing was written"
            )
    for name in expected:
        if name not in got:
            raise SchemaMismatchError(
                f"column {name!r} of the log is missing from the batch; nothing was written"
            )


@dataclass(frozen=True)
class BatchReport:
    """What one counting job found in a batch, per partition."""

    rows: int
    null_keys: int
    null_partitions: int
    negative_partitions: int
    oversized_values: int
    partitions: dict[int, tuple[int, int | None, int | None, int]]  # rows, min/max offset, distinct

    def problems(
        self, *, key_columns: Sequence[str], has_offsets: bool, message_max_bytes: int
    ) -> list[str]:
        """Human-readable descriptions of everything that makes the batch unwritable."""
        found = []
        keys = ", ".join(repr(k) for k in key_columns)
        if self.null_keys:
            found.append(
                f"{self.null_keys} of {self.rows} rows have a null key ({keys}); "
                "a compacted log cannot hold a record without a key"
            )
        if self.null_partitions:
            found.append(f"{self.null_partitions} of {self.rows} rows have a null 'partition'")
        if self.negative_partitions:
            found.append(
                f"{self.negative_partitions} of {self.rows} rows have a negative 'partition'"
            )
        if self.oversized_values:
            found.append(
                f"{self.oversized_values} of {self.rows} rows have a value larger than "
                f"message.max.bytes ({message_max_bytes} bytes)"
            )
        if has_offsets:
            for partition, (rows, low, _high, distinct) in sorted(self.partitions.items()):
                if low is None:
                    found.append(f"{rows} rows of partition {partition} have a null 'offset'")
                elif distinct != rows:
                    found.append(
                        f"partition {partition} has {rows - distinct} rows whose 'offset' "
                        "repeats another row's"
                    )
        return found


def inspect_batch(
    df: DataFrame,
    *,
    key_columns: Sequence[str],
    has_offsets: bool,
    message_max_bytes: int,
) -> BatchReport:
    """Count rows, null keys, bad partitions and oversized values in one Spark job."""
    null_key = F.lit(False)
    for k in key_columns:
        null_key = null_key | F.col(k).isNull()
    value_type = df.schema[VALUE].dataType
    if isinstance(value_type, T.BinaryType | T.StringType):
        oversized = F.coalesce(F.octet_length(VALUE), F.lit(0)) > message_max_bytes
    else:
        oversized = F.lit(False)
    distinct = F.count_distinct(OFFSET) if has_offsets else F.lit(0)
    rows = (
        df.groupBy(PARTITION)
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum(null_key.cast("long")).alias("null_keys"),
            F.sum(oversized.cast("long")).alias("oversized"),
            F.min(OFFSET).alias("low"),
            F.max(OFFSET).alias("high"),
            distinct.alias("distinct"),
        )
        .collect()
    )
    partitions = {}
    null_partitions = negative = 0
    for r in rows:
        if r[PARTITION] is None:
            null_partitions += r["rows"]
        elif r[PARTITION] < 0:
            negative += r["rows"]
        else:
            partitions[r[PARTITION]] = (r["rows"], r["low"], r["high"], r["distinct"])
    return BatchReport(
        rows=sum(r["rows"] for r in rows),
        null_keys=sum(r["null_keys"] or 0 for r in rows),
        null_partitions=null_partitions,
        negative_partitions=negative,
        oversized_values=sum(r["oversized"] or 0 for r in rows),
        partitions=partitions,
    )


def raise_for_problems(problems: list[str], *, batch_id: int) -> None:
    if problems:
        raise BadInputError(f"batch {batch_id}: " + "; ".join(problems) + "; nothing was written")


def assign_offsets(df: DataFrame, log_end_offsets: Mapping[int, int]) -> DataFrame:
    """Number records per partition from its log end offset, in input order (contiguous)."""
    order = Window.partitionBy(PARTITION).orderBy(INPUT_ORDER)
    start = _per_partition(log_end_offsets)
    return df.withColumn(OFFSET, start + F.row_number().over(order) - 1).drop(INPUT_ORDER)


def drop_below_log_end(df: DataFrame, log_end_offsets: Mapping[int, int]) -> DataFrame:
    """Keep Kafka records at or above their partition's log end offset (the rest are in the log)."""
    return df.filter(F.col(OFFSET) >= _per_partition(log_end_offsets))


def _per_partition(values: Mapping[int, int]) -> Column:
    if not values:
        return F.lit(0).cast("long")
    mapping = F.create_map(*[F.lit(x) for kv in sorted(values.items()) for x in kv])
    return F.coalesce(mapping[F.col(PARTITION)], F.lit(0)).cast("long")


def _strip_nullability(data_type: T.DataType) -> str:
    return data_type.simpleString()
