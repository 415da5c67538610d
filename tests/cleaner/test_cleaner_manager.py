"""Cleaner states in the checkpoint table: claim, heartbeat expiry, pause, uncleanable backoff."""

from __future__ import annotations

import threading

import pytest

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint
from sinks.cleaner.cleaner_manager import (
    IDLE,
    IN_PROGRESS,
    PAUSED,
    UNCLEANABLE,
    CleanerManager,
    may_start_cleaning,
    uncleanable_backoff_ms,
)
from sinks.errors import CleanerError

LOG = "/lake/log"


class Clock:
    def __init__(self, now=1_000_000):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def checkpoints(tmp_path):
    return CleanerOffsetCheckpoint(str(tmp_path / "_cleaner-offset-checkpoint"))


def manager(checkpoints, owner, clock, **kw):
    return CleanerManager(
        checkpoints, LOG, owner=owner, clock=clock, heartbeat_timeout_ms=1_000, **kw
    )


def test_backoff_doubles_and_is_capped():
    assert [uncleanable_backoff_ms(n, base_ms=10, max_ms=100) for n in range(6)] == [
        0,
        10,
        20,
        40,
        80,
        100,
    ]


def test_may_start_cleaning_by_state():
    def entry(**kw):
        return CheckpointEntry(log_path=LOG, partition=0, first_dirty_offset=0, **kw)

    args = dict(owner="me", now_ms=10_000, heartbeat_timeout_ms=1_000)
    assert may_start_cleaning(None, **args)
    assert may_start_cleaning(entry(cleaner_state=IDLE), **args)
    assert not may_start_cleaning(entry(cleaner_state=PAUSED, state_owner="me"), **args)
    live = entry(cleaner_state=IN_PROGRESS, state_owner="other", state_heartbeat_ms=9_500)
    assert not may_start_cleaning(live, **args)
    assert may_start_cleaning(live.with_changes(state_heartbeat_ms=8_000), **args)
    assert may_start_cleaning(live.with_changes(state_owner="me"), **args)
    failed = entry(cleaner_state=UNCLEANABLE, uncleanable_since_ms=9_000, failed_attempts=2)
    assert not may_start_cleaning(failed, **args, backoff_base_ms=1_000)  # waits 2 s
    assert may_start_cleaning(failed, **args, backoff_base_ms=500)  # waited 1 s >= 1 s


def test_one_owner_claims_the_other_waits_until_heartbeat_expires(checkpoints):
    clock = Clock()
    a, b = manager(checkpoints, "a", clock), manager(checkpoints, "b", clock)
    assert a.start_cleaning([0, 1]) == [0, 1]
    assert b.start_cleaning([0, 1]) == []
    assert b.busy_partitions() == {0, 1}
    clock.now += 900
    assert a.heartbeat([0]) == [0]
    clock.now += 200  # partition 1's heartbeat is 1.1 s old: its owner counts as dead
    assert b.start_cleaning([0, 1]) == [1]
    assert a.heartbeat([0, 1]) == [0]  # a lost partition 1 to b
    entries = a.entries()
    assert (entries[0].state_owner, entries[1].state_owner) == ("a", "b")


def test_done_cleaning_writes_figures_and_releases(checkpoints):
    clock = Clock()
    a = manager(checkpoints, "a", clock)
    a.start_cleaning([0])
    a.done_cleaning(
        [CheckpointEntry(log_path=LOG, partition=0, first_dirty_offset=42, records_read=7)]
    )
    row = a.entries()[0]
    assert (row.cleaner_state, row.first_dirty_offset, row.records_read) == (IDLE, 42, 7)
    assert row.state_owner is None


def test_uncleanable_is_retried_with_backoff_and_cleared_by_success(checkpoints):
    clock = Clock()
    a = manager(checkpoints, "a", clock, backoff_base_ms=1_000)
    a.start_cleaning([0])
    a.mark_uncleanable([0], RuntimeError("disk full"))
    row = a.entries()[0]
    assert row.cleaner_state == UNCLEANABLE and row.failed_attempts == 1
    assert row.uncleanable_reason == "RuntimeError: disk full"
    assert a.start_cleaning([0]) == []
    clock.now += 1_000
    assert a.start_cleaning([0]) == [0]
    a.mark_uncleanable([0], "again")
    clock.now += 1_500
    assert a.start_cleaning([0]) == []  # second failure: 2 s
    clock.now += 500
    assert a.start_cleaning([0]) == [0]
    a.done_cleaning([CheckpointEntry(log_path=LOG, partition=0, first_dirty_offset=5)])
    row = a.entries()[0]
    assert (row.cleaner_state, row.failed_attempts, row.uncleanable_reason) == (IDLE, 0, None)


def test_pause_blocks_claims_until_resume_and_survives_a_pass_ending(checkpoints):
    clock = Clock()
    a, b = manager(checkpoints, "a", clock), manager(checkpoints, "b", clock)
    b.pause_cleaning([0])
    b.pause_cleaning([0])  # idempotent
    assert a.start_cleaning([0]) == []
    a.done_cleaning([CheckpointEntry(log_path=LOG, partition=0, first_dirty_offset=3)])
    assert a.entries()[0].cleaner_state == PAUSED
    b.resume_cleaning([0])
    assert a.entries()[0].cleaner_state == IDLE
    assert a.start_cleaning([0]) == [0]


def test_pause_waits_for_a_live_pass_then_gives_up(checkpoints):
    clock = Clock()
    a, b = manager(checkpoints, "a", clock), manager(checkpoints, "b", clock)
    a.start_cleaning([0])
    with pytest.raises(CleanerError, match="still running"):
        b.pause_cleaning([0], timeout_ms=300)
    done = threading.Timer(
        0.3,
        lambda: a.done_cleaning([CheckpointEntry(log_path=LOG, partition=0, first_dirty_offset=1)]),
    )
    done.start()
    b.pause_cleaning([0], timeout_ms=5_000)
    done.join()
    row = b.entries()[0]
    assert (row.cleaner_state, row.first_dirty_offset) == (PAUSED, 1)


def test_racing_claims_from_threads_give_exactly_one_owner(checkpoints):
    clock = Clock()
    managers = [manager(checkpoints, f"m{i}", clock) for i in range(4)]
    managers[0].done_cleaning([CheckpointEntry(log_path=LOG, partition=0, first_dirty_offset=0)])
    claimed = {}
    barrier = threading.Barrier(len(managers))

    def claim(m):
        barrier.wait()
        claimed[m.owner] = m.start_cleaning([0])

    threads = [threading.Thread(target=claim, args=(m,)) for m in managers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [owner for owner, parts in claimed.items() if parts == [0]]
    assert len(winners) == 1
    assert managers[0].entries()[0].state_owner == winners[0]
    assert len(checkpoints.read(LOG)) == 1


def test_a_pass_over_16_partitions_claims_and_releases_them_in_one_commit_each(checkpoints):
    """One compare-and-set per transition of a pass, not one per partition (issue #20: at 16
    partitions the claims, heartbeats and releases cost more than a small pass)."""
    from deltalake import DeltaTable

    clock = Clock()
    a, b = manager(checkpoints, "a", clock), manager(checkpoints, "b", clock)
    b.pause_cleaning([3])
    before = DeltaTable(checkpoints.uri).version()
    assert a.start_cleaning(range(16)) == [p for p in range(16) if p != 3]
    assert DeltaTable(checkpoints.uri).version() == before + 1
    assert a.heartbeat(range(16)) == [p for p in range(16) if p != 3]
    a.done_cleaning(
        CheckpointEntry(log_path=LOG, partition=p, first_dirty_offset=10 * p)
        for p in range(16)
        if p != 3
    )
    assert DeltaTable(checkpoints.uri).version() == before + 3
    entries = a.entries()
    assert entries[3].cleaner_state == PAUSED and entries[5].first_dirty_offset == 50
    assert {e.cleaner_state for p, e in entries.items() if p != 3} == {IDLE}
