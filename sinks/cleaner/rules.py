"""What a pass keeps, each rule once, for both engines side by side: Spark and Arrow.

The latest record per key (design.md §3, with a ``sequence_column`` §13's order), then
KIP-534 on the tombstones kept (§7, held by registered consumers §20). A pass runs the
Arrow versions inside its tasks (`sinks.cleaner.recopy_task.RecopyTask`); the Spark
versions are the reference that tests and readers hold a pass to (``retain_latest``),
and ``tests/cleaner/test_rules.py`` checks that both agree. Every function is pure: the
Spark ones return a lazy DataFrame, the Arrow ones a new table; none commits or raises
beyond what Spark or Arrow raise on a bad column.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from sinks.log.latest import latest_offsets
from sinks.log.log_keys import LogKeys
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, VALUE

if TYPE_CHECKING:  # the Arrow readers import this module without pyspark (design.md §59)
    from pyspark.sql import DataFrame

_LATEST = "_latest"

# -- latest per key ------------------------------------------------------------------------


def latest_records(df: DataFrame, keys: LogKeys) -> DataFrame:
    """Spark: one row per key (``keys``' columns), its newest record (highest sequence
    then offset), all columns (a ``max_by`` over a struct of every column)."""
    from pyspark.sql import functions as F

    key_columns, sequence_column = keys.key_columns, keys.sequence_column
    order = F.struct(*([F.col(sequence_column)] if sequence_column else []), F.col(OFFSET))
    rest = [c for c in df.columns if c not in key_columns]
    latest = df.groupBy(*key_columns).agg(F.max_by(F.struct(*rest), order).alias(_LATEST))
    return latest.select(*key_columns, *[F.col(f"{_LATEST}.{c}").alias(c) for c in rest])


def spark_latest_offsets(records: DataFrame, keys: LogKeys) -> DataFrame:
    """Spark: (key columns, offset) of each key's newest record, from narrow columns.

    Without a sequence ``max(offset)``; with one ``max(struct(sequence, offset))``, the
    order `latest_records` uses.
    """
    from pyspark.sql import functions as F

    group, sequence_column = list(keys.key_columns), keys.sequence_column
    if sequence_column is None or sequence_column in (*group, OFFSET):
        return records.groupBy(*group).agg(F.max(OFFSET).alias(OFFSET))
    order = F.struct(F.col(sequence_column), F.col(OFFSET))
    latest = records.groupBy(*group).agg(F.max(order).alias(_LATEST))
    return latest.select(*group, F.col(f"{_LATEST}.{OFFSET}").alias(OFFSET))


def arrow_latest_offsets(records: pa.Table, keys: LogKeys) -> pa.Table:
    """Arrow: (key columns, offset) of each key's newest record: `latest_offsets`
    over a table's columns, for readers (`sinks.reading.arrow_state`)."""
    group, sequence_column = list(keys.key_columns), keys.sequence_column
    sequence = None
    if sequence_column is not None and sequence_column not in (*group, OFFSET):
        sequence = records.column(sequence_column)
    distinct, newest = latest_offsets(records.select(group), records.column(OFFSET), sequence)
    return distinct.append_column(OFFSET, pa.array(newest, pa.int64()))


# -- tombstones (KIP-534) -------------------------------------------------------------------


def drop_tombstones(df: DataFrame) -> DataFrame:
    """Spark: records whose value is not null (the live state)."""
    from pyspark.sql import functions as F

    return df.filter(F.col(VALUE).isNotNull())


def drop_expired_tombstones(
    df: DataFrame, *, pass_start_ms: int, held_below: Mapping[int, int] | None = None
) -> DataFrame:
    """Spark: remove tombstones whose delete horizon lies before this pass's start, except
    those at or above their partition's ``held_below``."""
    from pyspark.sql import functions as F

    expired = (
        F.col(VALUE).isNull()
        & F.col(DELETE_HORIZON_MS).isNotNull()
        & (F.col(DELETE_HORIZON_MS) < F.lit(pass_start_ms))
    )
    if held_below:
        floor = F.create_map(*[F.lit(x) for kv in held_below.items() for x in kv])
        expired = expired & ~F.coalesce(F.col(OFFSET) >= floor[F.col(PARTITION)], F.lit(False))
    return df.filter(~expired)


def stamp_delete_horizon(
    df: DataFrame, *, pass_start_ms: int, delete_retention_ms: int
) -> DataFrame:
    """Spark: give each unstamped tombstone the horizon ``pass_start_ms + delete_retention_ms``."""
    from pyspark.sql import functions as F

    unstamped = F.col(VALUE).isNull() & F.col(DELETE_HORIZON_MS).isNull()
    horizon = F.lit(pass_start_ms + delete_retention_ms).cast("long")
    return df.withColumn(
        DELETE_HORIZON_MS, F.when(unstamped, horizon).otherwise(F.col(DELETE_HORIZON_MS))
    )


def apply_tombstone_rules(
    df: DataFrame,
    *,
    pass_start_ms: int,
    delete_retention_ms: int,
    held_below: Mapping[int, int] | None = None,
) -> DataFrame:
    """Spark: KIP-534 on kept records, one row at a time: drop expired, stamp new ones."""
    kept = drop_expired_tombstones(df, pass_start_ms=pass_start_ms, held_below=held_below)
    return stamp_delete_horizon(
        kept, pass_start_ms=pass_start_ms, delete_retention_ms=delete_retention_ms
    )


def apply_arrow_tombstone_rules(
    table: pa.Table, *, pass_start_ms: int, delete_retention_ms: int, held_below: int | None = None
) -> pa.Table:
    """Arrow: `apply_tombstone_rules` over the rows of one partition (``held_below`` is its
    consumers' hold)."""
    tombstone = pc.is_null(table.column(VALUE))
    horizon = table.column(DELETE_HORIZON_MS)
    expired = pc.and_(
        tombstone, pc.fill_null(pc.less(horizon, pa.scalar(pass_start_ms, pa.int64())), False)
    )
    if held_below is not None:
        expired = pc.and_(expired, pc.less(table.column(OFFSET), held_below))
    if pc.any(expired).as_py():
        table = table.filter(pc.invert(expired))
        tombstone = pc.is_null(table.column(VALUE))
        horizon = table.column(DELETE_HORIZON_MS)
    unstamped = pc.and_(tombstone, pc.is_null(horizon))
    if not pc.any(unstamped).as_py():
        return table
    stamp = pa.scalar(pass_start_ms + delete_retention_ms, horizon.type)
    index = table.schema.get_field_index(DELETE_HORIZON_MS)
    return table.set_column(index, table.schema.field(index), pc.if_else(unstamped, stamp, horizon))


# -- the whole rule -------------------------------------------------------------------------


def retain_latest(
    df: DataFrame,
    *,
    keys: LogKeys,
    pass_start_ms: int,
    delete_retention_ms: int,
) -> DataFrame:
    """Spark: what a pass over every record of ``df`` keeps: latest per (partition, key),
    then KIP-534; ``df``'s columns in their order."""
    return (
        latest_records(df, keys.partitioned())
        .transform(
            lambda d: apply_tombstone_rules(
                d, pass_start_ms=pass_start_ms, delete_retention_ms=delete_retention_ms
            )
        )
        .select(*df.columns)
    )
