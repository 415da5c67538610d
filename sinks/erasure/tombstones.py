"""Forgetting keys: tombstones for them, once, and their partitions marked for cleaning
(design.md §54). `erasure_status` (`sinks.maintenance.erasure_status`) proves what is left.

Kafka's answer to "forget this user" is a tombstone plus ``max.compaction.lag.ms``
(KIP-354): the cleaner must reach the tombstone within that lag, and drops it after
``delete.retention.ms``. `erase` does the same on the log, and one thing more: it records,
per partition holding an erased key, the offset below which the partition must be cleaned
(``compacted-sink/erasure/<p>``, a ``txn`` action, the offset just past the key's last
record there). The cleaner's trigger (`sinks.cleaner.log_to_clean.LogToClean`) takes a
partition whose cleaner offset lies below that mark as cleanable once the mark lies below
the first uncleanable offset, whatever its dirty ratio and ``max.compaction.lag.ms``: an
erasure never waits for the log to get dirty. Nothing else is shortened: the tombstones
keep ``delete.retention.ms`` and registered consumers' holds (a downstream copy forgets the
key only by reading the delete), and removed files keep the history window (time travel
and other engines' readers are promised it).

Exactly once, by the log's state rather than by a batch id: a tombstone is written only
where the key's latest record in a partition holds a value, or is a plain delete that no
erasure mark covers yet (so the erasure's batch names every key it erases, which a
`restore` across it needs, design.md §64); a retried or repeated request finds the key's
latest record an erasure's tombstone below the mark and writes nothing more, and two
erasers at once each either commit their own batch (under `ERASE_APP_ID`, numbered past
the last recorded) or find theirs written by the other. (A crash between the batch and
its mark, or another eraser's batch seen before its mark, costs one more tombstone for the
key, no more.) Nothing derived from a key (a digest, a request id) is stored: the log would
then name the key forever. Idempotent.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import types as T

from sinks.errors import CommitConflictError, CompactedSinkError, ConcurrentCommitError
from sinks.log.committer import commit_rewrite
from sinks.log.foreign.commits import read_commit
from sinks.log.location import LogLocation
from sinks.log.log_format import ERASE_APP_ID, ERASURE_TXN
from sinks.log.log_table import LogSnapshot, LogTable, now_ms
from sinks.log.records import METADATA_COLUMNS, OFFSET, PARTITION, VALUE
from sinks.maintenance.segment_deleter import delete_expired_files
from sinks.produce.append_batch import ArrowRecords
from sinks.produce.dead_letter import DEAD_LETTER_SCHEMA
from sinks.produce.log_append import LogAppender
from sinks.reading.lookup import KeyLookup, wanted_keys

logger = logging.getLogger("compacted_sink")

"""The app id erasures' tombstone batches commit under (design.md §2's ``txn``)."""

ERASE_ATTEMPTS = 8


@dataclass(frozen=True)
class ErasureReport:
    """What one `erase` did: tombstones written, partitions marked, dead letters removed.

    ``tombstones`` counts (partition, key) pairs a tombstone was written for; ``marked``
    maps each partition to the offset below which it must now be cleaned; ``version`` is
    the log's version after the erasure (None: no log).
    """

    keys: int
    tombstones: int
    marked: dict[int, int]
    dead_letters_removed: int = 0
    version: int | None = None

    def summary(self) -> str:
        """One line saying what the erasure did; pure."""
        marks = ", ".join(f"p{p} below {o}" for p, o in sorted(self.marked.items())) or "none"
        return (
            f"erased {self.keys} key(s): {self.tombstones} tombstone(s) appended, partitions "
            f"to clean {marks}, {self.dead_letters_removed} dead letter(s) removed"
        )


def key_list(keys: Any) -> list[Any]:
    """``keys`` as a list: one key (a value, or a tuple for several key columns) or a list."""
    return list(keys) if isinstance(keys, list | set | frozenset) else [keys]


def erase(
    appender: LogAppender, keys: Any, *, key_columns: Sequence[str]
) -> tuple[int, dict[int, int], LogSnapshot | None]:
    """Append tombstones for ``keys`` where their latest record is live or a delete no
    erasure mark covers, then mark their partitions (`ERASURE_TXN`); returns (tombstones
    written, marks, the log after).

    Raises `BadInputError` for a key that does not fit the key columns, and
    `CommitConflictError` when other writers kept winning. Idempotent (module docstring).
    """
    log = appender.log
    for _ in range(ERASE_ATTEMPTS):
        snapshot = log.snapshot(repair=True)
        if snapshot is None:
            return 0, {}, None
        records, sequence = _records_of(snapshot, keys, key_columns)
        tombstones = _tombstones_needed(records, key_columns, sequence, _marks(snapshot, records))
        if tombstones.num_rows == 0:
            return 0, _mark(log, snapshot, records), log.snapshot()
        recorded = snapshot.txn_version(ERASE_APP_ID)  # batch 0 is recorded as 0: not falsy
        batch_id = 0 if recorded is None else recorded + 1
        info = appender.append(
            ArrowRecords(_tombstone_rows(tombstones, snapshot), _input_schema(snapshot)),
            app_id=ERASE_APP_ID,
            batch_id=batch_id,
        )
        if not info.already_committed:
            # Marked at once: until its mark covers them, this batch's own tombstones would
            # count as deletes no erasure covers.
            fresh = log.snapshot()
            assert fresh is not None
            found, _ = _records_of(fresh, keys, key_columns)
            return tombstones.num_rows, _mark(log, fresh, found), log.snapshot()
    raise CommitConflictError(
        f"{log.uri}: erasing {len(key_list(keys))} key(s) kept meeting other erasures after "
        f"{ERASE_ATTEMPTS} attempts"
    )


def _records_of(
    snapshot: LogSnapshot, keys: Any, key_columns: Sequence[str]
) -> tuple[pa.Table, str | None]:
    """Every visible record of ``keys`` in the live files (key columns, partition, offset,
    value and the sequence column, read with the key filters, `KeyLookup`), and the log's
    sequence column when it orders records (design.md §13)."""
    lookup = KeyLookup.of(snapshot)
    wanted = wanted_keys(key_list(keys), snapshot.arrow_schema, lookup.own_keys)
    found = lookup.records_of(wanted)
    sequence = lookup.keys.sequence_column
    if sequence in (*key_columns, PARTITION, OFFSET):
        sequence = None
    columns = [*lookup.own_keys, PARTITION, OFFSET, VALUE, *([sequence] if sequence else [])]
    return found.select(columns), sequence


def _marks(snapshot: LogSnapshot, records: pa.Table) -> dict[int, int]:
    """The erasure mark recorded for each partition ``records`` lie in (0: none)."""
    partitions = set(records.column(PARTITION).to_pylist()) if records.num_rows else set()
    return {p: snapshot.txn_version(ERASURE_TXN.format(p)) or 0 for p in partitions}


def _tombstones_needed(
    records: pa.Table,
    key_columns: Sequence[str],
    sequence: str | None = None,
    marks: Mapping[int, int] | None = None,
) -> pa.Table:
    """(key columns, partition) of each key whose latest record in a partition, by offset or
    by (sequence, offset), is live, or is a tombstone at or above the partition's erasure
    mark in ``marks`` (a plain delete no erasure covers yet: the erasure's batch names the
    key, so a restore across it can erase it again, design.md §64); with a sequence column,
    the latest record's sequence, which the tombstone carries so that it wins (a tie goes
    to the higher offset)."""
    own = [k for k in key_columns if k != PARTITION]
    group = [*own, PARTITION]
    kept = [*group, *([sequence] if sequence else [])]
    if records.num_rows == 0:
        return records.select(kept)
    order = [*([sequence] if sequence else []), OFFSET]
    ranked = records.sort_by([(c, "descending") for c in order])
    numbered = ranked.append_column("_n", pa.array(range(ranked.num_rows), pa.int64()))
    firsts = numbered.group_by(group, use_threads=False).aggregate([("_n", "min")])
    winners = ranked.take(firsts.column("_n_min"))
    marked = pa.array(
        [(marks or {}).get(p, 0) for p in winners.column(PARTITION).to_pylist()], pa.int64()
    )
    uncovered = pc.greater_equal(winners.column(OFFSET), marked)
    needed = pc.or_(pc.is_valid(winners.column(VALUE)), uncovered)
    return winners.filter(needed).select(kept)


def _mark(log: LogTable, snapshot: LogSnapshot, records: pa.Table) -> dict[int, int]:
    """Commit, per partition holding a record of the keys, the offset just past the last of
    them as its erasure mark, where the mark recorded is lower; the marks now due."""
    if records.num_rows == 0:
        return {}
    ends = records.group_by([PARTITION], use_threads=False).aggregate([(OFFSET, "max")])
    wanted = {
        p: o + 1
        for p, o in zip(
            ends.column(PARTITION).to_pylist(),
            ends.column(f"{OFFSET}_max").to_pylist(),
            strict=True,
        )
    }
    for _ in range(ERASE_ATTEMPTS):
        raise_to = {
            ERASURE_TXN.format(p): end
            for p, end in wanted.items()
            if (snapshot.txn_version(ERASURE_TXN.format(p)) or 0) < end
        }
        if not raise_to:
            return wanted
        try:
            snapshot.commit(data_change=False, transactions=raise_to, info={"operation": "erase"})
            return wanted
        except ConcurrentCommitError:
            fresh = log.snapshot(repair=True)
            assert fresh is not None
            snapshot = fresh
    raise CommitConflictError(f"{log.uri}: could not record the erasure's marks")


def _input_schema(snapshot: LogSnapshot) -> T.StructType:
    """The log's columns a tombstone batch carries: every one but the metadata the append
    assigns (offset, timestamp, delete horizon); ``partition`` is kept."""
    return T.StructType(
        [
            f
            for f in snapshot.spark_schema.fields
            if f.name == PARTITION or f.name not in METADATA_COLUMNS
        ]
    )


def _tombstone_rows(tombstones: pa.Table, snapshot: LogSnapshot) -> pa.Table:
    """One row per (key, partition): the key columns, a null value and null payload."""
    schema = snapshot.arrow_schema
    n = tombstones.num_rows
    columns = {}
    for field in _input_schema(snapshot).fields:
        arrow_type = schema.field(field.name).type
        if field.name in tombstones.column_names:
            columns[field.name] = tombstones.column(field.name).cast(arrow_type)
        else:
            columns[field.name] = pa.nulls(n, arrow_type)
    return pa.table(columns)


# -- erasures a restore would undo (design.md §64) -------------------------------------------


@dataclass(frozen=True)
class ErasuresAfter:
    """The erasures committed after a version: their batches' versions, how many tombstones
    they wrote, and the distinct keys those tombstones erase (one value per key, a tuple for
    several key columns: what `erase` takes)."""

    versions: tuple[int, ...]
    tombstones: int
    keys: list[Any]

    def __bool__(self) -> bool:
        return bool(self.versions)

    def describe(self) -> str:
        """Which erasures, and how many keys, without naming a key; pure."""
        at = ", ".join(map(str, self.versions))
        return (
            f"{len(self.versions)} erasure(s) committed after it (version(s) {at}) erased "
            f"{len(self.keys)} key(s) ({self.tombstones} tombstone(s))"
        )


def erasures_after(
    snapshot: LogSnapshot, version: int, *, key_columns: Sequence[str]
) -> ErasuresAfter:
    """The erasures the log of ``snapshot`` committed after ``version``: every commit above it
    carrying an `ERASE_APP_ID` transaction, and the keys of the tombstones it added, read
    from its files (removed by a later pass, they are still on storage whenever ``version``
    is inside the history window). Raises `CompactedSinkError` naming a file that cannot be
    read. Reads only: one Delta commit file per version above ``version``."""
    location = snapshot.location
    own = [k for k in key_columns if k != PARTITION]
    versions: list[int] = []
    paths: list[str] = []
    for v in range(version + 1, snapshot.version + 1):
        actions = read_commit(location, v) or []  # trimmed: not reachable by a restore anyway
        if any((a.get("txn") or {}).get("appId") == ERASE_APP_ID for a in actions):
            versions.append(v)
            paths += [unquote(a["add"]["path"]) for a in actions if "add" in a]
    if not versions:
        return ErasuresAfter((), 0, [])
    fs, root = location.filesystem()
    parts = []
    for path in paths:
        try:
            parts.append(pq.read_table(f"{root}/{path}", columns=own, filesystem=fs))
        except (FileNotFoundError, OSError) as e:
            raise CompactedSinkError(
                f"{location.uri}: cannot read the tombstones of an erasure after version "
                f"{version} ({path}: {e}); it must still be on storage (inside the history "
                "window)"
            ) from e
    rows = pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({})
    tombstones = rows.num_rows
    distinct = rows.group_by(own, use_threads=False).aggregate([]) if tombstones else rows
    listed = distinct.select(own).to_pylist() if tombstones else []
    keys = [r[own[0]] if len(own) == 1 else tuple(r[k] for k in own) for r in listed]
    return ErasuresAfter(tuple(versions), tombstones, keys)


# -- the dead-letter table ------------------------------------------------------------------


def dead_letter_matches(record: str | None, wanted: list[dict[str, Any]]) -> bool:
    """True when a dead letter's ``record`` (its row as JSON) holds one of the ``wanted``
    keys (column name to value, compared as JSON values and as text). Pure."""
    if record is None:
        return False
    try:
        row = json.loads(record)
    except ValueError:
        return False
    if not isinstance(row, dict):
        return False
    return any(all(_same(row.get(c), v) for c, v in key.items()) for key in wanted)


def _same(stored: Any, value: Any) -> bool:
    return stored == value or (stored is not None and str(stored) == str(value))


def wanted_dicts(keys: Any, key_columns: Sequence[str]) -> list[dict[str, Any]]:
    """``keys`` as one {column: value} per key (for matching dead letters). Pure."""
    own = [k for k in key_columns if k != PARTITION]
    out = []
    for key in key_list(keys):
        if isinstance(key, dict):
            out.append({c: key[c] for c in own})
        elif len(own) > 1:
            out.append(dict(zip(own, key, strict=True)))
        else:
            out.append({own[0]: key[0] if isinstance(key, tuple) else key})
    return out


def erase_dead_letters(
    location: LogLocation, keys: Any, *, key_columns: Sequence[str], log_path: str
) -> int:
    """Remove the dead letters of the log at ``log_path`` that hold one of ``keys``: each
    file holding one is rewritten without them, in one Delta commit that names no key (no
    predicate in its commit info, no statistics on its removes); the old files stay for
    the window. Returns how many were removed. Idempotent."""
    table = location.delta_table_if_any()
    if table is None:  # no dead letter yet: no table
        return 0
    wanted = wanted_dicts(keys, key_columns)
    fs, root = location.filesystem()
    added = pa.table(table.get_add_actions(flatten=True))
    stamp = now_ms()
    removes: list[tuple[str, int]] = []
    adds: list[tuple[str, int, str]] = []
    removed = 0
    for path, size in zip(
        added.column("path").to_pylist(), added.column("size_bytes").to_pylist(), strict=True
    ):
        rows = pq.read_table(f"{root}/{unquote(path)}")
        doomed = pa.array(
            [
                lp == log_path and dead_letter_matches(record, wanted)
                for lp, record in zip(
                    rows.column("log_path").to_pylist(),
                    rows.column("record").to_pylist(),
                    strict=True,
                )
            ],
            pa.bool_(),
        )
        hits = pc.sum(doomed).as_py() or 0
        if not hits:
            continue
        removed += hits
        removes.append((path, size))
        kept = rows.filter(pc.invert(doomed))
        if kept.num_rows:
            name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            pq.write_table(kept, f"{root}/{name}", filesystem=fs, compression="snappy")
            written = fs.get_file_info(f"{root}/{name}").size or 0
            stats = json.dumps({"numRecords": kept.num_rows})
            adds.append((name, written, stats))
    if removes:
        commit_rewrite(
            location,
            removes=removes,
            adds=adds,
            schema=DEAD_LETTER_SCHEMA,
            metadata={"compactedSink": json.dumps({"operation": "erase"})},
            timestamp_ms=stamp,
        )
    return removed


def vacuum_dead_letters(location: LogLocation, *, window_ms: int) -> None:
    """Delete the dead-letter table's files removed more than ``window_ms`` ago (an
    erasure's rewrites) and trim its Delta log; nothing without a table. Idempotent."""
    if location.delta_table_if_any() is None:
        return
    delete_expired_files(location, window_ms=window_ms, kind="checkpoint")
