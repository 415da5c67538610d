"""Retention: Kafka's ``deleteOldSegments`` and ``DeleteRecords``, as whole-file removes
(design.md §21, §22).

Planning is pure (`plan_retention`, `plan_delete_records`: segments and offsets in, a
`RetentionPlan` out); `commit_retention` is the one place that commits, against the
snapshot the plan came from; `apply_retention` and `delete_records` plan and commit,
re-planning on conflicts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sinks.crash_points import RETENTION_BEFORE_COMMIT, crash_point
from sinks.errors import CommitConflictError, ConcurrentCommitError, OffsetOutOfRangeError
from sinks.log.log_format import LOG_START_OFFSET_TXN
from sinks.log.log_table import LogSnapshot, LogTable
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
        """True when the plan removes nothing and moves no log start offset."""
        return not self.removes and not self.log_start_offsets

    @property
    def segments(self) -> list[Segment]:
        """Every file the plan removes, over all partitions."""
        return [s for segments in self.removes.values() for s in segments]

    @property
    def bytes(self) -> int:
        """The size of the files the plan removes."""
        return sum(s.size_bytes for s in self.segments)

    @property
    def records(self) -> int:
        """The records (by file statistics) in the files the plan removes."""
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

    Per partition, oldest first, a prefix of its files: first those wholly below the log
    start offset, then those whose newest record is older than ``retention_ms``, then
    those the partition can lose and still hold ``retention_bytes``; never the newest file
    (design.md §21). Pure; raises nothing.
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

    Returns an empty plan for an offset at or below the current log start (idempotent).
    Unlike time and size retention this may remove every file of the partition
    (design.md §22). Pure. Raises `OffsetOutOfRangeError` when ``before_offset`` is
    negative or above ``log_end_offset``.
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

    Commits against ``snapshot`` (the one the plan came from). Raises
    `ConcurrentCommitError` when a concurrent commit removed one of the same files: nothing
    was committed, and the caller re-plans. Not idempotent on its own (a second commit of
    the same plan conflicts); retry by re-planning.
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

    Returns the plan that was committed (empty when nothing was due or the log has no
    commit). Raises `CommitConflictError` after 8 conflicting attempts, nothing committed.
    Idempotent: a second call right after the first finds nothing to delete.
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

    Returns the plan that was committed (see `plan_delete_records`). Raises
    `OffsetOutOfRangeError` for an offset out of range and `CommitConflictError` after 8
    conflicting attempts, nothing committed. Idempotent; re-plans on conflicts.
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
        snapshot = log.snapshot(repair=True)
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
