"""Redeliveries: Kafka records below the log end offset, dropped only when proven obsolete.

Kafka's consumers deliver at least once: a query started from an earlier position, or a
second query over the same topic, reads records the log already took. Offsets increase in
append order (design.md §1), so a record below its partition's log end offset can never be
appended. The append drops it only when the log proves that dropping it changes nothing
(design.md §48):

- *held*: the log holds a record of the same key at that very offset (the record itself,
  delivered again);
- *superseded*: the log, or the same batch above the log end, holds a newer record of its
  key in its partition (a higher offset; with a ``sequence_column``, ranked higher by
  design.md §13), so the record is obsolete, as a pass would find it and as a reader
  resolves it;
- *deleted*: its offset lies below the partition's log start offset (retention or
  ``delete_records`` removed that range, design.md §22).

Anything else below the log end (a file read out of order, a backfill whose offsets lie
under what the log took) fails the batch with `BadInputError`, naming the partition, the
offsets, some keys, what the log holds and what to do; nothing is written. The proof reads
only when a batch brings such records (the writers count them as they drop them), and then
only the key, partition, offset and sequence columns of the files, row groups pruned by
the keys wanted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from sinks.errors import BadInputError
from sinks.log.file_reader import conform
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogSnapshot
from sinks.log.records import OFFSET, PARTITION, at_or_above, below

_ROW = "_redelivered_row"
_READERS = 8
_SHOWN_KEYS = 3


@dataclass(frozen=True)
class Redeliveries:
    """How many records below the log end offset a batch brought, by why each was dropped."""

    held: int = 0  # the log holds the record itself (same key, same offset)
    superseded: int = 0  # a newer record of its key is in the log or the batch
    deleted: int = 0  # below the log start offset: retention or delete_records removed it

    @property
    def total(self) -> int:
        return self.held + self.superseded + self.deleted

    def describe(self) -> str:
        """The reasons, for the batch's line: ``6 held, 2 superseded``."""
        parts = [
            f"{self.held} the log holds" if self.held else "",
            f"{self.superseded} superseded by newer records of their keys"
            if self.superseded
            else "",
            f"{self.deleted} below the log start offset" if self.deleted else "",
        ]
        return ", ".join(p for p in parts if p)


class RowsBelow(Protocol):
    """A batch's ``columns`` of every row whose ``on`` (partition and key) has a row below its
    partition's log end offset, those at or above it included (`sinks.produce.append_batch`)."""

    def __call__(
        self, end_offsets: Mapping[int, int], *, columns: Sequence[str], on: Sequence[str]
    ) -> pa.Table: ...


def key_on(keys: LogKeys) -> list[str]:
    """What a record's key is, where redeliveries are matched: its partition and key columns."""
    return list(dict.fromkeys([PARTITION, *keys.key_columns]))


def record_columns(keys: LogKeys) -> list[str]:
    """The columns a proof reads of the batch and the log: partition, offset, the key columns,
    the sequence column."""
    own = [k for k in keys.key_columns if k != PARTITION]
    sequence = [keys.sequence_column] if keys.sequence_column else []
    return list(dict.fromkeys([PARTITION, OFFSET, *own, *sequence]))


def prove_redeliveries(
    snapshot: LogSnapshot,
    rows: pa.Table,
    end_offsets: Mapping[int, int],
    keys: LogKeys,
    *,
    batch_id: int,
) -> Redeliveries:
    """Check that every record of ``rows`` below its partition's log end offset is obsolete.

    ``rows`` are the batch's records (`record_columns`) of every (partition, key) that has a
    record below the log end offset (``end_offsets``, as the batch was numbered from), those
    at or above it included: they may supersede the ones below. Returns the counts by
    reason; raises `BadInputError` naming what the log cannot account for. Reads the log's
    files (key columns first, pruned by the keys wanted); writes nothing.
    """
    under = below(rows, end_offsets)
    candidates = rows.filter(pa.array(under))
    if candidates.num_rows == 0:
        return Redeliveries()
    starts = {p: snapshot.log_start_offset(p) for p in snapshot.partitions}
    deleted = below(candidates, starts)
    live = candidates.filter(pa.array(~deleted))
    live = live.append_column(_ROW, pa.array(np.arange(live.num_rows, dtype=np.int64)))
    newer_in_batch = rows.filter(pa.array(~under))
    records = pa.concat_tables(
        [_log_records(snapshot, live, keys, starts), conform(newer_in_batch, _schema(rows, keys))]
    )
    held, superseded = _proofs(live, records, keys)
    unproven = live.filter(pa.array(~(held | superseded)))
    if unproven.num_rows:
        raise BadInputError(_refusal(unproven, snapshot, end_offsets, keys, batch_id))
    return Redeliveries(
        held=int(held.sum()), superseded=int(superseded.sum()), deleted=int(deleted.sum())
    )


# -- the proof, pure ---------------------------------------------------------------------------


def _proofs(
    candidates: pa.Table, records: pa.Table, keys: LogKeys
) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate, whether ``records`` hold it (same key and offset) and whether they hold
    a newer record of its key in its partition. Pure."""
    n = candidates.num_rows
    held, superseded = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    if n == 0 or records.num_rows == 0:
        return held, superseded
    on = key_on(keys)
    pairs = _pairs(candidates.select([*on, OFFSET, *_seq(keys), _ROW]), records, on, keys)
    if pairs.num_rows == 0:
        return held, superseded
    row = pairs.column(_ROW).to_numpy()
    offset, theirs = pairs.column(OFFSET), pairs.column("_r_" + OFFSET)
    same = pc.equal(offset, theirs).to_numpy(zero_copy_only=False)
    later = pc.greater(theirs, offset)
    if keys.sequence_column is not None:
        mine, other = pairs.column(keys.sequence_column), pairs.column("_r_" + keys.sequence_column)
        both = pc.and_(pc.is_valid(mine), pc.is_valid(other))
        ranked = pc.or_(pc.greater(other, mine), pc.and_(pc.equal(other, mine), later))
        later = pc.if_else(
            both,
            ranked,
            pc.if_else(pc.is_valid(other), True, pc.and_(pc.is_null(mine), later)),
        )
    newer = pc.fill_null(later, False).to_numpy(zero_copy_only=False)
    held[row[same]] = True
    superseded[row[newer & ~same]] = True
    superseded &= ~held
    return held, superseded


def _seq(keys: LogKeys) -> list[str]:
    return [keys.sequence_column] if keys.sequence_column else []


def _pairs(candidates: pa.Table, records: pa.Table, on: list[str], keys: LogKeys) -> pa.Table:
    """Each candidate beside each record of its (partition, key): the records' columns
    prefixed ``_r_``. Keys Arrow cannot join on (structs, lists) are paired in Python."""
    theirs = records.select([*on, OFFSET, *_seq(keys)])
    theirs = theirs.rename_columns([*on, *("_r_" + c for c in [OFFSET, *_seq(keys)])])
    try:
        return candidates.join(theirs, on, join_type="inner")
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid):
        pass
    index: dict[str, list[int]] = {}
    for i, key in enumerate(_canonical(theirs, on)):
        index.setdefault(key, []).append(i)
    left, right = [], []
    for i, key in enumerate(_canonical(candidates, on)):
        for j in index.get(key, ()):
            left.append(i)
            right.append(j)
    mine = candidates.take(pa.array(left, pa.int64()))
    other = theirs.take(pa.array(right, pa.int64())).drop_columns(on)
    for name in other.column_names:
        mine = mine.append_column(name, other.column(name))
    return mine


def _canonical(table: pa.Table, on: list[str]) -> Iterator[str]:
    """Each row's ``on`` values as one comparable text (keys compared by value)."""
    for row in table.select(on).to_pylist():
        yield json.dumps(row, sort_keys=True, default=repr)


def _schema(rows: pa.Table, keys: LogKeys) -> pa.Schema:
    return pa.schema([rows.schema.field(c) for c in record_columns(keys)])


# -- the log's records of the candidates' keys -------------------------------------------------


def _log_records(
    snapshot: LogSnapshot, candidates: pa.Table, keys: LogKeys, starts: Mapping[int, int]
) -> pa.Table:
    """Every visible record of the log whose key is one of ``candidates``', with
    `record_columns` (in the candidates' types); row groups pruned by the keys. Records
    below their partition's log start offset (``starts``) are not visible."""
    schema = _schema(candidates, keys)
    if candidates.num_rows == 0:
        return schema.empty_table()
    partitions = set(candidates.column(PARTITION).to_pylist())
    paths = [s.path for p in partitions for s in snapshot.segments.get(p, [])]
    paths += [f.path for f in snapshot.foreign_files if any(f.may_hold(p) for p in partitions)]
    fs, root = snapshot.location.filesystem()
    own = [k for k in keys.key_columns if k != PARTITION]
    wanted = candidates.select(own)
    key_filter = _key_filter(wanted, own)

    def read(path: str) -> pa.Table:
        data = pads.dataset(f"{root}/{path}", filesystem=fs, format="parquet")
        present = [c for c in schema.names if c in data.schema.names]
        table = data.to_table(columns=present, filter=key_filter, use_threads=False)
        return _of_keys(conform(table, schema), wanted, own)

    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        found = list(pool.map(read, paths))
    records = pa.concat_tables([schema.empty_table(), *found])
    return at_or_above(records, {p: s for p, s in starts.items() if s > 0})


def _key_filter(wanted: pa.Table, own: list[str]) -> pads.Expression | None:
    """A filter on the first key column that prunes row groups, when its type allows."""
    first = own[0]
    values = pc.unique(wanted.column(first).combine_chunks())
    if pa.types.is_nested(values.type):
        return None
    return pads.field(first).isin(values)


def _of_keys(table: pa.Table, wanted: pa.Table, own: list[str]) -> pa.Table:
    """``table``'s rows whose key is one of ``wanted``'s (exact, by value)."""
    if table.num_rows == 0:
        return table
    if len(own) == 1 and not pa.types.is_nested(wanted.schema.field(own[0]).type):
        mask = pc.is_in(table.column(own[0]), value_set=wanted.column(own[0]).combine_chunks())
        return table.filter(mask)
    keys = set(_canonical(wanted, own))
    return table.filter(pa.array([k in keys for k in _canonical(table, own)]))


# -- the refusal ---------------------------------------------------------------------------------


def _refusal(
    unproven: pa.Table,
    snapshot: LogSnapshot,
    end_offsets: Mapping[int, int],
    keys: LogKeys,
    batch_id: int,
) -> str:
    """What `BadInputError` says: per partition, the offsets the log cannot account for,
    some keys, what the log holds, and what to do."""
    own = [k for k in keys.key_columns if k != PARTITION]
    parts = []
    for p in sorted(set(unproven.column(PARTITION).to_pylist())):
        mine = unproven.filter(pc.equal(unproven.column(PARTITION), p))
        offsets = mine.column(OFFSET)
        shown = [_shown(r) for r in mine.select(own).slice(0, _SHOWN_KEYS).to_pylist()]
        segments = snapshot.segments.get(p, [])
        held = (
            f"offsets {segments[0].base_offset}-{segments[-1].last_offset} in its files"
            if segments
            else "no file"
        )
        parts.append(
            f"partition {p}: {mine.num_rows} record(s) at offsets "
            f"{pc.min(offsets).as_py()}-{pc.max(offsets).as_py()} (keys {', '.join(shown)}"
            f"{', ...' if mine.num_rows > _SHOWN_KEYS else ''}) lie below the log end offset "
            f"{end_offsets.get(p, 0)}, and the log neither holds them nor a newer record of "
            f"their keys (it holds {held}, log start offset {snapshot.log_start_offset(p)})"
        )
    resume = json.dumps({str(p): o for p, o in sorted(end_offsets.items())})
    return (
        f"batch {batch_id}: " + "; ".join(parts) + ". A partition's offsets only increase "
        "as records are appended, so these cannot be appended, and dropping them would lose "
        "them. Feed each partition's records in offset order (a batch's own records are "
        "sorted by offset; Spark's file source takes files oldest first, so give the files "
        "modification times in offset order, or read them in one batch); if these records "
        "were appended before and their keys deleted since, start the query from the log "
        f"end offsets (startingOffsets {resume}); "
        "nothing was written"
    )


def _shown(row: Mapping[str, object]) -> str:
    values = [_text(v) for v in row.values()]
    return values[0] if len(values) == 1 else "(" + ", ".join(values) + ")"


def _text(value: object) -> str:
    if isinstance(value, bytes):
        try:
            return repr(value.decode("utf-8"))
        except UnicodeDecodeError:
            return value.hex()
    return repr(value)
