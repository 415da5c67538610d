"""`LogCleaner`: Kafka's ``LogCleaner`` for one log: it owns the log's cleaning.

A `LogCleaner` builds and owns the log's `Cleaner` (one pass), its `CleanerManager`
(which partitions to clean, their claims and checkpoints, Kafka's
``LogCleanerManager``), retention (``cleanup.policy`` with ``delete``), the
`SegmentDeleter` and the `Throttler`. Its round (`maintain`) is what Kafka's log
manager and cleaner threads do between them: retention, then one pass over the
cleanable partitions (dirtiest first, design.md §4), claimed in the checkpoint table
and checkpointed where it ended; then, at most every
``log.retention.check.interval.ms``, the deletion of files out of the log longer than
the history window.

Where rounds run is `sinks.cleaner.cleaner_thread`: one loop over one or many logs,
beside a streaming query (the sink's worker, `wakeup`) or in the ``clean`` command.
Called directly (``cleaning="inline"``, ``sink.clean()``) a round runs in the caller's
thread. One pass at a time per `LogCleaner`: a pass holds the cleaner's lock, so the
caller and the worker never race each other (passes of other processes are kept apart
by the claims). A worker killed mid-pass (the process died) leaves what a crash
leaves: the old files or the new ones, never both; recovery handles the rest.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from deltalake.exceptions import CommitFailedError
from pyspark.sql import SparkSession

from checkpoints import CleanerOffsetCheckpoint
from sinks.cleaner.cleaner import Cleaner
from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.cleaner_thread import WorkerSlot
from sinks.cleaner.cleaning_plan import CleaningPlan, LogPlanner
from sinks.cleaner.filthiest_log import filthiest_cleanable, grab_filthiest_compacted_log
from sinks.cleaner.foreign_files import absorb_foreign_files
from sinks.cleaner.log_to_clean import LogToClean, dirty_ratio
from sinks.cleaner.throttler import Throttler
from sinks.config import LONG_MAX, CleanerConfig
from sinks.crash_points import CLEAN_BEFORE_CHECKPOINT, crash_point
from sinks.errors import CleanerError, CommitConflictError, TableFeatureError
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.maintenance import retention
from sinks.maintenance.retention import RetentionPlan
from sinks.maintenance.segment_deleter import SegmentDeleter

logger = logging.getLogger("compacted_sink")

CleaningMode = Literal["auto", "background", "inline"]
"""Where passes run: ``inline`` after each append in the hook's thread, ``background``
on a worker thread beside the query, ``auto`` background inside a streaming query and
inline for direct calls."""

PASS_ATTEMPTS = 3
"""How many times `LogCleaner.clean` plans a pass whose commit another writer's beat."""
PassListener = Callable[[CleanerStats], None]


@dataclass(frozen=True)
class RoundReport:
    """What one round did: the retention plan applied (if any) and the pass (if any)."""

    retention: RetentionPlan | None = None
    clean: CleanerStats | None = None


class LogCleaner:
    """Retention and cleaning of one log: a round inline (`maintain`, `clean`), or on the
    worker thread (`wakeup`).

    ``key_columns`` and ``sequence_column`` are the log's (for its `Cleaner`);
    ``owner`` names this cleaner in the checkpoint table (default: host, pid, random);
    ``recover`` is the front's recovery (once per log it opens), which a loop that opens
    logs itself (the ``clean`` command) runs before their rounds.
    Holds no Spark session between calls: each call (or `wakeup`) brings the one to
    use. Not picklable while its worker runs; a sink creates it lazily.
    """

    def __init__(
        self,
        log: LogTable,
        checkpoints: CleanerOffsetCheckpoint,
        config: CleanerConfig,
        *,
        key_columns: Sequence[str],
        sequence_column: str | None,
        clock: Callable[[], int],
        owner: str | None = None,
        idle_ms: int = 600_000,
        recover: Callable[[], object] | None = None,
    ) -> None:
        self.log = log
        self.recover = recover
        self.checkpoints = checkpoints
        self.config = config
        self.clock = clock
        self.idle_ms = idle_ms
        self.cleaner = Cleaner(
            log,
            key_columns=key_columns,
            sequence_column=sequence_column,
            delete_retention_ms=config.delete_retention_ms,
            segment_bytes=config.segment_bytes,
            dedupe_buffer_size=config.dedupe_buffer_size,
        )
        self.manager = CleanerManager(
            checkpoints, log.uri, owner=owner, clock=clock, backoff_base_ms=config.backoff_ms
        )
        self.segment_deleter = SegmentDeleter(
            log.uri,
            checkpoints.uri,
            window_ms=config.file_delete_delay_ms,
            check_interval_ms=config.log_retention_check_interval_ms,
            storage_options=log.storage_options,
        )
        self.throttler = Throttler(config.log_cleaner_io_max_bytes_per_second)
        self.planner = LogPlanner(log, checkpoints, config, clock=clock)
        self.listeners: list[PassListener] = []
        self.last_round: RoundReport | None = None
        self.last_error: BaseException | None = None
        self.passes = 0
        self._pass_lock = threading.Lock()
        self.worker = WorkerSlot(self)

    @property
    def backoff_ms(self) -> int:
        """Kafka's ``log.cleaner.backoff.ms``, from the config (written once)."""
        return self.config.backoff_ms

    # -- measuring -------------------------------------------------------------------------

    def logs_to_clean(
        self, snapshot: LogSnapshot | None = None, *, fresh_checkpoints: bool = True
    ) -> list[LogToClean]:
        """Every partition as a cleaning candidate, measured now (no Spark job)."""
        plan = self.plan(snapshot, fresh_checkpoints=fresh_checkpoints)
        return list(plan.logs) if plan is not None else []

    def plan(
        self, snapshot: LogSnapshot | None = None, *, fresh_checkpoints: bool = True
    ) -> CleaningPlan | None:
        """Every partition as a cleaning candidate, measured now (see `LogPlanner.plan`)."""
        return self.planner.plan(snapshot, fresh_checkpoints=fresh_checkpoints)

    def consumer_holds(self, snapshot: LogSnapshot, *, now_ms: int) -> dict[int, int]:
        """Where registered consumers hold expired tombstones (`LogPlanner.consumer_holds`)."""
        return self.planner.consumer_holds(snapshot, now_ms=now_ms)

    def has_work(self, plan: CleaningPlan | None, *, force: bool = False) -> bool:
        """Whether a round now could do anything: retention, deletion of expired files, a
        checkpoint to reset, or a cleanable partition (design.md §4, time triggers
        included; ``force``: any cleanable bytes). No Spark job.

        A batch asks this before handing the log over, so the many batches that leave
        nothing cleanable cost no round (no snapshot load, no claim) beside the query.
        """
        if plan is None:
            return False
        if self.config.delete or self.segment_deleter.due():
            return True  # retention, or expired files to delete (the deleter's interval)
        if not self.config.compact:
            return False
        if plan.foreign_files:
            return True
        now = self.clock()
        return any(log.force_checkpoint for log in plan.logs) or bool(
            filthiest_cleanable(plan.logs, self.config, now_ms=now, force=force)
        )

    def dirty_ratio(
        self, snapshot: LogSnapshot | None = None, *, fresh_checkpoints: bool = True
    ) -> float:
        """Cleanable bytes over clean plus cleanable bytes, over all partitions."""
        return dirty_ratio(self.logs_to_clean(snapshot, fresh_checkpoints=fresh_checkpoints))

    # -- handing the log over after an append ----------------------------------------------

    def hand_over(
        self, spark: SparkSession, snapshot: LogSnapshot, *, background: bool, appended: bool
    ) -> tuple[CleanerStats | None, LogSnapshot, float]:
        """What the produce path does after an append (Kafka's broker handing its logs to
        the cleaner threads): plan the log once; when a round has work, wake the worker
        (``background``) or run the round here. A batch that appended nothing
        (``appended`` false) costs no round.

        Returns the pass run here (if any), the log after it and its dirty ratio.
        """
        plan = self.plan(snapshot, fresh_checkpoints=False)
        stats = None
        if appended and self.has_work(plan):
            if background:
                self.wakeup(spark)
            else:
                stats = self.maintain(spark).clean
        if stats is None:
            return None, snapshot, dirty_ratio(plan.logs if plan else [])
        after = self.log.snapshot() or snapshot  # a pass committed: a new version to measure
        return stats, after, self.dirty_ratio(after, fresh_checkpoints=False)

    # -- one round, in the caller's thread ---------------------------------------------------

    def maintain(
        self,
        spark: SparkSession,
        *,
        force: bool = False,
        max_tasks: int | None = None,
        niceness: int = 0,
        raise_errors: bool = False,
    ) -> RoundReport:
        """One round: retention (delete policies), one pass over what is cleanable now,
        then the segment deleter's turn when due.

        ``max_tasks`` and ``niceness`` are the pass's share of the cores (see `clean`).
        The pass plans its own version afresh (checkpoint rows read now), whatever
        plan led to the round.
        A failed pass is recorded (`last_error`, the partitions marked uncleanable)
        and logged, not raised: the batch that triggered it is committed; retention
        that keeps conflicting gives up until the next round. ``raise_errors``
        (``sink.clean()``) raises both instead.
        """
        report = None
        if self.config.delete:
            try:
                report = self.retain()
            except CommitConflictError as e:
                if raise_errors:
                    raise
                logger.warning("retention of %s gave up until the next round: %s", self.log.uri, e)
        stats = None
        if self.config.compact:
            try:
                stats = self.clean(spark, force=force, max_tasks=max_tasks, niceness=niceness)
            except CleanerError as e:
                self.last_error = e
                if raise_errors:
                    raise
                logger.warning("cleaning %s failed: %s", self.log.uri, e)
        self.segment_deleter.maybe_run(self.manager.busy_partitions)
        self.last_round = RoundReport(retention=report, clean=stats)
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

        Without ``force`` a partition qualifies by design.md §4 (ratio, max lag, or an
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
                        spark,
                        snapshot,
                        force=force,
                        max_tasks=max_tasks,
                        niceness=niceness,
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

        Files another engine wrote are rewritten into segments first
        (`absorb_foreign_files`): a pass plans over segments only.
        """
        if snapshot.foreign_files:
            absorbed = absorb_foreign_files(spark, self, snapshot)
            if absorbed is None:
                return None
            snapshot = absorbed
        start = self.clock()
        claim = grab_filthiest_compacted_log(
            self.log, self.planner, self.manager, self.config, snapshot, now_ms=start, force=force
        )
        if claim is None:
            return None
        try:
            with self.manager.heartbeating(claim.partitions):
                stats = self.cleaner.clean(
                    spark,
                    claim.snapshot,
                    claim.logs,
                    pass_start_ms=start,
                    max_tasks=max_tasks,
                    niceness=niceness,
                    held_below=self.consumer_holds(claim.snapshot, now_ms=start),
                )
        except CommitFailedError as e:
            self.manager.abort_cleaning(claim.partitions)
            raise CleanerError(
                f"another cleaner committed first ({e}); this pass was dropped",
                log_path=self.log.uri,
                partition=claim.logs[0].partition,
            ) from e
        except TableFeatureError:
            # Not this partition's failure: no commit to the log can succeed until the
            # feature goes, and the error says how.
            self.manager.abort_cleaning(claim.partitions)
            raise
        except Exception as e:
            self.manager.mark_uncleanable(claim.partitions, e)
            raise CleanerError(
                f"pass failed ({type(e).__name__}: {str(e)[:500]}); marked uncleanable, "
                "retried with backoff",
                log_path=self.log.uri,
                partition=claim.logs[0].partition,
            ) from e
        budget = self.config.log_cleaner_max_bytes_per_pass
        if budget < LONG_MAX:
            work_left = claim.work_left or stats.work_left
            stats = replace(stats, budget_bytes=budget, work_left=work_left)
        crash_point(CLEAN_BEFORE_CHECKPOINT)
        self.manager.checkpoint_pass(claim.logs, stats, table_id=claim.snapshot.table_id)
        logger.info("%s", stats.summary())
        return stats

    # -- the worker thread (`sinks.cleaner.cleaner_thread`) ----------------------------------

    def wakeup(self, spark: SparkSession) -> None:
        """Ask the worker for a round soon, starting it if needed (with ``spark``, the
        session of the batch that started it); returns at once."""
        self.worker.wakeup(spark)

    @property
    def running(self) -> bool:
        """True while the worker thread lives."""
        return self.worker.running

    def await_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until the worker has no round running or pending; False on timeout."""
        return self.worker.await_idle(timeout_s)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop the worker after the round it is running (Kafka's ``LogCleaner.shutdown``)."""
        self.worker.shutdown(timeout_s)
