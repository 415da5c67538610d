"""`LogCleaner`: Kafka's ``LogCleaner`` and its ``CleanerThread``, for one log.

Kafka keeps cleaning off the produce path: a produce request appends and
returns, and cleaner threads pick the filthiest log, clean it, and back off.
Here the ``foreachBatch`` hook appends and hands the log to its `LogCleaner`:

- *inline* (direct calls, tests, the synchronous mode): `maintain` runs in the
  caller's thread right after the append, as the hook always did;
- *background* (inside a streaming query): `wakeup` signals a daemon worker
  thread beside the query, which runs the same round while the next
  micro-batches append. An append never waits for a pass, and never fails
  because a pass committed first: its commit is retried against the new
  version with the same files (`sinks.log.log_append`), as a pass removes no
  file an append adds.

A round (`maintain`) is what Kafka's log manager and cleaner threads do between
them: retention (``cleanup.policy`` with ``delete``), then one pass over the
cleanable partitions (dirtiest first, SPEC rule 4), each pass claimed in the
checkpoint table (`CleanerManager`) and checkpointed where it ended; then, at
most every ``log.retention.check.interval.ms``, the deletion of files out of the
log longer than the history window (`SegmentDeleter`).

One pass at a time per `LogCleaner`: a pass holds the cleaner's lock, so
``clean()`` from the caller and the worker never race each other (passes of
other processes are kept apart by the claims). Between requests the worker
looks again every ``backoff_ms`` (Kafka's ``log.cleaner.backoff.ms``), which is
how time-based triggers (the max compaction lag, expired tombstones) fire
without a new append; it ends after ``idle_ms`` without a request (a stopped or
long-idle query; the next batch starts it again). A foreachBatch function
cannot ask whether its query still runs: the batch's session is a clone that
does not list it. `shutdown` stops the worker after the pass it is running,
and the interpreter's exit does the same. A worker killed mid-pass (the
process died) leaves what a crash leaves: the old files or the new ones, never
both; recovery handles the rest.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from deltalake.exceptions import CommitFailedError
from pyspark.sql import SparkSession

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint
from sinks.cleaner.cleaner import Cleaner
from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.consumer_holds import consumer_holds, without_held_tombstones
from sinks.cleaner.log_to_clean import (
    LogToClean,
    cleanable_offsets,
    dirty_ratio,
    filthiest_first,
    log_to_clean,
    within_budget,
)
from sinks.cleaner.throttler import Throttler
from sinks.config import LONG_MAX, CleanerConfig
from sinks.crash_points import CLEAN_BEFORE_CHECKPOINT, crash_point
from sinks.errors import CleanerError, CommitConflictError
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.maintenance import retention
from sinks.maintenance.rearrangement import absorb
from sinks.maintenance.retention import RetentionPlan
from sinks.maintenance.segment_deleter import SegmentDeleter
from sinks.shutdown import stop_at_exit

logger = logging.getLogger("compacted_sink")

CleaningMode = Literal["auto", "background", "inline"]
"""Where passes run: ``inline`` after each append in the hook's thread, ``background``
on a worker thread beside the query, ``auto`` background inside a streaming query and
inline for direct calls."""

DEFAULT_BACKOFF_MS = 15_000  # Kafka's log.cleaner.backoff.ms
DEFAULT_IDLE_MS = 600_000
PASS_ATTEMPTS = 3
"""How many times `LogCleaner.clean` plans a pass whose commit another writer's beat."""
PassListener = Callable[[CleanerStats], None]


@dataclass(frozen=True)
class RoundReport:
    """What one round did: the retention plan applied (if any) and the pass (if any)."""

    retention: RetentionPlan | None = None
    clean: CleanerStats | None = None


class LogCleaner:
    """Retention and cleaning of one log, inline (`maintain`, `clean`) or on a worker thread.

    Holds no Spark session between calls: each call (or `wakeup`) brings the one to
    use. Not picklable while its worker runs; a sink creates it lazily.
    """

    def __init__(
        self,
        log: LogTable,
        checkpoints: CleanerOffsetCheckpoint,
        manager: CleanerManager,
        cleaner: Cleaner,
        config: CleanerConfig,
        *,
        clock: Callable[[], int],
        backoff_ms: int = DEFAULT_BACKOFF_MS,
        idle_ms: int = DEFAULT_IDLE_MS,
    ) -> None:
        self.log = log
        self.checkpoints = checkpoints
        self.manager = manager
        self.cleaner = cleaner
        self.config = config
        self.clock = clock
        self.backoff_ms = backoff_ms
        self.idle_ms = idle_ms
        self.listeners: list[PassListener] = []
        self.last_round: RoundReport | None = None
        self.last_error: BaseException | None = None
        self.passes = 0
        self._pass_lock = threading.Lock()
        self._worker: _CleanerThread | None = None
        self._worker_lock = threading.Lock()
        self._checkpoint_cache: tuple[float, dict[int, int] | None] = (0.0, None)
        self.segment_deleter = SegmentDeleter(
            log.uri,
            checkpoints.uri,
            window_ms=config.file_delete_delay_ms,
            check_interval_ms=config.log_retention_check_interval_ms,
            storage_options=log.storage_options,
        )
        self.throttler = Throttler(config.log_cleaner_io_max_bytes_per_second)

    # -- measuring -------------------------------------------------------------------------

    def logs_to_clean(
        self, snapshot: LogSnapshot | None = None, *, fresh_checkpoints: bool = True
    ) -> list[LogToClean]:
        """Every partition as a cleaning candidate, measured now (no Spark job).

        The first dirty offset comes from the cleaner's ``txn`` entry in the log;
        the checkpoint table is read only for partitions the log has none for
        (a log not cleaned yet, or a checkpoint set by hand). Without
        ``fresh_checkpoints`` (a batch's report) rows read within ``backoff_ms`` do.
        """
        snapshot = snapshot or self.log.snapshot()
        if snapshot is None:
            return []
        recorded = {p: snapshot.cleaner_offset(p) for p in snapshot.partitions}
        if any(offset is None for offset in recorded.values()):
            for p, offset in self._checkpointed_offsets(fresh=fresh_checkpoints).items():
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
        return candidates

    def consumer_holds(self, snapshot: LogSnapshot, *, now_ms: int) -> dict[int, int]:
        """Per partition, where registered consumers hold expired tombstones (see
        `sinks.cleaner.consumer_holds`); empty when no live consumer reads the log."""
        return consumer_holds(
            self.checkpoints.uri,
            self.log.uri,
            snapshot.partitions,
            now_ms=now_ms,
            storage_options=self.checkpoints.storage_options,
        )

    def _checkpointed_offsets(self, *, fresh: bool) -> dict[int, int]:
        read_at, offsets = self._checkpoint_cache
        if fresh or offsets is None or time.monotonic() - read_at > self.backoff_ms / 1000:
            rows = self.checkpoints.read(self.log.uri)
            offsets = {p: entry.first_dirty_offset for (_, p), entry in rows.items()}
            self._checkpoint_cache = (time.monotonic(), offsets)
        return offsets

    def has_work(self, snapshot: LogSnapshot) -> bool:
        """Whether a round now could do anything: retention, deletion of expired files, a
        checkpoint to reset, or a cleanable partition (SPEC rule 4, time triggers
        included). No Spark job.

        A batch asks this before handing the log over, so the many batches that leave
        nothing cleanable cost no round (no snapshot load, no claim) beside the query.
        """
        if self.config.delete or self.segment_deleter.due():
            return True  # retention, or expired files to delete (the deleter's interval)
        if not self.config.compact:
            return False
        if snapshot.foreign_files:
            return True  # another engine's files, for the next pass to rewrite
        now = self.clock()
        return any(
            log.force_checkpoint
            or log.is_cleanable(
                now_ms=now,
                min_cleanable_dirty_ratio=self.config.min_cleanable_dirty_ratio,
                max_compaction_lag_ms=self.config.max_compaction_lag_ms,
            )
            for log in self.logs_to_clean(snapshot, fresh_checkpoints=False)
        )

    def dirty_ratio(
        self, snapshot: LogSnapshot | None = None, *, fresh_checkpoints: bool = True
    ) -> float:
        """Cleanable bytes over clean plus cleanable bytes, over all partitions."""
        return dirty_ratio(self.logs_to_clean(snapshot, fresh_checkpoints=fresh_checkpoints))

    # -- one round, in the caller's thread ---------------------------------------------------

    def maintain(
        self,
        spark: SparkSession,
        *,
        force: bool = False,
        max_tasks: int | None = None,
        niceness: int = 0,
    ) -> RoundReport:
        """Retention (delete policies), then one pass over what is cleanable now.

        ``max_tasks`` and ``niceness`` are the pass's share of the cores (see `clean`).

        A failed pass is recorded (`last_error`, the partitions marked uncleanable)
        and logged, not raised: the batch that triggered it is committed. Retention
        that keeps conflicting gives up until the next round.
        """
        plan = None
        if self.config.delete:
            try:
                plan = self.retain()
            except CommitConflictError as e:
                logger.warning("retention of %s gave up until the next round: %s", self.log.uri, e)
        stats = None
        if self.config.compact:
            try:
                stats = self.clean(spark, force=force, max_tasks=max_tasks, niceness=niceness)
            except CleanerError as e:
                self.last_error = e
                logger.warning("cleaning %s failed: %s", self.log.uri, e)
        self.segment_deleter.maybe_run(self.manager.busy_partitions)
        self.last_round = RoundReport(retention=plan, clean=stats)
        return self.last_round

    def retain(self) -> RetentionPlan:
        """Time and size retention now (``cleanup.policy`` contains ``delete``)."""
        return retention.apply_retention(
            self.log,
            now_ms=self.clock(),
            retention_ms=self.config.retention_ms,
            retention_bytes=self.config.retention_bytes,
        )

    def clean(
        self,
        spark: SparkSession,
        *,
        force: bool = False,
        snapshot: LogSnapshot | None = None,
        max_tasks: int | None = None,
        niceness: int = 0,
    ) -> CleanerStats | None:
        """One pass over every cleanable partition now, dirtiest first; None when none is.

        The pass runs at most ``max_tasks`` Spark tasks at once (None: every core), each
        niced by ``niceness`` (`sinks.cleaner.cpu_priority`).

        Without ``force`` a partition qualifies by SPEC rule 4 (ratio, max lag, or an
        expired tombstone); with it, any cleanable bytes or expired tombstone will do.
        Waits for a pass of this cleaner's worker to end first. Raises `CleanerError`
        when the pass fails; the log is then unchanged.
        """
        with self._pass_lock:
            stats = None
            for attempt in range(PASS_ATTEMPTS):
                snapshot = snapshot if attempt == 0 and snapshot else self.log.snapshot()
                if snapshot is None:
                    return None
                try:
                    stats = self._clean(
                        spark, snapshot, force=force, max_tasks=max_tasks, niceness=niceness
                    )
                    break
                except CleanerError as e:
                    # Another writer swapped the same files first (another cleaner, an
                    # OPTIMIZE): nothing was committed; plan again from the new version.
                    if attempt + 1 == PASS_ATTEMPTS or not isinstance(
                        e.__cause__, CommitFailedError
                    ):
                        raise
                    logger.info("pass over %s conflicted; planning again: %s", self.log.uri, e)
            if stats is not None:
                slept = self.throttler.maybe_throttle(stats.bytes_read + stats.bytes_written)
                if slept:
                    stats = replace(stats, throttled_ms=int(slept * 1000))
        if stats is not None:
            self.passes += 1
            self.last_error = None
            for listener in list(self.listeners):
                listener(stats)
        return stats

    def _clean(
        self,
        spark: SparkSession,
        snapshot: LogSnapshot,
        *,
        force: bool,
        max_tasks: int | None,
        niceness: int,
    ) -> CleanerStats | None:
        """Choose, claim, re-plan after the claim, run the pass, checkpoint: Kafka's
        ``grabFilthiestCompactedLog`` + ``cleanLog`` + ``doneCleaning`` for one log.

        Files another engine wrote are rewritten into segments first (`_absorb`): a
        pass plans over segments only.
        """
        if snapshot.foreign_files:
            absorbed = self._absorb(spark, snapshot)
            if absorbed is None:
                return None
            snapshot = absorbed
        start = self.clock()
        candidates = self.logs_to_clean(snapshot)
        chosen = self._cleanable(candidates, now_ms=start, force=force)
        reset = [log for log in candidates if log.force_checkpoint and log not in chosen]
        if reset:
            self._checkpoint_resets(reset)
        if not chosen:
            return None
        claimed = set(self.manager.start_cleaning([log.partition for log in chosen]))
        if not claimed:
            return None  # paused, cleaned by a live cleaner elsewhere, or backing off
        if claimed != {log.partition for log in chosen}:
            logger.info("cleaning only %s of %s: the others are busy", claimed, self.log.uri)
        fresh = self.log.snapshot()
        assert fresh is not None
        if fresh.foreign_files:  # another engine rewrote files since: rewrite them first
            self.manager.abort_cleaning(claimed)
            raise CleanerError(
                "another engine rewrote files while this pass was planned",
                log_path=self.log.uri,
                partition=chosen[0].partition,
            ) from CommitFailedError(f"{self.log.uri}: foreign files at version {fresh.version}")
        if fresh.version != snapshot.version:  # plan again after the claim: less to conflict
            snapshot = fresh
            chosen = self._cleanable(self.logs_to_clean(snapshot), now_ms=start, force=force)
        chosen = [log for log in chosen if log.partition in claimed]
        budget = self.config.log_cleaner_max_bytes_per_pass
        plan = within_budget(chosen, snapshot.segments, budget)
        chosen = list(plan.logs)
        unused = claimed - {log.partition for log in chosen}
        if unused:
            self.manager.abort_cleaning(unused)
            claimed -= unused
        if not chosen:
            return None
        try:
            with self.manager.heartbeating(claimed):
                stats = self.cleaner.clean(
                    spark,
                    snapshot,
                    chosen,
                    pass_start_ms=start,
                    max_tasks=max_tasks,
                    niceness=niceness,
                    held_below=self.consumer_holds(snapshot, now_ms=start),
                )
        except CommitFailedError as e:
            self.manager.abort_cleaning(claimed)
            raise CleanerError(
                f"another cleaner committed first ({e}); this pass was dropped",
                log_path=self.log.uri,
                partition=chosen[0].partition,
            ) from e
        except Exception as e:
            self.manager.mark_uncleanable(claimed, e)
            raise CleanerError(
                f"pass failed ({type(e).__name__}: {str(e)[:500]}); marked uncleanable, "
                "retried with backoff",
                log_path=self.log.uri,
                partition=chosen[0].partition,
            ) from e
        if budget < LONG_MAX:
            stats = replace(stats, budget_bytes=budget, work_left=plan.work_left or stats.work_left)
        crash_point(CLEAN_BEFORE_CHECKPOINT)
        self._checkpoint(chosen, stats)
        logger.info("%s", stats.summary())
        return stats

    def _absorb(self, spark: SparkSession, snapshot: LogSnapshot) -> LogSnapshot | None:
        """Rewrite another engine's files into segments (`sinks.maintenance.rearrangement`),
        holding every partition of the log; None when some partition is busy elsewhere.

        Every partition, because a foreign file may hold any of them, and a pass over a
        partition must not run while its records sit outside its segments.
        """
        partitions = snapshot.partitions
        claimed = set(self.manager.start_cleaning(partitions))
        if claimed != set(partitions):
            self.manager.abort_cleaning(claimed)
            logger.info("files another engine wrote in %s wait: partitions busy", self.log.uri)
            return None
        try:
            with self.manager.heartbeating(claimed):
                fresh = self.log.snapshot() or snapshot
                report = absorb(
                    spark,
                    self.log,
                    fresh,
                    stats_columns=self.cleaner.stats_columns(fresh),
                    segment_bytes=self.config.segment_bytes,
                )
        except CommitFailedError as e:
            raise CleanerError(
                f"another writer rewrote the same files first ({e}); tried again next round",
                log_path=self.log.uri,
                partition=partitions[0],
            ) from e
        finally:
            self.manager.abort_cleaning(claimed)
        if report is not None:
            logger.info("cleaner: %s: %s", self.log.uri, report.summary())
        return self.log.snapshot()

    def _cleanable(
        self, candidates: Sequence[LogToClean], *, now_ms: int, force: bool
    ) -> list[LogToClean]:
        return [
            log
            for log in filthiest_first(candidates)
            if log.is_cleanable(
                now_ms=now_ms,
                min_cleanable_dirty_ratio=self.config.min_cleanable_dirty_ratio,
                max_compaction_lag_ms=self.config.max_compaction_lag_ms,
                force=force,
            )
        ]

    def _checkpoint_resets(self, reset: Sequence[LogToClean]) -> None:
        """Rewrite checkpoints found out of range, as Kafka does even when nothing is cleaned."""
        rows = self.checkpoints.read(self.log.uri)
        entries = []
        for log in reset:
            entry = rows.get((self.log.uri, log.partition)) or CheckpointEntry(
                log_path=self.log.uri, partition=log.partition, first_dirty_offset=0
            )
            entries.append(
                entry.with_changes(
                    first_dirty_offset=log.first_dirty_offset,
                    first_uncleanable_offset=log.first_uncleanable_offset,
                )
            )
        self.checkpoints.write(entries)

    def _checkpoint(self, cleaned: Sequence[LogToClean], stats: CleanerStats) -> None:
        self.manager.done_cleaning(
            CheckpointEntry(
                log_path=self.log.uri,
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

    # -- the worker thread -----------------------------------------------------------------

    def wakeup(self, spark: SparkSession) -> None:
        """Ask the worker for a round soon, starting it if needed; returns at once.

        The worker runs its rounds with ``spark`` (the session of the batch that
        started it).
        """
        with self._worker_lock:
            worker = self._worker
            if worker is not None and worker.request_round():
                return
            worker = _CleanerThread(self, spark)
            self._worker = worker
            _running.add(self)
            stop_at_exit(self)  # joined before the interpreter finalizes (sinks.shutdown)
            worker.start()
            worker.request_round()

    @property
    def running(self) -> bool:
        """True while the worker thread lives."""
        worker = self._worker
        return worker is not None and worker.is_alive()

    def await_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until the worker has no round running or pending; False on timeout."""
        worker = self._worker
        return True if worker is None else worker.await_idle(timeout_s)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop the worker after the round it is running (Kafka's ``LogCleaner.shutdown``)."""
        with self._worker_lock:
            worker, self._worker = self._worker, None
        _running.discard(self)
        if worker is not None:
            worker.stop()
            worker.join(timeout_s)


class _CleanerThread(threading.Thread):
    """The worker: a round when asked or every ``backoff_ms``; ends ``idle_ms`` after the
    last request."""

    def __init__(self, cleaner: LogCleaner, spark: SparkSession) -> None:
        super().__init__(name=f"log-cleaner-{cleaner.log.uri.rsplit('/', 1)[-1]}", daemon=True)
        self.cleaner = cleaner
        self.spark = spark
        self._last_request = time.monotonic()
        self._condition = threading.Condition()
        self._pending = False
        self._busy = False
        self._stopped = False

    def request_round(self) -> bool:
        """Ask for a round; False when this worker has stopped (start another)."""
        with self._condition:
            if self._stopped:
                return False
            self._pending = True
            self._last_request = time.monotonic()
            self._condition.notify_all()
            return True

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()

    def await_idle(self, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._condition:
            while (self._pending or self._busy) and self.is_alive():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._condition.wait(remaining)
        return True

    def run(self) -> None:
        backoff_s = self.cleaner.backoff_ms / 1000
        idle_s = self.cleaner.idle_ms / 1000
        while True:
            with self._condition:
                if not self._pending and not self._stopped:
                    self._condition.wait(backoff_s)
                if not self._pending and time.monotonic() - self._last_request > idle_s:
                    self._stopped = True  # nothing asked for long: the query stopped or idles
                if self._stopped:
                    break
                self._pending = False
                self._busy = True
            try:
                # Kafka's cleaner threads: the pass leaves the other cores to the query,
                # and yields the ones it runs on whenever the query's tasks want them.
                report = self.cleaner.maintain(
                    self.spark,
                    max_tasks=self.cleaner.config.log_cleaner_threads,
                    niceness=self.cleaner.config.log_cleaner_nice,
                )
                if report.clean is not None and report.clean.work_left:
                    with self._condition:  # the budget cut the pass: the rest goes next
                        self._pending = True
            except Exception as e:  # noqa: BLE001 - the worker must outlive one bad round
                self.cleaner.last_error = e
                logger.warning("cleaner round over %s failed", self.cleaner.log.uri, exc_info=True)
            finally:
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()
        with self._condition:
            self._busy = self._pending = False
            self._condition.notify_all()


_running: weakref.WeakSet[LogCleaner] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    # A pass in flight at exit finishes, within a bounded wait; past it (or if Spark
    # stopped first and the pass fails) the log is left as a crash would leave it.
    for cleaner in list(_running):
        cleaner.shutdown(timeout_s=30)
