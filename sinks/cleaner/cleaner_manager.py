"""`CleanerManager`: Kafka's ``LogCleanerManager`` for one log, in the checkpoint table.

It chooses (`grab_filthiest`: the cleanable partitions, dirtiest first, that this
owner may claim), claims (`start_cleaning`, kept live by `heartbeating`), and records
(`checkpoint_pass` / `done_cleaning`, `abort_cleaning`, `mark_uncleanable`), and
pauses around ``delete_records`` and restores. Kafka keeps these states in memory,
guarded by a lock, because one broker owns its logs; here cleaners run in different
processes, so each state lives in the checkpoint table's row for the partition
(`checkpoints.cleaner_states` says what a row means) and moves by compare-and-set
(`CleanerOffsetCheckpoint.compare_and_set`). A partition whose pass failed is retried
once ``backoff_ms`` doubled per failed attempt (capped at an hour) has passed.

The state is advisory for correctness: a pass that loses its claim (expired,
paused) can still only commit against the snapshot it planned from, and delta-rs
rejects a swap whose removed files another commit already removed. The states
save wasted passes and make pauses and failures visible to ``status``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint
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
from sinks.cleaner.log_to_clean import LogToClean, filthiest_first
from sinks.config import CleanerConfig
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

    def grab_filthiest(
        self,
        candidates: Sequence[LogToClean],
        config: CleanerConfig,
        *,
        now_ms: int,
        force: bool = False,
        claimable_only: bool = False,
    ) -> list[LogToClean]:
        """The cleanable partitions of ``candidates`` (SPEC rule 4), dirtiest first.

        ``claimable_only`` also drops partitions this owner may not start now (paused,
        cleaned elsewhere, or uncleanable inside its backoff): one read of the table.
        """
        chosen = [
            log
            for log in filthiest_first(candidates)
            if log.is_cleanable(
                now_ms=now_ms,
                min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
                max_compaction_lag_ms=config.max_compaction_lag_ms,
                force=force,
            )
        ]
        if claimable_only and chosen:
            rows = self.entries()
            chosen = [log for log in chosen if self.may_clean(log.partition, rows)]
        return chosen

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

    def reset_checkpoints(self, reset: Sequence[LogToClean]) -> None:
        """Rewrite checkpoints found out of range, as Kafka does even when nothing is cleaned."""
        rows = self.entries()
        self.checkpoints.write(
            self._base(rows.get(log.partition), log.partition).with_changes(
                first_dirty_offset=log.first_dirty_offset,
                first_uncleanable_offset=log.first_uncleanable_offset,
            )
            for log in reset
        )

    def checkpoint_pass(self, cleaned: Sequence[LogToClean], stats: CleanerStats) -> None:
        """Record a committed pass: each partition's end offset and figures, then release it."""
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
            )
            for log in cleaned
        )

    # -- transitions ---------------------------------------------------------------------

    def start_cleaning(self, partitions: Iterable[int]) -> list[int]:
        """Claim ``partitions`` for a pass (state ``in_progress``); returns those claimed.

        A partition is skipped when paused, when another live owner cleans it, or
        when it is uncleanable and its backoff has not passed.
        """
        claimed = []
        for p in partitions:

            def claim(entry: CheckpointEntry | None, p: int = p) -> CheckpointEntry | None:
                if not self.may_clean(p, {p: entry} if entry else {}):
                    return None
                return self._base(entry, p).with_changes(
                    cleaner_state=IN_PROGRESS,
                    state_owner=self.owner,
                    state_heartbeat_ms=self.clock(),
                )

            if self._transition(p, claim) is not None:
                claimed.append(p)
        return claimed

    def heartbeat(self, partitions: Iterable[int]) -> list[int]:
        """Prove this owner's passes live; returns the partitions it still owns."""
        kept = []
        for p in partitions:

            def beat(entry: CheckpointEntry | None, p: int = p) -> CheckpointEntry | None:
                if not self._owns(entry):
                    return None
                assert entry is not None
                return entry.with_changes(state_heartbeat_ms=self.clock())

            if self._transition(p, beat) is not None:
                kept.append(p)
        return kept

    def done_cleaning(self, entries: Iterable[CheckpointEntry]) -> None:
        """Record a committed pass's checkpoint rows and release the partitions.

        The figures are written whatever the state (the pass is committed in the
        log); a partition paused meanwhile stays paused, any other goes ``idle``,
        and an uncleanable mark is cleared.
        """
        for done in entries:

            def finish(
                entry: CheckpointEntry | None, done: CheckpointEntry = done
            ) -> CheckpointEntry:
                paused = entry is not None and entry.cleaner_state == PAUSED
                return done.with_changes(
                    cleaner_state=PAUSED if paused else IDLE,
                    state_owner=entry.state_owner if paused and entry else None,
                    state_heartbeat_ms=None,
                    uncleanable_reason=None,
                    uncleanable_since_ms=None,
                    failed_attempts=0,
                )

            self._transition(done.partition, finish)

    def abort_cleaning(self, partitions: Iterable[int]) -> None:
        """Release partitions this owner claimed without a committed pass (a lost race)."""
        for p in partitions:

            def release(entry: CheckpointEntry | None) -> CheckpointEntry | None:
                if not self._owns(entry):
                    return None
                assert entry is not None
                return entry.with_changes(
                    cleaner_state=IDLE, state_owner=None, state_heartbeat_ms=None
                )

            self._transition(p, release)

    def mark_uncleanable(self, partitions: Iterable[int], error: BaseException | str) -> None:
        """Mark partitions whose pass failed: the error, the time, one more failed attempt.

        A paused partition stays paused (its failure is still counted).
        """
        reason = (error if isinstance(error, str) else f"{type(error).__name__}: {error}")[
            :_REASON_CHARS
        ]
        for p in partitions:

            def mark(entry: CheckpointEntry | None, p: int = p) -> CheckpointEntry:
                base = self._base(entry, p)
                paused = base.cleaner_state == PAUSED
                return base.with_changes(
                    cleaner_state=PAUSED if paused else UNCLEANABLE,
                    state_owner=base.state_owner if paused else None,
                    state_heartbeat_ms=None,
                    uncleanable_reason=reason,
                    uncleanable_since_ms=self.clock(),
                    failed_attempts=(base.failed_attempts or 0) + 1,
                )

            self._transition(p, mark)

    def pause_cleaning(self, partitions: Iterable[int], *, timeout_ms: int | None = None) -> None:
        """Stop cleaning of ``partitions`` until `resume_cleaning` (idempotent).

        Waits while another owner's pass is live (Kafka's abortAndPauseCleaning),
        at most ``timeout_ms`` (default: the heartbeat timeout, after which the
        pass counts as dead). Raises `CleanerError` when the pass outlives it.
        """
        wanted = list(partitions)
        deadline = time.monotonic() + (timeout_ms or self.heartbeat_timeout_ms) / 1000
        for p in wanted:

            def pause(entry: CheckpointEntry | None, p: int = p) -> CheckpointEntry:
                base = self._base(entry, p)
                keep = base.cleaner_state == UNCLEANABLE
                return base.with_changes(
                    cleaner_state=PAUSED,
                    state_owner=self.owner,
                    state_heartbeat_ms=None,
                    uncleanable_reason=base.uncleanable_reason if keep else None,
                )

            while True:
                entry = self.entries().get(p)
                if not _live_other(self, entry):
                    if self._transition(p, pause, only_if=lambda e: not _live_other(self, e)):
                        break
                    continue
                assert entry is not None
                if time.monotonic() > deadline:
                    raise CleanerError(
                        f"cannot pause cleaning: a pass of {entry.state_owner} is still running",
                        log_path=self.log_path,
                        partition=p,
                    )
                time.sleep(0.2)

    def resume_cleaning(self, partitions: Iterable[int]) -> None:
        """Let ``partitions`` be cleaned again; a partition that is not paused is left alone."""
        for p in partitions:

            def resume(entry: CheckpointEntry | None) -> CheckpointEntry | None:
                if entry is None or entry.cleaner_state != PAUSED:
                    return None
                failed = bool(entry.uncleanable_reason) and (entry.failed_attempts or 0) > 0
                return entry.with_changes(
                    cleaner_state=UNCLEANABLE if failed else IDLE,
                    state_owner=None,
                    state_heartbeat_ms=None,
                )

            self._transition(p, resume)

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

    def _transition(
        self,
        partition: int,
        decide: Callable[[CheckpointEntry | None], CheckpointEntry | None],
        *,
        only_if: Callable[[CheckpointEntry | None], bool] | None = None,
    ) -> CheckpointEntry | None:
        """Read the row, let ``decide`` compute the next one, and swap it in if unchanged.

        Returns the row written, or None when ``decide`` (or ``only_if``) declined.
        """
        for _attempt in range(_CAS_ATTEMPTS):
            current = self.entries().get(partition)
            if only_if is not None and not only_if(current):
                return None
            new = decide(current)
            if new is None:
                return None
            if self.checkpoints.compare_and_set(current, new):
                return new
        raise CommitConflictError(
            f"cleaner state of {self.log_path} partition {partition} kept changing under "
            f"{_CAS_ATTEMPTS} attempts to update it"
        )


def _live_other(manager: CleanerManager, entry: CheckpointEntry | None) -> bool:
    return is_live_claim(
        entry,
        now_ms=manager.clock(),
        heartbeat_timeout_ms=manager.heartbeat_timeout_ms,
        other_than=manager.owner,
    )
