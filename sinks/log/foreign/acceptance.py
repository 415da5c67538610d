"""What accepting another engine's data changes re-derives from the records (design.md §41).

The sink's bookkeeping lives in ``txn`` actions beside the data (`sinks.log.log_table`):
the cleaner offset of each partition (below it the *clean section*: at most one record per
key), the log end offset (the next offset an append assigns), the partition count. Another
engine's commit does not move them, so after a DELETE, UPDATE, MERGE, INSERT or RESTORE
they may no longer describe the records: a RESTORE to a version before a pass brings back
segments below the cleaner offset (a key twice in the "clean" section), an INSERT holds
offsets at or past the recorded log end offset (the next append would assign them again).

`plan_acceptance` reads what the accept needs and decides, per partition:

- **the cleaner offset** stays only when the clean section is still one a pass left: every
  live segment below it was live below it at the version before the first accepted change
  (the last version whose bookkeeping held), and no accepted row lies below it. Otherwise
  it goes back to the log start offset: every segment is dirty, readers merge the whole
  partition, and the next pass cleans it again (one full pass of that partition);
- **the log end offset** is one past the highest offset any live record holds (foreign
  files' rows are read: their statistics may span partitions), never below the recorded one;
- **the partition count** covers every partition a live record names.

It refuses, with `ForeignChangeError` naming the version that added the rows, their count
and the ways on, rows the log cannot take: a null ``partition``, ``offset`` or key column
(rows another engine inserted with only some of the log's columns), and accepted rows
whose offset repeats one a live record holds or lies inside a live segment's offset range
(a segment's range is the sink's alone: such a row could never become a segment).

Cost: the commits since the last accepted or checked version (their actions, already read
by the guard), one snapshot of the version before the first change, and the
``partition``, ``offset`` and key columns of the live files other engines wrote.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sinks.errors import ForeignChangeError, TableFeatureError
from sinks.log.foreign.commits import foreign_change, read_commit
from sinks.log.log_format import (
    ACCEPTED_VERSION_TXN,
    CHECKED_VERSION_TXN,
    CLEANER_OFFSET_TXN,
    LOG_END_OFFSET_TXN,
    PARTITIONS_TXN,
)
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.records import OFFSET, PARTITION
from sinks.log.segment import Segment

SEARCH_COMMITS = 2_000
"""How far back the commits of a log that records no checked version are read."""

WAYS_ON = (
    "To go on, remove or fix those rows with the engine that wrote them (for example "
    "DELETE FROM delta.`{uri}` WHERE partition IS NULL OR offset IS NULL, or an INSERT "
    "that gives each row its partition, its key and an offset at or past the log end "
    "offset), then accept again; or restore the log to version {before} (sink.restore"
    "({before}), or `compacted-sink restore {uri} --to-version {before}`), which undoes "
    "version {version} and every later commit. See docs/operations.md, "
    '"Other engines on the log".'
)


@dataclass(frozen=True)
class ForeignRows:
    """The ``partition`` and ``offset`` of every row of the live files other engines wrote,
    and which file (and which accepted commit) each came from."""

    partitions: pa.Array
    offsets: pa.Array
    accepted: pa.Array  # bool: the row's file was added by a commit being accepted


@dataclass(frozen=True)
class Acceptance:
    """What an accept commits: per partition, the re-derived offsets; and what changed."""

    version: int
    first_change: int | None
    log_end_offsets: Mapping[int, int]
    cleaner_offsets: Mapping[int, int]
    partitions: int
    reset: Mapping[int, str] = field(default_factory=dict)  # partition -> why all dirty

    def transactions(self) -> dict[str, int]:
        """The ``txn`` versions the accept commits (`sinks.log.log_table`)."""
        out = {ACCEPTED_VERSION_TXN: self.version, CHECKED_VERSION_TXN: self.version}
        out.update({LOG_END_OFFSET_TXN.format(p): e for p, e in self.log_end_offsets.items()})
        out.update({CLEANER_OFFSET_TXN.format(p): e for p, e in self.cleaner_offsets.items()})
        if self.partitions:
            out[PARTITIONS_TXN] = self.partitions
        return out

    def info(self) -> dict[str, object]:
        return {
            "operation": "accept-foreign-changes",
            "throughVersion": self.version,
            "firstChange": self.first_change,
            "logEndOffsets": {str(p): e for p, e in self.log_end_offsets.items()},
            "cleanerOffsets": {str(p): e for p, e in self.cleaner_offsets.items()},
            "dirtyAgain": {str(p): why for p, why in self.reset.items()},
        }


def foreign_data_changes(log: LogTable, snapshot: LogSnapshot) -> dict[int, set[str]]:
    """The commits after the last checked or accepted version, through ``snapshot``'s, that
    another engine made and that changed records: version -> the paths it added."""
    floor = max(
        (
            v
            for v in (
                snapshot.txn_version(CHECKED_VERSION_TXN),
                snapshot.txn_version(ACCEPTED_VERSION_TXN),
            )
            if v is not None
        ),
        default=max(-1, snapshot.version - SEARCH_COMMITS),
    )
    changes: dict[int, set[str]] = {}
    for version in range(floor + 1, snapshot.version + 1):
        actions = read_commit(log.location, version)
        if actions is None or foreign_change(version, actions) is None:
            continue
        changes[version] = {unquote(a["add"]["path"]) for a in actions if "add" in a}
    return changes


def plan_acceptance(
    log: LogTable, snapshot: LogSnapshot, version: int, key_columns: Sequence[str]
) -> Acceptance:
    """The offsets an accept of ``snapshot`` (through ``version``) commits; raises
    `ForeignChangeError` for rows the log cannot take. Reads; commits nothing."""
    changes = foreign_data_changes(log, snapshot)
    first_change = min(changes) if changes else None
    try:
        snapshot.data_files()
    except TableFeatureError:
        if not _has_deletion_vectors(snapshot):
            raise  # a log the sink refuses to own (a shallow clone): no commit to it
        return _all_dirty(snapshot, version, first_change)
    added_by = {p: v for v, paths in sorted(changes.items()) for p in paths}
    rows = _foreign_rows(log, snapshot, added_by, key_columns)
    _check_placement(log, snapshot, rows, added_by)
    trusted = _trusted(log, first_change)
    partitions = set(snapshot.partitions)
    partitions |= {int(p) for p in pc.unique(rows.partitions).to_pylist()}
    ends: dict[int, int] = {}
    cleaner: dict[int, int] = {}
    reset: dict[int, str] = {}
    highest = _max_by_partition(rows.partitions, rows.offsets)
    accepted_lowest = _min_by_partition(
        rows.partitions.filter(rows.accepted), rows.offsets.filter(rows.accepted)
    )
    for p in sorted(partitions):
        recorded = snapshot.log_end_offset(p)
        end = max(recorded, highest.get(p, -1) + 1)
        if end != recorded or snapshot.txn_version(LOG_END_OFFSET_TXN.format(p)) is None:
            ends[p] = end
        offset = snapshot.cleaner_offset(p)
        if offset is None or first_change is None:
            continue
        why = _dirty_again(snapshot, trusted, p, offset, accepted_lowest.get(p))
        if why is not None:
            cleaner[p] = snapshot.log_start_offset(p)
            reset[p] = why
    count = max(partitions) + 1 if partitions else 0
    known = snapshot.txn_version(PARTITIONS_TXN) or 0
    return Acceptance(
        version=version,
        first_change=first_change,
        log_end_offsets=ends,
        cleaner_offsets=cleaner,
        partitions=count if count > known else 0,
        reset=reset,
    )


def _has_deletion_vectors(snapshot: LogSnapshot) -> bool:
    if "deletionVectors" not in (snapshot.table.protocol().reader_features or ()):
        return False
    return pa.table(snapshot.table.deletion_vectors()).num_rows > 0


def _all_dirty(snapshot: LogSnapshot, version: int, first_change: int | None) -> Acceptance:
    """The accept of a log whose files carry deletion vectors: its rows cannot be read as
    they are (every reader refuses it until REORG ... APPLY (PURGE)), so no offset is read
    from them; every cleaned partition is made dirty, which is exact whatever the change."""
    count = snapshot.txn_version(PARTITIONS_TXN) or 0
    reset = {
        p: "its files carry deletion vectors: the clean section cannot be compared"
        for p in range(count)
        if first_change is not None and snapshot.cleaner_offset(p) is not None
    }
    return Acceptance(
        version=version,
        first_change=first_change,
        log_end_offsets={},
        cleaner_offsets={p: snapshot.log_start_offset(p) for p in reset},
        partitions=0,
        reset=reset,
    )


def _trusted(log: LogTable, first_change: int | None) -> LogSnapshot | None:
    """The log just before ``first_change`` (its bookkeeping held there); None when no
    change is accepted or that version cannot be read any more."""
    if first_change is None or first_change == 0:
        return None
    try:
        trusted = log.snapshot(first_change - 1, verify=False)
        assert trusted is not None
        trusted.segments  # noqa: B018 - its files, read now: a version the sink refuses too
    except Exception:  # an expired or refused version fails in several ways
        return None
    return trusted


def _dirty_again(
    snapshot: LogSnapshot,
    trusted: LogSnapshot | None,
    partition: int,
    offset: int,
    accepted_lowest: int | None,
) -> str | None:
    """Why ``partition``'s clean section below ``offset`` may no longer be clean; None when
    it still is (every segment there was clean before the change, no accepted row below)."""
    if accepted_lowest is not None and accepted_lowest < offset:
        return f"accepted rows at offset {accepted_lowest}, below the cleaner offset {offset}"
    clean_now = {
        unquote(s.path) for s in snapshot.segments.get(partition, []) if s.last_offset < offset
    }
    if not clean_now:
        return None
    if trusted is None:
        return "the version before the change cannot be read to compare its clean section"
    before = trusted.cleaner_offset(partition)
    clean_then = {
        unquote(s.path)
        for s in trusted.segments.get(partition, [])
        if before is not None and s.last_offset < before
    }
    if before != offset:
        return f"the cleaner offset was {before} before the change, {offset} after it"
    back = clean_now - clean_then
    if back:
        return (
            f"{len(back)} segment(s) below the cleaner offset {offset} were not in the clean "
            "section before the change (a RESTORE brought them back)"
        )
    return None


def _foreign_rows(
    log: LogTable,
    snapshot: LogSnapshot,
    added_by: Mapping[str, int],
    key_columns: Sequence[str],
) -> ForeignRows:
    """Read ``partition``, ``offset`` and the key columns of every live foreign file; raise
    for rows with a null one (naming the version that added them and their count)."""
    fs, root = log.location.filesystem()
    parts: list[pa.Array] = []
    offsets: list[pa.Array] = []
    accepted: list[pa.Array] = []
    missing: dict[int | None, int] = {}
    examples: dict[int | None, str] = {}
    wanted = [PARTITION, OFFSET, *key_columns]
    for file in snapshot.foreign_files:
        path = unquote(file.path)
        parquet = pq.ParquetFile(f"{root}/{path}", filesystem=fs)
        present = [c for c in wanted if c in parquet.schema_arrow.names]
        table = parquet.read(columns=present)
        n = table.num_rows
        columns = {c: table.column(c) for c in present}
        bad = pa.array([False] * n)
        for name in wanted:
            column = columns.get(name)
            if column is None:
                bad = pa.array([True] * n)
                break
            bad = pc.or_(bad, pc.is_null(column))
        nulls = pc.sum(bad).as_py() or 0
        version = added_by.get(path)
        if nulls:
            missing[version] = missing.get(version, 0) + nulls
            examples.setdefault(version, path)
            continue
        parts.append(pc.cast(columns[PARTITION], pa.int64()).combine_chunks())
        offsets.append(pc.cast(columns[OFFSET], pa.int64()).combine_chunks())
        accepted.append(pa.array([path in added_by] * n, pa.bool_()))
    if missing:
        version = min((v for v in missing if v is not None), default=None)
        count = missing[version]
        at = f"Delta version {version}" if version is not None else "a version before the last"
        before = version - 1 if version is not None else snapshot.version - 1
        raise ForeignChangeError(
            f"log {log.uri}: {at} (another engine's commit) holds {count} row(s) with no "
            f"{', '.join(repr(c) for c in wanted)} (null, or the column missing from the "
            f"file; e.g. {examples[version]}): a log's record needs all of them, so the "
            "sink cannot accept it (one reader would skip those rows, another fail on them). "
            + WAYS_ON.format(uri=log.uri, before=before, version=version),
            log_path=log.uri,
            version=version if version is not None else snapshot.version,
        )
    if not parts:
        empty = pa.array([], pa.int64())
        return ForeignRows(empty, empty, pa.array([], pa.bool_()))
    return ForeignRows(
        pa.concat_arrays(parts), pa.concat_arrays(offsets), pa.concat_arrays(accepted)
    )


def _check_placement(
    log: LogTable, snapshot: LogSnapshot, rows: ForeignRows, added_by: Mapping[str, int]
) -> None:
    """Raise when an accepted row repeats the (partition, offset) of another live record it
    can see, or lies inside a live segment's offset range."""
    if not len(rows.offsets):
        return
    table = pa.table({"p": rows.partitions, "o": rows.offsets, "a": rows.accepted})
    counts = table.group_by(["p", "o"]).aggregate([("a", "count"), ("a", "max")])
    repeated = counts.filter(pc.and_(pc.greater(counts["a_count"], 1), counts["a_max"]))
    accepted = table.filter(table["a"])
    inside, example = _inside_segments(snapshot, accepted["p"], accepted["o"])
    if not repeated.num_rows and not inside:
        return
    version = min(added_by.values()) if added_by else snapshot.version
    if repeated.num_rows:
        p, o = repeated["p"][0].as_py(), repeated["o"][0].as_py()
        what = (
            f"{repeated.num_rows} (partition, offset) pair(s) held by more than one live "
            f"record (e.g. partition {p}, offset {o})"
        )
    else:
        assert example is not None
        p, o, segment = example
        what = (
            f"{inside} row(s) whose offset lies inside a segment the sink wrote (e.g. "
            f"partition {p}, offset {o}, inside {segment.path} [{segment.base_offset}, "
            f"{segment.last_offset}])"
        )
    raise ForeignChangeError(
        f"log {log.uri}: another engine's rows (first change at Delta version {version}) "
        f"include {what}: an offset names one record of a partition, so the sink cannot "
        "accept them without losing one. "
        + WAYS_ON.format(uri=log.uri, before=version - 1, version=version),
        log_path=log.uri,
        version=version,
    )


def _inside_segments(
    snapshot: LogSnapshot, partitions: pa.ChunkedArray, offsets: pa.ChunkedArray
) -> tuple[int, tuple[int, int, Segment] | None]:
    """How many of the rows (``partitions``, ``offsets``) lie inside a live segment's offset
    range, and the first such (partition, offset, segment)."""
    inside, example = 0, None
    by_partition = pa.table({"p": partitions, "o": offsets})
    for p, segments in snapshot.segments.items():
        if not segments:
            continue
        mine = by_partition.filter(pc.equal(by_partition["p"], p))["o"].to_numpy()
        if not len(mine):
            continue
        bases = np.array([s.base_offset for s in segments])
        lasts = np.array([s.last_offset for s in segments])
        at = np.searchsorted(bases, mine, side="right") - 1
        hit = (at >= 0) & (mine <= lasts[np.maximum(at, 0)])
        inside += int(hit.sum())
        if example is None and hit.any():
            first = int(np.argmax(hit))
            example = (p, int(mine[first]), segments[int(at[first])])
    return inside, example


def _max_by_partition(partitions: pa.Array, offsets: pa.Array) -> dict[int, int]:
    if not len(offsets):
        return {}
    grouped = pa.table({"p": partitions, "o": offsets}).group_by("p").aggregate([("o", "max")])
    return dict(zip(grouped["p"].to_pylist(), grouped["o_max"].to_pylist(), strict=True))


def _min_by_partition(partitions: pa.Array, offsets: pa.Array) -> dict[int, int]:
    if not len(offsets):
        return {}
    grouped = pa.table({"p": partitions, "o": offsets}).group_by("p").aggregate([("o", "min")])
    return dict(zip(grouped["p"].to_pylist(), grouped["o_min"].to_pylist(), strict=True))
