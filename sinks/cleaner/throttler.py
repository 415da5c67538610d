"""The pass's share of the machine: Kafka's ``Throttler`` for its I/O, a nice value for its CPU.

Kafka's ``Throttler`` holds the cleaner's I/O to ``log.cleaner.io.max.bytes.per.second``.

Kafka's cleaner thread calls ``maybeThrottle(bytes)`` as it reads and writes; once
more than ``checkIntervalMs`` has passed since the period began, the observed rate
is compared with the desired one and the thread sleeps long enough to bring the
period's average down to it. Here the bytes are moved by Spark tasks, so the
cleaner observes each pass's bytes (read plus written) when the pass ends and
sleeps before the next: the rate is held on average over passes, and
``log.cleaner.max.bytes.per.pass`` bounds how much one pass moves at full speed.

The pass's CPU (`TaskBudget`, `at_lower_priority`): a background pass runs at most
``log.cleaner.threads`` tasks at once, at a lower CPU priority than the query's.

Kafka's cleaner threads share a broker's cores with the produce path and rely on
the Throttler alone. On a Spark executor the pass's tasks and the query's tasks
share cores too, so the pass also gives up the CPU: each task recopies on a
thread niced by ``log.cleaner.nice`` (as RocksDB lowers its compaction pool's
CPU priority and Cassandra its compaction threads'). When the query's task wants
the core, it gets it; when it does not, the pass runs at full speed.

Linux keeps a nice value per thread, so the work runs on a short-lived thread of
its own and a reused Python worker keeps its priority for the tasks after it.
Elsewhere (no per-thread nice) the work runs unchanged on the calling thread.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from sinks.cleaner.cleaner_stats import format_bytes
from sinks.config import (
    LOG_CLEANER_IO_MAX_BYTES_PER_SECOND,
    LOG_CLEANER_MAX_BYTES_PER_PASS,
    LONG_MAX,
    CleanerConfig,
)

CHECK_INTERVAL_MS = 300  # Kafka's Throttler default


class Throttler:
    """Sleeps in `maybe_throttle` while the observed byte rate exceeds ``desired_rate_per_sec``.

    Thread-safe. ``clock`` returns seconds (monotonic); ``sleep`` takes seconds (a test
    passes fakes for both).
    """

    def __init__(
        self,
        desired_rate_per_sec: float,
        *,
        check_interval_ms: int = CHECK_INTERVAL_MS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not desired_rate_per_sec > 0:
            raise ValueError(f"desired rate must be > 0, got {desired_rate_per_sec!r}")
        self.desired_rate_per_sec = desired_rate_per_sec
        self.check_interval_ms = check_interval_ms
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start = clock()
        self._observed = 0.0

    @property
    def unlimited(self) -> bool:
        return self.desired_rate_per_sec == float("inf")

    def maybe_throttle(self, observed: float) -> float:
        """Count ``observed`` bytes; sleep if the period's rate is above the desired one.

        Returns the seconds slept (0.0 when under the rate or within the check interval).
        """
        if self.unlimited:
            return 0.0
        with self._lock:
            self._observed += observed
            elapsed = self._clock() - self._period_start
            if elapsed * 1000 <= self.check_interval_ms or self._observed <= 0:
                return 0.0
            slept = 0.0
            if self._observed / elapsed > self.desired_rate_per_sec:
                slept = self._observed / self.desired_rate_per_sec - elapsed
                if slept > 0:
                    self._sleep(slept)
                else:
                    slept = 0.0
            self._period_start = self._clock()
            self._observed = 0.0
            return slept


@dataclass(frozen=True)
class TaskBudget:
    """A pass's share of the cores: at most ``max_tasks`` Spark tasks at once (None: every
    core), each on a thread niced by ``niceness`` (`at_lower_priority`).

    The default is a direct call's (every core, not niced); `background` is the worker's,
    from ``log.cleaner.threads`` and ``log.cleaner.nice``.
    """

    max_tasks: int | None = None
    niceness: int = 0

    @classmethod
    def background(cls, config: CleanerConfig) -> TaskBudget:
        """The background worker's share, from ``config``."""
        return cls(config.log_cleaner_threads, config.log_cleaner_nice)


EVERY_CORE = TaskBudget()
"""A direct call's share: every core, not niced."""


def budget_summary(config: CleanerConfig) -> str:
    """The throttle and per-pass budget as one short line; empty when both are unlimited."""
    parts = []
    if config.log_cleaner_max_bytes_per_pass < LONG_MAX:
        budget = format_bytes(config.log_cleaner_max_bytes_per_pass)
        parts.append(f"{LOG_CLEANER_MAX_BYTES_PER_PASS} {budget}")
    if config.log_cleaner_io_max_bytes_per_second != float("inf"):
        rate = format_bytes(int(config.log_cleaner_io_max_bytes_per_second))
        parts.append(f"{LOG_CLEANER_IO_MAX_BYTES_PER_SECOND} {rate}/s")
    return ", ".join(parts)


T = TypeVar("T")

MAX_NICE = 19
_PER_THREAD = sys.platform.startswith("linux") and hasattr(os, "setpriority")
_DONE = object()


def lower_thread_priority(niceness: int) -> bool:
    """Raise the calling thread's nice value by ``niceness`` (capped at 19); False if
    this platform cannot nice one thread."""
    if niceness <= 0 or not _PER_THREAD:
        return False
    tid = threading.get_native_id()
    current = os.getpriority(os.PRIO_PROCESS, tid)
    os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, current + niceness))
    return True


def at_lower_priority(niceness: int, produce: Callable[[], Iterator[T]]) -> Iterator[T]:
    """Yield ``produce()``'s items, computed on a thread niced by ``niceness``.

    The producer runs at most two items ahead; its exception is raised here; if the
    consumer stops early, the producer stops at its next item.
    """
    if niceness <= 0 or not _PER_THREAD:
        yield from produce()
        return
    handoff: queue.Queue[object] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        lower_thread_priority(niceness)
        try:
            for item in produce():
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            put(e)

    worker = threading.Thread(target=work, name="log-cleaner-task", daemon=True)
    worker.start()
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        worker.join()
