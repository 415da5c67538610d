"""What the ``kafka`` tests do with the broker and the sink (the ``kafka`` fixture is a `KafkaKit`).

Topics, a producer that records where each record landed, a consumer that reads a topic
whole, the broker's cleaner-offset checkpoint, and a Kafka stream run into a sink.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from streaming.inputs.local_kafka import LocalKafka

SUMMARY: list[str] = []
"""Lines the kafka tests want in the run's summary (broker start time, judge workloads)."""


@dataclass(frozen=True)
class Produced:
    """One record as the broker acknowledged it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class KafkaKit:
    def __init__(self, broker: LocalKafka) -> None:
        from confluent_kafka.admin import AdminClient

        self.broker = broker
        self.bootstrap = broker.bootstrap
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})

    def topic_name(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    def create_topic(self, name: str, partitions: int, config: dict[str, str] | None = None) -> str:
        from confluent_kafka.admin import NewTopic

        topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        self.admin.create_topics([topic], operation_timeout=30)[name].result(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # metadata reaches the broker's cache
            found = self.admin.list_topics(name, timeout=10).topics.get(name)
            if found is not None and found.error is None and len(found.partitions) == partitions:
                return name
            time.sleep(0.1)
        raise AssertionError(f"topic {name} did not appear")

    def delete_topic(self, name: str) -> None:
        self.admin.delete_topics([name], operation_timeout=30)[name].result(timeout=60)

    def producer(self, **config: object):
        from confluent_kafka import Producer

        # Idempotent: a retried request (a new topic's leader not known yet, a broker slow under
        # load) never reorders a partition's records, which the tests compare offset by offset.
        settings = {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True}
        return Producer({**settings, **config})

    def produce(
        self,
        topic: str,
        records: Iterable[tuple[int | None, bytes | None, bytes | None]],
        producer=None,
    ) -> list[Produced]:
        """Send ``(partition or None, key, value)`` in order; the acknowledged records."""
        producer = producer or self.producer()
        acked: list[Produced] = []
        errors: list[str] = []

        def on_delivery(err, msg) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                acked.append(Produced(msg.partition(), msg.offset(), msg.key(), msg.value()))

        for partition, key, value in records:
            kwargs = {} if partition is None else {"partition": partition}
            while True:
                try:
                    producer.produce(topic, value=value, key=key, on_delivery=on_delivery, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        assert producer.flush(60) == 0, "records not delivered within 60 s"
        assert not errors, errors
        return sorted(acked, key=lambda r: (r.partition, r.offset))

    def consume_all(self, topic: str, **config: object) -> list[Produced]:
        """Every record the topic holds now, from each partition's start to its end."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        partitions = self.admin.list_topics(topic, timeout=10).topics[topic].partitions
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"read-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                **config,
            }
        )
        try:
            pending = set()
            assignment = []
            for p in partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if high > low:
                    pending.add(p)
                assignment.append(TopicPartition(topic, p, OFFSET_BEGINNING))
            consumer.assign(assignment)
            found: list[Produced] = []
            deadline = time.monotonic() + 60
            while pending and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == -191:  # KafkaError._PARTITION_EOF
                        pending.discard(msg.partition())
                        continue
                    raise AssertionError(f"consuming {topic}: {msg.error()}")
                found.append(Produced(msg.partition(), msg.offset(), msg.key(), msg.value()))
            assert not pending, f"partitions {sorted(pending)} of {topic} not read to the end"
            return sorted(found, key=lambda r: (r.partition, r.offset))
        finally:
            consumer.close()

    def cleaner_checkpoint(self, topic: str) -> dict[int, int]:
        """The broker's ``cleaner-offset-checkpoint``: where its cleaner ended, by partition."""
        path = self.broker.log_dir / "cleaner-offset-checkpoint"
        if not path.exists():
            return {}
        lines = path.read_text().splitlines()[2:]  # version, count, then "topic partition offset"
        found = {}
        for line in lines:
            name, partition, offset = line.split()
            if name == topic:
                found[int(partition)] = int(offset)
        return found


def replay(records: Iterable[Produced]) -> dict[bytes, bytes]:
    """What a consumer folding the records in offset order holds: key -> latest non-null value."""
    state: dict[bytes, bytes | None] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        state[r.key] = r.value
    return {k: v for k, v in state.items() if v is not None}


def kafka_options(kafka: KafkaKit, topic: str, **extra: str) -> dict[str, str]:
    """The options a job gives ``spark.readStream.format("kafka")`` (docs/kafka.md)."""
    return {
        "kafka.bootstrap.servers": kafka.bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        **extra,
    }


def run_available(spark: SparkSession, options: dict[str, str], hook, checkpoint: Path) -> None:
    """One ``availableNow`` run of a Kafka stream into ``hook``, from ``checkpoint``."""
    stream = spark.readStream.format("kafka").options(**options).load()
    query = (
        stream.writeStream.foreachBatch(hook)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    if query.isActive:
        query.stop()
        raise AssertionError("the Kafka stream did not finish within 600 s")
    if query.exception() is not None:
        raise query.exception()


def sink_records(sink) -> list[Produced]:
    rows = sink.log().select("partition", "offset", "key", "value").collect()
    return sorted(
        (
            Produced(
                r["partition"],
                r["offset"],
                None if r["key"] is None else bytes(r["key"]),
                None if r["value"] is None else bytes(r["value"]),
            )
            for r in rows
        ),
        key=lambda r: (r.partition, r.offset),
    )


class RegistryOver:
    """A schema registry client (confluent-kafka's ``mock://`` one) answered over HTTP on
    loopback, for `streaming.decoding.schema_registry.SchemaStore`: the two paths it reads."""

    def __init__(self, client) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        def answer(path: str) -> dict | None:
            parts = path.strip("/").split("/")
            try:
                if parts[:2] == ["schemas", "ids"]:
                    return {"schema": client.get_schema(int(parts[2])).schema_str}
                if parts[0] == "subjects" and parts[2:] == ["versions", "latest"]:
                    latest = client.get_latest_version(parts[1])
                    return {"id": latest.schema_id, "schema": latest.schema.schema_str}
            except Exception:  # the mock's own "not found"
                return None
            return None

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = answer(self.path)
                self.send_response(200 if body else 404)
                self.end_headers()
                self.wfile.write(json.dumps(body or {"error_code": 40403}).encode())

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
