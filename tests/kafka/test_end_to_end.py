"""Through the front door: a confluent-kafka producer, a real broker, Spark's Kafka source,
``foreachBatch(CompactedStateSink)``."""

from __future__ import annotations

import random

import pytest
from kafka_kit import kafka_options, replay, run_available, sink_records

from sinks import CleanerConfig, CompactedStateSink

pytestmark = pytest.mark.kafka


def workload(rng: random.Random, records: int, keys: int, tombstones: float):
    for i in range(records):
        key = f"user-{rng.randrange(keys)}".encode()
        yield None, key, None if rng.random() < tombstones else f"v{i}".encode()


def test_a_topic_streamed_into_the_sink_is_its_state_with_kafkas_offsets(
    spark, kafka, tmp_path
) -> None:
    topic = kafka.create_topic(kafka.topic_name("users"), 4)
    produced = kafka.produce(topic, workload(random.Random(7), 3_000, 400, 0.1))
    assert {r.partition for r in produced} == {0, 1, 2, 3}
    # No pass while streaming (a ratio is never above 1): the log is every record Kafka holds.
    sink = CompactedStateSink(
        str(tmp_path / "users"),
        key_columns=("key",),
        config=CleanerConfig(min_cleanable_dirty_ratio=1.0),
    )
    options = kafka_options(kafka, topic, maxOffsetsPerTrigger="700")
    run_available(spark, options, sink, tmp_path / "chk")

    assert sink_records(sink) == produced  # Kafka's partitions and offsets, key and value
    assert {"topic", "timestamp", "timestampType"} <= set(sink.log().columns)  # payload columns
    state = {bytes(r["key"]): bytes(r["value"]) for r in sink.state().collect()}
    assert state == replay(produced)

    # A pass keeps a subset of Kafka's records, at their offsets, and the same state.
    assert sink.clean(force=True) is not None
    kept = sink_records(sink)
    assert set(kept) <= set(produced)
    assert len(kept) < len(produced)
    assert {bytes(r["key"]): bytes(r["value"]) for r in sink.state().collect()} == state

    # More records later: the query resumes from its checkpoint, and only the new ones arrive.
    more = kafka.produce(topic, workload(random.Random(8), 500, 400, 0.1))
    run_available(spark, options, sink, tmp_path / "chk")
    state = {bytes(r["key"]): bytes(r["value"]) for r in sink.state().collect()}
    assert state == replay(produced + more)
    assert set(sink_records(sink)) == set(kept) | set(more)
