"""`LogCleaner`: Kafka's ``LogCleaner``: one log's rounds, and the loop and thread that run them.

A `LogCleaner` builds and owns the log's `Cleaner` (one pass, and its `Throttler`), its
`CleanerManager` (which partitions to clean, their claims and checkpoints, Kafka's
``LogCleanerManager``), retention (``cleanup.policy`` with ``delete``) and the
`SegmentDeleter`. Its round (`LogCleaner.run_round`) is what Kafka's log manager and
cleaner threads do between them: retention, then one pass (`Cleaner.run_pass`) over the
cleanable partitions (dirtiest first, design.md §4), claimed in the checkpoint table and
checkpointed where it ended; then, at most every ``log.retention.check.interval.ms``, the
deletion of files out of the log longer than the history window.

Two levels, each named once: a round (`run_round`) and the pass in it (`run_pass`, which
reads top to bottom in `sinks.cleaner.cleaner`). What a round is asked to do is one frozen
value built once by whoever asks (`RoundRequest`: what is forced, the plan, the budget)
and handed down as it is. The log is measured and its filthiest partitions chosen once a
round (`LogPlanner.choose`): the batch's hand-over or the loop's choice of the filthiest
log makes the plan, and it goes along in the request to the pass.

Where rounds run is `CleanerLoop`: one loop over one or many logs, beside a
streaming query (the sink's worker, `wakeup`) or in the ``clean`` command.
Called directly (``cleaning="inline"``, ``sink.clean()``) a round runs in the caller's
thread. One pass at a time per `LogCleaner`: a pass holds the cleaner's lock, so the
caller and the worker never race each other (passes of other processes are kept apart
by the claims). A worker killed mid-pass (the process died) leaves what a crash
leaves: the old files or the new ones, never both; recovery handles the rest.

The loop (Kafka's ``CleanerThread``, here not a thread of its own): a turn
(`CleanerLoop.run_once`) gives every log's segment deleter its turn, then takes the logs
that have work (retention, a cleanable partition, a checkpoint to reset, another
engine's files), filthiest first, and runs each one's round once. A turn that cleaned
nothing is followed by a back-off of ``log.cleaner.backoff.ms``, which is how time-based
triggers (the max compaction lag, expired tombstones) fire without a new append. A
partition whose pass failed backs off in the checkpoint table (its ``uncleanable``
state, design.md §31).

Two drivers run the loop:

- `CleanerLoop.run`, the ``clean`` command over every log it was given, until stopped;
- `CleanerWorker`, the sink's daemon thread beside a streaming query, over its one log:
  a round when a batch asks (`LogCleaner.wakeup`) or every back-off; it ends after
  ``idle_ms`` without a request (a stopped or long-idle query; the next batch starts
  it again). A foreachBatch function cannot ask whether its query still runs: the
  batch's session is a clone that does not list it. `LogCleaner.shutdown` stops it
  after the round it is running, and the interpreter's exit does the same.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pyspark.sql import SparkSession

from checkpoints import CleanerOffsetCheckpoint
from sinks.cleaner.cleaner import Cleaner
from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_to_clean import LogToClean, dirty_ratio
from sinks.cleaner.pass_planning import LogPlanner, RoundRequest
from sinks.cleaner.throttler import TaskBudget
from sinks.config import CleanerConfig
from sinks.errors import CleanerError, CommitConflictError
from sinks.log.location import LogLocation
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.maintenance import retention
from sinks.maintenance.retention import RetentionPlan
from sinks.maintenance.segment_deleter import SegmentDeleter
from sinks.shutdown import forget, stop_at_exit

logger = logging.getLogger("compacted_sink")

CleaningMode = Literal["auto", "background", "inline"]
"""Where passes run: ``inline`` after each append in the hook's thread, ``background``
on a worker thread beside the query, ``auto`` background inside a streaming query and
inline for direct calls."""

PassListener = Callable[[CleanerStats], None]


@dataclass(frozen=True)
class RoundReport:
    """What one round did: the retention plan applied (if any) and the pass (if any)."""

    retention: RetentionPlan | None = None
    clean: CleanerStats | None = None


class LogCleaner:
    """Retention and cleaning of one log: a round inline (`run_round`), or on the worker
    thread (`wakeup`).

    ``keys`` are the log's key and sequence columns (for its `Cleaner`);
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
        keys: LogKeys,
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
        self.manager = CleanerManager(
            checkpoints, log.uri, owner=owner, clock=clock, backoff_base_ms=config.backoff_ms
        )
        self.planner = LogPlanner(log, checkpoints, config, clock=clock)
        self.cleaner = Cleaner(
            log,
            self.manager,
            self.planner,
            config,
            keys=keys,
            clock=clock,
        )
        self.segment_deleter = SegmentDeleter(
            log.location,
            LogLocation(checkpoints.uri, log.location.storage_options),
            window_ms=config.file_delete_delay_ms,
            check_interval_ms=config.log_retention_check_interval_ms,
            committer=log.committer,
        )
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

    def candidates(
        self, snapshot: LogSnapshot | None = None, *, fresh_checkpoints: bool = True
    ) -> list[LogToClean]:
        """Every partition of the log now (or of ``snapshot``) as a cleaning candidate
        (`LogPlanner.plan`); empty without a log. Read-only."""
        plan = self.planner.plan(snapshot, fresh_checkpoints=fresh_checkpoints)
        return list(plan.partitions) if plan is not None else []

    def request(self, asked: RoundRequest, snapshot: LogSnapshot | None = None) -> RoundRequest:
        """``asked`` with its plan: ``snapshot`` (default: the log now) measured and its
        filthiest partitions chosen for what ``asked`` forces (`LogPlanner.choose`, with
        the checkpoint rows read within the back-off); a request without a plan when there
        is no log. Read-only; no Spark job."""
        plan = self.planner.choose(snapshot, force=asked.force, fresh_checkpoints=False)
        return replace(asked, plan=plan)

    def has_work(self, request: RoundRequest) -> bool:
        """Whether a round asked with ``request`` could do anything now: retention, deletion
        of expired files, a checkpoint to reset, or a cleanable partition (its plan,
        chosen). Pure; no Spark job (design.md §43)."""
        plan = request.plan
        if plan is None:
            return False
        if self.config.delete or self.segment_deleter.due():
            return True  # retention, or expired files to delete (the deleter's interval)
        if not self.config.compact:
            return False
        if plan.foreign_files:
            return True
        assert plan.filthiest is not None, "a plan is chosen from before a round is asked for"
        return any(p.force_checkpoint for p in plan.partitions) or bool(plan.filthiest)

    def dirty_ratio(
        self, snapshot: LogSnapshot | None = None, *, fresh_checkpoints: bool = True
    ) -> float:
        """Cleanable bytes over clean plus cleanable bytes, over all partitions."""
        return dirty_ratio(self.candidates(snapshot, fresh_checkpoints=fresh_checkpoints))

    # -- handing the log over after an append ----------------------------------------------

    def hand_over(
        self, spark: SparkSession, snapshot: LogSnapshot, *, background: bool, appended: bool
    ) -> tuple[CleanerStats | None, LogSnapshot, float]:
        """After an append: plan ``snapshot`` once and, when ``appended`` and a round has
        work, wake the worker (``background``) or run the round here (design.md §43).

        Returns the pass run here (or None), the log after it and its dirty ratio. Never
        raises over a failed pass (`run_round`).
        """
        request = self.request(RoundRequest(), snapshot)
        stats = None
        if appended and self.has_work(request):
            if background:
                self.wakeup(spark)
            else:
                stats = self.run_round(spark, request).clean
        if stats is None:
            return None, snapshot, dirty_ratio(request.plan.partitions if request.plan else [])
        after = self.log.snapshot() or snapshot  # a pass committed: a new version to measure
        return stats, after, self.dirty_ratio(after, fresh_checkpoints=False)

    # -- one round, in the caller's thread ---------------------------------------------------

    def run_round(
        self, spark: SparkSession, request: RoundRequest, *, raise_errors: bool = False
    ) -> RoundReport:
        """One round: retention, one pass, then the segment deleter when due (design.md §43).

        Takes the round's ``request`` (what is forced, the plan, the budget), handed to the
        pass as it is. Returns the round's `RoundReport` (also ``last_round``). A failed
        pass sets ``last_error`` and is logged; with ``raise_errors`` it raises
        `CleanerError`, and retention's `CommitConflictError`. Not idempotent.
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
                with self._pass_lock:  # one pass at a time per log cleaner
                    stats = self.cleaner.run_pass(spark, request)
                if stats is not None:
                    self.passes += 1
                    self.last_error = None
                    for listener in list(self.listeners):
                        listener(stats)
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

    # -- the worker thread (`CleanerWorker`) ------------------------------------------------

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


# -- the loop: Kafka's ``CleanerThread``, over one or many logs --------------------------


@dataclass(frozen=True)
class Candidate:
    """A log with work; ``filthiest`` is its dirtiest cleanable partition (None: other
    work only, such as retention); ``request`` what its round is asked, with the plan it
    was chosen from."""

    cleaner: LogCleaner
    filthiest: LogToClean | None
    request: RoundRequest

    @property
    def ratio(self) -> float:
        return -1.0 if self.filthiest is None else self.filthiest.cleanable_ratio


class CleanerLoop:
    """Rounds over ``cleaners``: the filthiest log first, each log once a turn.

    ``request`` is what each log's round is asked (what is forced, each pass's share of
    the cores, `RoundRequest`; default: nothing forced, every core), given each log's plan
    as it is chosen. ``before_round``
    hears which log is next, ``on_round`` each log's round as it ends. With
    ``recover_before_round``, each log is recovered (`LogCleaner.recover`) before its
    round, for a loop that opens the logs itself; the sink's worker does not (the sink's
    first append recovered its log before any round).
    """

    def __init__(
        self,
        cleaners: Sequence[LogCleaner],
        *,
        request: RoundRequest | None = None,
        before_round: Callable[[Candidate], None] | None = None,
        on_round: Callable[[LogCleaner, RoundReport], None] | None = None,
        recover_before_round: bool = False,
    ) -> None:
        self.before_round = before_round
        self.recover_before_round = recover_before_round
        self.cleaners = list(cleaners)
        self.request = request or RoundRequest()
        self.on_round = on_round
        self.passes = 0
        self.work_left = False

    @property
    def backoff_ms(self) -> int:
        """How long `run` waits after a turn without a pass (the logs' shortest)."""
        return min((c.config.backoff_ms for c in self.cleaners), default=15_000)

    def grab_filthiest(
        self, exclude: Collection[LogCleaner] = (), *, cleanable_only: bool = False
    ) -> Candidate | None:
        """The log whose dirtiest claimable partition is dirtiest (Kafka's
        ``grabFilthiestCompactedLog``); a log with other work only comes after every
        cleanable one, and not at all with ``cleanable_only``. Delta metadata only."""
        best: Candidate | None = None
        for cleaner in self.cleaners:
            if cleaner in exclude:
                continue
            request = cleaner.request(self.request)  # the round's one choice, for its pass
            if not cleaner.has_work(request):
                continue
            assert request.plan is not None and request.plan.filthiest is not None
            chosen = cleaner.manager.claimable(request.plan.filthiest)
            candidate = Candidate(cleaner, chosen[0] if chosen else None, request)
            if cleanable_only and candidate.filthiest is None:
                continue
            if best is None or candidate.ratio > best.ratio:
                best = candidate
        return best

    def delete_expired_files(self, *, now: bool = False) -> list[LogCleaner]:
        """Give each log's segment deleter its turn (``now``: whatever its interval);
        returns the logs whose deleter ran."""
        ran = []
        for cleaner in self.cleaners:
            deleter = cleaner.segment_deleter
            if now:
                deleter.run(cleaner.manager.busy_partitions)
            elif not deleter.maybe_run(cleaner.manager.busy_partitions):
                continue
            ran.append(cleaner)
        return ran

    def run_once(self, spark: SparkSession) -> int:
        """One turn: the round of each log with work, filthiest first, once; returns the
        passes."""
        done: set[LogCleaner] = set()
        passes = 0
        self.work_left = False
        while (candidate := self.grab_filthiest(exclude=done)) is not None:
            cleaner = candidate.cleaner
            done.add(cleaner)
            if self.before_round is not None:
                self.before_round(candidate)
            if self.recover_before_round and cleaner.recover is not None:
                cleaner.recover()
            report = cleaner.run_round(spark, candidate.request)
            if report.clean is not None:
                passes += 1
                self.work_left = self.work_left or report.clean.work_left
            if self.on_round is not None:
                self.on_round(cleaner, report)
        self.passes += passes
        return passes

    def run(self, spark: SparkSession, stop: threading.Event | None = None) -> None:
        """Turns until ``stop`` is set, backing off after a turn that cleaned nothing."""
        stop = stop or threading.Event()
        while not stop.is_set():
            self.delete_expired_files()
            if self.run_once(spark) == 0:
                stop.wait(self.backoff_ms / 1000)


class CleanerWorker(threading.Thread):
    """The sink's worker: the loop over one log, a round when asked or every back-off;
    ends ``idle_ms`` after the last request.

    Kafka's cleaner threads: the pass leaves the other cores to the query
    (``log.cleaner.threads`` tasks) and yields the ones it runs on whenever the query's
    tasks want them (``log.cleaner.nice``).
    """

    def __init__(self, cleaner: LogCleaner, spark: SparkSession) -> None:
        super().__init__(name=f"log-cleaner-{cleaner.log.uri.rsplit('/', 1)[-1]}", daemon=True)
        self.cleaner = cleaner
        self.spark = spark
        background = RoundRequest(budget=TaskBudget.background(cleaner.config))
        self.loop = CleanerLoop([cleaner], request=background)
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
                self.loop.run_once(self.spark)
                if self.loop.work_left:
                    with self._condition:  # the budget cut the pass: the rest goes next
                        self._pending = True
            except Exception as e:  # the worker must outlive one bad round
                self.cleaner.last_error = e
                logger.warning("cleaner round over %s failed", self.cleaner.log.uri, exc_info=True)
            finally:
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()
        with self._condition:
            self._busy = self._pending = False
            self._condition.notify_all()


class WorkerSlot:
    """A log cleaner's place for its worker: started on request, replaced once stopped."""

    def __init__(self, cleaner: LogCleaner) -> None:
        self.cleaner = cleaner
        self._worker: CleanerWorker | None = None
        self._lock = threading.Lock()

    def wakeup(self, spark: SparkSession) -> None:
        with self._lock:
            worker = self._worker
            if worker is not None and worker.request_round():
                return
            worker = CleanerWorker(self.cleaner, spark)
            self._worker = worker
            stop_at_exit(self.cleaner)  # joined before the interpreter finalizes (sinks.shutdown)
            worker.start()
            worker.request_round()

    @property
    def running(self) -> bool:
        worker = self._worker
        return worker is not None and worker.is_alive()

    def await_idle(self, timeout_s: float | None) -> bool:
        worker = self._worker
        return True if worker is None else worker.await_idle(timeout_s)

    def shutdown(self, timeout_s: float | None) -> None:
        with self._lock:
            worker, self._worker = self._worker, None
        forget(self.cleaner)
        if worker is not None:
            worker.stop()
            worker.join(timeout_s)
