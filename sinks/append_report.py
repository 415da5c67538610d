"""`AppendReport`: what one call of the ``foreachBatch`` hook did, in one log line.

The front's report (`sinks.sink`): the append's figures (`sinks.produce.log_append`)
beside what the cleaner did after it (`sinks.cleaner.cleaner_stats`), so it sits
above both.
"""

from __future__ import annotations

from dataclasses import dataclass

from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.produce.log_append import LogAppendInfo
from sinks.produce.redelivery import Redeliveries


@dataclass(frozen=True)
class AppendReport:
    """What one call of the hook did; ``skipped`` when the batch id was already committed."""

    batch_id: int
    records: int
    partitions: tuple[int, ...]
    files: int
    bytes: int
    skipped: bool
    dirty_ratio: float
    duration_ms: int
    delta_version: int | None
    clean: CleanerStats | None = None
    redeliveries: Redeliveries = Redeliveries()  # below the log end, proven obsolete, dropped

    @property
    def redelivered(self) -> int:
        """Kafka records below the log end offset dropped as redelivered (design.md §48)."""
        return self.redeliveries.total

    @classmethod
    def of(
        cls,
        batch_id: int,
        info: LogAppendInfo,
        *,
        dirty_ratio: float,
        duration_ms: int,
        delta_version: int | None,
        clean: CleanerStats | None,
    ) -> AppendReport:
        written = info.written
        return cls(
            batch_id=batch_id,
            records=sum(w.num_records for w in written),
            partitions=tuple(sorted({w.partition for w in written})),
            files=len(written),
            bytes=sum(w.size_bytes for w in written),
            skipped=info.already_committed,
            dirty_ratio=dirty_ratio,
            duration_ms=duration_ms,
            delta_version=delta_version,
            clean=clean,
            redeliveries=info.redeliveries,
        )

    def summary(self) -> str:
        if self.skipped:
            head = f"batch {self.batch_id}: already committed, skipped"
        else:
            head = (
                f"batch {self.batch_id}: appended {self.records} records to "
                f"{len(self.partitions)} partition(s) in {self.files} file(s) "
                f"({self.bytes} B) in {self.duration_ms / 1000:.1f} s"
            )
        if self.redelivered:
            head += (
                f"; dropped {self.redelivered} redelivered record(s) below the log end offset "
                f"({self.redeliveries.describe()})"
            )
        tail = f"; dirty ratio {self.dirty_ratio:.2f}"
        return head + tail + (f"; {self.clean.summary()}" if self.clean else "")
