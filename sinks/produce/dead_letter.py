"""Dead letters: bad rows of a batch quarantined to a Delta table, with the reason (design.md §12).

Kafka refuses a record without a key on a compacted topic and a record over
``message.max.bytes``; a producer then routes it to a dead-letter topic. Here the
sink does both in one call: `sinks.produce.validity.rejection_reason` names what is
wrong with each row (null key, null or negative partition, null Kafka offset, a
value over ``message.max.bytes``, an undecodable payload flagged by a decoder in
the ``_decode_error`` column), the bad rows go to the dead-letter table and the
good rows to the log.

Atomicity without a two-table transaction: the dead-letter commit carries a
Delta ``txn`` (the sink's app id, the batch id) and is made *before* the log
append, which carries the same pair. Both are idempotent, and a replayed batch
(Spark replays an uncommitted batch id with the same rows) recomputes the same
split. So a crash between the two commits leaves the dead letters committed and
the log untouched; the replay skips the dead-letter commit and appends the good
rows. A crash cannot leave good rows written without their dead letters, nor a
batch's dead letters twice.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sinks.log.committer import DELTA_RS, LogCommitter
from sinks.log.location import LogLocation
from sinks.log.log_keys import LogKeys
from sinks.log.records import DECODE_ERROR
from sinks.produce.validity import arrow_rejection_reasons, rejection_reason
from sinks.spark_compat import to_arrow

logger = logging.getLogger("compacted_sink")

REASON = "_dead_letter_reason"

DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("log_path", pa.string()),
        ("app_id", pa.string()),
        ("batch_id", pa.int64()),
        ("reason", pa.string()),
        ("record", pa.string()),
        ("dead_lettered_ms", pa.int64()),
    ]
)


@dataclass(frozen=True)
class SplitBatch:
    """A batch split into rows for the log (``good``) and rows for dead letters (``bad``).

    Both come from one cached evaluation of the batch; `release` frees it once the
    good rows are appended.
    """

    good: DataFrame
    bad: DataFrame
    tagged: DataFrame

    def release(self) -> None:
        self.tagged.unpersist()


def split_batch(
    df: DataFrame,
    *,
    keys: LogKeys,
    has_offsets: bool,
    message_max_bytes: int,
    record_columns: Sequence[str] | None = None,
) -> SplitBatch:
    """Split ``df`` by `rejection_reason`, evaluating it once (cached).

    ``good`` keeps ``df``'s columns except ``_decode_error``; ``bad`` holds the
    dead letters (`as_dead_letters`) of the rows, each ``record`` made of
    ``record_columns`` (default: all of ``df``'s), the columns the batch came with.
    """
    reason = rejection_reason(
        df, keys=keys, has_offsets=has_offsets, message_max_bytes=message_max_bytes
    )
    tagged = df.withColumn(REASON, reason).persist()
    good = tagged.filter(F.col(REASON).isNull()).drop(REASON)
    if DECODE_ERROR in good.columns:
        good = good.drop(DECODE_ERROR)
    bad = tagged.filter(F.col(REASON).isNotNull())
    columns = [c for c in (record_columns or df.columns) if c in df.columns]
    return SplitBatch(good=good, bad=as_dead_letters(bad.select(REASON, *columns)), tagged=tagged)


def as_dead_letters(bad: DataFrame, *, reason: Column | str | None = None) -> DataFrame:
    """``reason`` and ``record`` (the row as JSON; binary as base64) for each bad row.

    ``reason`` defaults to the ``_dead_letter_reason`` column `split_batch` added;
    a string gives every row the same reason (a batch whose schema does not match).
    """
    if reason is None:
        reason_column = F.col(REASON)
    elif isinstance(reason, str):
        reason_column = F.lit(reason)
    else:
        reason_column = reason
    payload = [c for c in bad.columns if c != REASON]
    record = F.to_json(F.struct(*[_jsonable(bad, c) for c in payload]))
    return bad.select(reason_column.alias("reason"), record.alias("record"))


class DeadLetterTable:
    """The dead-letter Delta table at ``location`` (created on the first dead letter).

    Shared by many sinks: each commit is tagged with the sink's app id and batch id.
    """

    def __init__(self, location: LogLocation, *, committer: LogCommitter = DELTA_RS) -> None:
        self.location = location
        self.committer = committer

    @property
    def uri(self) -> str:
        return self.location.uri

    def committed(self, app_id: str, batch_id: int) -> bool:
        """True when this (app id, batch id) already wrote its dead letters."""
        recorded = self.location.txn_version(app_id)  # batch 0 is recorded as 0: not falsy here
        return recorded is not None and recorded >= batch_id

    def write(
        self,
        dead_letters: DataFrame | pa.Table,
        *,
        log_path: str,
        app_id: str,
        batch_id: int,
        now_ms: int,
    ) -> int:
        """Commit ``dead_letters`` (columns ``reason``, ``record``) once per (app id, batch id).

        Idempotent: returns 0 and writes nothing when the pair is already committed.
        A batch without bad rows commits nothing (its replay finds none again).
        The rows are collected on the driver (dead letters are the exception, not the
        stream). Returns how many rows were written.
        """
        if self.committed(app_id, batch_id):
            logger.info("dead letters of batch %s of %s already committed", batch_id, app_id)
            return 0
        if isinstance(dead_letters, pa.Table):
            rows = dead_letters
        else:
            rows = to_arrow(dead_letters.select("reason", "record"))
        n = rows.num_rows
        if n == 0:
            return 0
        table = pa.table(
            {
                "log_path": pa.array([log_path] * n, pa.string()),
                "app_id": pa.array([app_id] * n, pa.string()),
                "batch_id": pa.array([batch_id] * n, pa.int64()),
                "reason": rows.column("reason").cast(pa.string()),
                "record": rows.column("record").cast(pa.string()),
                "dead_lettered_ms": pa.array([now_ms] * n, pa.int64()),
            },
            schema=DEAD_LETTER_SCHEMA,
        )
        self.committer.append_rows(self.location, table, transactions={app_id: batch_id})
        logger.warning(
            "batch %s of %s: %d bad row(s) quarantined to %s", batch_id, app_id, n, self.uri
        )
        return n

    def read(self) -> pa.Table:
        """Every dead letter (empty when the table does not exist yet)."""
        table = self.location.read_arrow()
        return DEAD_LETTER_SCHEMA.empty_table() if table is None else table


def _jsonable(df: DataFrame, name: str) -> Column:
    # to_json has no form for binary; base64 keeps the bytes recoverable.
    if isinstance(df.schema[name].dataType, T.BinaryType):
        return F.base64(F.col(name)).alias(name)
    return F.col(name)


def split_arrow_batch(
    table: pa.Table,
    *,
    keys: LogKeys,
    has_offsets: bool,
    message_max_bytes: int,
    record_columns: Sequence[str],
) -> tuple[pa.Table, pa.Table]:
    """`split_batch` on Arrow: (good rows without ``_decode_error``, dead letters). Pure.

    Each dead letter's ``record`` is its ``record_columns`` as JSON (binary as base64).
    """
    reasons = arrow_rejection_reasons(
        table, keys=keys, has_offsets=has_offsets, message_max_bytes=message_max_bytes
    )
    bad_mask = pc.is_valid(reasons)
    good = table.filter(pc.invert(bad_mask))
    if DECODE_ERROR in good.column_names:
        good = good.drop_columns([DECODE_ERROR])
    bad = table.filter(bad_mask).select([c for c in record_columns if c in table.column_names])
    records = [json.dumps(row, default=_json_default) for row in bad.to_pylist()]
    letters = pa.table(
        {"reason": reasons.filter(bad_mask), "record": pa.array(records, pa.string())}
    )
    return good, letters


def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)
