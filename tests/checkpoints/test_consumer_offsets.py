"""The consumer-offsets table and who holds deletes below which offset."""

from __future__ import annotations

from checkpoints.consumer_offsets import (
    CommittedOffset,
    ConsumerOffsets,
    consumer_offsets_uri,
    held_below,
)

DAY = 86_400_000


def row(consumer: str, partition: int, offset: int, at: int, expiration: int = DAY):
    return CommittedOffset(
        log_path="l",
        consumer_id=consumer,
        partition=partition,
        committed_offset=offset,
        committed_ms=at,
        expiration_ms=expiration,
    )


def test_held_below_is_the_lowest_offset_of_live_consumers() -> None:
    rows = [row("a", 0, 10, 0), row("a", 1, 7, 0), row("b", 0, 4, 0)]
    # b has not seen partition 1: it holds it from 0.
    assert held_below(rows, [0, 1], now_ms=1000) == {0: 4, 1: 0}


def test_an_expired_consumer_holds_nothing() -> None:
    rows = [row("a", 0, 10, 0), row("b", 0, 4, 0, expiration=500)]
    assert held_below(rows, [0], now_ms=1000) == {0: 10}
    assert held_below(rows, [0], now_ms=2 * DAY) == {}
    assert held_below([], [0], now_ms=0) == {}


def test_commits_upsert_per_partition_and_delete_unregisters(tmp_path) -> None:
    uri = consumer_offsets_uri(str(tmp_path / "_cleaner-offset-checkpoint"))
    assert uri == f"{tmp_path}/_consumer-offsets"
    table = ConsumerOffsets(uri)
    table.commit("l", "billing", {0: 3, 1: 4}, clock=lambda: 1000)
    table.commit("l", "billing", {0: 9}, clock=lambda: 2000)
    table.commit("l", "audit", {0: 1}, clock=lambda: 2000)
    table.commit("other", "billing", {0: 100}, clock=lambda: 2000)
    assert table.committed("l", "billing") == {0: 9, 1: 4}
    states = {s.consumer_id: s for s in table.consumers("l", now_ms=3000)}
    assert sorted(states) == ["audit", "billing"]
    assert states["billing"].committed_ms == 2000 and not states["billing"].expired
    assert table.held_below("l", [0, 1], now_ms=3000) == {0: 1, 1: 0}
    assert table.delete("l", "audit") == 1
    assert table.held_below("l", [0, 1], now_ms=3000) == {0: 9, 1: 4}
