"""Planning a fetch on the driver: which files each Spark task reads for an offset range. Pure.

A fetch range (`streaming.consumers.consumer_position.FetchRange`) is half-open,
``[from_offset, until_offset)``, over one partition. `plan_partitions` cuts each
range into runs of consecutive files, one `ConsumerReadPartition` (one Spark task)
per run, cut only between files whose offsets do not overlap: offset order within a
partition is the order of its read partitions. `streaming.consumers.fetcher` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sinks.config import LONG_MAX
from sinks.log import LogSnapshot, Segment, is_segment_path
from sinks.spark_compat import InputPartition
from streaming.consumers.consumer_position import FetchRange

TASK_MAX_BYTES = 128 * 1024 * 1024  # files one task reads, as Spark's maxPartitionBytes


class ConsumerReadPartition(InputPartition):
    """What one Spark task reads: consecutive files of one partition, one offset range."""

    def __init__(
        self, fetch: FetchRange, paths: Sequence[str], whole: Sequence[bool], ordered: bool
    ) -> None:
        super().__init__((fetch.partition, fetch.from_offset, fetch.until_offset))
        self.fetch = fetch
        self.paths = tuple(paths)
        self.whole = tuple(whole)  # per file: every offset of it lies in the range
        self.ordered = ordered  # the files' offset ranges follow one another


def plan_partitions(
    segments: Mapping[int, Sequence[Segment]],
    ranges: Sequence[FetchRange],
    *,
    max_bytes: int = TASK_MAX_BYTES,
) -> list[ConsumerReadPartition]:
    """One read partition per run of a partition's files overlapping its range. Pure.

    A run is cut at ``max_bytes`` only between files whose offsets do not overlap,
    so offset order within a partition is the order of its read partitions.
    """
    planned: list[ConsumerReadPartition] = []
    for fetch in ranges:
        chosen = [
            s
            for s in sorted(segments.get(fetch.partition, []))
            if s.last_offset >= fetch.from_offset and s.base_offset < fetch.until_offset
        ]
        run: list[Segment] = []
        run_bytes = 0
        for segment in chosen:
            run_end = max((s.last_offset for s in run), default=-1)
            if run and run_bytes >= max_bytes and segment.base_offset > run_end:
                planned.append(_read_partition(fetch, run))
                run, run_bytes = [], 0
            run.append(segment)
            run_bytes += segment.size_bytes
        if run:
            planned.append(_read_partition(fetch, run))
    return planned


def files_by_partition(snapshot: LogSnapshot) -> dict[int, list[Segment]]:
    """Each partition's segments, plus every file another engine wrote that may hold its
    records (`sinks.log.segment.ForeignFile`), as a segment spanning every offset: its
    records are then filtered to the range and sorted by offset (`RangeReader`)."""
    files = {p: list(segments) for p, segments in snapshot.segments.items()}
    for foreign in snapshot.foreign_files:
        for p in snapshot.partitions:
            if foreign.may_hold(p):
                files.setdefault(p, []).append(
                    Segment(p, 0, LONG_MAX, foreign.path, foreign.size_bytes, foreign.num_records)
                )
    return files


def _read_partition(fetch: FetchRange, run: Sequence[Segment]) -> ConsumerReadPartition:
    low = max(fetch.from_offset, run[0].base_offset)
    high = min(fetch.until_offset, max(s.last_offset for s in run) + 1)
    return ConsumerReadPartition(
        FetchRange(fetch.partition, low, high),
        [s.path for s in run],
        [low <= s.base_offset and s.last_offset < high for s in run],
        # Only the sink's own files are sorted by offset; another engine's may be in any order.
        all(is_segment_path(s.path) for s in run)
        and all(a.last_offset < b.base_offset for a, b in zip(run, run[1:], strict=False)),
    )
