"""The demo from a real Kafka broker: ``make demo-kafka``.

Starts a local Apache Kafka broker (KRaft, on 127.0.0.1, from the jars `make jars` fetched;
`streaming.inputs.local_kafka`, the tests' launcher and config), creates a 4-partition compacted
topic, produces keyed updates and tombstones with confluent-kafka (an idempotent producer:
a retried send is never written twice nor out of order), streams the topic with Spark's
Kafka source into ``foreachBatch(CompactedStateSink)``, checks ``state()`` against what
the topic holds, and stops the broker. Needs the Kafka venv (pyspark 4.2: Spark's Kafka
source is not published for 4.3).

The check is Kafka's own (``LogCompactionTester``): consume the topic from its start and
fold it into key -> the value at the highest offset, a tombstone removing the key. The sink
keeps the topic's offset order, so that fold, not the order of production, is what its
state must equal.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sinks import CleanerConfig, CompactedStateSink, NotACompactedLogError  # noqa: E402
from streaming.inputs.local_kafka import LocalKafka, spark_jars  # noqa: E402
from streaming.jobs.demo import prepare_lake  # noqa: E402
from streaming.jobs.session import local_session  # noqa: E402
from streaming.status.progress import ProgressHook  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", default="lake-demo-kafka", help="lake directory (wiped first)")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--tombstone-rate", type=float, default=0.02)
    args = parser.parse_args()

    connector = ROOT / ".jars" / f"spark-kafka-{pyspark.__version__}"
    jars = spark_jars(connector)
    if not any("spark-sql-kafka" in j for j in jars):
        print(
            f"no Spark Kafka source for pyspark {pyspark.__version__} in {connector}: "
            "run `make demo-kafka` (it fetches the jars and uses the pyspark 4.2 venv)"
        )
        return 2
    try:
        prepare_lake(Path(args.lake))  # wipes only an earlier demo's lake (streaming.jobs.demo)
    except NotACompactedLogError as e:
        print(f"kafka_demo: {e}")
        return 2
    work = Path(tempfile.mkdtemp(prefix="kafka-demo-"))
    broker = LocalKafka(
        ROOT / ".jars" / "kafka",
        work,
        ROOT / "tests" / "kafka" / "server.properties",
        ROOT / "tests" / "kafka" / "log4j2.properties",
    )
    try:
        broker.start()
        print(f"Kafka broker on {broker.bootstrap}: started in {broker.start_seconds:.1f} s")
        return run(broker.bootstrap, jars, args)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
        print("Kafka broker stopped")


def run(bootstrap: str, jars: list[str], args: argparse.Namespace) -> int:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = "users"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"cleanup.policy": "compact"}
    new = NewTopic(topic, num_partitions=args.partitions, replication_factor=1, config=config)
    admin.create_topics([new])[topic].result(timeout=60)

    rng = random.Random(42)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True, "acks": "all"}
    )
    produced: dict[bytes, bytes | None] = {}
    began = time.monotonic()
    for n in range(args.records):
        key = f"user-{rng.randrange(args.keys)}".encode()
        value = None if rng.random() < args.tombstone_rate else f'{{"n": {n}}}'.encode()
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
        produced[key] = value
    if producer.flush(60):
        print("the producer did not deliver every record within 60 s")
        return 1
    print(f"produced {args.records} records ({args.keys} keys) in {time.monotonic() - began:.1f} s")

    spark = local_session(
        "compacted-sink-kafka-demo", "local[2]", conf={"spark.jars": ",".join(jars)}
    )
    sink = CompactedStateSink(
        f"{args.lake}/users",
        key_columns=("key",),
        config=CleanerConfig(min_cleanable_dirty_ratio=0.5),
    )
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "5000")
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(ProgressHook(sink))
        .option("checkpointLocation", f"{args.lake}/_chk/users")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    sink.close()
    state = {bytes(r["key"]): bytes(r["value"]) for r in sink.state().collect()}
    records = sink.log().count()
    spark.stop()
    held = topic_state(bootstrap, topic)
    ok = state == held
    print(
        f"state: {len(state)} live keys from {args.records} records; the log holds {records}; "
        f"{'matches' if ok else 'DOES NOT MATCH'} the topic read from its start "
        f"({len(held)} live keys)"
    )
    if not ok:
        print(difference(state, held))
    live = {k: v for k, v in produced.items() if v is not None}
    if held != live:  # not the sink's doing: the topic itself holds another order
        print(
            f"note: the topic's last values differ from the order of production for "
            f"{sum(held.get(k) != live.get(k) for k in held.keys() | live.keys())} keys"
        )
    return 0 if ok else 1


def topic_state(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    """What ``topic`` holds, folded as Kafka's ``LogCompactionTester`` folds it: every
    partition read from its start to its high watermark, key -> the value at the highest
    offset, a tombstone (null value) removing the key."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kafka-demo-check-{time.time_ns()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        ends = {}
        for partition in metadata.partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            ends[partition] = high
        pending = {p for p, high in ends.items() if high > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        last: dict[bytes, bytes | None] = {}
        deadline = time.monotonic() + 120
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} back: partitions {sorted(pending)} unfinished")
            for message in consumer.consume(1000, timeout=1.0):
                if message.error():
                    raise RuntimeError(f"reading {topic} back: {message.error()}")
                last[message.key()] = message.value()
                if message.offset() + 1 >= ends[message.partition()]:
                    pending.discard(message.partition())
    finally:
        consumer.close()
    return {k: v for k, v in last.items() if v is not None}


def difference(state: dict[bytes, bytes], held: dict[bytes, bytes]) -> str:
    """A few keys where the sink's state and the topic differ, for the failure's line."""
    keys = sorted(k for k in state.keys() | held.keys() if state.get(k) != held.get(k))
    shown = ", ".join(f"{k!r}: sink {state.get(k)!r}, topic {held.get(k)!r}" for k in keys[:5])
    return f"{len(keys)} keys differ, e.g. {shown}"


if __name__ == "__main__":
    sys.exit(main())
