"""Forgetting a key (design.md §54, §55): `erase` appends tombstones once and makes its
partitions cleanable; `erasure_status` lists every file still holding the key, and says
"none" only when a read of every byte under the paths finds no record of it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from testkit import arrow_append, state_of

from checkpoints.consumer_offsets import ConsumerOffsets, consumer_offsets_uri
from sinks import CleanerConfig, CompactedStateSink, lookup, read_state
from sinks.errors import HistoryExpiredError

SCHEMA = "key string, value string, partition int"
WINDOW_MS = 4_000  # the history window (wall time: delta-rs deletes by the wall clock)
RETENTION_MS = 3_600_000  # delete.retention.ms (the sink's clock: the test moves it)
ERASED = ["erase-me-alpha", "erase-me-bravo"]


def erasure_config(**changes) -> CleanerConfig:
    settings = dict(
        min_cleanable_dirty_ratio=0.99,  # the erasure, not the ratio, makes the pass
        delete_retention_ms=RETENTION_MS,
        file_delete_delay_ms=WINDOW_MS,
        log_retention_check_interval_ms=3_600_000,  # only the explicit vacuum() deletes
    )
    settings.update(changes)
    return CleanerConfig(**settings)


def feed(sink, spark, batches: int = 3, start: int = 0) -> None:
    for b in range(start, start + batches):
        rows = [(f"keep-{b}-{i}", f"v{b}", i % 2) for i in range(4)]
        rows += [(ERASED[0], f"alpha-{b}", 0), (ERASED[1], f"bravo-{b}", 1)]
        arrow_append(sink, rows, SCHEMA, b, spark)


def bytes_naming(root: Path, key: str) -> list[str]:
    """Every file under ``root`` whose bytes, or decoded Parquet values, hold ``key``."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        hit = key.encode() in raw
        if not hit and path.suffix == ".parquet":
            table = pq.read_table(path)
            hit = key in json.dumps(table.to_pylist(), default=str)
        if hit:
            found.append(str(path.relative_to(root)))
    return found


def settle(sink, clock, *, window_ms: int = WINDOW_MS) -> None:
    """Drop expired tombstones, let the window pass, and delete: what the cleaner's rounds
    do. The deleter checkpoints the idle log itself, so its commits can be trimmed."""
    clock.advance(RETENTION_MS + 60_000)
    sink.clean()  # the pass that drops the tombstones (their horizon has passed)
    time.sleep(window_ms / 1000 + 0.3)
    clock.now = max(clock.now, int(time.time() * 1000))
    sink.vacuum()


def test_erase_cleans_its_partitions_and_the_status_says_none_only_when_no_byte_holds_it(
    spark, lake, clock_at
):
    clock = clock_at(int(time.time() * 1000))
    path = lake / "log"
    sink = CompactedStateSink(str(path), config=erasure_config(), clock=clock)
    feed(sink, spark)
    before = sink.log_table.snapshot().version
    assert sink.erasure_status(ERASED[0]).keys[0].places  # live before the erasure

    report = sink.erase(ERASED)
    # Time travel inside the window still shows the key (documented), by every reader.
    assert ERASED[0] in {r["key"] for r in sink.state(as_of=before).collect()}
    assert lookup(str(path), ERASED[0], as_of=before).num_rows == 1
    assert ERASED[0] in read_state(str(path), as_of=before).column("key").to_pylist()

    assert report.tombstones == 2 and set(report.marked) == {0, 1}
    state = state_of(sink)
    assert ERASED[0] not in state and ERASED[1] not in state
    assert len(state) == 12
    # The erasure made the pass (ratio 0.99 would not have): no older record is live.
    live = sink.log().where("key like 'erase-me-%'").collect()
    assert sorted((r["key"], r["value"]) for r in live) == [(ERASED[0], None), (ERASED[1], None)]
    again = sink.erase(ERASED)  # exactly once: nothing more to write
    assert again.tombstones == 0

    status = sink.erasure_status(ERASED)
    assert not status.gone
    kinds = {p.kind for k in status.keys for p in k.places}
    assert {"live segment", "history segment", "delta commit"} <= kinds
    tombstone = [p for p in status.keys[0].places if p.kind == "live segment"]
    assert tombstone and tombstone[0].goes_at_ms is not None
    assert tombstone[0].goes_at_ms >= clock() + RETENTION_MS
    assert status.deadline_ms is None or status.deadline_ms >= clock()

    settle(sink, clock)

    final = sink.erasure_status(ERASED)
    assert final.gone, [p.as_dict() for k in final.keys for p in k.places]
    assert final.files_decoded >= 0 and final.delta_log_files_read > 0
    for key in ERASED:
        assert bytes_naming(path, key) == []
    assert len(state_of(sink)) == 12
    # Time travel to before the erasure now refuses by name, whoever reads.
    for travel in (
        lambda: sink.state(as_of=before),
        lambda: sink.log(as_of=before),
        lambda: lookup(str(path), ERASED[0], as_of=before),
        lambda: read_state(str(path), as_of=before),
        lambda: sink.restore(before),
    ):
        with pytest.raises(HistoryExpiredError):
            travel()


def test_a_key_in_the_dead_letter_table_is_erased_there_too(spark, lake, clock_at):
    clock = clock_at(int(time.time() * 1000))
    path, dead = lake / "log", lake / "dead-letters"
    config = erasure_config(message_max_bytes=64)
    sink = CompactedStateSink(str(path), config=config, clock=clock, dead_letter_table=str(dead))
    arrow_append(sink, [("keep-0", "ok", 0), (ERASED[0], "x" * 100, 0)], SCHEMA, 0, spark)
    arrow_append(sink, [(ERASED[0], "small", 0), ("keep-1", "y" * 100, 0)], SCHEMA, 1, spark)
    assert any(p.kind == "dead-letter row" for p in sink.erasure_status(ERASED[0]).keys[0].places)

    report = sink.erase(ERASED[0])

    assert report.dead_letters_removed == 1
    status = sink.erasure_status(ERASED[0])
    kinds = {p.kind for p in status.keys[0].places}
    assert "dead-letter row" not in kinds and "dead-letter history file" in kinds
    assert "keep-1" in json.dumps(sink.appender.dead_letters.read().to_pylist())

    settle(sink, clock)

    final = sink.erasure_status(ERASED[0])
    assert final.gone, [p.as_dict() for p in final.keys[0].places]
    assert bytes_naming(dead, ERASED[0]) == [] and bytes_naming(path, ERASED[0]) == []


def test_a_lagging_registered_consumer_holds_the_tombstone_and_the_status_says_so(
    spark, lake, clock_at
):
    clock = clock_at(int(time.time() * 1000))
    sink = CompactedStateSink(str(lake / "log"), config=erasure_config(), clock=clock)
    feed(sink, spark, batches=2)
    offsets = ConsumerOffsets(consumer_offsets_uri(sink.checkpoint_path))
    snapshot = sink.log_table.snapshot()
    offsets.commit(
        sink.path,
        "laggard",
        {0: 1, 1: 1},
        clock=clock,
        table_id=snapshot.table_id,
        table_version=snapshot.version,
    )
    sink.erase(ERASED[0])
    clock.advance(RETENTION_MS + 60_000)
    offsets.commit(
        sink.path,
        "laggard",
        {0: 1, 1: 1},
        clock=clock,
        table_id=snapshot.table_id,
        table_version=snapshot.version,
    )
    sink.clean()
    held = [p for p in sink.erasure_status(ERASED[0]).keys[0].places if p.kind == "live segment"]
    assert held and held[0].goes_at_ms is None and "registered consumers" in held[0].why
    assert sink.erasure_status(ERASED[0]).deadline_ms is None


def test_a_key_never_written_is_none_at_once_and_later_erasures_are_batches_of_their_own(
    spark, lake, clock_at
):
    sink = CompactedStateSink(
        str(lake / "log"), config=erasure_config(), clock=clock_at(int(time.time() * 1000))
    )
    feed(sink, spark, batches=1)
    status = sink.erasure_status("never-written")
    assert status.gone and status.keys[0].deadline_ms is None
    assert sink.erase("never-written").tombstones == 0
    # Each later erasure is a batch of its own (numbered past the last one recorded).
    assert sink.erase("keep-0-0").tombstones == 1
    assert sink.erase(["keep-0-1", "keep-0-2"]).tombstones == 2
    assert set(state_of(sink)) == {"keep-0-3", *ERASED}


def test_another_engines_optimize_between_the_erasure_and_its_pass(spark, lake, clock_at):
    clock = clock_at(int(time.time() * 1000))
    path = lake / "log"
    lag = 600_000  # the erasure's pass waits for min.compaction.lag.ms: OPTIMIZE comes first
    # A window longer than the passes take: a Delta checkpoint written after OPTIMIZE's
    # file left the window but before the deleter ran would make it an orphan the sink
    # never deletes (another engine's naming, design.md §26), and the status say so.
    window = 12_000
    config = erasure_config(min_compaction_lag_ms=lag, file_delete_delay_ms=window)
    sink = CompactedStateSink(str(path), config=config, clock=clock)
    feed(sink, spark)
    sink.erase(ERASED)
    assert sink.log().where("key like 'erase-me-%' and value is not null").count() == 6

    DeltaTable(
        str(path)
    ).optimize.compact()  # delta-rs, no Spark: files rewritten, dataChange false

    status = sink.erasure_status(ERASED)
    assert all(not k.gone for k in status.keys)
    clock.advance(lag + 1_000)
    sink.clean()
    assert sink.log().where("key like 'erase-me-%' and value is not null").count() == 0
    settle(sink, clock, window_ms=window)
    final = sink.erasure_status(ERASED)
    assert final.gone, [p.as_dict() for k in final.keys for p in k.places]
    for key in ERASED:
        assert bytes_naming(path, key) == []


def test_an_erasure_mark_makes_its_partition_cleanable_whatever_the_ratio():
    from sinks.cleaner.log_to_clean import LogToClean, why_not_cleanable

    def partition(**changes) -> LogToClean:
        fields = dict(
            log_path="log",
            partition=0,
            first_dirty_offset=10,
            first_uncleanable_offset=20,
            clean_bytes=1_000,
            cleanable_bytes=10,
        )
        fields.update(changes)
        return LogToClean(**fields)

    def because(log: LogToClean) -> str | None:
        return log.cleanable_because(
            now_ms=0, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=2**63 - 1
        )

    assert because(partition()) is None
    assert because(partition(erasure_offset=15)) == "erasure"
    assert because(partition(erasure_offset=20)) == "erasure"
    assert because(partition(erasure_offset=10)) is None  # cleaned past it already
    waiting = partition(erasure_offset=25)  # its tombstones still inside min.compaction.lag.ms
    assert because(waiting) is None
    assert "erasure below offset 25 waits" in why_not_cleanable(
        waiting, erasure_config(min_compaction_lag_ms=60_000), now_ms=0
    )


def test_on_a_log_ordered_by_a_sequence_column_the_tombstone_carries_the_latest_sequence(
    spark, lake, clock_at
):
    sink = CompactedStateSink(
        str(lake / "log"),
        config=erasure_config(),
        sequence_column="seq",
        clock=clock_at(int(time.time() * 1000)),
    )
    schema = "key string, value string, partition int, seq long"
    arrow_append(sink, [("a", "newest", 0, 5), ("a", "older", 0, 3), ("b", "b", 0, 1)], schema, 0)
    assert state_of(sink) == {"a": "newest", "b": "b"}
    assert sink.erase("a").tombstones == 1
    assert state_of(sink) == {"b": "b"}
    (tombstone,) = sink.log().where("key = 'a' and value is null").collect()
    assert tombstone["seq"] == 5


def test_a_tombstone_is_needed_where_the_latest_record_holds_a_value_or_is_an_uncovered_delete():
    import pyarrow as pa

    from sinks.erasure.tombstones import _tombstones_needed

    records = pa.table(
        {
            "key": ["live", "live", "erased", "deleted", "deleted"],
            "partition": pa.array([0, 0, 0, 1, 1], pa.int32()),
            "offset": pa.array([0, 1, 2, 0, 3], pa.int64()),
            "value": ["a", "b", None, "c", None],
        }
    )
    marks = {0: 3, 1: 2}  # p0's erasure covers "erased" (offset 2); p1's covers offset 0 only
    needed = _tombstones_needed(records, ["key"], None, marks)
    assert sorted((r["key"], r["partition"]) for r in needed.to_pylist()) == [
        ("deleted", 1),  # a plain delete at offset 3, above the mark: the batch names it
        ("live", 0),
    ]
    assert _tombstones_needed(records, ["key"], None, {0: 3, 1: 4}).column("key").to_pylist() == [
        "live"
    ]
