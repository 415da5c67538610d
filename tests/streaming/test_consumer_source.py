"""``readStream.format("compacted-state")``: downstream queries tail the log as Kafka consumers.

Real streaming queries (memory sink) read a log while the sink appends, passes run
and ``delete_records`` moves the log start; the tests check what a consumer sees.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from checkpoints.consumer_offsets import ConsumerOffsets
from sinks import CleanerConfig, CompactedStateSink
from streaming.cli import main as cli
from streaming.consumers.consumer_groups import consumer_report, delete_consumer, reset_offsets
from streaming.consumers.consumer_position import DataLossError
from streaming.consumers.datasource import CompactedStateDataSource, register
from streaming.status.gauges import log_status
from streaming.status.status_render import render_table

NEVER = CleanerConfig(min_cleanable_dirty_ratio=1.0)  # passes run only when the test asks


def batch(spark, round_: int, n: int = 12):
    """Round ``round_``'s records: 13 keys, each in one partition, a tombstone now and then."""
    rows = []
    for j in range(n):
        k = (round_ * 7 + j) % 13
        value = None if (round_ + j) % 6 == 5 else f"v{round_}-{j}"
        rows.append((f"k{k}", value, k % 2))
    return spark.createDataFrame(rows, "key string, value string, partition int")


def appended(sink, ends: dict[int, int]) -> set[tuple]:
    """The records the log holds at or above ``ends`` (what the last append added)."""
    rows = sink.log().collect()
    return {
        (r.partition, r.offset, r.key, r.value)
        for r in rows
        if r.offset >= ends.get(r.partition, 0)
    }


def collector(directory: str):
    """A foreachBatch function that writes each batch's rows, in the order read, to a file
    named by batch id (a re-run batch overwrites its file: what was seen, exactly once)."""

    def collect(batch_df, batch_id: int) -> None:
        import json
        import os

        rows = [[r.partition, r.offset, r.key, r.value] for r in batch_df.collect()]
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"batch-{batch_id:06d}.json"), "w") as out:
            json.dump(rows, out)

    return collect


def start_reader(spark, path, checkpoint, seen_dir, **options):
    reader = spark.readStream.format("compacted-state")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load(path)
        .writeStream.foreachBatch(collector(str(seen_dir)))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def seen(seen_dir) -> list[tuple]:
    """Every row the reader's query delivered, batch by batch, in the order read."""
    rows: list[tuple] = []
    for name in sorted(os.listdir(seen_dir)) if os.path.isdir(seen_dir) else []:
        with open(os.path.join(seen_dir, name)) as f:
            rows += [tuple(r) for r in json.load(f)]
    return rows


def assert_offset_order(rows: list[tuple]) -> None:
    for partition in {r[0] for r in rows}:
        offsets = [r[1] for r in rows if r[0] == partition]
        assert offsets == sorted(offsets), f"partition {partition} out of offset order"


ROUNDS = 10
"""Appends, each followed by a pass, while the reader tails the log. Every round repeats the
same interleaving (append, read, pass); what differs is the reader's restart (round 5) and the
deletion below what it read (round 7), both with passes before and after them."""


def test_a_query_tails_the_log_through_10_passes_a_deletion_and_a_restart(spark, lake) -> None:
    register(spark)
    path, checkpoint = str(lake / "users"), lake / "_chk_reader"
    sink = CompactedStateSink(path, config=NEVER)
    sink(batch(spark, 0), 0)
    expected = appended(sink, {})
    seen_dir = lake / "seen"
    query = start_reader(spark, path, checkpoint, seen_dir, maxOffsetsPerTrigger="7")
    passes = 0
    try:
        for round_ in range(1, ROUNDS + 1):
            if round_ == 5:  # stop the reader; the next append waits for its restart
                query.processAllAvailable()
                query.stop()
            before = sink.log_table.snapshot().log_end_offsets()
            sink(batch(spark, round_), round_)
            expected |= appended(sink, before)
            if round_ == 5:
                query = start_reader(spark, path, checkpoint, seen_dir, maxOffsetsPerTrigger="7")
            query.processAllAvailable()
            if sink.clean(force=True) is not None:
                passes += 1
            if round_ == 7:  # a deletion below what the reader has read: no loss
                sink.delete_records(0, sink.log_table.snapshot().log_end_offset(0) - 2)
        query.processAllAvailable()
    finally:
        query.stop()
    rows = seen(seen_dir)
    assert passes == ROUNDS
    assert len(rows) == len(set(rows)), "a record was read twice"
    assert set(rows) == expected, "a record was missed or altered"
    assert_offset_order(rows)
    assert query.exception() is None


def state_of(rows: list[tuple]) -> dict[str, str]:
    """A table rebuilt from records in the order read: latest per key, tombstones delete."""
    table: dict[str, str] = {}
    for _, _, key, value in rows:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


@pytest.mark.both_sessions
def test_bootstrap_from_earliest_gives_the_state_then_the_tail(spark, lake) -> None:
    register(spark)
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=NEVER)
    for round_ in range(4):
        sink(batch(spark, round_), round_)
        sink.clean(force=True)
    sink(batch(spark, 4), 4)  # a dirty tail after the compacted log
    state = {r.key: r.value for r in sink.state().collect()}
    seen_dir = lake / "seen"
    query = start_reader(spark, path, lake / "_chk", seen_dir, startingOffsets="earliest")
    try:
        query.processAllAvailable()
        bootstrap = seen(seen_dir)
        assert state_of(bootstrap) == state
        before = sink.log_table.snapshot().log_end_offsets()
        sink(batch(spark, 5), 5)
        tail = appended(sink, before)
        sink.clean(force=True)
        query.processAllAvailable()
        rows = seen(seen_dir)
    finally:
        query.stop()
    assert rows[: len(bootstrap)] == bootstrap
    assert set(rows[len(bootstrap) :]) == tail and len(rows) == len(bootstrap) + len(tail)
    assert_offset_order(rows)
    assert state_of(rows) == {r.key: r.value for r in sink.state().collect()}


def test_a_batch_read_between_offsets_and_data_loss(spark, lake) -> None:
    register(spark)
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=NEVER)
    sink(batch(spark, 0, n=20), 0)
    log = {(r.partition, r.offset): r.key for r in sink.log().collect()}
    read = (
        spark.read.format("compacted-state")
        .option("startingOffsets", '{"0": 2, "1": -2}')
        .option("endingOffsets", '{"0": 5, "1": -1}')
        .load(path)
    )
    assert "delete_horizon_ms" not in read.columns
    got = {(r.partition, r.offset): r.key for r in read.collect()}
    assert got == {k: v for k, v in log.items() if k[0] == 1 or 2 <= k[1] < 5}
    latest = spark.read.format("compacted-state").option("startingOffsets", "latest").load(path)
    assert latest.count() == 0

    sink.delete_records(0, 4)
    below = spark.read.format("compacted-state").option("startingOffsets", '{"0": 1, "1": 0}')
    with pytest.raises(Exception, match="lies below the log start offset 4"):
        below.load(path).collect()
    lenient = below.option("failOnDataLoss", "false").load(path)
    assert min(r.offset for r in lenient.collect() if r.partition == 0) >= 4
    assert DataLossError.__doc__.startswith("Raised when")


def test_starting_timestamp_starts_at_the_first_record_at_or_after_it(spark, lake, clock) -> None:
    register(spark)
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=NEVER, clock=clock)
    sink(batch(spark, 0), 0)
    clock.advance(60_000)
    cut = clock()
    before = sink.log_table.snapshot().log_end_offsets()
    sink(batch(spark, 1), 1)
    read = spark.read.format("compacted-state").option("startingTimestamp", str(cut)).load(path)
    assert {(r.partition, r.offset, r.key, r.value) for r in read.collect()} == appended(
        sink, before
    )


RETENTION_MS = 60_000  # delete.retention.ms of the lagging-consumer logs
STOPPED_MS = 2 * 3_600_000  # how long the consumer stays stopped (fake time)


def read_available(spark, path, checkpoint, seen_dir, **options) -> None:
    reader = spark.readStream.format("compacted-state")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load(path)
        .writeStream.foreachBatch(collector(str(seen_dir)))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None


def lagging_consumer(spark, lake, clock, name: str, **options) -> tuple[list[tuple], list]:
    """A consumer reads the log, stops; deletes arrive; it stays stopped for STOPPED_MS
    (longer than delete.retention.ms) while passes run; then it reads again.
    Returns the rows it read after the restart, and every pass's figures."""
    path, checkpoint, seen_dir = str(lake / name), lake / f"_chk_{name}", lake / f"seen_{name}"
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, delete_retention_ms=RETENTION_MS)
    sink = CompactedStateSink(path, config=config, clock=clock)
    passes: list = []
    sink.add_pass_listener(passes.append)
    rows = [(f"k{i}", f"v{i}", i % 2) for i in range(10)]
    sink(spark.createDataFrame(rows, "key string, value string, partition int"), 0)
    read_available(spark, path, checkpoint, seen_dir, **options)
    before = len(seen(seen_dir))

    deletes = [(f"k{i}", None, i % 2) for i in range(5)] + [("k5", "v5b", 1)]
    sink(spark.createDataFrame(deletes, "key string, value string, partition int"), 1)
    sink.clean(force=True)  # stamps the tombstones' delete horizon: now + delete.retention.ms
    clock.advance(STOPPED_MS)
    for batch_id in range(2, 5):  # the log goes on while the consumer is stopped
        more = [(f"k{i}", f"v{i}-{batch_id}", i % 2) for i in range(6, 10)]
        sink(spark.createDataFrame(more, "key string, value string, partition int"), batch_id)
        sink.clean(force=True)
    read_available(spark, path, checkpoint, seen_dir, **options)
    return seen(seen_dir)[before:], passes


def test_a_registered_consumer_stopped_past_delete_retention_sees_every_delete(
    spark, lake, clock, capsys
) -> None:
    register(spark)
    clock.now = int(time.time() * 1000)  # consumers commit with the wall clock
    rows, passes = lagging_consumer(spark, lake, clock, "registered", **{"consumer.id": "billing"})
    deleted = sorted(key for _, _, key, value in rows if value is None)
    assert deleted == ["k0", "k1", "k2", "k3", "k4"]
    held = [p.tombstones_held for p in passes if p.start_ms >= clock() - 1]
    assert max(held) == 5
    assert any("held 5 tombstones for consumers" in p.summary() for p in passes)
    # Trigger.AvailableNow commits the consumer's last batch as the query ends: it read
    # the deletes, so it holds none of them any more, and nothing is left to read.
    report = consumer_report(str(lake / "registered"), now=clock())
    assert [(r.consumer.consumer_id, r.tombstones_held) for r in report] == [("billing", 0)]
    assert report[0].line().startswith("billing: live, lag 0 (p0 0, p1 0)") and (
        "holds 0 tombstones" in report[0].line()
    )
    assert cli(["consumers", str(lake / "registered")]) == 0  # the same lines, from the CLI
    assert "billing: live, lag " in capsys.readouterr().out
    status = render_table([log_status(CompactedStateSink(str(lake / "registered"), clock=clock))])
    assert "consumer billing: live, lag " in status  # and in status

    # The tombstones it read are dropped by the next pass; a record appended later is
    # read, and committed, by the next availableNow run.
    path = str(lake / "registered")
    sink = CompactedStateSink(path, clock=clock)
    clock.advance(1)
    sink(spark.createDataFrame([("k9", "last", 1)], "key string, value string, partition int"), 5)
    read_after = sink.log_table.snapshot().log_end_offsets()
    billing = {"consumer.id": "billing"}
    read_available(spark, path, lake / "_chk_registered", lake / "seen_registered", **billing)
    stats = sink.clean(force=True)  # None when the append's own pass already dropped them
    assert stats is None or stats.tombstones_held == 0
    assert sink.log().where("value is null").count() == 0
    consumers = ConsumerOffsets(str(lake / "_consumer-offsets")).consumers(path, now_ms=clock())
    assert [c.consumer_id for c in consumers] == ["billing"] and not consumers[0].expired
    assert consumers[0].committed == read_after  # the last batch commits as the query ends
    assert consumer_report(path, now=clock())[0].lag == {0: 0, 1: 0}
    assert reset_offsets(path, "billing", "earliest") == {0: 0, 1: 0}
    assert delete_consumer(path, "billing") == 2
    assert consumer_report(path, now=clock()) == []


def test_an_unregistered_or_expired_consumer_may_miss_deletes(spark, lake, clock) -> None:
    register(spark)
    clock.now = int(time.time() * 1000)
    rows, passes = lagging_consumer(spark, lake, clock, "unregistered")
    assert [key for _, _, key, value in rows if value is None] == []
    assert all(p.tombstones_held == 0 for p in passes)

    expiring = {"consumer.id": "brief", "consumer.expiration.ms": str(STOPPED_MS // 2)}
    rows, passes = lagging_consumer(spark, lake, clock, "expired", **expiring)
    assert [key for _, _, key, value in rows if value is None] == []


def test_a_reader_asked_twice_for_its_start_gives_its_first_answer(spark, lake) -> None:
    """Spark may ask a stream reader for its initial offset more than once; with ``latest``
    an append between the two must not move the start of the first batch."""
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=NEVER)
    sink(batch(spark, 0), 0)
    source = CompactedStateDataSource({"path": path, "startingOffsets": "latest"})
    reader = source.streamReader(source.schema())
    first = reader.initialOffset()
    sink(batch(spark, 1), 1)
    assert reader.initialOffset() == first
    fresh = source.streamReader(source.schema()).initialOffset()
    assert fresh != first, "the append moved no log end offset: the test shows nothing"
