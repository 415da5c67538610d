"""Turning a micro-batch into log records: Kafka's producer-side checks and offset
assignment (``LogValidator``).

A batch arrives with key column(s) and ``value``, and perhaps the other columns of
Spark's Kafka source. `prepare_batch` adds what the log needs (``partition``,
``offset`` when absent, ``timestamp``, ``delete_horizon_ms``) as a pure DataFrame
→ DataFrame function. The rest runs on Arrow, where the rows are (an executor's append
task, or the data source's driver): `sinks.produce.validity.RecordValidator` counts what
is wrong with the records, per partition, into a `BatchReport` whose `problems` say
what, which column and how many rows; `OffsetAssigner` numbers records per partition
from the log end offset in input order, and `drop_below_log_end` drops Kafka records
the log already holds. One place for the checks, whichever path appends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from sinks.errors import BadInputError, SchemaMismatchError
from sinks.log.records import (
    DECODE_ERROR,
    DELETE_HORIZON_MS,
    INPUT_ORDER,
    METADATA_COLUMNS,
    OFFSET,
    PARTITION,
    TIMESTAMP,
    TRANSIENT_COLUMNS,
    VALUE,
    at_or_above,
    sql_name,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sinks.log.log_keys import LogKeys


@dataclass(frozen=True)
class PreparedBatch:
    """A batch with the log's columns; ``has_offsets`` when offsets came with it (Kafka input)."""

    df: DataFrame
    has_offsets: bool


def prepare_batch(batch: DataFrame, *, keys: LogKeys, now_ms: int) -> PreparedBatch:
    """Add the log's metadata columns; columns other than keys and metadata are payload.

    Without Kafka offsets, ``_input_order`` records the input order to number by; a
    decoder's ``_decode_error`` column is kept for the checks. Both are transient.
    Raises `BadInputError` when a key, ``value`` or the sequence column is missing.
    """
    key_columns, sequence_column = keys.key_columns, keys.sequence_column
    columns = set(batch.columns)
    for name in [*key_columns, VALUE, *([sequence_column] if sequence_column else [])]:
        if name not in columns:
            raise SchemaMismatchError(
                f"batch has no column {name!r}; it has {sorted(columns)}; nothing was written"
            )
    if DELETE_HORIZON_MS in columns:
        raise SchemaMismatchError(f"column {DELETE_HORIZON_MS!r} is reserved for the cleaner")
    has_offsets = OFFSET in columns
    reserved = (*key_columns, VALUE, *METADATA_COLUMNS, DECODE_ERROR)
    payload = [c for c in batch.columns if c not in reserved]
    given = {c: sql_name(c) for c in (PARTITION, OFFSET, TIMESTAMP) if c in columns}
    expressions = [
        *[sql_name(k) for k in key_columns],
        sql_name(VALUE),
        f"CAST({given.get(PARTITION, '0')} AS INT) AS {sql_name(PARTITION)}",
        f"CAST({given.get(OFFSET, 'NULL')} AS BIGINT) AS {sql_name(OFFSET)}",
        f"CAST({given[TIMESTAMP]} AS TIMESTAMP) AS {sql_name(TIMESTAMP)}"
        if TIMESTAMP in given
        else f"timestamp_millis({int(now_ms)}) AS {sql_name(TIMESTAMP)}",
        *[sql_name(c) for c in payload],
        f"CAST(NULL AS BIGINT) AS {sql_name(DELETE_HORIZON_MS)}",
        *([] if has_offsets else [f"monotonically_increasing_id() AS {sql_name(INPUT_ORDER)}"]),
        *([sql_name(DECODE_ERROR)] if DECODE_ERROR in columns else []),
    ]
    # One projection, built in one call: a chain of withColumn is one analysis each.
    return PreparedBatch(batch.selectExpr(*expressions), has_offsets)


def log_columns(df: DataFrame) -> DataFrame:
    """``df`` without the transient columns: what the log stores."""
    return df.drop(*[c for c in TRANSIENT_COLUMNS if c in df.columns])


@dataclass(frozen=True)
class PartitionCounts:
    """What the checks counted in one partition's rows of a batch (all zero but ``rows``: valid)."""

    rows: int = 0
    null_keys: int = 0
    oversized_values: int = 0
    null_offsets: int = 0
    repeated_offsets: int = 0
    undecodable: int = 0
    null_sequence_tombstones: int = 0
    redelivered: int = 0  # Kafka records below the log end offset, dropped once proven obsolete

    def __add__(self, other: PartitionCounts) -> PartitionCounts:
        return PartitionCounts(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    @property
    def bad(self) -> int:
        """How many problems were counted (a row may count twice); redelivered rows are none."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name not in _NOT_PROBLEMS)


_NOT_PROBLEMS = ("rows", "redelivered")


COUNT_COLUMNS = tuple(f.name for f in fields(PartitionCounts))


@dataclass(frozen=True)
class BatchReport:
    """What the checks found in a batch, per value of its ``partition`` column (None included)."""

    partitions: Mapping[int | None, PartitionCounts] = field(default_factory=dict)

    @classmethod
    def merged(cls, counts: Iterable[tuple[int | None, PartitionCounts]]) -> BatchReport:
        """One report from per-partition counts, as tasks send them (a partition may repeat)."""
        merged: dict[int | None, PartitionCounts] = {}
        for partition, c in counts:
            merged[partition] = merged.get(partition, PartitionCounts()) + c
        return cls(merged)

    def _total(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.partitions.values())

    @property
    def rows(self) -> int:
        return self._total("rows")

    @property
    def redelivered(self) -> int:
        """Kafka records dropped below the log end offset (proven obsolete, design.md §48)."""
        return self._total("redelivered")

    @property
    def null_partitions(self) -> int:
        return self.partitions[None].rows if None in self.partitions else 0

    @property
    def negative_partitions(self) -> int:
        return sum(c.rows for p, c in self.partitions.items() if p is not None and p < 0)

    def problems(self, *, keys: LogKeys, message_max_bytes: int) -> list[str]:
        """Human-readable descriptions of everything that makes the batch unwritable."""
        found = []
        rows = self.rows
        key_names = ", ".join(repr(k) for k in keys.key_columns)
        if null_keys := self._total("null_keys"):
            found.append(
                f"{null_keys} of {rows} rows have a null key ({key_names}); "
                "a compacted log cannot hold a record without a key"
            )
        if self.null_partitions:
            found.append(f"{self.null_partitions} of {rows} rows have a null 'partition'")
        if self.negative_partitions:
            found.append(f"{self.negative_partitions} of {rows} rows have a negative 'partition'")
        if oversized := self._total("oversized_values"):
            found.append(
                f"{oversized} of {rows} rows have a value larger than "
                f"message.max.bytes ({message_max_bytes} bytes)"
            )
        if undecodable := self._total("undecodable"):
            found.append(
                f"{undecodable} of {rows} rows have an undecodable payload ({DECODE_ERROR})"
            )
        if unordered := self._total("null_sequence_tombstones"):
            found.append(
                f"{unordered} of {rows} rows are tombstones whose sequence column "
                f"{keys.sequence_column!r} is null: a null sequence sorts lowest, so such a "
                "tombstone would never delete its key; give it the sequence of the delete it "
                "stands for (for Debezium input, value_format='debezium-json' does), or drop it"
            )
        valid = sorted((p, c) for p, c in self.partitions.items() if p is not None and p >= 0)
        for partition, c in valid:
            if c.null_offsets:
                found.append(f"{c.null_offsets} rows of partition {partition} have a null 'offset'")
            if c.repeated_offsets:
                found.append(
                    f"partition {partition} has {c.repeated_offsets} rows whose 'offset' "
                    "repeats another row's"
                )
        return found


def raise_for_problems(problems: list[str], *, batch_id: int) -> None:
    """Raise `BadInputError` listing ``problems``, if any."""
    if problems:
        raise BadInputError(f"batch {batch_id}: " + "; ".join(problems) + "; nothing was written")


class OffsetAssigner:
    """Numbers records per partition from its log end offset, in arrival order (contiguous).

    Kafka's leader assigns offsets the same way. Fed one task's valid rows batch by
    batch; each partition's numbering continues across batches.
    """

    def __init__(self, log_end_offsets: Mapping[int, int]) -> None:
        self._next = dict(log_end_offsets)

    def assign(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        partitions = batch.column(PARTITION).to_numpy(zero_copy_only=False)
        offsets = np.empty(batch.num_rows, dtype=np.int64)
        for p in np.unique(partitions).tolist():
            where = np.flatnonzero(partitions == p)
            start = self._next.get(p, 0)
            offsets[where] = np.arange(start, start + len(where))
            self._next[p] = start + len(where)
        index = batch.schema.get_field_index(OFFSET)
        return batch.set_column(index, OFFSET, pa.array(offsets))


def drop_below_log_end(batch: pa.RecordBatch, log_end_offsets: Mapping[int, int]) -> pa.RecordBatch:
    """Kafka records at or above their partition's log end offset (the rest are in the log)."""
    return at_or_above(batch, log_end_offsets)
