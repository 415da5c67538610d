"""Kafka's ``grabFilthiestCompactedLog`` for one log: its cleanable partitions, dirtiest
first, claimed for one pass.

Kafka's manager chooses under a lock and marks the log in progress. Here the claim is
a compare-and-set on each partition's checkpoint row (`CleanerManager.start_cleaning`),
so another process may take partitions between the choice and the claim, and other
writers may commit meanwhile: `grab_filthiest_compacted_log` plans again after
claiming when the log moved (a pass planned from the newest version has less to
conflict with), refuses to go on over files another engine wrote since (they are
absorbed first), and cuts the choice to the pass's byte budget
(``log.cleaner.max.bytes.per.pass``), releasing the partitions it does not keep.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from deltalake.exceptions import CommitFailedError

from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaning_plan import LogPlanner
from sinks.cleaner.log_to_clean import LogToClean, filthiest_first, within_budget
from sinks.config import CleanerConfig
from sinks.errors import CleanerError
from sinks.log.log_table import LogSnapshot, LogTable

logger = logging.getLogger("compacted_sink")


def filthiest_cleanable(
    candidates: Sequence[LogToClean], config: CleanerConfig, *, now_ms: int, force: bool = False
) -> list[LogToClean]:
    """The cleanable partitions of ``candidates`` (design.md §4; ``force``: any cleanable
    bytes or expired tombstone), dirtiest first. Pure."""
    return [
        log
        for log in filthiest_first(candidates)
        if log.is_cleanable(
            now_ms=now_ms,
            min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
            max_compaction_lag_ms=config.max_compaction_lag_ms,
            force=force,
        )
    ]


@dataclass(frozen=True)
class Claim:
    """The partitions a pass holds: their plans (``logs``), of ``snapshot``; ``work_left``
    when the byte budget left cleanable partitions for the next pass."""

    snapshot: LogSnapshot
    logs: list[LogToClean]
    work_left: bool

    @property
    def partitions(self) -> set[int]:
        return {log.partition for log in self.logs}


def grab_filthiest_compacted_log(
    log: LogTable,
    planner: LogPlanner,
    manager: CleanerManager,
    config: CleanerConfig,
    snapshot: LogSnapshot,
    *,
    now_ms: int,
    force: bool,
) -> Claim | None:
    """Choose the cleanable partitions of ``snapshot``, dirtiest first, claim them, plan
    again if the log moved meanwhile, and cut the choice to the pass's byte budget; None:
    nothing to do. Checkpoints found out of range are rewritten on the way, as Kafka does.

    Raises `CleanerError` (caused by `CommitFailedError`, so the caller plans again) when
    another engine rewrote files after the choice.
    """
    plan = planner.plan(snapshot)  # the pass's own version, checkpoint rows read now
    assert plan is not None
    chosen = filthiest_cleanable(plan.logs, config, now_ms=now_ms, force=force)
    reset = [p for p in plan.logs if p.force_checkpoint and p not in chosen]
    if reset:
        manager.reset_checkpoints(reset, table_id=snapshot.table_id, version=snapshot.version)
    if not chosen:
        return None
    claimed = set(manager.start_cleaning([p.partition for p in chosen]))
    if not claimed:
        return None  # paused, cleaned by a live cleaner elsewhere, or backing off
    if claimed != {p.partition for p in chosen}:
        logger.info("cleaning only %s of %s: the others are busy", claimed, log.uri)
    fresh = log.snapshot()
    assert fresh is not None
    if fresh.foreign_files:  # another engine rewrote files since: absorb them first
        manager.abort_cleaning(claimed)
        raise CleanerError(
            "another engine rewrote files while this pass was planned",
            log_path=log.uri,
            partition=chosen[0].partition,
        ) from CommitFailedError(f"{log.uri}: foreign files at version {fresh.version}")
    if fresh.version != snapshot.version:  # plan again after the claim: less to conflict
        snapshot = fresh
        replanned = planner.plan(snapshot)
        assert replanned is not None
        chosen = filthiest_cleanable(replanned.logs, config, now_ms=now_ms, force=force)
    chosen = [p for p in chosen if p.partition in claimed]
    budgeted = within_budget(chosen, snapshot.segments, config.log_cleaner_max_bytes_per_pass)
    unused = claimed - {p.partition for p in budgeted.logs}
    if unused:
        manager.abort_cleaning(unused)
    if not budgeted.logs:
        return None
    return Claim(snapshot, list(budgeted.logs), budgeted.work_left)
