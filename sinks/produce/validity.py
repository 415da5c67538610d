"""Which records a compacted log refuses: Kafka's producer-side checks, written once.

Kafka's broker refuses a record without a key on a compacted topic and a record
over ``message.max.bytes`` (``LogValidator``). The rules, in the order a dead
letter names the first one a row breaks (`ROW_RULES`):

- ``undecodable``: a decoder flagged the payload in ``_decode_error``;
- ``null_keys``: a key column is null;
- ``null_partition`` / ``negative_partition``: no partition to append to;
- ``null_offsets``: Kafka input (offsets came with the batch) without an offset;
- ``oversized_values``: a string or binary value longer than ``message.max.bytes``;
- ``null_sequence_tombstones``: with a ``sequence_column``, a tombstone whose sequence is
  null: a null sorts lowest (design.md §13), so it could never delete its key (design.md
  §49); Kafka's tombstone after a change stream's delete event is the usual case.

They run in two places, so they exist in two forms side by side here, and
``tests/produce/test_validity.py`` holds them to the same verdict on the same rows:
`rejection_reason` (Spark, the reason column a batch is split on for dead letters)
and `row_problems` (Arrow, the masks `RecordValidator` counts where the append's
task holds the rows, and `arrow_rejection_reasons`, the data source's dead letters).

One rule is not a row's: a Kafka offset that repeats within a partition says the
batch itself is broken (a source redelivered inside one batch), not that a record
is bad, so no row of it can be chosen as the one to quarantine. `RecordValidator`
counts repeats (input sorted by partition and offset) and the batch fails whole,
with or without a dead-letter table.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sinks.log.log_keys import LogKeys
from sinks.log.records import DECODE_ERROR, OFFSET, PARTITION, VALUE, sql_name
from sinks.produce.log_validator import BatchReport, PartitionCounts

ROW_RULES = (
    "undecodable",
    "null_keys",
    "null_partition",
    "negative_partition",
    "null_offsets",
    "oversized_values",
    "null_sequence_tombstones",
)
"""The per-row rules, in the order a dead letter names the first one broken."""


def reason_text(rule: str, *, keys: LogKeys, message_max_bytes: int) -> str:
    """The dead-letter reason for ``rule`` (``undecodable`` is followed by the decoder's text)."""
    return {
        "undecodable": "undecodable payload: ",
        "null_keys": f"null key ({', '.join(keys.key_columns)})",
        "null_partition": "null partition",
        "negative_partition": "negative partition",
        "null_offsets": "null offset",
        "oversized_values": f"value larger than message.max.bytes ({message_max_bytes} bytes)",
        "null_sequence_tombstones": (
            f"tombstone with a null sequence ({keys.sequence_column!r}): it could never win"
        ),
    }[rule]


# -- Spark: the reason column dead letters split on --------------------------------------


def spark_row_problems(
    df: DataFrame, *, keys: LogKeys, has_offsets: bool, message_max_bytes: int
) -> dict[str, Column]:
    """Each rule that applies to ``df``'s columns, as a boolean Column (true: broken)."""
    return {
        rule: F.expr(sql)
        for rule, sql in spark_row_problems_sql(
            df, keys=keys, has_offsets=has_offsets, message_max_bytes=message_max_bytes
        ).items()
    }


def spark_row_problems_sql(
    df: DataFrame, *, keys: LogKeys, has_offsets: bool, message_max_bytes: int
) -> dict[str, str]:
    """`spark_row_problems` as SQL expressions (a plan built in few calls to the JVM)."""
    columns = set(df.columns)
    checks: dict[str, str] = {}
    if DECODE_ERROR in columns:
        checks["undecodable"] = f"{sql_name(DECODE_ERROR)} IS NOT NULL"
    checks["null_keys"] = " OR ".join(f"{sql_name(k)} IS NULL" for k in keys.key_columns)
    if PARTITION in columns:
        checks["null_partition"] = f"{sql_name(PARTITION)} IS NULL"
        checks["negative_partition"] = f"{sql_name(PARTITION)} < 0"
    if has_offsets and OFFSET in columns:
        checks["null_offsets"] = f"{sql_name(OFFSET)} IS NULL"
    if VALUE in columns and isinstance(df.schema[VALUE].dataType, T.BinaryType | T.StringType):
        checks["oversized_values"] = (
            f"coalesce(octet_length({sql_name(VALUE)}), 0) > {int(message_max_bytes)}"
        )
    sequence = keys.sequence_column
    if sequence is not None and sequence in columns and VALUE in columns:
        checks["null_sequence_tombstones"] = (
            f"{sql_name(VALUE)} IS NULL AND {sql_name(sequence)} IS NULL"
        )
    return {rule: f"({checks[rule]})" for rule in ROW_RULES if rule in checks}


def rejection_reason(
    df: DataFrame, *, keys: LogKeys, has_offsets: bool, message_max_bytes: int
) -> Column:
    """Why a row cannot go into the log, or null when it can (the first rule it breaks)."""
    reason: Column | None = None
    problems = spark_row_problems(
        df, keys=keys, has_offsets=has_offsets, message_max_bytes=message_max_bytes
    )
    for rule, broken in problems.items():
        text = reason_text(rule, keys=keys, message_max_bytes=message_max_bytes)
        message = (
            F.concat(F.lit(text), F.col(DECODE_ERROR)) if rule == "undecodable" else F.lit(text)
        )
        reason = F.when(broken, message) if reason is None else reason.when(broken, message)
    assert reason is not None  # null_keys always applies
    return reason.otherwise(F.lit(None).cast("string"))


# -- Arrow: the masks the append task counts ---------------------------------------------


def row_problems(
    batch: pa.RecordBatch | pa.Table,
    *,
    keys: LogKeys,
    has_offsets: bool,
    message_max_bytes: int,
) -> dict[str, pa.Array]:
    """Each rule that applies to ``batch``'s columns, as a boolean mask (true: broken). Pure."""
    names = set(batch.schema.names)
    checks: dict[str, pa.Array] = {}
    if DECODE_ERROR in names:
        checks["undecodable"] = pc.is_valid(batch.column(DECODE_ERROR))
    first, *rest = keys.key_columns
    null_key = pc.is_null(batch.column(first))
    for k in rest:
        null_key = pc.or_(null_key, pc.is_null(batch.column(k)))
    checks["null_keys"] = null_key
    if PARTITION in names:
        partition = batch.column(PARTITION)
        checks["null_partition"] = pc.is_null(partition)
        checks["negative_partition"] = pc.fill_null(pc.less(partition, 0), False)
    if has_offsets and OFFSET in names:
        checks["null_offsets"] = pc.is_null(batch.column(OFFSET))
    if VALUE in names and _has_length(batch.schema.field(VALUE).type):
        lengths = pc.fill_null(pc.binary_length(batch.column(VALUE)), 0)
        checks["oversized_values"] = pc.greater(lengths, message_max_bytes)
    sequence = keys.sequence_column
    if sequence is not None and sequence in names and VALUE in names:
        checks["null_sequence_tombstones"] = pc.and_(
            pc.is_null(batch.column(VALUE)), pc.is_null(batch.column(sequence))
        )
    return {rule: checks[rule] for rule in ROW_RULES if rule in checks}


def arrow_rejection_reasons(
    batch: pa.RecordBatch | pa.Table,
    *,
    keys: LogKeys,
    has_offsets: bool,
    message_max_bytes: int,
) -> pa.Array:
    """`rejection_reason` on Arrow: per row, the first rule it breaks as text, or null."""
    problems = row_problems(
        batch, keys=keys, has_offsets=has_offsets, message_max_bytes=message_max_bytes
    )
    reasons: list[str | None] = [None] * batch.num_rows
    decode_errors = (
        batch.column(DECODE_ERROR).to_pylist() if DECODE_ERROR in batch.schema.names else None
    )
    for rule, mask in problems.items():
        text = reason_text(rule, keys=keys, message_max_bytes=message_max_bytes)
        for i in np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False)):
            if reasons[i] is None:
                reasons[i] = text + decode_errors[i] if rule == "undecodable" else text
    return pa.array(reasons, pa.string())


_NO_PARTITION = np.iinfo(np.int64).min  # stands in for a null partition when comparing neighbours
_PARTITION_RULES = ("null_partition", "negative_partition")  # counted by grouping on partition


class RecordValidator:
    """Counts, batch by batch, what makes records unwritable (Kafka's ``LogValidator``).

    `row_problems` per row, counted per partition; and, for Kafka input, offsets that
    repeat within a partition. Repeats are found between neighbours, so Kafka input
    must arrive sorted by (partition, offset) across all the batches fed to one
    validator. Not thread-safe; one per task.
    """

    def __init__(self, *, keys: LogKeys, has_offsets: bool, message_max_bytes: int) -> None:
        self.keys = keys
        self.has_offsets = has_offsets
        self.message_max_bytes = message_max_bytes
        self._counts: dict[int | None, PartitionCounts] = {}
        self._last: tuple[int, int] | None = None  # (partition, offset) of the previous row

    def validate(self, batch: pa.RecordBatch | pa.Table) -> bool:
        """Count ``batch``'s problems; True when it has none."""
        if batch.num_rows == 0:
            return True
        partition = batch.column(PARTITION)
        masks: dict[str, pa.Array | np.ndarray] = {
            rule: mask
            for rule, mask in row_problems(
                batch,
                keys=self.keys,
                has_offsets=self.has_offsets,
                message_max_bytes=self.message_max_bytes,
            ).items()
            if rule not in _PARTITION_RULES
        }
        if self.has_offsets:
            masks["repeated_offsets"] = self._repeats(partition, batch.column(OFFSET))
        table = pa.table({PARTITION: partition, **masks})
        grouped = table.group_by(PARTITION, use_threads=False).aggregate(
            [([], "count_all"), *[(name, "sum") for name in masks]]
        )
        clean = True
        for row in grouped.to_pylist():
            counts = PartitionCounts(
                rows=row["count_all"], **{name: int(row[f"{name}_sum"]) for name in masks}
            )
            p = row[PARTITION]
            clean = clean and counts.bad == 0 and p is not None and p >= 0
            self._add(p, counts)
        return clean

    def _repeats(self, partition: pa.Array, offset: pa.Array) -> np.ndarray:
        p = pc.fill_null(partition.cast(pa.int64()), _NO_PARTITION).to_numpy(zero_copy_only=False)
        valid = pc.is_valid(offset).to_numpy(zero_copy_only=False)
        o = pc.fill_null(offset, 0).to_numpy(zero_copy_only=False)
        same = np.zeros(len(o), dtype=bool)
        same[1:] = valid[1:] & valid[:-1] & (p[1:] == p[:-1]) & (o[1:] == o[:-1])
        if self._last is not None and valid[0]:
            same[0] = (int(p[0]), int(o[0])) == self._last
        last = len(o) - 1
        self._last = (int(p[last]), int(o[last])) if valid[last] else None
        return same

    def count_redelivered(self, before: pa.RecordBatch, kept: pa.RecordBatch) -> None:
        """Count, per partition, the rows `drop_below_log_end` took out of ``before``."""
        if before.num_rows == kept.num_rows:
            return
        dropped = Counter(before.column(PARTITION).to_pylist())
        dropped.subtract(kept.column(PARTITION).to_pylist())
        for partition, n in dropped.items():
            if n:
                self._add(partition, PartitionCounts(redelivered=n))

    def _add(self, partition: int | None, counts: PartitionCounts) -> None:
        self._counts[partition] = self._counts.get(partition, PartitionCounts()) + counts

    @property
    def found_problems(self) -> bool:
        """True once any row fed so far is unwritable."""
        return any(c.bad or p is None or p < 0 for p, c in self._counts.items())

    def report(self) -> BatchReport:
        """What was counted so far, per partition value (a copy). Pure."""
        return BatchReport(dict(self._counts))


def _has_length(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_binary(arrow_type)
        or pa.types.is_string(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_large_string(arrow_type)
    )
