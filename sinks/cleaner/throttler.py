"""Kafka's ``Throttler``: hold the cleaner's I/O to ``log.cleaner.io.max.bytes.per.second``.

Kafka's cleaner thread calls ``maybeThrottle(bytes)`` as it reads and writes; once
more than ``checkIntervalMs`` has passed since the period began, the observed rate
is compared with the desired one and the thread sleeps long enough to bring the
period's average down to it. Here the bytes are moved by Spark tasks, so the
cleaner observes each pass's bytes (read plus written) when the pass ends and
sleeps before the next: the rate is held on average over passes, and
``log.cleaner.max.bytes.per.pass`` bounds how much one pass moves at full speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

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
