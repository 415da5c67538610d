"""The ``clean`` command's loop over every registered log: the library's `CleanerLoop`.

The loop itself is `sinks.cleaner.log_cleaner.CleanerLoop`, the one the sink's
worker runs too: each round gives every log's segment deleter its turn (``vacuum``:
on the first round whatever the interval), then runs the round of each log with
work, filthiest first; a round that cleaned nothing backs off for
``log.cleaner.backoff.ms``. A partition whose pass fails is marked uncleanable in the
checkpoint table and retried after a backoff that doubles per failure (capped): the
one persisted backoff, which ``status`` shows. This adapter names logs by their
`LogRef` and says, one line at a time, what the loop did and why a log was not cleaned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from sinks.cleaner import (
    Candidate,
    CleanerLoop,
    LogCleaner,
    LogToClean,
    RoundReport,
    RoundRequest,
    nothing_cleanable_line,
)
from sinks.spark_session import active_session
from streaming.jobs.registry import LogRef


@dataclass(frozen=True)
class FilthiestRegisteredLog:
    """A registered log with at least one cleanable partition, ordered by its dirtiest one."""

    ref: LogRef
    filthiest: LogToClean


class RegisteredLogsCleaner:
    """Cleans the filthiest of ``logs`` again and again; `run_once` for a single round.

    ``force`` cleans any partition with cleanable bytes, ignoring the ratio.
    ``backoff_ms`` overrides each log's ``log.cleaner.backoff.ms``. ``out`` receives one
    line per pass, failure and back-off.
    """

    def __init__(
        self,
        logs: Sequence[LogRef],
        *,
        force: bool = False,
        vacuum: bool = False,
        backoff_ms: int | None = None,
        out: Callable[[str], None] = print,
    ) -> None:
        self.logs = list(logs)
        self.sinks = {ref.spec.path: _with_backoff(ref, backoff_ms).sink() for ref in self.logs}
        self.refs = {id(self.sinks[ref.spec.path].log_cleaner): ref for ref in self.logs}
        self.out = out
        self.vacuum = vacuum
        self.loop = CleanerLoop(
            [sink.log_cleaner for sink in self.sinks.values()],
            request=RoundRequest(force=force),
            before_round=self._announce,
            on_round=self._said,
            recover_before_round=True,
        )

    @property
    def backoff_ms(self) -> int:
        return self.loop.backoff_ms

    @property
    def passes(self) -> int:
        return self.loop.passes

    def grab_filthiest(self, exclude: Collection[str] = ()) -> FilthiestRegisteredLog | None:
        """The log whose dirtiest cleanable partition is dirtiest, among logs not backing off."""
        skipped = [c for c in self.loop.cleaners if c.log.uri in exclude]
        found = self.loop.grab_filthiest(skipped, cleanable_only=True)
        if found is None or found.filthiest is None:
            return None
        return FilthiestRegisteredLog(self.refs[id(found.cleaner)], found.filthiest)

    def delete_expired_files(self) -> int:
        """Give each log's segment deleter its turn (``vacuum``: now, else when due);
        returns the number of files deleted."""
        deleted = 0
        for cleaner in self.loop.delete_expired_files(now=self.vacuum):
            report = cleaner.segment_deleter.last_report
            if report is not None and (report.deleted or self.vacuum):
                deleted += len(report.deleted)
                self.out(report.summary())
        return deleted

    def run_once(self) -> int:
        """Clean every cleanable log once, filthiest first, after deleting expired files;
        returns the number of passes."""
        self.delete_expired_files()
        passes = self.loop.run_once(active_session())
        if passes == 0:
            for line in self.idle_reasons():
                self.out(line)
        return passes

    def idle_reasons(self) -> list[str]:
        """A line per log saying why it was not cleaned: per partition, which of design.md
        §4's triggers is missing (ratio against threshold, lag, tombstones not yet due), or
        that the log backs off after a failed pass. Reads Delta metadata only."""
        lines = []
        for ref in self.logs:
            path = ref.spec.path
            cleaner = self.sinks[path].log_cleaner
            now = cleaner.clock()
            retry_at = cleaner.manager.retry_at_ms()
            if retry_at is not None and retry_at > now:
                wait_s = (retry_at - now) / 1000
                lines.append(f"{path}: backing off after a failed pass; retry in {wait_s:.0f} s")
                continue
            partitions = cleaner.candidates()
            lines.append(nothing_cleanable_line(path, partitions, cleaner.config, now_ms=now))
        return lines

    def run(self, stop: threading.Event | None = None) -> None:
        """Clean until ``stop`` is set: the filthiest log, or back off when none is cleanable."""
        stop = stop or threading.Event()
        spark = active_session()
        while not stop.is_set():
            self.delete_expired_files()
            self.vacuum = False  # on demand once; then on each log's interval
            if self.loop.run_once(spark) == 0:
                stop.wait(self.backoff_ms / 1000)

    def _announce(self, candidate: Candidate) -> None:
        filthiest = candidate.filthiest
        if filthiest is not None:
            self.out(
                f"cleaning {candidate.cleaner.log.uri}: filthiest partition "
                f"p{filthiest.partition} at {filthiest.cleanable_ratio:.1%} dirty"
            )

    def _said(self, cleaner: LogCleaner, report: RoundReport) -> None:
        path = cleaner.log.uri
        if report.clean is not None:
            self.out(report.clean.summary())
        elif cleaner.last_error is not None and report.clean is None:
            retry_at = cleaner.manager.retry_at_ms()
            wait = "" if retry_at is None else f" in {(retry_at - cleaner.clock()) / 1000:.0f} s"
            self.out(f"pass over {path} failed ({cleaner.last_error}); retrying{wait}")
            cleaner.last_error = None


def _with_backoff(ref: LogRef, backoff_ms: int | None) -> LogRef:
    """``ref`` with its log's ``log.cleaner.backoff.ms`` set (the command's flag wins)."""
    if backoff_ms is None:
        return ref
    config = ref.spec.config.with_settings(backoff_ms=backoff_ms)
    return replace(ref, spec=replace(ref.spec, config=config))
