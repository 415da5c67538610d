"""``readChangeFeed``: the log read as Delta's Change Data Feed, its before-images surviving passes.

A downstream aggregate (sum and count of live values) kept from the feed alone, retracting
each pre-image and delete, equals the aggregate of ``state()`` after every read, over a
seeded random workload with passes between reads; a stream with a registered consumer
reads each change once across restarts; a read past the feed's retention is refused by
name (design.md §57).
"""

from __future__ import annotations

import random
import time

import pytest

from sinks import CleanerConfig, CompactedStateSink, read_state
from streaming.consumers.datasource import register

NEVER = CleanerConfig(min_cleanable_dirty_ratio=1.0)  # passes run only when the test asks
KEYS = 12


def random_batch(spark, rng: random.Random, n: int = 10):
    """Upserts and tombstones of a few keys, a key twice now and then, a value repeated."""
    rows = []
    for _ in range(n):
        k = rng.randrange(KEYS)
        value = None if rng.random() < 0.2 else rng.randrange(4)  # small values repeat
        rows.append((f"k{k}", value, k % 2))
    return spark.createDataFrame(rows, "key string, value int, partition int")


def feed(spark, path: str, **options):
    reader = spark.read.format("compacted-state").option("readChangeFeed", "true")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load(path)


def apply(aggregate: dict[str, int], rows) -> None:
    """Retract pre-images and deletes, add inserts and post-images."""
    for r in rows:
        sign = 1 if r["_change_type"] in ("insert", "update_postimage") else -1
        aggregate["sum"] += sign * r["value"]
        aggregate["count"] += sign


def state_aggregate(sink) -> dict[str, int]:
    values = read_state(sink.path).column("value").to_pylist()
    return {"sum": sum(values), "count": len(values)}


def test_an_aggregate_kept_from_the_feed_equals_the_states(spark, tmp_path):
    register(spark)
    path = str(tmp_path / "log")
    sink = CompactedStateSink(path, config=NEVER)
    rng = random.Random(65)
    aggregate = {"sum": 0, "count": 0}
    read_through = -1
    for batch_id in range(5):
        sink(random_batch(spark, rng), batch_id)
        if batch_id % 2:
            sink.clean(force=True)  # cleans away the before-images of later records
            sink(random_batch(spark, rng), 100 + batch_id)
        latest = sink.log_table.snapshot().version
        rows = feed(spark, path, startingVersion=read_through + 1, endingVersion=latest).collect()
        rows = sorted(rows, key=lambda r: (r._commit_version, r.offset))
        apply(aggregate, [r.asDict() for r in rows])
        assert aggregate == state_aggregate(sink), batch_id
        assert all(r._commit_version > read_through for r in rows)
        read_through = latest


@pytest.mark.both_sessions
def test_same_value_update_and_unknown_tombstone(spark, tmp_path):
    register(spark)
    path = str(tmp_path / "log")
    sink = CompactedStateSink(path, config=NEVER)
    rows = [("a", 1, 0), ("b", None, 0)]
    sink(spark.createDataFrame(rows, "key string, value int, partition int"), 0)
    sink(spark.createDataFrame([("a", 1, 0)], "key string, value int, partition int"), 1)
    sink.clean(force=True)
    sink(spark.createDataFrame([("a", None, 0)], "key string, value int, partition int"), 2)
    changes = [
        (r._change_type, r.key, r.value, r.offset)
        for r in feed(spark, path, startingVersion=0)
        .orderBy("_commit_version", "offset", "_change_type")
        .collect()
    ]
    assert changes == [
        ("insert", "a", 1, 0),  # b's tombstone: b was not live, nothing
        ("update_preimage", "a", 1, 0),  # the same value is still an update
        ("update_postimage", "a", 1, 2),
        ("delete", "a", 1, 2),  # the deleted record's image, read after a pass removed none
    ]


def test_a_stream_reads_each_change_once_across_restarts(spark, tmp_path):
    register(spark)
    path, checkpoint = str(tmp_path / "log"), str(tmp_path / "chk")
    sink = CompactedStateSink(path, config=NEVER)
    rng = random.Random(7)
    sink(random_batch(spark, rng), 0)
    seen: list[dict] = []

    def run() -> None:
        query = (
            spark.readStream.format("compacted-state")
            .option("readChangeFeed", "true")
            .option("consumer.id", "aggregates")
            .load(path)
            .writeStream.foreachBatch(lambda df, _: seen.extend(r.asDict() for r in df.collect()))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    run()  # the state at the version it started from, as inserts
    assert {r["_change_type"] for r in seen} == {"insert"}
    for batch_id in (1, 2):
        sink(random_batch(spark, rng), batch_id)
    sink.clean(force=True)
    sink(random_batch(spark, rng), 3)
    run()
    aggregate = {"sum": 0, "count": 0}
    apply(aggregate, seen)
    assert aggregate == state_aggregate(sink)
    versions = sorted({r["_commit_version"] for r in seen})
    assert len(versions) == 4  # the starting state, then three appends, each once


def test_a_read_past_the_retention_is_refused_by_name(spark, tmp_path):
    register(spark)
    path = str(tmp_path / "log")
    window = CleanerConfig(min_cleanable_dirty_ratio=1.0, file_delete_delay_ms=1_000)
    sink = CompactedStateSink(path, config=window)
    schema = "key string, value int, partition int"
    sink(spark.createDataFrame([("a", 1, 0)], schema), 0)
    checkpoint = str(tmp_path / "chk")

    def run():
        query = (
            spark.readStream.format("compacted-state")
            .option("readChangeFeed", "true")
            .option("consumer.id", "slow")
            .load(path)
            .writeStream.foreachBatch(lambda df, _: df.collect())
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
        except Exception as failed:  # the query's failure is the answer
            return failed
        return query.exception()

    assert run() is None  # the state as inserts
    time.sleep(1.5)  # the consumer lags past the window
    sink(spark.createDataFrame([("a", 2, 0)], schema), 1)
    with pytest.raises(Exception, match="ChangeDataExpiredError") as caught:
        feed(spark, path, startingVersion=0).collect()
    assert "file.delete.delay.ms" in str(caught.value)
    lagged = run()  # refused by name, not given net changes
    assert lagged is not None and "ChangeDataExpiredError" in str(lagged)
