"""What Kafka delivers, stored exactly: a killed query, transactions, a compacted topic."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka_kit import Produced, kafka_options, replay, run_available, sink_records

from sinks import CleanerConfig, CompactedStateSink

pytestmark = pytest.mark.kafka

HERE = Path(__file__).resolve().parent
NO_PASS = CleanerConfig(min_cleanable_dirty_ratio=1.0)  # the log keeps every record


def keyed(rng: random.Random, records: int, keys: int, tombstones: float, tag: str):
    for i in range(records):
        key = f"user-{rng.randrange(keys)}".encode()
        yield None, key, None if rng.random() < tombstones else f"{tag}{i}".encode()


def state_of(sink) -> dict[bytes, bytes]:
    return {bytes(r["key"]): bytes(r["value"]) for r in sink.state().collect()}


@pytest.mark.crash
def test_a_query_killed_mid_stream_resumes_from_its_checkpoint_exactly_once(
    spark, kafka, tmp_path
) -> None:
    topic = kafka.create_topic(kafka.topic_name("killed"), 4)
    produced = kafka.produce(topic, keyed(random.Random(3), 4_000, 500, 0.1, "v"))
    log, checkpoint, batches = tmp_path / "log", tmp_path / "chk", tmp_path / "batches"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    args = [kafka.bootstrap, topic, str(log), str(checkpoint), str(batches)]
    job = subprocess.Popen(
        [sys.executable, str(HERE / "stream_job.py"), *args, spark.conf.get("spark.jars")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "job.log", "wb"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and job.poll() is None:
            if batches.exists() and len(batches.read_text().split()) >= 3:
                break
            time.sleep(0.05)
        assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the query committed no 3 batches in 300 s"
        time.sleep(random.Random().uniform(0, 0.4))  # anywhere in the next batches
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    done = [int(b) for b in batches.read_text().split()]
    assert len(done) < 4_000 // 300 + 1, "killed after the last batch: not mid-stream"
    print(f"\nkilled after batch {done[-1]} (of ~{4_000 // 300 + 1})")

    sink = CompactedStateSink(str(log), key_columns=("key",), config=NO_PASS)
    run_available(spark, kafka_options(kafka, topic), sink, checkpoint)
    assert sink_records(sink) == produced  # every record once, at its offset
    assert state_of(sink) == replay(produced)


def test_read_committed_stores_no_aborted_record_and_keeps_kafkas_offset_gaps(
    spark, kafka, tmp_path
) -> None:
    topic = kafka.create_topic(kafka.topic_name("txn"), 4)
    producer = kafka.producer(**{"transactional.id": f"txn-{topic}"})
    producer.init_transactions(30)
    rng = random.Random(5)
    committed: list[Produced] = []
    aborted: list[Produced] = []
    for t in range(8):
        producer.begin_transaction()
        sent = kafka.produce(topic, keyed(rng, 120, 60, 0.1, f"t{t}-"), producer=producer)
        if t % 3 == 1:
            producer.abort_transaction(30)
            aborted += sent
        else:
            producer.commit_transaction(30)
            committed += sent
    assert aborted and committed

    sink = CompactedStateSink(str(tmp_path / "log"), key_columns=("key",), config=NO_PASS)
    options = kafka_options(kafka, topic, **{"kafka.isolation.level": "read_committed"})
    run_available(spark, options, sink, tmp_path / "chk")

    stored = sink_records(sink)
    assert stored == sorted(committed, key=lambda r: (r.partition, r.offset))
    assert not set(stored) & set(aborted)
    gaps = [
        (a.partition, a.offset, b.offset)
        for a, b in zip(stored, stored[1:], strict=False)
        if a.partition == b.partition and b.offset - a.offset > 1
    ]
    assert gaps, "no gap: the transaction markers and aborted records left none"
    assert state_of(sink) == replay(committed)


def test_a_compacted_topic_keeps_its_gapped_offsets_in_the_log(spark, kafka, tmp_path) -> None:
    topic = kafka.create_topic(
        kafka.topic_name("compacted"),
        4,
        {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0"},
    )
    produced = kafka.produce(topic, keyed(random.Random(9), 2_000, 50, 0.0, "v"))
    time.sleep(0.5)
    rolled = kafka.produce(topic, [(p, b"roll", b"r") for p in range(4)])
    active = {r.partition: r.offset for r in rolled}
    deadline = time.monotonic() + 90
    while any(kafka.cleaner_checkpoint(topic).get(p, -1) < o for p, o in active.items()):
        assert time.monotonic() < deadline, "Kafka's cleaner did not run"
        time.sleep(0.1)
    held = kafka.consume_all(topic)
    assert len(held) < len(produced) / 4  # compacted: offsets with gaps

    sink = CompactedStateSink(str(tmp_path / "log"), key_columns=("key",), config=NO_PASS)
    run_available(spark, kafka_options(kafka, topic), sink, tmp_path / "chk")
    assert sink_records(sink) == held
    assert state_of(sink) == replay(produced + rolled)
