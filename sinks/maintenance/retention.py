"""Retention: Kafka's ``deleteOldSegments`` and ``DeleteRecords``, as whole-file removes.

Ports `UnifiedLog.deleteRetentionMsBreachedSegments`,
`deleteRetentionSizeBreachedSegments` and `deleteLogStartOffsetBreachedSegments`.
Planning is pure (`plan_retention`, `plan_delete_records`: plain numbers from
the Delta log in, a `RetentionPlan` out); `commit_retention` is the one place
that commits, against the snapshot the plan came from.

Invariants:

- Whole files go, oldest (lowest base offset) first, and a partition's deletions
  are a prefix of its files: the first file that does not qualify stops them.
- Time and size retention never delete a partition's newest file (Kafka keeps
  its active segment), so a partition keeps its newest records until replaced.
- ``retention.bytes`` is per partition, as in Kafka, and a file goes only while
  the partition's remaining files still hold at least ``retention.bytes``.
- The log start offset only moves forward. It is recorded in the
  ``compacted-sink/log-start-offset/<p>`` txn in the same commit that removes
  the files, so readers never see records below it, not even from a file that
  straddles it. The log end offset is untouched: offsets keep counting.
- A remove commit is logical (``dataChange=true``); the Parquet files stay for
  time travel until the table is vacuumed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sinks.crash_points import RETENTION_BEFORE_COMMIT, crash_point
from sinks.errors import CommitConflictError, ConcurrentCommitError, OffsetOutOfRangeError
from sinks.log.log_table import LOG_START_OFFSET_TXN, LogSnapshot, LogTable
from sinks.log.segment import Segment

logger = logging.getLogger("compacted_sink")

_COMMIT_ATTEMPTS = 8


@dataclass(frozen=True)
class RetentionPlan:
    """The files to remove per partition and the log start offsets that move with them.

    ``reasons`` says per partition which policies fired (``retention.ms``,
    ``retention.bytes``, ``log-start-offset``).
    """

    removes: Mapping[int, tuple[Segment, ...]] = field(default_factory=dict)
    log_start_offsets: Mapping[int, int] = field(default_factory=dict)
    reasons: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.removes and not self.log_start_offsets

    @property
    def segments(self) -> list[Segment]:
        return [s for segments in self.removes.values() for s in segments]

    @property
    def bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    @property
    def records(self) -> int:
        return sum(s.num_records for s in self.segments)


def plan_retention(
    segments: Mapping[int, Sequence[Segment]],
    *,
    log_start_offsets: Mapping[int, int],
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
) -> RetentionPlan:
    """Which files time and size retention delete now (``-1`` disables a policy).

    Per partition, oldest first: first the files wholly below the log start offset,
    then files whose newest record is older than ``retention_ms``, then files while
    the partition still holds ``retention_bytes`` without them. Never the newest file.
    A file without timestamp statistics is never deleted by time.
    """
    removes: dict[int, tuple[Segment, ...]] = {}
    starts: dict[int, int] = {}
    reasons: dict[int, tuple[str, ...]] = {}
    for partition, files in sorted(segments.items()):
        ordered = sorted(files)
        start = log_start_offsets.get(partition, 0)
        doomed = 0
        why: list[str] = []
        while doomed < len(ordered) - 1 and ordered[doomed].last_offset < start:
            doomed += 1
        if doomed:
            why.append("log-start-offset")
        if retention_ms >= 0:
            before = doomed
            cutoff = now_ms - retention_ms
            while doomed < len(ordered) - 1 and _older_than(ordered[doomed], cutoff):
                doomed += 1
            if doomed > before:
                why.append("retention.ms")
        if retention_bytes >= 0:
            before = doomed
            excess = sum(s.size_bytes for s in ordered[doomed:]) - retention_bytes
            while doomed < len(ordered) - 1 and excess - ordered[doomed].size_bytes >= 0:
                excess -= ordered[doomed].size_bytes
                doomed += 1
            if doomed > before:
                why.append("retention.bytes")
        if doomed:
            removes[partition] = tuple(ordered[:doomed])
            new_start = max(start, ordered[doomed].base_offset)
            if new_start > start:
                starts[partition] = new_start
            reasons[partition] = tuple(why)
    return RetentionPlan(removes, starts, reasons)


def plan_delete_records(
    segments: Sequence[Segment],
    *,
    partition: int,
    before_offset: int,
    log_start_offset: int,
    log_end_offset: int,
) -> RetentionPlan:
    """Kafka's DeleteRecords: the log start becomes ``before_offset``; files wholly below go.

    Idempotent: an offset at or below the current log start changes nothing.
    Unlike time and size retention this may delete every file of the partition;
    the log end offset still holds, so offsets keep counting.
    Raises `OffsetOutOfRangeError` when ``before_offset`` lies above the log end offset.
    """
    if before_offset > log_end_offset:
        raise OffsetOutOfRangeError(
            f"cannot delete records of partition {partition} before offset {before_offset}: "
            f"the log end offset is {log_end_offset}"
        )
    if before_offset < 0:
        raise OffsetOutOfRangeError(f"before_offset must be >= 0, got {before_offset}")
    if before_offset <= log_start_offset:
        return RetentionPlan()
    doomed = tuple(s for s in sorted(segments) if s.last_offset < before_offset)
    return RetentionPlan(
        {partition: doomed} if doomed else {},
        {partition: before_offset},
        {partition: ("delete-records",)},
    )


def commit_retention(snapshot: LogSnapshot, plan: RetentionPlan, *, operation: str) -> None:
    """Remove the plan's files and record the new log start offsets, in one commit.

    Commits against ``snapshot`` (the one the plan came from); raises delta-rs's
    `ConcurrentCommitError` when a concurrent pass or retention removed one of the
    same files, in which case nothing was committed and the caller re-plans.
    """
    crash_point(RETENTION_BEFORE_COMMIT)
    snapshot.commit(
        removes=plan.segments,
        data_change=True,
        transactions={LOG_START_OFFSET_TXN.format(p): o for p, o in plan.log_start_offsets.items()},
        info={
            "operation": operation,
            "logStartOffsets": {str(p): o for p, o in plan.log_start_offsets.items()},
            "filesRemoved": len(plan.segments),
            "bytesRemoved": plan.bytes,
            "reasons": {str(p): list(r) for p, r in plan.reasons.items()},
        },
    )


def apply_retention(
    log: LogTable, *, now_ms: int, retention_ms: int, retention_bytes: int
) -> RetentionPlan:
    """Plan and commit time and size retention for every partition; re-plans on conflicts.

    Idempotent: a second call right after the first finds nothing to delete.
    Returns the plan that was committed (empty when nothing was due).
    """

    def plan(snapshot: LogSnapshot) -> RetentionPlan:
        return plan_retention(
            snapshot.segments,
            log_start_offsets={p: snapshot.log_start_offset(p) for p in snapshot.partitions},
            now_ms=now_ms,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
        )

    return _commit_with_retries(log, plan, operation="retention")


def delete_records(log: LogTable, partition: int, before_offset: int) -> RetentionPlan:
    """Move ``partition``'s log start offset to ``before_offset`` and drop the files below it.

    Idempotent; re-plans on conflicts. See `plan_delete_records` for the rules.
    """

    def plan(snapshot: LogSnapshot) -> RetentionPlan:
        return plan_delete_records(
            snapshot.segments.get(partition, []),
            partition=partition,
            before_offset=before_offset,
            log_start_offset=snapshot.log_start_offset(partition),
            log_end_offset=snapshot.log_end_offset(partition),
        )

    return _commit_with_retries(log, plan, operation="delete-records")


def _commit_with_retries(
    log: LogTable, plan_for: Callable[[LogSnapshot], RetentionPlan], *, operation: str
) -> RetentionPlan:
    for _attempt in range(_COMMIT_ATTEMPTS):
        snapshot = log.snapshot()
        if snapshot is None:
            return RetentionPlan()
        plan = plan_for(snapshot)
        if plan.is_empty:
            return plan
        try:
            commit_retention(snapshot, plan, operation=operation)
        except ConcurrentCommitError as e:
            logger.info("%s of %s conflicted (%s); planning again", operation, log.uri, e)
            continue
        logger.info(
            "%s of %s: removed %d file(s), %d record(s), %d B; log start offsets %s",
            operation,
            log.uri,
            len(plan.segments),
            plan.records,
            plan.bytes,
            dict(plan.log_start_offsets),
        )
        return plan
    raise CommitConflictError(
        f"{operation} of {log.uri} kept conflicting after {_COMMIT_ATTEMPTS} attempts; "
        "nothing was committed"
    )


def _older_than(segment: Segment, cutoff_ms: int) -> bool:
    return segment.max_timestamp_ms is not None and segment.max_timestamp_ms < cutoff_ms
