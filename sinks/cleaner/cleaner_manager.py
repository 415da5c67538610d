"""`CleanerManager`: Kafka's ``LogCleanerManager`` for one log: the partitions' cleaner
states (design.md §31) and checkpoints (design.md §8), in the checkpoint table.

It tells which partitions this owner may claim (`claimable`), claims (`start_cleaning`,
kept live by `heartbeating`), records (`checkpoint_pass` / `done_cleaning`,
`abort_cleaning`, `mark_uncleanable`), and pauses around ``delete_records`` and restores.
Each transition is one compare-and-set commit over a pass's partitions, however many
(`CleanerOffsetCheckpoint.compare_and_set_many`); `checkpoints.cleaner_states` says what
a row means. The states are advisory: correctness rests on design.md §9 and §11.
A transition that keeps losing its compare-and-set (20 tries) raises
`CommitConflictError`, having written nothing more.

What to claim is planned in `sinks.cleaner.pass_planning`; the choice and the claim are
made together by `sinks.cleaner.cleaner.Cleaner.claim_filthiest`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint, now_ms
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
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_to_clean import (
    LogToClean,
)
from sinks.errors import CleanerError, CommitConflictError

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
    Every transition is a compare-and-set on the checkpoint table and raises
    `CommitConflictError` when it keeps losing; none blocks except `pause_cleaning`,
    which waits for a live pass of another owner to end. Reads are read-only.
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
        self.clock = clock or now_ms
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
        """Whether this owner may start a pass over ``partition`` now (``entries``: rows
        already read, else one read)."""
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

    def claimable(self, partitions: Sequence[LogToClean]) -> list[LogToClean]:
        """The ``partitions`` this owner may start now (not paused, not cleaned elsewhere,
        not uncleanable inside its backoff), in their order: one read."""
        rows = self.entries() if partitions else {}
        return [c for c in partitions if self.may_clean(c.partition, rows)]

    def retry_at_ms(self) -> int | None:
        """When (epoch ms) the first partition of this log backing off after a failed pass
        may be tried again; None when none is backing off."""
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
        the rows name the table (``table_id``) and ``version`` they were measured at.

        An upsert, not a compare-and-set: idempotent, and retried on conflicts by the table.
        """
        rows = self.entries()
        self.checkpoints.write(
            self._base(rows.get(c.partition), c.partition).with_changes(
                first_dirty_offset=c.first_dirty_offset,
                first_uncleanable_offset=c.first_uncleanable_offset,
                table_id=table_id,
                log_version=version,
            )
            for c in reset
        )

    def checkpoint_pass(
        self, cleaned: Sequence[LogToClean], stats: CleanerStats, *, table_id: str | None = None
    ) -> None:
        """Record a committed pass: each partition's end offset and figures, then release it.
        The rows name the Delta table (``table_id``) and the version after the pass.

        `done_cleaning` for ``cleaned``; idempotent; raises `CommitConflictError`.
        """
        self.done_cleaning(
            CheckpointEntry(
                log_path=self.log_path,
                partition=c.partition,
                first_dirty_offset=stats.end_offsets[c.partition],
                first_uncleanable_offset=c.first_uncleanable_offset,
                last_clean_ms=stats.start_ms,
                last_pass_duration_ms=stats.duration_ms,
                bytes_read=stats.bytes_read,
                bytes_written=stats.bytes_written,
                records_read=stats.records_read,
                records_written=stats.records_written,
                max_dirty_ratio=c.cleanable_ratio,
                log_version=stats.delta_version,
                table_id=table_id,
            )
            for c in cleaned
        )

    # -- transitions ---------------------------------------------------------------------

    def start_cleaning(self, partitions: Iterable[int]) -> list[int]:
        """Claim ``partitions`` for a pass (state ``in_progress``); returns those claimed.

        A partition is skipped when paused, when another live owner cleans it, or
        when it is uncleanable and its backoff has not passed. Idempotent for this owner
        (a partition it already claimed is claimed again, its heartbeat renewed).
        Raises `CommitConflictError`.
        """

        def claim(p: int, entry: CheckpointEntry | None) -> CheckpointEntry | None:
            if not self.may_clean(p, {p: entry} if entry else {}):
                return None
            return self._base(entry, p).with_changes(
                cleaner_state=IN_PROGRESS, state_owner=self.owner, state_heartbeat_ms=self.clock()
            )

        return self._transition(partitions, claim)

    def heartbeat(self, partitions: Iterable[int]) -> list[int]:
        """Prove this owner's passes live; returns the partitions it still owns.
        Idempotent; raises `CommitConflictError`."""

        def beat(_p: int, entry: CheckpointEntry | None) -> CheckpointEntry | None:
            return (
                entry.with_changes(state_heartbeat_ms=self.clock()) if self._owns(entry) else None
            )

        return self._transition(partitions, beat)

    def done_cleaning(self, entries: Iterable[CheckpointEntry]) -> None:
        """Record a committed pass's checkpoint rows and release the partitions.

        The figures are written whatever the state (the pass is committed in the
        log); a partition paused meanwhile stays paused, any other goes ``idle``,
        and an uncleanable mark is cleared. Idempotent; raises `CommitConflictError`.
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
        """Release partitions this owner claimed without a committed pass (a lost race).
        Partitions it does not own are left alone. Idempotent; raises `CommitConflictError`."""

        def release(_p: int, entry: CheckpointEntry | None) -> CheckpointEntry | None:
            if not self._owns(entry):
                return None
            assert entry is not None
            return entry.with_changes(cleaner_state=IDLE, state_owner=None, state_heartbeat_ms=None)

        self._transition(partitions, release)

    def mark_uncleanable(self, partitions: Iterable[int], error: BaseException | str) -> None:
        """Mark partitions whose pass failed: the error, the time, one more failed attempt.

        A paused partition stays paused (its failure is still counted). Not idempotent:
        each call counts one more failed attempt. Raises `CommitConflictError`.
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
        pass counts as dead). Raises `CleanerError` when the pass outlives it (partitions
        already paused stay paused) and `CommitConflictError`.
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
        """Let ``partitions`` be cleaned again; a partition that is not paused is left alone.
        A paused partition with a recorded failure goes back to ``uncleanable``, any other
        to ``idle``. Idempotent; raises `CommitConflictError`."""

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
        """No pass over ``partitions`` inside the block (`pause_cleaning`, then resume,
        also when the block raises); raises what `pause_cleaning` raises."""
        self.pause_cleaning(partitions)
        try:
            yield
        finally:
            self.resume_cleaning(partitions)

    @contextmanager
    def heartbeating(self, partitions: Iterable[int]) -> Iterator[None]:
        """Keep proving this owner's claims live (every third of the timeout) inside the block,
        on a daemon thread; a failed beat is logged, never raised."""
        claimed = list(partitions)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_timeout_ms / 3000):
                try:
                    self.heartbeat(claimed)
                except Exception:  # a missed beat only risks a takeover
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
