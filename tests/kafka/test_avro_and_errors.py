"""Avro values in Confluent's wire format through the broker; errors that write nothing."""

from __future__ import annotations

import json
import time

import pytest
from kafka_kit import RegistryOver, kafka_options, run_available, sink_records

from sinks import CompactedStateSink
from streaming.decoding.avro import ConfluentAvroDecoder, DecodingHook
from streaming.decoding.schema_registry import SchemaStore
from streaming.inputs.local_kafka import free_port

pytestmark = pytest.mark.kafka

USER_V1 = {
    "type": "record",
    "name": "User",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
USER_V2 = {
    **USER_V1,
    "fields": [*USER_V1["fields"], {"name": "email", "type": ["null", "string"], "default": None}],
}


def test_avro_values_of_two_schema_versions_and_tombstones_decode_to_the_state(
    spark, kafka, tmp_path
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = kafka.create_topic(kafka.topic_name("avro"), 4)
    client = SchemaRegistryClient.new_client({"url": f"mock://{topic}"})
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(USER_V1))
    v2 = AvroSerializer(client, json.dumps(USER_V2))
    registry = RegistryOver(client)
    try:
        sink = CompactedStateSink(str(tmp_path / "users"), key_columns=("key",))
        hook = DecodingHook(
            sink,
            ConfluentAvroDecoder(SchemaStore(registry_url=registry.url), subject=f"{topic}-value"),
        )
        options = kafka_options(kafka, topic)

        first = [
            (None, str(i).encode(), v1({"id": i, "name": f"n{i}"}, context)) for i in range(40)
        ]
        kafka.produce(topic, first)
        run_available(spark, options, hook, tmp_path / "chk")
        assert sink.log().schema["value"].dataType.fieldNames() == ["id", "name"]

        later = [
            *[
                (None, str(i).encode(), v2({"id": i, "name": f"m{i}", "email": f"{i}@x"}, context))
                for i in range(0, 40, 2)
            ],
            *[(None, str(i).encode(), None) for i in range(1, 40, 4)],  # tombstones
            *[
                (None, str(i).encode(), v1({"id": i, "name": f"o{i}"}, context))
                for i in range(3, 40, 8)
            ],
        ]
        kafka.produce(topic, later)
        run_available(spark, options, hook, tmp_path / "chk")
    finally:
        registry.close()

    expected: dict[bytes, dict | None] = {}
    for i in range(40):
        expected[str(i).encode()] = {"id": i, "name": f"n{i}", "email": None}
    for i in range(0, 40, 2):
        expected[str(i).encode()] = {"id": i, "name": f"m{i}", "email": f"{i}@x"}
    for i in range(1, 40, 4):
        expected[str(i).encode()] = None
    for i in range(3, 40, 8):
        expected[str(i).encode()] = {"id": i, "name": f"o{i}", "email": None}
    state = {bytes(r["key"]): r["value"].asDict() for r in sink.state().collect()}
    assert state == {k: v for k, v in expected.items() if v is not None}
    assert sink.log().schema["value"].dataType.fieldNames() == ["id", "name", "email"]


def failure(spark, options, hook, checkpoint) -> str:
    with pytest.raises(Exception) as failed:
        run_available(spark, options, hook, checkpoint)
    return str(failed.value)


def test_a_null_key_fails_the_batch_naming_it_and_writes_nothing(spark, kafka, tmp_path) -> None:
    topic = kafka.create_topic(kafka.topic_name("nullkey"), 2)
    rows = [(None, f"k{i}".encode(), b"v") for i in range(20)] + [(0, None, b"x")] * 3
    kafka.produce(topic, rows)
    sink = CompactedStateSink(str(tmp_path / "log"), key_columns=("key",))
    message = failure(spark, kafka_options(kafka, topic), sink, tmp_path / "chk")
    print(f"\nnull key: {message[:400]}")
    assert "3 of 23 rows have a null key" in message
    assert sink.log_table.snapshot() is None  # nothing written


def test_a_deleted_topic_fails_the_query_naming_it_and_writes_nothing(
    spark, kafka, tmp_path
) -> None:
    topic = kafka.create_topic(kafka.topic_name("deleted"), 2)
    sent = kafka.produce(topic, [(None, f"k{i}".encode(), b"v") for i in range(30)])
    sink = CompactedStateSink(str(tmp_path / "log"), key_columns=("key",))
    options = kafka_options(kafka, topic)
    run_available(spark, options, sink, tmp_path / "chk")
    assert sink_records(sink) == sent  # 30 distinct keys: a pass keeps them all
    kafka.delete_topic(topic)
    time.sleep(1)
    message = failure(spark, options, sink, tmp_path / "chk")
    print(f"\ndeleted topic: {message[:600]}")
    assert topic in message and "UnknownTopicOrPartitionException" in message
    assert sink_records(sink) == sent


def test_an_unreachable_broker_fails_the_query_and_writes_nothing(spark, tmp_path) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    options = {
        "kafka.bootstrap.servers": nowhere,
        "subscribe": "users",
        "startingOffsets": "earliest",
        "kafka.default.api.timeout.ms": "5000",
        "kafka.request.timeout.ms": "3000",
        "fetchOffset.numRetries": "1",
    }
    sink = CompactedStateSink(str(tmp_path / "log"), key_columns=("key",))
    began = time.monotonic()
    message = failure(spark, options, sink, tmp_path / "chk")
    print(f"\nunreachable broker ({time.monotonic() - began:.0f} s): {message[:600]}")
    assert "TimeoutException" in message
    assert sink.log_table.snapshot() is None
