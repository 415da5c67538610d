"""Planning a log's cleaning: every partition as a candidate, from Delta metadata only.

`LogPlanner.plan` measures one version of a log (first dirty and uncleanable
offsets, cleanable bytes, expired tombstones a registered consumer still holds) into
a `CleaningPlan`, the one list of `LogToClean` that a batch's hand-over, a round's
choice and ``status`` share. Pure arithmetic over the snapshot
(`sinks.cleaner.log_to_clean`), plus at most one read of the checkpoint table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from checkpoints import CleanerOffsetCheckpoint, split_histories
from sinks.cleaner.consumer_holds import consumer_holds, without_held_tombstones
from sinks.cleaner.log_to_clean import LogToClean, cleanable_offsets, log_to_clean
from sinks.config import CleanerConfig
from sinks.log.log_table import LogSnapshot, LogTable


@dataclass(frozen=True)
class CleaningPlan:
    """Every partition of one log version as a cleaning candidate (`LogPlanner.plan`).

    ``fresh`` unless checkpoint rows older than this plan went into it (a partition the
    log records no pass for, measured from the cached checkpoint table).
    """

    version: int
    logs: tuple[LogToClean, ...]
    fresh: bool = True
    foreign_files: bool = False  # another engine's files, for the next pass to rewrite


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
        """Every partition as a cleaning candidate, measured now (no Spark job); None
        without a log.

        The first dirty offset comes from the cleaner's ``txn`` entry in the log;
        the checkpoint table is read only for partitions the log has none for
        (a log not cleaned yet, or a checkpoint set by hand). Without
        ``fresh_checkpoints`` (a batch's plan) rows read within ``backoff_ms`` do.
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
            candidates.append(log_to_clean(self.log.uri, p, segments, offsets))
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

    def consumer_holds(self, snapshot: LogSnapshot, *, now_ms: int) -> dict[int, int]:
        """Per partition, where registered consumers hold expired tombstones (see
        `sinks.cleaner.consumer_holds`); empty when no live consumer reads the log."""
        return consumer_holds(
            self.checkpoints.uri,
            self.log.uri,
            snapshot.partitions,
            now_ms=now_ms,
            storage_options=self.checkpoints.storage_options,
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
