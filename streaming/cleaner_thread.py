"""The cleaner loop of the ``clean`` command: Kafka's ``CleanerThread`` over many logs.

Each round measures every log (from Delta metadata, no Spark job), grabs the
filthiest log that has a cleanable partition (SPEC rule 4), cleans it with one
pass, and goes on; when no log is cleanable it backs off for
``log.cleaner.backoff.ms`` (Kafka's default: 15 s) before measuring again.

Beside the passes, each round gives every log's segment deleter its turn: files
out of the log longer than ``file.delete.delay.ms`` leave storage, at most every
``log.retention.check.interval.ms`` per log and a bounded number per call
(``vacuum=True`` deletes on the first round whatever the interval).

A log whose pass fails is skipped for a backoff that doubles per consecutive
failure (capped), then retried, never given up on. The sink itself records the
failure in the checkpoint table (the partition's ``uncleanable`` state and
reason, which ``status`` shows); this loop only decides when to try again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from sinks import CleanerStats, CompactedSinkError
from sinks.cleaner.log_to_clean import LogToClean
from sinks.cleaner.not_cleanable import nothing_cleanable_line
from sinks.log.log_table import now_ms
from streaming.registry import LogRef

DEFAULT_BACKOFF_MS = 15_000  # Kafka's log.cleaner.backoff.ms
MAX_FAILURE_BACKOFF_MS = 15 * 60_000


@dataclass(frozen=True)
class Candidate:
    """A log with at least one cleanable partition, ordered by its dirtiest one."""

    ref: LogRef
    filthiest: LogToClean


class CleanerThread:
    """Cleans the filthiest of ``logs`` again and again; `run_once` for a single round.

    ``force`` cleans any partition with cleanable bytes, ignoring the ratio.
    ``out`` receives one line per pass, failure and back-off.
    """

    def __init__(
        self,
        logs: Sequence[LogRef],
        *,
        force: bool = False,
        vacuum: bool = False,
        backoff_ms: int = DEFAULT_BACKOFF_MS,
        out: Callable[[str], None] = print,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.logs = list(logs)
        self.sinks = {ref.spec.path: ref.sink() for ref in self.logs}
        self.force = force
        self.backoff_ms = backoff_ms
        self.out = out
        self.clock = clock
        self.failures: dict[str, int] = {}
        self.retry_at: dict[str, int] = {}
        self.passes = 0
        self.vacuum = vacuum

    def grab_filthiest(self, exclude: Collection[str] = ()) -> Candidate | None:
        """The log whose dirtiest cleanable partition is dirtiest, among logs not backing off."""
        now = self.clock()
        best: Candidate | None = None
        for ref in self.logs:
            path = ref.spec.path
            if path in exclude or self.retry_at.get(path, 0) > now:
                continue
            sink = self.sinks[path]
            config = sink.config
            if not config.compact:
                continue
            cleanable = [
                log
                for log in sink.logs_to_clean()
                if log.is_cleanable(
                    now_ms=now,
                    min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
                    max_compaction_lag_ms=config.max_compaction_lag_ms,
                    force=self.force,
                )
            ]
            if not cleanable:
                continue
            dirtiest = max(cleanable, key=lambda log: log.cleanable_ratio)
            if best is None or dirtiest.cleanable_ratio > best.filthiest.cleanable_ratio:
                best = Candidate(ref, dirtiest)
        return best

    def clean(self, candidate: Candidate) -> CleanerStats | None:
        """One pass over ``candidate``'s log; a failure is reported and backed off, not raised."""
        path = candidate.ref.spec.path
        self.out(
            f"cleaning {path}: filthiest partition p{candidate.filthiest.partition} at "
            f"{candidate.filthiest.cleanable_ratio:.1%} dirty"
        )
        try:
            stats = self.sinks[path].clean(force=self.force)
        except CompactedSinkError as e:
            failures = self.failures.get(path, 0) + 1
            self.failures[path] = failures
            wait = min(self.backoff_ms * 2 ** (failures - 1), MAX_FAILURE_BACKOFF_MS)
            self.retry_at[path] = self.clock() + wait
            self.out(f"pass over {path} failed ({e}); retrying in {wait / 1000:.0f} s")
            return None
        self.failures.pop(path, None)
        self.retry_at.pop(path, None)
        if stats is not None:
            self.passes += 1
            self.out(stats.summary())
        return stats

    def delete_expired_files(self) -> int:
        """Give each log's segment deleter its turn (``vacuum``: now, else when due);
        returns the number of files deleted."""
        deleted = 0
        for sink in self.sinks.values():
            deleter = sink.log_cleaner.segment_deleter
            if self.vacuum:
                deleter.run(sink.manager.busy_partitions)
            elif not deleter.maybe_run(sink.manager.busy_partitions):
                continue
            report = deleter.last_report
            if report is not None and (report.deleted or self.vacuum):
                deleted += len(report.deleted)
                self.out(report.summary())
        return deleted

    def run_once(self) -> int:
        """Clean every cleanable log once, filthiest first, then delete expired files;
        returns the number of passes."""
        self.delete_expired_files()
        done: set[str] = set()
        passes = 0
        while (candidate := self.grab_filthiest(exclude=done)) is not None:
            done.add(candidate.ref.spec.path)
            if self.clean(candidate) is not None:
                passes += 1
        if passes == 0:
            for line in self.idle_reasons():
                self.out(line)
        return passes

    def idle_reasons(self) -> list[str]:
        """A line per log saying why it was not cleaned: per partition, which of SPEC rule
        4's triggers is missing (ratio against threshold, lag, tombstones not yet due), or
        that the log backs off after a failure. Reads Delta metadata only."""
        now = self.clock()
        lines = []
        for ref in self.logs:
            path = ref.spec.path
            if self.retry_at.get(path, 0) > now:
                wait_s = (self.retry_at[path] - now) / 1000
                lines.append(f"{path}: backing off after a failed pass; retry in {wait_s:.0f} s")
                continue
            sink = self.sinks[path]
            logs = sink.logs_to_clean() if sink.log_table.snapshot() is not None else []
            lines.append(nothing_cleanable_line(path, logs, sink.config, now_ms=now))
        return lines

    def run(self, stop: threading.Event | None = None) -> None:
        """Clean until ``stop`` is set: the filthiest log, or back off when none is cleanable."""
        stop = stop or threading.Event()
        while not stop.is_set():
            self.delete_expired_files()
            self.vacuum = False  # on demand once; then on each log's interval
            candidate = self.grab_filthiest()
            if candidate is None:
                stop.wait(self.backoff_ms / 1000)
                continue
            self.clean(candidate)
