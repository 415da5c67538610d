"""`Segment`: one Parquet data file of a log, Kafka's log segment, as plain numbers.

Every data file holds records of exactly one partition, sorted by offset, so a
partition's segments never overlap and sort by base offset. A segment covers the
half-open offset range ``[base_offset, last_offset + 1)``. The numbers come from
the file's add action in the Delta log (its statistics); nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Segment:
    """One data file of the log: Kafka's log segment. Ordered by (partition, base offset)."""

    partition: int
    base_offset: int
    last_offset: int
    path: str = field(compare=False)
    size_bytes: int = field(compare=False)
    num_records: int = field(compare=False)
    min_timestamp_ms: int | None = field(default=None, compare=False)
    max_timestamp_ms: int | None = field(default=None, compare=False)
    min_delete_horizon_ms: int | None = field(default=None, compare=False)

    @property
    def next_offset(self) -> int:
        """The offset just past this segment's last record."""
        return self.last_offset + 1
