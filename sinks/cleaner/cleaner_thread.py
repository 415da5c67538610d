"""`CleanerThread`: Kafka's cleaner thread, one worker loop over one or many logs.

A round (`CleanerThread.run_once`) gives every log's segment deleter its turn, then
takes the logs that have work (retention, a cleanable partition, a checkpoint to
reset, another engine's files), filthiest first, and runs each one's round
(`LogCleaner.maintain`) once. A round that cleaned nothing is followed by a back-off
of ``log.cleaner.backoff.ms`` (`CleanerConfig.backoff_ms`), which is how time-based
triggers (the max compaction lag, expired tombstones) fire without a new append. A
partition whose pass failed backs off in the checkpoint table (its ``uncleanable``
state, `CleanerManager`): the one persisted backoff, doubling per failure, capped.

Two drivers run the loop:

- `CleanerThread.run`, the ``clean`` command over every log it was given, until stopped;
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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from sinks.cleaner.filthiest_log import filthiest_cleanable
from sinks.cleaner.log_to_clean import LogToClean
from sinks.shutdown import forget, stop_at_exit

if TYPE_CHECKING:  # the log cleaner starts its worker from here: no import cycle at run time
    from sinks.cleaner.log_cleaner import LogCleaner, RoundReport

logger = logging.getLogger("compacted_sink")


@dataclass(frozen=True)
class Candidate:
    """A log with work; ``filthiest`` is its dirtiest cleanable partition (None: other
    work only, such as retention)."""

    cleaner: LogCleaner
    filthiest: LogToClean | None

    @property
    def ratio(self) -> float:
        return -1.0 if self.filthiest is None else self.filthiest.cleanable_ratio


class CleanerThread:
    """Rounds over ``cleaners``: the filthiest log first, each log once a round.

    ``force`` cleans any partition with cleanable bytes, ignoring the ratio. A pass
    runs at most ``max_tasks`` Spark tasks at once (None: every core), niced by
    ``niceness``. ``before_round`` hears which log is next, ``on_round`` each log's
    round as it ends. ``recover``: recover each log (`LogCleaner.recover`) before its
    round, for a loop that opens the logs itself; the sink's worker does not (the
    sink's first append recovered its log before any round).
    """

    def __init__(
        self,
        cleaners: Sequence[LogCleaner],
        *,
        force: bool = False,
        max_tasks: int | None = None,
        niceness: int = 0,
        before_round: Callable[[Candidate], None] | None = None,
        on_round: Callable[[LogCleaner, RoundReport], None] | None = None,
        recover: bool = False,
    ) -> None:
        self.before_round = before_round
        self.recover = recover
        self.cleaners = list(cleaners)
        self.force = force
        self.max_tasks = max_tasks
        self.niceness = niceness
        self.on_round = on_round
        self.passes = 0
        self.work_left = False

    @property
    def backoff_ms(self) -> int:
        """How long `run` waits after a round without a pass (the logs' shortest)."""
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
            plan = cleaner.plan(fresh_checkpoints=False)
            if not cleaner.has_work(plan, force=self.force):
                continue
            assert plan is not None
            chosen = cleaner.manager.claimable(
                filthiest_cleanable(
                    plan.logs, cleaner.config, now_ms=cleaner.clock(), force=self.force
                )
            )
            candidate = Candidate(cleaner, chosen[0] if chosen else None)
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
        """One round: each log with work, filthiest first, once; returns the passes."""
        done: set[LogCleaner] = set()
        passes = 0
        self.work_left = False
        while (candidate := self.grab_filthiest(exclude=done)) is not None:
            cleaner = candidate.cleaner
            done.add(cleaner)
            if self.before_round is not None:
                self.before_round(candidate)
            if self.recover and cleaner.recover is not None:
                cleaner.recover()
            report = cleaner.maintain(
                spark,
                force=self.force,
                max_tasks=self.max_tasks,
                niceness=self.niceness,
            )
            if report.clean is not None:
                passes += 1
                self.work_left = self.work_left or report.clean.work_left
            if self.on_round is not None:
                self.on_round(cleaner, report)
        self.passes += passes
        return passes

    def run(self, spark: SparkSession, stop: threading.Event | None = None) -> None:
        """Rounds until ``stop`` is set, backing off after a round that cleaned nothing."""
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
        self.loop = CleanerThread(
            [cleaner],
            max_tasks=cleaner.config.log_cleaner_threads,
            niceness=cleaner.config.log_cleaner_nice,
        )
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
