"""The cleaner-offset checkpoint table: Kafka's ``cleaner-offset-checkpoint``, as a Delta table.

One row per (log, partition): the first dirty offset (where the last pass ended), the
cleaner's state for that partition, and the last pass's figures. Many logs share one
table. Every write commits the table's rows as one file against the version it read
(`checkpoints.keyed_table`), so a reader sees either the old row or the new one. It has
one writer, `CleanerOffsetCheckpoint`, with two moves: `write` (an upsert, retried) and
`compare_and_set` (the cleaner states' transitions, see `checkpoints.cleaner_states`);
the table is created in one place with its properties (`checkpoints.keyed_table`). Its
removed files and old commits are deleted by the segment deleter
(``sinks.maintenance.segment_deleter``). Each row names the Delta table (its id) and the
version it describes, so a row left by another table at the same path, or by a later
history of a copy put back, is told apart (`other_history`) and ignored. The log itself
also records each pass's end offset (see `sinks.log.log_table`), so a crash between a
pass's commit and its checkpoint row is repaired by rolling the checkpoint forward from
the log.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Literal, TypeVar

import pyarrow as pa
from deltalake import DeltaTable

from checkpoints.clock import Clock, now_ms
from checkpoints.keyed_table import KeyedTable

CleanerState = Literal["idle", "in_progress", "paused", "uncleanable"]
K = TypeVar("K", bound=Hashable)

CHECKPOINT_SCHEMA = pa.schema(
    [
        ("log_path", pa.string()),
        ("partition", pa.int32()),
        ("first_dirty_offset", pa.int64()),
        ("first_uncleanable_offset", pa.int64()),
        ("cleaner_state", pa.string()),
        ("state_owner", pa.string()),
        ("state_heartbeat_ms", pa.int64()),
        ("uncleanable_reason", pa.string()),
        ("uncleanable_since_ms", pa.int64()),
        ("failed_attempts", pa.int32()),
        ("last_clean_ms", pa.int64()),
        ("last_pass_duration_ms", pa.int64()),
        ("bytes_read", pa.int64()),
        ("bytes_written", pa.int64()),
        ("records_read", pa.int64()),
        ("records_written", pa.int64()),
        ("max_dirty_ratio", pa.float64()),
        ("log_version", pa.int64()),
        ("updated_ms", pa.int64()),
        ("table_id", pa.string()),
    ]
)
# Kept small: no one time-travels this table. The segment deleter trims it further.
HANDS_OFF_PROPERTIES = {
    # Databricks' auto compaction and optimized writes (Delta's names): rearranging a log's
    # files costs a pass a rewrite (`sinks.log.foreign.rearrangement`). Predictive
    # optimization is a catalog setting: docs/operations.md gives the statement.
    "delta.autoOptimize.autoCompact": "false",
    "delta.autoOptimize.optimizeWrite": "false",
}
"""Table properties that tell engines which honour them not to rearrange a table's files."""

DELTA_CHECKPOINT_INTERVAL = 10
"""Commits between two Delta checkpoints of every table the sink writes: its logs, this table
and the consumer offsets (delta-spark's default; delta-rs's is 100; design.md §24). One value,
since the segment deleter sets a log's window properties on this table too."""

CHECKPOINT_TABLE_PROPERTIES = {
    **HANDS_OFF_PROPERTIES,
    "delta.deletedFileRetentionDuration": "interval 1 hour",
    "delta.logRetentionDuration": "interval 1 hour",
    "delta.checkpointInterval": str(DELTA_CHECKPOINT_INTERVAL),
    "delta.enableExpiredLogCleanup": "false",
}


@dataclass(frozen=True, kw_only=True)
class CheckpointEntry:
    """One (log, partition) row of the checkpoint table.

    ``first_dirty_offset`` is where the clean section ends; the pass figures are
    those of the last pass (``last_clean_ms`` is its start, epoch ms).
    """

    log_path: str
    partition: int
    first_dirty_offset: int
    first_uncleanable_offset: int | None = None
    cleaner_state: CleanerState = "idle"
    state_owner: str | None = None
    state_heartbeat_ms: int | None = None
    uncleanable_reason: str | None = None
    uncleanable_since_ms: int | None = None
    failed_attempts: int = 0
    last_clean_ms: int | None = None
    last_pass_duration_ms: int | None = None
    bytes_read: int | None = None
    bytes_written: int | None = None
    records_read: int | None = None
    records_written: int | None = None
    max_dirty_ratio: float | None = None
    log_version: int | None = None
    updated_ms: int | None = None
    table_id: str | None = None

    def with_changes(self, **changes: object) -> CheckpointEntry:
        return replace(self, **changes)  # type: ignore[arg-type]

    def other_history(self, *, table_id: str, version: int) -> str | None:
        """Why this row describes another history than the log's (`other_history`); None
        when it describes the log's, or cannot tell."""
        return other_history(self.table_id, self.log_version, table_id=table_id, version=version)


_FIELD_NAMES = [f.name for f in fields(CheckpointEntry)]
assert _FIELD_NAMES == CHECKPOINT_SCHEMA.names


class CleanerOffsetCheckpoint:
    """The checkpoint table at ``uri``, created on first write. Safe to share between logs."""

    def __init__(
        self,
        uri: str,
        storage_options: Mapping[str, str] | None = None,
        *,
        clock: Clock = now_ms,
    ) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options or {})
        self.clock = clock  # stamps each row's updated_ms
        self._keyed = KeyedTable(
            uri,
            CHECKPOINT_SCHEMA,
            ("log_path", "partition"),
            name="cleaner-offset-checkpoint",
            properties=CHECKPOINT_TABLE_PROPERTIES,
            storage_options=self.storage_options,
        )

    def read(self, log_path: str | None = None) -> dict[tuple[str, int], CheckpointEntry]:
        """Every row (or one log's rows), keyed by (log_path, partition)."""
        rows = self._keyed.rows(None if log_path is None else {"log_path": log_path})
        # A column a row's table predates (``table_id``) reads as None: unknown.
        entries = (CheckpointEntry(**{k: r.get(k) for k in _FIELD_NAMES}) for r in rows)
        return {(e.log_path, e.partition): e for e in entries}

    def logs(self) -> list[str]:
        """Every log registered in this checkpoint table."""
        return sorted({log for log, _ in self.read()})

    def write(self, entries: Iterable[CheckpointEntry]) -> None:
        """Upsert rows by (log_path, partition) in one commit; retried on conflicts."""
        stamp = self.clock()
        rows = [asdict(e.with_changes(updated_ms=stamp)) for e in entries]
        self._keyed.upsert(pa.Table.from_pylist(rows, schema=CHECKPOINT_SCHEMA))

    def compare_and_set(self, expected: CheckpointEntry | None, new: CheckpointEntry) -> bool:
        """Write ``new`` only if its row is still ``expected`` (None: only if it has no row).

        True when the row was written, also when the store lost the answer of the commit
        that wrote it (`checkpoints.keyed_table`). A concurrent writer makes this return
        False (its commit changed the row, or delta-rs rejected ours as conflicting).
        """
        return bool(self.compare_and_set_many([(expected, new)]))

    def compare_and_set_many(
        self, changes: Sequence[tuple[CheckpointEntry | None, CheckpointEntry]]
    ) -> list[CheckpointEntry]:
        """`compare_and_set` for many rows in one commit: each ``new`` is written only if its
        row is still its ``expected`` (None: only if it has no row). Returns the rows written
        (stamped), also when the store lost the commit's answer; the others changed
        meanwhile, or a concurrent commit made delta-rs reject this one, and the caller
        reads again and decides.
        """
        if not changes:
            return []
        previous = max((e.updated_ms or 0 for e, _ in changes if e is not None), default=0)
        stamp = max(self.clock(), previous + 1)
        news = [new.with_changes(updated_ms=stamp) for _, new in changes]
        rows = pa.Table.from_pylist([asdict(n) for n in news], schema=CHECKPOINT_SCHEMA)
        written = self._keyed.compare_and_set_rows(rows, [_as_read(e) for e, _ in changes])
        return [new for new, wrote in zip(news, written, strict=True) if wrote]

    def open_or_create(self) -> DeltaTable:
        """The table, created with its properties if it does not exist yet."""
        return self._keyed.open_or_create()


def other_history(
    row_table_id: str | None, row_version: int | None, *, table_id: str, version: int
) -> str | None:
    """Why a row naming Delta table ``row_table_id`` at ``row_version`` describes another
    history than a log that is table ``table_id`` at ``version``; None when it describes
    this one, or cannot tell (a row written before rows named their table). Pure.

    Kafka keys its cleaner checkpoints by topic id, so a topic recreated under the same
    name starts clean. Here a row names the Delta table id (``metaData.id``, new for every
    table created) and the version it describes: another id is a new table at the old
    path; a version above the log's latest is an older copy of the log put back (one taken
    before the commit the row describes). Either way the row's offsets mean nothing for
    this log, which starts from its own Delta log (design.md §30).
    """
    if row_table_id is not None and row_table_id != table_id:
        return f"describes another table (Delta table id {row_table_id}, the log is {table_id})"
    if row_version is not None and row_version > version:
        return (
            f"describes version {row_version}, the log is at version {version}: an older "
            "copy of the log was put back"
        )
    return None


def split_histories(
    entries: Mapping[K, CheckpointEntry],
    *,
    table_id: str,
    version: int,
    latest_version: Callable[[], int],
) -> tuple[dict[K, CheckpointEntry], dict[K, str]]:
    """``entries`` split into the rows that describe the log's history and the others, with
    why (`other_history`). ``version`` is the snapshot the caller plans from; a row of a
    later version is judged against ``latest_version()`` (called at most once), so a pass
    committed since the snapshot is not taken for another history."""
    kept: dict[K, CheckpointEntry] = {}
    others: dict[K, str] = {}
    latest: int | None = None
    for key, entry in entries.items():
        at = version
        if entry.log_version is not None and entry.log_version > version:
            latest = latest_version() if latest is None else latest
            at = latest
        why = entry.other_history(table_id=table_id, version=at)
        if why is None:
            kept[key] = entry
        else:
            others[key] = why
    return kept, others


def _as_read(entry: CheckpointEntry | None) -> dict[str, object] | None:
    """What a transition reads of ``entry``'s row: its row is still ``entry`` while these
    columns are unchanged (`KeyedTable.compare_and_set_rows`). None: no row."""
    if entry is None:
        return None
    return {c: getattr(entry, c) for c in TRANSITION_READS}


TRANSITION_READS = ("updated_ms", "cleaner_state", "state_owner", "first_dirty_offset")
"""The columns of a row a compare-and-set checks are unchanged since it read the row."""
