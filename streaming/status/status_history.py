"""`history`: the log's size and dirty ratio at each Delta version still reachable.

Each commit's ``compactedSink`` metadata says whether it was an append or a pass.
A version is measured from that version alone (`_as_it_was`): the cleaner offset
the log recorded by then, never today's checkpoint row, so a point shows the dirty
ratio the cleaner saw at the time. Read-only; reads Delta metadata, no Spark job.
`streaming.status.status_render.plot_history` draws the points.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sinks import CompactedStateSink
from sinks.cleaner import LogToClean, cleanable_offsets, dirty_ratio
from sinks.cleaner.log_to_clean import log_to_clean
from sinks.log import COMMIT_INFO_KEY, LogSnapshot, now_ms, reachable_commits


@dataclass(frozen=True)
class HistoryPoint:
    """The log at one Delta version: its size and dirty ratio, and what the commit was."""

    version: int
    timestamp_ms: int
    operation: str
    size_bytes: int
    dirty_ratio: float


def history(sink: CompactedStateSink, *, max_points: int = 120) -> list[HistoryPoint]:
    """Size and dirty ratio of the log at (at most ``max_points``) versions, oldest first.

    The first dirty offset at each version comes from the cleaner-offset ``txn``
    the log recorded by then, so the ratio is the one the cleaner saw at the time
    (the checkpoint table only holds today's rows).
    """
    commits = reachable_commits(sink.log_table.location, now_ms=now_ms())
    versions = sorted(commits)
    if len(versions) > max_points:
        step = (len(versions) - 1) / (max_points - 1)
        versions = sorted({versions[round(i * step)] for i in range(max_points)})
    points = []
    for version in versions:
        snapshot = sink.log_table.snapshot(version)
        if snapshot is None:
            continue
        info = commits[version].get(COMMIT_INFO_KEY) or {}
        if isinstance(info, str):
            info = json.loads(info)
        at = int(commits[version]["timestamp"])
        logs = [
            _as_it_was(snapshot, p, now=at, min_compaction_lag_ms=sink.config.min_compaction_lag_ms)
            for p in snapshot.partitions
        ]
        points.append(
            HistoryPoint(
                version=version,
                timestamp_ms=at,
                operation=info.get("operation", commits[version].get("operation", "?")),
                size_bytes=sum(s.size_bytes for s in snapshot.data_files()),
                dirty_ratio=dirty_ratio(logs),
            )
        )
    return points


def _as_it_was(
    snapshot: LogSnapshot, partition: int, *, now: int, min_compaction_lag_ms: int
) -> LogToClean:
    """A partition measured from one version alone: the cleaner offset the log recorded
    by then (the log start before any pass), never today's checkpoint row."""
    segments = snapshot.segments.get(partition, [])
    offsets = cleanable_offsets(
        segments,
        checkpoint_dirty_offset=snapshot.cleaner_offset(partition),
        log_start_offset=snapshot.log_start_offset(partition),
        log_end_offset=snapshot.log_end_offset(partition),
        now_ms=now,
        min_compaction_lag_ms=min_compaction_lag_ms,
    )
    return log_to_clean(snapshot.uri, partition, segments, offsets)
