"""Pure planning for the cleaner: which offsets of a partition are cleanable, how dirty it
is, what one pass takes (Kafka's ``cleanableOffsets``, ``LogToClean``,
``groupSegmentsBySize``): design.md §4, §5, §33.

Plain numbers from the Delta log in (one `Segment` per Parquet data file, one partition
each), plain values out; no Spark, no I/O, nothing raised. Offset ranges are half-open:
``[first_dirty_offset, first_uncleanable_offset)`` is the cleanable section, a segment
covers ``[base_offset, last_offset + 1)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from sinks.config import (
    LONG_MAX,
    MAX_COMPACTION_LAG_MS,
    MIN_CLEANABLE_DIRTY_RATIO,
    MIN_COMPACTION_LAG_MS,
    CleanerConfig,
)
from sinks.log.segment import Segment, split_clean


@dataclass(frozen=True)
class OffsetsToClean:
    """The cleanable section ``[first_dirty_offset, first_uncleanable_offset)`` of a partition.

    ``force_checkpoint`` is True when the checkpointed offset was out of range and
    was reset, so the checkpoint must be rewritten even if nothing is cleaned.
    """

    first_dirty_offset: int
    first_uncleanable_offset: int
    force_checkpoint: bool = False


def cleanable_offsets(
    segments: Sequence[Segment],
    *,
    checkpoint_dirty_offset: int | None,
    log_start_offset: int,
    log_end_offset: int,
    now_ms: int,
    min_compaction_lag_ms: int,
) -> OffsetsToClean:
    """Where cleaning of one partition may start and must stop (Kafka's cleanableOffsets).

    The first dirty offset is ``checkpoint_dirty_offset``, reset to the log start (and
    ``force_checkpoint`` set) when it lies outside ``[log_start_offset,
    log_end_offset]``; the first uncleanable offset is design.md §5's. Pure.
    """
    force = False
    first_dirty = log_start_offset if checkpoint_dirty_offset is None else checkpoint_dirty_offset
    if first_dirty < log_start_offset or first_dirty > log_end_offset:
        first_dirty, force = log_start_offset, checkpoint_dirty_offset is not None

    first_uncleanable = log_end_offset
    if min_compaction_lag_ms > 0:
        cutoff = now_ms - min_compaction_lag_ms
        for segment in sorted(segments):
            if segment.last_offset < first_dirty:
                continue
            if segment.max_timestamp_ms is None or segment.max_timestamp_ms > cutoff:
                first_uncleanable = max(first_dirty, min(segment.base_offset, log_end_offset))
                break
    return OffsetsToClean(first_dirty, first_uncleanable, force)


@dataclass(frozen=True)
class LogToClean:
    """One partition of one log as a cleaning candidate, ordered by its cleanable ratio.

    ``clean_bytes`` and ``cleanable_bytes`` are counted per file as design.md §4 says;
    ``force_checkpoint`` is True when the checkpointed first dirty offset was out of
    range and was reset.
    """

    log_path: str
    partition: int
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    oldest_dirty_timestamp_ms: int | None = None
    earliest_delete_horizon_ms: int | None = None
    force_checkpoint: bool = False
    erasure_offset: int | None = None  # the partition's erasure mark (design.md §54)

    @property
    def total_bytes(self) -> int:
        """Clean plus cleanable bytes."""
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        """``cleanable / (clean + cleanable)``; 0.0 for an empty partition."""
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    def has_expired_tombstones(self, now_ms: int) -> bool:
        """True when a stamped tombstone's delete horizon lies before ``now_ms``."""
        horizon = self.earliest_delete_horizon_ms
        return horizon is not None and horizon < now_ms

    @property
    def erasure_due(self) -> bool:
        """True when an erasure's tombstones lie in the cleanable section and no pass has
        cleaned past them yet (design.md §54)."""
        mark = self.erasure_offset
        return (
            mark is not None
            and self.first_dirty_offset < mark <= self.first_uncleanable_offset
            and self.cleanable_bytes > 0
        )

    def compaction_delay_ms(self, now_ms: int) -> int:
        """How long the oldest dirty record has waited to be cleaned (0 when none)."""
        if self.cleanable_bytes == 0 or self.oldest_dirty_timestamp_ms is None:
            return 0
        return max(0, now_ms - self.oldest_dirty_timestamp_ms)

    def is_cleanable(
        self,
        *,
        now_ms: int,
        min_cleanable_dirty_ratio: float,
        max_compaction_lag_ms: int,
        force: bool = False,
    ) -> bool:
        """design.md §4: past the ratio, past the max lag, or holding an expired tombstone.

        With ``force``, any cleanable bytes or expired tombstone will do.
        """
        because = self.cleanable_because(
            now_ms=now_ms,
            min_cleanable_dirty_ratio=min_cleanable_dirty_ratio,
            max_compaction_lag_ms=max_compaction_lag_ms,
            force=force,
        )
        return because is not None

    def cleanable_because(
        self,
        *,
        now_ms: int,
        min_cleanable_dirty_ratio: float,
        max_compaction_lag_ms: int,
        force: bool = False,
    ) -> str | None:
        """Which clause of design.md §4 makes the partition cleanable now; None when none does."""
        if self.has_expired_tombstones(now_ms):
            return "expired tombstones"
        if self.erasure_due:
            return "erasure"
        if self.cleanable_bytes == 0:
            return None
        if force:
            return "forced"
        if self.cleanable_ratio > min_cleanable_dirty_ratio:
            return "dirty ratio"
        if self.compaction_delay_ms(now_ms) > max_compaction_lag_ms:
            return "max.compaction.lag.ms"
        return None


def log_to_clean(
    log_path: str,
    partition: int,
    segments: Iterable[Segment],
    offsets: OffsetsToClean,
    *,
    erasure_offset: int | None = None,
) -> LogToClean:
    """Measure a partition's clean and cleanable bytes, oldest dirty timestamp and earliest
    delete horizon from its segments, within ``offsets``; ``erasure_offset`` is the
    partition's erasure mark (design.md §54). Pure."""
    clean = cleanable = 0
    oldest_dirty: int | None = None
    horizon: int | None = None
    for segment in segments:
        if segment.base_offset >= offsets.first_uncleanable_offset:
            continue
        if segment.min_delete_horizon_ms is not None:
            horizon = _min(horizon, segment.min_delete_horizon_ms)
        if segment.last_offset < offsets.first_dirty_offset:
            clean += segment.size_bytes
        else:
            cleanable += segment.size_bytes
            oldest_dirty = _min(oldest_dirty, segment.min_timestamp_ms)
    return LogToClean(
        log_path=log_path,
        partition=partition,
        first_dirty_offset=offsets.first_dirty_offset,
        first_uncleanable_offset=offsets.first_uncleanable_offset,
        clean_bytes=clean,
        cleanable_bytes=cleanable,
        oldest_dirty_timestamp_ms=oldest_dirty,
        earliest_delete_horizon_ms=horizon,
        force_checkpoint=offsets.force_checkpoint,
        erasure_offset=erasure_offset,
    )


def dirty_ratio(partitions: Iterable[LogToClean]) -> float:
    """The dirty ratio over many partitions: their cleanable bytes over their total bytes."""
    cleanable = total = 0
    for candidate in partitions:
        cleanable += candidate.cleanable_bytes
        total += candidate.total_bytes
    return cleanable / total if total else 0.0


def filthiest_first(partitions: Iterable[LogToClean]) -> list[LogToClean]:
    """Candidates ordered dirtiest first (Kafka's grabFilthiestCompactedLog order)."""
    return sorted(partitions, key=lambda c: (-c.cleanable_ratio, c.log_path, c.partition))


def filthiest_cleanable(
    candidates: Sequence[LogToClean], config: CleanerConfig, *, now_ms: int, force: bool = False
) -> list[LogToClean]:
    """The cleanable partitions of ``candidates`` (design.md §4; ``force``: any cleanable
    bytes or expired tombstone), dirtiest first. Pure."""
    return [
        candidate
        for candidate in filthiest_first(candidates)
        if candidate.is_cleanable(
            now_ms=now_ms,
            min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
            max_compaction_lag_ms=config.max_compaction_lag_ms,
            force=force,
        )
    ]


def segments_to_clean(segments: Iterable[Segment], first_uncleanable_offset: int) -> list[Segment]:
    """The segments a pass reads: every segment wholly below the first uncleanable offset."""
    return sorted(s for s in segments if s.last_offset < first_uncleanable_offset)


@dataclass(frozen=True)
class PassPlan:
    """The partitions one pass cleans, each possibly cut short, and whether work is left."""

    partitions: tuple[LogToClean, ...]
    bytes_read: int
    work_left: bool


def within_budget(
    partitions: Sequence[LogToClean], segments: Mapping[int, Sequence[Segment]], max_bytes: int
) -> PassPlan:
    """Cut a pass to about ``max_bytes`` of input (``log.cleaner.max.bytes.per.pass``). Pure.

    Takes ``partitions`` dirtiest first and each partition's ``segments``. Returns a `PassPlan`
    whose partitions have their first uncleanable offset lowered to the base of the
    first dirty segment past the budget, later partitions skipped when nothing of them
    fits, and ``work_left`` set when anything was cut (design.md §33).
    """
    chosen: list[LogToClean] = []
    used = 0
    left = False
    for candidate in partitions:
        inputs = segments_to_clean(
            segments.get(candidate.partition, []), candidate.first_uncleanable_offset
        )
        clean, dirty = split_clean(inputs, candidate.first_dirty_offset)
        cost = sum(s.size_bytes for s in clean)
        taken = 0
        for segment in dirty:
            first_step = not chosen and taken == 0
            if not first_step and used + cost + segment.size_bytes > max_bytes:
                break
            cost += segment.size_bytes
            taken += 1
        if dirty and taken == 0 or not dirty and chosen and used + cost > max_bytes:
            left = True
            continue
        end = candidate.first_uncleanable_offset
        if taken < len(dirty):
            end, left = dirty[taken].base_offset, True
        chosen.append(replace(candidate, first_uncleanable_offset=end))
        used += cost
    return PassPlan(tuple(chosen), used, left)


def group_segments_by_size(segments: Sequence[Segment], max_size: int) -> list[list[Segment]]:
    """Group consecutive segments so each group's total size stays within ``max_size``.

    Every group holds at least one segment, so a segment larger than ``max_size`` is a
    group of its own (design.md §33). Pure.
    """
    groups: list[list[Segment]] = []
    current: list[Segment] = []
    size = 0
    for segment in segments:
        if current and size + segment.size_bytes > max_size:
            groups.append(current)
            current, size = [], 0
        current.append(segment)
        size += segment.size_bytes
    if current:
        groups.append(current)
    return groups


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def why_not_cleanable(candidate: LogToClean, config: CleanerConfig, *, now_ms: int) -> str:
    """One clause for the partition of ``candidate``: why none of design.md §4's triggers
    holds (``p0: ...``).

    Meant for a partition `LogToClean.is_cleanable` refused without ``force``.
    """
    reasons = []
    if candidate.cleanable_bytes == 0:
        if candidate.first_dirty_offset < candidate.first_uncleanable_offset:
            reasons.append("no cleanable bytes")
        elif config.min_compaction_lag_ms > 0:
            reasons.append(
                f"no cleanable bytes (dirty records are younger than {MIN_COMPACTION_LAG_MS} "
                f"{_duration(config.min_compaction_lag_ms)})"
            )
        else:
            reasons.append("no dirty records")
    else:
        reasons.append(
            f"dirty ratio {candidate.cleanable_ratio:.2f} not above "
            f"{MIN_CLEANABLE_DIRTY_RATIO} {config.min_cleanable_dirty_ratio:g}"
        )
        if config.max_compaction_lag_ms < LONG_MAX:
            reasons.append(
                f"oldest dirty record {_duration(candidate.compaction_delay_ms(now_ms))} old, "
                f"not past {MAX_COMPACTION_LAG_MS} {_duration(config.max_compaction_lag_ms)}"
            )
    mark, first_dirty = candidate.erasure_offset, candidate.first_dirty_offset
    if mark is not None and first_dirty < mark > candidate.first_uncleanable_offset:
        reasons.append(
            f"erasure below offset {mark} waits for {MIN_COMPACTION_LAG_MS} "
            f"{_duration(config.min_compaction_lag_ms)}"
        )
    horizon = candidate.earliest_delete_horizon_ms
    if horizon is not None:
        reasons.append(f"next tombstone due in {_duration(max(0, horizon - now_ms))}")
    return f"p{candidate.partition}: " + ", ".join(reasons)


def nothing_cleanable_line(
    log_path: str, partitions: Iterable[LogToClean], config: CleanerConfig, *, now_ms: int
) -> str:
    """The line ``clean`` prints for a log it did not clean: each partition's reason."""
    if not config.compact:
        return f"{log_path}: not cleaned: cleanup.policy={config.cleanup_policy} (no compact)"
    clauses = [why_not_cleanable(c, config, now_ms=now_ms) for c in partitions]
    if not clauses:
        return f"{log_path}: nothing to clean: the log has no records"
    return f"{log_path}: nothing to clean: " + "; ".join(clauses)


def _duration(ms: int) -> str:
    if ms < 1_000:
        return f"{ms} ms"
    seconds = ms / 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"
