"""`CleanerStats`: the figures of one cleaning pass, as Kafka's cleaner logs them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class CleanerStats:
    """What a pass read and wrote. One pass may clean several partitions of a log.

    ``end_offsets`` maps each cleaned partition to the offset its pass ended at
    (the new first dirty offset); ``start_ms`` is the pass's start (epoch ms).
    ``budget_bytes`` is ``log.cleaner.max.bytes.per.pass`` when one is set, ``work_left``
    says the budget cut this pass short, ``throttled_ms`` how long the Throttler then
    held the cleaner back; ``tombstones_held`` counts expired tombstones kept for
    registered consumers (`sinks.cleaner.pass_planning.consumer_holds`).
    """

    log_path: str
    start_ms: int
    duration_ms: int
    end_offsets: Mapping[int, int] = field(default_factory=dict)
    first_dirty_offsets: Mapping[int, int] = field(default_factory=dict)
    segments_read: int = 0
    segments_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    delta_version: int | None = None
    budget_bytes: int | None = None
    work_left: bool = False
    throttled_ms: int = 0
    tombstones_held: int = 0

    @property
    def partitions(self) -> list[int]:
        return sorted(self.end_offsets)

    @property
    def records_removed(self) -> int:
        return self.records_read - self.records_written

    @property
    def recopy_ratio(self) -> float:
        """Bytes written over bytes read (Kafka's recopy percent, as a fraction)."""
        return self.bytes_written / self.bytes_read if self.bytes_read else 0.0

    def summary(self) -> str:
        """One line with the pass's figures, for logs and progress output."""
        ranges = ", ".join(
            f"p{p} [{self.first_dirty_offsets.get(p, 0)}, {end})"
            for p, end in sorted(self.end_offsets.items())
        )
        seconds = self.duration_ms / 1000
        return (
            f"cleaned {self.log_path} {ranges}: "
            f"{self.records_read} -> {self.records_written} records, "
            f"{format_bytes(self.bytes_read)} -> {format_bytes(self.bytes_written)} "
            f"({self.segments_read} -> {self.segments_written} files, "
            f"recopy {self.recopy_ratio:.0%}) in {seconds:.1f} s{self._budget()}"
        )

    def _budget(self) -> str:
        parts = []
        if self.budget_bytes is not None:
            more = ", more left" if self.work_left else ""
            parts.append(f"budget {format_bytes(self.budget_bytes)}{more}")
        if self.throttled_ms:
            parts.append(f"throttled {self.throttled_ms / 1000:.1f} s")
        if self.tombstones_held:
            parts.append(f"held {self.tombstones_held} tombstones for consumers")
        return f"; {', '.join(parts)}" if parts else ""


def format_bytes(n: int) -> str:
    """A byte count as people read it: ``14644 -> '14.3 KiB'``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
