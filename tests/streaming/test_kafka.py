"""Kafka-shaped input routed by topic: each topic to its own log, exactly once per log."""

from __future__ import annotations

import datetime as dt

import pytest

from sinks import BadInputError, CompactedStateSink
from streaming.inputs.kafka import KAFKA_SCHEMA, TopicRouter
from streaming.status.progress import ProgressHook


def kafka_rows(topic: str, partition: int, start: int, values: list[str | None]) -> list[tuple]:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [
        (
            f"k{i % 3}".encode(),
            None if v is None else v.encode(),
            topic,
            partition,
            start + i,
            when,
            0,
        )
        for i, v in enumerate(values)
    ]


def test_each_topic_lands_in_its_own_log_and_a_replayed_batch_writes_nothing(spark, lake) -> None:
    users = CompactedStateSink(str(lake / "users"), key_columns=("key",))
    orders = CompactedStateSink(str(lake / "orders"), key_columns=("key",))
    lines: list[str] = []
    router = TopicRouter(
        {
            "users": ProgressHook(users, out=lines.append, label="[users] "),
            "orders": ProgressHook(orders, out=lines.append, label="[orders] "),
        }
    )
    rows = kafka_rows("users", 0, 10, ["a", "b", "c", None]) + kafka_rows("orders", 1, 0, ["x"])
    batch = spark.createDataFrame(rows, KAFKA_SCHEMA)

    router(batch, 0)
    router(batch, 0)  # Spark may deliver a batch twice

    assert sorted((bytes(r["key"]), bytes(r["value"])) for r in users.state().collect()) == [
        (b"k1", b"b"),
        (b"k2", b"c"),
    ]
    # Kafka offsets kept; the hook's pass dropped k0's record 10, superseded by its tombstone 13.
    assert [r["offset"] for r in users.log().orderBy("offset").collect()] == [11, 12, 13]
    assert [bytes(r["value"]) for r in orders.state().collect()] == [b"x"]
    assert "topic" not in users.log().columns
    assert sum("already committed" in line for line in lines) == 2
    assert any(line.startswith("[users] batch 0: appended 4 records") for line in lines)


def test_a_topic_without_a_log_fails_the_batch(spark, lake) -> None:
    users = CompactedStateSink(str(lake / "users"), key_columns=("key",))
    rows = kafka_rows("users", 0, 0, ["a"]) + kafka_rows("payments", 0, 0, ["p", "q"])
    with pytest.raises(BadInputError, match="2 of topic 'payments'"):
        TopicRouter({"users": users})(spark.createDataFrame(rows, KAFKA_SCHEMA), 0)
    assert users.log_table.snapshot() is None
