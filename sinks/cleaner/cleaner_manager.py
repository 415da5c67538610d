"""`CleanerManager`: Kafka's ``LogCleanerManager`` for one log, in the checkpoint table.

It tells which partitions this owner may claim (`claimable`), claims (`start_cleaning`,
kept live by `heartbeating`), and records (`checkpoint_pass` / `done_cleaning`,
`abort_cleaning`, `mark_uncleanable`), and pauses around ``delete_records`` and
restores. Kafka keeps these states in memory, guarded by a lock, because one broker owns
its logs; here cleaners run in different processes, so each state lives in the
checkpoint table's row for the partition (`checkpoints.cleaner_states` says what a row
means) and moves by compare-and-set: one commit per transition of a pass's partitions,
however many (`CleanerOffsetCheckpoint.compare_and_set_many`). A partition whose pass
failed is retried once ``backoff_ms`` doubled per failed attempt (capped at an hour) has
passed.

The state is advisory for correctness: a pass that loses its claim (expired,
paused) can still only commit against the snapshot it planned from, and delta-rs
rejects a swap whose removed files another commit already removed. The states
save wasted passes and make pauses and failures visible to ``status``.

The cleanable offsets (Kafka's ``LogCleanerManager.cleanableOffsets``): every partition
of a log as a cleaning candidate, from Delta metadata only.

`LogPlanner.plan` measures one version of a log (first dirty and uncleanable
offsets, cleanable bytes, expired tombstones a registered consumer still holds) into
a `CleaningPlan`, the one list of `LogToClean` that a batch's hand-over, a round's
choice and ``status`` share. Pure arithmetic over the snapshot
(`sinks.cleaner.log_to_clean`), plus at most one read of the checkpoint table.

The choice (Kafka's ``grabFilthiestCompactedLog``): Kafka's manager chooses under a lock
and marks the log in progress. Here the claim is a compare-and-set on each partition's
checkpoint row (`CleanerManager.start_cleaning`), so another process may take partitions
between the choice and the claim, and other writers may commit meanwhile:
`grab_filthiest_compacted_log` plans again after claiming when the log moved (a pass
planned from the newest version has less to conflict with), refuses to go on over files
another engine wrote since (they are absorbed first), and cuts the choice to the pass's
byte budget (``log.cleaner.max.bytes.per.pass``), releasing the partitions it does not
keep.

Deletes held for registered consumers (`consumer_holds`), what Kafka's cleaner cannot
promise: Kafka drops a tombstone once its delete horizon has passed (KIP-534), so "a consumer
that lags by more than ``delete.retention.ms`` may miss delete markers". Here a
consumer reading the log with ``consumer.id`` commits its offsets in the
consumer-offsets table (`checkpoints.consumer_offsets`), and a pass gets, per
partition, the offset its live consumers have all read up to (``held_below``, the
lowest committed offset). The invariant:

    a tombstone at offset O of partition p whose delete horizon has passed is dropped
    only when O < held_below[p] (every live consumer has read it); a partition with no
    live consumer has no entry, and Kafka's rule applies unchanged.

Only tombstones are held; a superseded record goes as before, files and Delta
versions are never held beyond the history window. A consumer that has not
committed for ``consumer.expiration.ms`` holds nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pyarrow.compute as pc
import pyarrow.parquet as pq

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint, split_histories
from checkpoints.cleaner_states import (
    BACKOFF_BASE_MS,
    BACKOFF_MAX_MS,
    HEARTBEAT_TIMEOUT_MS,
    IDLE,
    IN_PROGRESS,
    PAUSED,
    UNCLEANABLE,
    default_owner,
    is_live_claim,
    live_claims,
    may_start_cleaning,
    uncleanable_backoff_ms,
)
from checkpoints.consumer_offsets import ConsumerOffsets, consumer_offsets_uri
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_to_clean import (
    LogToClean,
    cleanable_offsets,
    filthiest_cleanable,
    log_to_clean,
    within_budget,
)
from sinks.config import CleanerConfig
from sinks.errors import CleanerError, CommitConflictError, ConcurrentCommitError
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.records import DELETE_HORIZON_MS
from sinks.log.segment import Segment
from sinks.log.segment_writer import WrittenSegment
from sinks.log.storage import LogLocation

logger = logging.getLogger("compacted_sink")

__all__ = [
    "BACKOFF_BASE_MS",
    "IDLE",
    "IN_PROGRESS",
    "PAUSED",
    "UNCLEANABLE",
    "CleanerManager",
    "may_start_cleaning",
    "uncleanable_backoff_ms",
]

_CAS_ATTEMPTS = 20
_REASON_CHARS = 2_000


class CleanerManager:
    """The cleaning states of one log's partitions, as seen and changed by one ``owner``.

    ``clock`` gives epoch ms for heartbeats and backoff (a test moves it by hand).
    Every transition is a compare-and-set on the checkpoint table; none blocks
    except `pause_cleaning`, which waits for a live pass of another owner to end.
    """

    def __init__(
        self,
        checkpoints: CleanerOffsetCheckpoint,
        log_path: str,
        *,
        owner: str | None = None,
        clock: Callable[[], int] | None = None,
        heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS,
        backoff_base_ms: int = BACKOFF_BASE_MS,
        backoff_max_ms: int = BACKOFF_MAX_MS,
    ) -> None:
        self.checkpoints = checkpoints
        self.log_path = log_path
        self.owner = owner or default_owner()
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.backoff_base_ms = backoff_base_ms
        self.backoff_max_ms = backoff_max_ms

    # -- reading -------------------------------------------------------------------------

    def entries(self) -> dict[int, CheckpointEntry]:
        """This log's checkpoint rows by partition."""
        return {p: e for (_, p), e in self.checkpoints.read(self.log_path).items()}

    def may_clean(
        self, partition: int, entries: Mapping[int, CheckpointEntry] | None = None
    ) -> bool:
        """Whether this owner may start a pass over ``partition`` now."""
        rows = self.entries() if entries is None else entries
        return may_start_cleaning(
            rows.get(partition),
            owner=self.owner,
            now_ms=self.clock(),
            heartbeat_timeout_ms=self.heartbeat_timeout_ms,
            backoff_base_ms=self.backoff_base_ms,
            backoff_max_ms=self.backoff_max_ms,
        )

    def busy_partitions(self) -> set[int]:
        """Partitions another owner is cleaning right now (heartbeat not expired)."""
        return live_claims(
            self.entries().values(),
            now_ms=self.clock(),
            heartbeat_timeout_ms=self.heartbeat_timeout_ms,
            other_than=self.owner,
        )

    # -- choosing and recording (Kafka's grabFilthiestCompactedLog / doneCleaning) -----------

    def claimable(self, logs: Sequence[LogToClean]) -> list[LogToClean]:
        """The partitions of ``logs`` this owner may start now (not paused, not cleaned
        elsewhere, not uncleanable inside its backoff), in their order: one read."""
        rows = self.entries() if logs else {}
        return [log for log in logs if self.may_clean(log.partition, rows)]

    def retry_at_ms(self) -> int | None:
        """When the first partition of this log backing off after a failed pass may be
        tried again; None when none is backing off."""
        times = [
            (e.uncleanable_since_ms or 0)
            + uncleanable_backoff_ms(
                e.failed_attempts or 0, base_ms=self.backoff_base_ms, max_ms=self.backoff_max_ms
            )
            for e in self.entries().values()
            if e.cleaner_state == UNCLEANABLE
        ]
        return min(times) if times else None

    def reset_checkpoints(
        self,
        reset: Sequence[LogToClean],
        *,
        table_id: str | None = None,
        version: int | None = None,
    ) -> None:
        """Rewrite checkpoints found out of range, as Kafka does even when nothing is cleaned;
        the rows name the table (``table_id``) and ``version`` they were measured at."""
        rows = self.entries()
        self.checkpoints.write(
            self._base(rows.get(log.partition), log.partition).with_changes(
                first_dirty_offset=log.first_dirty_offset,
                first_uncleanable_offset=log.first_uncleanable_offset,
                table_id=table_id,
                log_version=version,
            )
            for log in reset
        )

    def checkpoint_pass(
        self, cleaned: Sequence[LogToClean], stats: CleanerStats, *, table_id: str | None = None
    ) -> None:
        """Record a committed pass: each partition's end offset and figures, then release it.
        The rows name the Delta table (``table_id``) and the version after the pass."""
        self.done_cleaning(
            CheckpointEntry(
                log_path=self.log_path,
                partition=log.partition,
                first_dirty_offset=stats.end_offsets[log.partition],
                first_uncleanable_offset=log.first_uncleanable_offset,
                last_clean_ms=stats.start_ms,
                last_pass_duration_ms=stats.duration_ms,
                bytes_read=stats.bytes_read,
                bytes_written=stats.bytes_written,
                records_read=stats.records_read,
                records_written=stats.records_written,
                max_dirty_ratio=log.cleanable_ratio,
                log_version=stats.delta_version,
                table_id=table_id,
            )
            for log in cleaned
        )

    # -- transitions ---------------------------------------------------------------------

    def start_cleaning(self, partitions: Iterable[int]) -> list[int]:
        """Claim ``partitions`` for a pass (state ``in_progress``); returns those claimed.

        A partition is skipped when paused, when another live owner cleans it, or
        when it is uncleanable and its backoff has not passed.
        """

        def claim(p: int, entry: CheckpointEntry | None) -> CheckpointEntry | None:
            if not self.may_clean(p, {p: entry} if entry else {}):
                return None
            return self._base(entry, p).with_changes(
                cleaner_state=IN_PROGRESS, state_owner=self.owner, state_heartbeat_ms=self.clock()
            )

        return self._transition(partitions, claim)

    def heartbeat(self, partitions: Iterable[int]) -> list[int]:
        """Prove this owner's passes live; returns the partitions it still owns."""

        def beat(_p: int, entry: CheckpointEntry | None) -> CheckpointEntry | None:
            return (
                entry.with_changes(state_heartbeat_ms=self.clock()) if self._owns(entry) else None
            )

        return self._transition(partitions, beat)

    def done_cleaning(self, entries: Iterable[CheckpointEntry]) -> None:
        """Record a committed pass's checkpoint rows and release the partitions.

        The figures are written whatever the state (the pass is committed in the
        log); a partition paused meanwhile stays paused, any other goes ``idle``,
        and an uncleanable mark is cleared.
        """
        done = {e.partition: e for e in entries}

        def finish(p: int, entry: CheckpointEntry | None) -> CheckpointEntry:
            paused = entry is not None and entry.cleaner_state == PAUSED
            return done[p].with_changes(
                cleaner_state=PAUSED if paused else IDLE,
                state_owner=entry.state_owner if paused and entry else None,
                state_heartbeat_ms=None,
                uncleanable_reason=None,
                uncleanable_since_ms=None,
                failed_attempts=0,
            )

        self._transition(done, finish)

    def abort_cleaning(self, partitions: Iterable[int]) -> None:
        """Release partitions this owner claimed without a committed pass (a lost race)."""

        def release(_p: int, entry: CheckpointEntry | None) -> CheckpointEntry | None:
            if not self._owns(entry):
                return None
            assert entry is not None
            return entry.with_changes(cleaner_state=IDLE, state_owner=None, state_heartbeat_ms=None)

        self._transition(partitions, release)

    def mark_uncleanable(self, partitions: Iterable[int], error: BaseException | str) -> None:
        """Mark partitions whose pass failed: the error, the time, one more failed attempt.

        A paused partition stays paused (its failure is still counted).
        """
        reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"

        def mark(p: int, entry: CheckpointEntry | None) -> CheckpointEntry:
            base = self._base(entry, p)
            paused = base.cleaner_state == PAUSED
            return base.with_changes(
                cleaner_state=PAUSED if paused else UNCLEANABLE,
                state_owner=base.state_owner if paused else None,
                state_heartbeat_ms=None,
                uncleanable_reason=reason[:_REASON_CHARS],
                uncleanable_since_ms=self.clock(),
                failed_attempts=(base.failed_attempts or 0) + 1,
            )

        self._transition(partitions, mark)

    def pause_cleaning(self, partitions: Iterable[int], *, timeout_ms: int | None = None) -> None:
        """Stop cleaning of ``partitions`` until `resume_cleaning` (idempotent).

        Waits while another owner's pass is live (Kafka's abortAndPauseCleaning),
        at most ``timeout_ms`` (default: the heartbeat timeout, after which the
        pass counts as dead). Raises `CleanerError` when the pass outlives it.
        """

        def pause(p: int, entry: CheckpointEntry | None) -> CheckpointEntry | None:
            if self._live_other(entry):
                return None  # waited for below
            base = self._base(entry, p)
            keep = base.cleaner_state == UNCLEANABLE
            return base.with_changes(
                cleaner_state=PAUSED,
                state_owner=self.owner,
                state_heartbeat_ms=None,
                uncleanable_reason=base.uncleanable_reason if keep else None,
            )

        pending = set(partitions)
        deadline = time.monotonic() + (timeout_ms or self.heartbeat_timeout_ms) / 1000
        while pending := pending - set(self._transition(sorted(pending), pause)):
            if time.monotonic() > deadline:
                p = min(pending)
                owner = getattr(self.entries().get(p), "state_owner", None)
                raise CleanerError(
                    f"cannot pause cleaning: a pass of {owner} is still running",
                    log_path=self.log_path,
                    partition=p,
                )
            time.sleep(0.2)

    def resume_cleaning(self, partitions: Iterable[int]) -> None:
        """Let ``partitions`` be cleaned again; a partition that is not paused is left alone."""

        def resume(_p: int, entry: CheckpointEntry | None) -> CheckpointEntry | None:
            if entry is None or entry.cleaner_state != PAUSED:
                return None
            failed = bool(entry.uncleanable_reason) and (entry.failed_attempts or 0) > 0
            return entry.with_changes(
                cleaner_state=UNCLEANABLE if failed else IDLE,
                state_owner=None,
                state_heartbeat_ms=None,
            )

        self._transition(partitions, resume)

    @contextmanager
    def paused(self, partitions: Sequence[int]) -> Iterator[None]:
        """No pass over ``partitions`` inside the block (`pause_cleaning`, then resume)."""
        self.pause_cleaning(partitions)
        try:
            yield
        finally:
            self.resume_cleaning(partitions)

    @contextmanager
    def heartbeating(self, partitions: Iterable[int]) -> Iterator[None]:
        """Keep proving this owner's claims live (every third of the timeout) inside the block."""
        claimed = list(partitions)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_timeout_ms / 3000):
                try:
                    self.heartbeat(claimed)
                except Exception:  # noqa: BLE001 - a missed beat only risks a takeover
                    logger.warning("heartbeat of %s failed", self.log_path, exc_info=True)

        thread = threading.Thread(target=beat, name=f"cleaner-heartbeat-{self.owner}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    # -- compare-and-set -----------------------------------------------------------------

    def _owns(self, entry: CheckpointEntry | None) -> bool:
        return (
            entry is not None
            and entry.cleaner_state == IN_PROGRESS
            and entry.state_owner == self.owner
        )

    def _base(self, entry: CheckpointEntry | None, partition: int) -> CheckpointEntry:
        # A partition without a row has never been checkpointed; offset 0 lies at or
        # below its log start, which planning treats as "no checkpoint" (Kafka's reset).
        return entry or CheckpointEntry(
            log_path=self.log_path, partition=partition, first_dirty_offset=0
        )

    def _live_other(self, entry: CheckpointEntry | None) -> bool:
        return is_live_claim(
            entry,
            now_ms=self.clock(),
            heartbeat_timeout_ms=self.heartbeat_timeout_ms,
            other_than=self.owner,
        )

    def _transition(
        self,
        partitions: Iterable[int],
        decide: Callable[[int, CheckpointEntry | None], CheckpointEntry | None],
    ) -> list[int]:
        """Read the rows, let ``decide`` compute each partition's next row (None: leave it),
        and swap them in, in one commit, where unchanged; a row that changed meanwhile
        is read and decided again. Returns the partitions written.
        """
        pending, written = list(dict.fromkeys(partitions)), []
        for _attempt in range(_CAS_ATTEMPTS):
            rows = self.entries()
            changes = [(rows.get(p), new) for p in pending if (new := decide(p, rows.get(p)))]
            swapped = {e.partition for e in self.checkpoints.compare_and_set_many(changes)}
            written += [new.partition for _, new in changes if new.partition in swapped]
            pending = [new.partition for _, new in changes if new.partition not in swapped]
            if not pending:
                return written
        raise CommitConflictError(
            f"cleaner states of {self.log_path} partitions {pending} kept changing under "
            f"{_CAS_ATTEMPTS} attempts to update them"
        )


@dataclass(frozen=True)
class CleaningPlan:
    """Every partition of one log version as a cleaning candidate (`LogPlanner.plan`).

    ``fresh`` unless checkpoint rows older than this plan went into it (a partition the
    log records no pass for, measured from the cached checkpoint table).
    """

    version: int
    logs: tuple[LogToClean, ...]
    fresh: bool = True
    foreign_files: bool = False  # another engine's files, for the next pass to rewrite


class LogPlanner:
    """Plans one log's cleaning; caches the checkpoint rows it read for ``backoff_ms``."""

    def __init__(
        self,
        log: LogTable,
        checkpoints: CleanerOffsetCheckpoint,
        config: CleanerConfig,
        *,
        clock: Callable[[], int],
    ) -> None:
        self.log = log
        self.checkpoints = checkpoints
        self.config = config
        self.clock = clock
        self._checkpoint_cache: tuple[float, dict[int, int] | None] = (0.0, None)

    def plan(
        self, snapshot: LogSnapshot | None = None, *, fresh_checkpoints: bool = True
    ) -> CleaningPlan | None:
        """Every partition as a cleaning candidate, measured now (no Spark job); None
        without a log.

        The first dirty offset comes from the cleaner's ``txn`` entry in the log;
        the checkpoint table is read only for partitions the log has none for
        (a log not cleaned yet, or a checkpoint set by hand). Without
        ``fresh_checkpoints`` (a batch's plan) rows read within ``backoff_ms`` do.
        """
        snapshot = snapshot or self.log.snapshot()
        if snapshot is None:
            return None
        recorded = {p: snapshot.cleaner_offset(p) for p in snapshot.partitions}
        fresh = True
        if any(offset is None for offset in recorded.values()):
            checkpointed, fresh = self._checkpointed_offsets(snapshot, fresh=fresh_checkpoints)
            for p, offset in checkpointed.items():
                if recorded.get(p, 0) is None:
                    recorded[p] = offset
        now = self.clock()
        candidates = []
        for p in snapshot.partitions:
            segments = snapshot.segments.get(p, [])
            offsets = cleanable_offsets(
                segments,
                checkpoint_dirty_offset=recorded[p],
                log_start_offset=snapshot.log_start_offset(p),
                log_end_offset=snapshot.log_end_offset(p),
                now_ms=now,
                min_compaction_lag_ms=self.config.min_compaction_lag_ms,
            )
            candidates.append(log_to_clean(self.log.uri, p, segments, offsets))
        if any(c.has_expired_tombstones(now) for c in candidates):
            held = self.consumer_holds(snapshot, now_ms=now)
            candidates = [
                without_held_tombstones(
                    c, snapshot.segments.get(c.partition, []), held.get(c.partition)
                )
                for c in candidates
            ]
        return CleaningPlan(
            snapshot.version, tuple(candidates), fresh, foreign_files=bool(snapshot.foreign_files)
        )

    def consumer_holds(self, snapshot: LogSnapshot, *, now_ms: int) -> dict[int, int]:
        """Per partition, where registered consumers hold expired tombstones (see
        `consumer_holds`); empty when no live consumer reads the log."""
        return consumer_holds(
            LogLocation(self.checkpoints.uri, self.checkpoints.storage_options),
            self.log.uri,
            snapshot.partitions,
            now_ms=now_ms,
            table_id=snapshot.table_id,
            version=snapshot.version,
        )

    def _checkpointed_offsets(
        self, snapshot: LogSnapshot, *, fresh: bool
    ) -> tuple[dict[int, int], bool]:
        """This log's checkpointed first dirty offsets, and whether they were read now.
        Rows that describe another table or history are left out (`split_histories`):
        the partition starts from what the log itself records."""
        read_at, offsets = self._checkpoint_cache
        if fresh or offsets is None or time.monotonic() - read_at > self.config.backoff_ms / 1000:
            rows, _ = split_histories(
                self.checkpoints.read(self.log.uri),
                table_id=snapshot.table_id,
                version=snapshot.version,
                latest_version=lambda: self.log.snapshot(verify=False).version,  # type: ignore[union-attr]
            )
            offsets = {p: entry.first_dirty_offset for (_, p), entry in rows.items()}
            self._checkpoint_cache = (time.monotonic(), offsets)
            return offsets, True
        return offsets, False


def consumer_holds(
    checkpoint_table: LogLocation,
    log_path: str,
    partitions: Sequence[int],
    *,
    now_ms: int,
    table_id: str | None = None,
    version: int | None = None,
) -> dict[int, int]:
    """Per partition, the offset below which expired tombstones may go (empty: no consumer).
    Offsets committed for another table or history of the log (``table_id``, ``version``)
    hold nothing."""
    uri = consumer_offsets_uri(checkpoint_table.uri)
    offsets = ConsumerOffsets(uri, checkpoint_table.storage_options)
    return offsets.held_below(
        log_path, partitions, now_ms=now_ms, table_id=table_id, version=version
    )


def without_held_tombstones(
    log: LogToClean, segments: Sequence[Segment], held_below: int | None
) -> LogToClean:
    """``log`` with only the tombstones a pass may drop counted as a reason to clean. Pure.

    A tombstone held for a consumer is no reason for a pass: the earliest delete horizon
    counts only segments that start below ``held_below`` (and below the first uncleanable
    offset, as `log_to_clean` counts them). Without this a held tombstone would make its
    partition cleanable on every check, and each pass would copy it again.
    """
    if held_below is None or log.earliest_delete_horizon_ms is None:
        return log
    horizons = [
        s.min_delete_horizon_ms
        for s in segments
        if s.min_delete_horizon_ms is not None
        and s.base_offset < min(held_below, log.first_uncleanable_offset)
    ]
    return replace(log, earliest_delete_horizon_ms=min(horizons, default=None))


def held_tombstones(
    log: LogLocation, written: Sequence[WrittenSegment], *, pass_start_ms: int
) -> int:
    """How many tombstones a pass kept past their delete horizon: only held ones survive it.

    Reads the ``delete_horizon_ms`` column of the written files whose statistics say
    they may hold one (only tombstones carry a horizon).
    """
    fs, root = log.filesystem()
    held = 0
    for segment in written:
        low = json.loads(segment.stats or "{}").get("minValues", {}).get(DELETE_HORIZON_MS)
        if low is None or low >= pass_start_ms:
            continue
        column = pq.read_table(
            f"{root}/{segment.path}", filesystem=fs, columns=[DELETE_HORIZON_MS]
        ).column(DELETE_HORIZON_MS)
        held += pc.sum(pc.less(column, pass_start_ms)).as_py() or 0
    return held


@dataclass(frozen=True)
class Claim:
    """The partitions a pass holds: their plans (``logs``), of ``snapshot``; ``work_left``
    when the byte budget left cleanable partitions for the next pass."""

    snapshot: LogSnapshot
    logs: list[LogToClean]
    work_left: bool

    @property
    def partitions(self) -> set[int]:
        return {log.partition for log in self.logs}


def grab_filthiest_compacted_log(
    log: LogTable,
    planner: LogPlanner,
    manager: CleanerManager,
    config: CleanerConfig,
    snapshot: LogSnapshot,
    *,
    plan: CleaningPlan | None = None,
    now_ms: int,
    force: bool,
) -> Claim | None:
    """Choose the cleanable partitions of ``snapshot``, dirtiest first, claim them, plan
    again if the log moved meanwhile, and cut the choice to the pass's byte budget; None:
    nothing to do. ``plan`` is the round's measure of the log: the choice is made from it
    when it is of ``snapshot``'s version and its checkpoint rows were read fresh (the
    log is then planned once a pass), else from a plan of ``snapshot`` made here.
    Checkpoints found out of range are rewritten on the way, as Kafka does.

    Raises `CleanerError` (caused by `ConcurrentCommitError`, so the caller plans again) when
    another engine rewrote files after the choice.
    """
    if plan is None or not plan.fresh or plan.version != snapshot.version:
        plan = planner.plan(snapshot)  # the pass's own version, checkpoint rows read now
        assert plan is not None
    chosen = filthiest_cleanable(plan.logs, config, now_ms=now_ms, force=force)
    reset = [p for p in plan.logs if p.force_checkpoint and p not in chosen]
    if reset:
        manager.reset_checkpoints(reset, table_id=snapshot.table_id, version=snapshot.version)
    if not chosen:
        return None
    claimed = set(manager.start_cleaning([p.partition for p in chosen]))
    if not claimed:
        return None  # paused, cleaned by a live cleaner elsewhere, or backing off
    if claimed != {p.partition for p in chosen}:
        logger.info("cleaning only %s of %s: the others are busy", claimed, log.uri)
    fresh = log.snapshot()
    assert fresh is not None
    if fresh.foreign_files:  # another engine rewrote files since: absorb them first
        manager.abort_cleaning(claimed)
        raise CleanerError(
            "another engine rewrote files while this pass was planned",
            log_path=log.uri,
            partition=chosen[0].partition,
        ) from ConcurrentCommitError(f"{log.uri}: foreign files at version {fresh.version}")
    if fresh.version != snapshot.version:  # plan again after the claim: less to conflict
        snapshot = fresh
        replanned = planner.plan(snapshot)
        assert replanned is not None
        chosen = filthiest_cleanable(replanned.logs, config, now_ms=now_ms, force=force)
    chosen = [p for p in chosen if p.partition in claimed]
    budgeted = within_budget(chosen, snapshot.segments, config.log_cleaner_max_bytes_per_pass)
    unused = claimed - {p.partition for p in budgeted.logs}
    if unused:
        manager.abort_cleaning(unused)
    if not budgeted.logs:
        return None
    return Claim(snapshot, list(budgeted.logs), budgeted.work_left)
