"""Planning a pass, pure or nearly (Kafka's ``LogCleanerManager.cleanableOffsets`` and the
planning half of ``Cleaner``): every partition of a log version measured into a
`CleaningPlan` (`LogPlanner.plan`) and its filthiest cleanable partitions chosen
(`LogPlanner.choose`, the one place a plan is chosen), what a round is asked to do
(`RoundRequest`: what is forced, the plan, the budget, built once and handed down), the
tombstones registered consumers still hold (`consumer_holds`), and one partition's share
of a pass (`plan_partition`). The claims and states these plans are acted on with are
`sinks.cleaner.cleaner_manager`'s.

`LogPlanner.plan` is arithmetic over the snapshot (`sinks.cleaner.log_to_clean`) plus at
most one read of the checkpoint table and, when a tombstone has expired, one of the
consumer-offsets table; no Spark job.

Deletes held for registered consumers (design.md cites the rule): a consumer reading the
log with ``consumer.id`` commits its offsets in the consumer-offsets table
(`checkpoints.consumer_offsets`), and a pass gets, per partition, the offset its live
consumers have all read up to (``held_below``, the lowest committed offset). The invariant:

    a tombstone at offset O of partition p whose delete horizon has passed is dropped
    only when O < held_below[p] (every live consumer has read it); a partition with no
    live consumer has no entry, and Kafka's rule applies unchanged.

Only tombstones are held; a consumer that has not committed for
``consumer.expiration.ms`` holds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from checkpoints import CleanerOffsetCheckpoint, split_histories
from checkpoints.consumer_offsets import ConsumerOffsets, consumer_offsets_uri
from sinks.cleaner.log_to_clean import (
    LogToClean,
    cleanable_offsets,
    filthiest_cleanable,
    log_to_clean,
    segments_to_clean,
)
from sinks.cleaner.offset_map import size_map
from sinks.cleaner.throttler import EVERY_CORE, TaskBudget
from sinks.config import CleanerConfig
from sinks.log.location import LogLocation
from sinks.log.log_format import ERASURE_TXN
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.segment import Segment


@dataclass(frozen=True)
class CleaningPlan:
    """Every partition of one log version as a cleaning candidate (`LogPlanner.plan`).

    ``fresh`` unless checkpoint rows older than this plan went into it (a partition the
    log records no pass for, measured from the cached checkpoint table).
    """

    version: int
    partitions: tuple[LogToClean, ...]
    fresh: bool = True
    foreign_files: bool = False  # another engine's files, for the next pass to rewrite
    filthiest: tuple[LogToClean, ...] | None = None  # once chosen (`choose`)
    forced: bool = False  # whether ``filthiest`` was chosen with ``force``

    def choose(self, config: CleanerConfig, *, now_ms: int, force: bool) -> CleaningPlan:
        """This plan with its cleanable partitions chosen, dirtiest first
        (`sinks.cleaner.log_to_clean.filthiest_cleanable`): the one choice a round makes
        and its pass goes on from (`LogPlanner.choose`). Pure."""
        chosen = filthiest_cleanable(self.partitions, config, now_ms=now_ms, force=force)
        return replace(self, filthiest=tuple(chosen), forced=force)


@dataclass(frozen=True)
class RoundRequest:
    """What one round is asked to do, built once by whoever asks and handed down as it is:
    ``force`` (any cleanable bytes or expired tombstone qualifies a partition, not only
    design.md §4's triggers), ``plan`` (the measure that led to the round, chosen for
    ``force`` by `LogPlanner.choose`; None: the pass measures the log itself) and
    ``budget`` (the pass's share of the cores).
    """

    force: bool = False
    plan: CleaningPlan | None = None
    budget: TaskBudget = EVERY_CORE

    def __post_init__(self) -> None:
        plan = self.plan
        if plan is not None and (plan.filthiest is None or plan.forced != self.force):
            raise ValueError("a round's plan is chosen for what the round forces")

    def plan_of(self, snapshot: LogSnapshot) -> CleaningPlan | None:
        """The request's plan when a pass starting from ``snapshot`` may go on from it: of
        the same version, its checkpoint rows read fresh (design.md §43); else None."""
        plan = self.plan
        if plan is None or not plan.fresh or plan.version != snapshot.version:
            return None
        return plan


class LogPlanner:
    """Plans one log's cleaning; caches the checkpoint rows it read for ``backoff_ms``."""

    def __init__(
        self,
        log: LogTable,
        checkpoints: CleanerOffsetCheckpoint,
        config: CleanerConfig,
        *,
        clock: Callable[[], int],
    ) -> None:
        self.log = log
        self.checkpoints = checkpoints
        self.config = config
        self.clock = clock
        self._checkpoint_cache: tuple[float, dict[int, int] | None] = (0.0, None)

    def plan(
        self, snapshot: LogSnapshot | None = None, *, fresh_checkpoints: bool = True
    ) -> CleaningPlan | None:
        """``snapshot`` (default: the log now) as a `CleaningPlan`; None without a log.
        Read-only; no Spark job.

        The first dirty offset comes from the cleaner's ``txn`` entry in the log;
        the checkpoint table is read only for partitions the log has none for. Without
        ``fresh_checkpoints`` rows read within ``backoff_ms`` are reused.
        """
        snapshot = snapshot or self.log.snapshot()
        if snapshot is None:
            return None
        recorded = {p: snapshot.cleaner_offset(p) for p in snapshot.partitions}
        fresh = True
        if any(offset is None for offset in recorded.values()):
            checkpointed, fresh = self._checkpointed_offsets(snapshot, fresh=fresh_checkpoints)
            for p, offset in checkpointed.items():
                if recorded.get(p, 0) is None:
                    recorded[p] = offset
        now = self.clock()
        candidates = []
        for p in snapshot.partitions:
            segments = snapshot.segments.get(p, [])
            offsets = cleanable_offsets(
                segments,
                checkpoint_dirty_offset=recorded[p],
                log_start_offset=snapshot.log_start_offset(p),
                log_end_offset=snapshot.log_end_offset(p),
                now_ms=now,
                min_compaction_lag_ms=self.config.min_compaction_lag_ms,
            )
            erasure = snapshot.txn_version(ERASURE_TXN.format(p))
            candidates.append(
                log_to_clean(self.log.uri, p, segments, offsets, erasure_offset=erasure)
            )
        if any(c.has_expired_tombstones(now) for c in candidates):
            held = self.consumer_holds(snapshot, now_ms=now)
            candidates = [
                without_held_tombstones(
                    c, snapshot.segments.get(c.partition, []), held.get(c.partition)
                )
                for c in candidates
            ]
        return CleaningPlan(
            snapshot.version, tuple(candidates), fresh, foreign_files=bool(snapshot.foreign_files)
        )

    def choose(
        self, snapshot: LogSnapshot | None = None, *, force: bool, fresh_checkpoints: bool = True
    ) -> CleaningPlan | None:
        """`plan` with its filthiest cleanable partitions chosen now (`CleaningPlan.choose`,
        ``force`` as a `RoundRequest` gives it): the one place a round's plan is made, for
        the hand-over, the loop's choice of a log and a pass. None without a log."""
        plan = self.plan(snapshot, fresh_checkpoints=fresh_checkpoints)
        return plan.choose(self.config, now_ms=self.clock(), force=force) if plan else None

    def consumer_holds(self, snapshot: LogSnapshot, *, now_ms: int) -> dict[int, int]:
        """Per partition, where registered consumers hold expired tombstones (see
        `consumer_holds`); empty when no live consumer reads the log."""
        return consumer_holds(
            LogLocation(self.checkpoints.uri, self.checkpoints.storage_options),
            self.log.uri,
            snapshot.partitions,
            now_ms=now_ms,
            table_id=snapshot.table_id,
            version=snapshot.version,
        )

    def _checkpointed_offsets(
        self, snapshot: LogSnapshot, *, fresh: bool
    ) -> tuple[dict[int, int], bool]:
        """This log's checkpointed first dirty offsets, and whether they were read now.
        Rows that describe another table or history are left out (`split_histories`):
        the partition starts from what the log itself records."""
        read_at, offsets = self._checkpoint_cache
        if fresh or offsets is None or time.monotonic() - read_at > self.config.backoff_ms / 1000:
            rows, _ = split_histories(
                self.checkpoints.read(self.log.uri),
                table_id=snapshot.table_id,
                version=snapshot.version,
                latest_version=lambda: self.log.snapshot(verify=False).version,  # type: ignore[union-attr]
            )
            offsets = {p: entry.first_dirty_offset for (_, p), entry in rows.items()}
            self._checkpoint_cache = (time.monotonic(), offsets)
            return offsets, True
        return offsets, False


def consumer_holds(
    checkpoint_table: LogLocation,
    log_path: str,
    partitions: Sequence[int],
    *,
    now_ms: int,
    table_id: str | None = None,
    version: int | None = None,
) -> dict[int, int]:
    """Per partition of ``partitions``, the offset below which expired tombstones may go
    (design.md §20); a partition no live consumer reads has no entry. Offsets committed for
    another table or history of the log (``table_id``, ``version``) hold nothing.
    Read-only: one read of the consumer-offsets table beside ``checkpoint_table``."""
    uri = consumer_offsets_uri(checkpoint_table.uri)
    offsets = ConsumerOffsets(uri, checkpoint_table.storage_options)
    return offsets.held_below(
        log_path, partitions, now_ms=now_ms, table_id=table_id, version=version
    )


def without_held_tombstones(
    candidate: LogToClean, segments: Sequence[Segment], held_below: int | None
) -> LogToClean:
    """``candidate`` with only the tombstones a pass may drop counted as a reason to clean.
    Pure.

    A tombstone held for a consumer is no reason for a pass: the earliest delete horizon
    counts only segments that start below ``held_below`` (and below the first uncleanable
    offset, as `log_to_clean` counts them). Without this a held tombstone would make its
    partition cleanable on every check, and each pass would copy it again.
    """
    if held_below is None or candidate.earliest_delete_horizon_ms is None:
        return candidate
    horizons = [
        s.min_delete_horizon_ms
        for s in segments
        if s.min_delete_horizon_ms is not None
        and s.base_offset < min(held_below, candidate.first_uncleanable_offset)
    ]
    return replace(candidate, earliest_delete_horizon_ms=min(horizons, default=None))


@dataclass(frozen=True)
class PartitionPlan:
    """One partition's share of a pass: the files it reads, those its map covers (built in
    ``buckets``), where it ends (``end_offset``, the next first dirty offset) and whether
    the map cut it short.
    """

    partition: int
    inputs: tuple[Segment, ...]
    mapped: tuple[Segment, ...]
    end_offset: int
    cut: bool
    buckets: int = 1


def plan_partition(
    candidate: LogToClean,
    segments: Sequence[Segment],
    *,
    cleaner_offset: int | None,
    keys: LogKeys,
    dedupe_buffer_size: int,
) -> PartitionPlan:
    """Which files a partition's pass reads and maps, and how, within the dedupe buffer. Pure.

    The end is the first uncleanable offset, or lower, at a segment boundary, when not
    even a map built in buckets fits (`sinks.cleaner.offset_map.size_map`).
    """
    inputs = segments_to_clean(segments, candidate.first_uncleanable_offset)
    size = size_map(
        inputs,
        first_dirty_offset=candidate.first_dirty_offset,
        cleaner_offset=cleaner_offset,
        keys=keys,
        end_offset=candidate.first_uncleanable_offset,
        dedupe_buffer_size=dedupe_buffer_size,
    )
    return PartitionPlan(
        partition=candidate.partition,
        inputs=tuple(s for s in inputs if s.last_offset < size.end_offset),
        mapped=size.mapped,
        end_offset=size.end_offset,
        cut=size.end_offset < candidate.first_uncleanable_offset,
        buckets=size.buckets,
    )
