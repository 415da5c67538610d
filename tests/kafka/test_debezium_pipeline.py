"""The database is the judge: PostgreSQL -> Debezium (Kafka Connect) -> Kafka -> Spark -> the sink.

A real PostgreSQL 15 (``wal_level=logical``), Debezium's PostgreSQL connector (``pgoutput``)
in Kafka's own Connect worker on the tests' KRaft broker, Spark's Kafka source and
``CompactedStateSink(..., value_format="debezium-json")`` (design.md §52, §53). One worker and
one connector serve the module: ``users`` is snapshotted when it starts, the seeded workloads'
tables (`tests/kafka/debezium_workload.py`) are created later and streamed.

After a snapshot and then streaming inserts, updates, deletes, a primary-key change, an update
that leaves a TOASTed value unchanged, ``ALTER TABLE ... ADD COLUMN``, a transaction and a
connector restart, and after each seeded random workload, the sink's ``state()`` and
``read_state`` equal ``SELECT * FROM`` the table, row for row and column for column, and so
does a second log replayed from the first. ``COMPACTED_SINK_CDC_SEEDS`` (default 1; ``make
test-cdc`` more) says how many seeds run.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sinks import CompactedStateSink
from sinks.produce.debezium_json import UNAVAILABLE_VALUE
from sinks.reading.replay import RestoreSource, replay
from streaming.inputs.local_debezium import (
    PG_BIN,
    ConnectWorker,
    LocalPostgres,
    postgres_connector,
    wait_until,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from debezium_workload import Workload, big_text, judge, marked, tombstoned
from kafka_kit import SUMMARY, KafkaKit, kafka_options, run_available

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
DEBEZIUM_JARS = ROOT / ".jars" / "debezium"
TOPIC = "dbz.public.users"
SEEDS = range(1, 1 + int(os.environ.get("COMPACTED_SINK_CDC_SEEDS", "1")))


@pytest.fixture(scope="module")
def postgres():
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL 15 at {PG_BIN}")
    pytest.importorskip("psycopg")
    pg = LocalPostgres()
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


@dataclass
class Pipeline:
    """The module's database connection and Connect worker, after ``users``' snapshot."""

    db: object
    worker: ConnectWorker
    snapshot_s: float


@pytest.fixture(scope="module")
def pipeline(
    kafka: KafkaKit, postgres: LocalPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    if not (DEBEZIUM_JARS / "debezium-connector-postgres-3.6.1.Final.jar").exists():
        message = f"no Debezium jars in {DEBEZIUM_JARS}: run `make jars`"
        if os.environ.get("COMPACTED_SINK_KAFKA_TESTS") == "required":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    rng = random.Random(63)
    db = postgres.connect()
    db.execute("CREATE TABLE users (id int PRIMARY KEY, name text NOT NULL, big text)")
    db.execute("ALTER TABLE users ALTER COLUMN big SET STORAGE EXTERNAL")
    for i in range(1, 21):
        db.execute(
            "INSERT INTO users VALUES (%s, %s, %s)",
            (i, f"user-{i}", big_text(rng) if i <= 3 else None),
        )
    kafka.create_topic(TOPIC, 1)
    connector = postgres_connector(
        postgres,
        name="module",
        tables=r"public\.users,public\.workload_\d+",
        publication="all_tables",
    )
    worker = ConnectWorker(
        DEBEZIUM_JARS, tmp_path_factory.mktemp("connect"), kafka.bootstrap, connector
    )
    started = time.monotonic()
    worker.start()
    try:
        wait_until(
            lambda: marked(kafka, TOPIC, 20),
            timeout_s=180,
            what="the snapshot",
            alive=worker.check_alive,
        )
        yield Pipeline(db, worker, time.monotonic() - started)
    finally:
        worker.stop()
        db.close()


def test_the_state_equals_the_table(
    spark: SparkSession, kafka: KafkaKit, pipeline: Pipeline, tmp_path: Path
) -> None:
    rng = random.Random(64)
    db, worker = pipeline.db, pipeline.worker
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    try:
        options = kafka_options(kafka, TOPIC, maxOffsetsPerTrigger="7")
        run_available(spark, options, sink, tmp_path / "chk")
        assert judge(spark, sink, db, "users") == 20  # the snapshot: op=r

        for i in range(21, 31):
            db.execute("INSERT INTO users VALUES (%s, %s, NULL)", (i, f"user-{i}"))
        db.execute("UPDATE users SET name = name || '-u' WHERE id BETWEEN 5 AND 10")
        db.execute("DELETE FROM users WHERE id BETWEEN 11 AND 13")
        db.execute("UPDATE users SET id = 100 WHERE id = 14")  # a primary-key change
        db.execute("UPDATE users SET name = 'kept' WHERE id = 1")  # big: TOAST, unchanged
        db.execute("UPDATE users SET big = %s WHERE id = 2", (big_text(rng),))
        db.execute("UPDATE users SET name = 'kept-2' WHERE id = 2")  # resolved in the batch
        db.execute("ALTER TABLE users ADD COLUMN score int")
        db.execute("UPDATE users SET score = id * 10 WHERE id <= 5")  # TOAST again, ids 1 to 3
        db.execute("INSERT INTO users VALUES (31, 'user-31', NULL, 310)")
        with db.transaction():
            db.execute("UPDATE users SET name = 'in-tx' WHERE id = 20")
            db.execute("DELETE FROM users WHERE id = 21")
            db.execute("INSERT INTO users VALUES (32, 'user-32', NULL, 320)")
        db.execute("DELETE FROM users WHERE id = 22")
        db.execute("INSERT INTO users VALUES (22, 'again', NULL, 22)")  # a key back
        db.execute("INSERT INTO users VALUES (999, 'marker', NULL, NULL)")
        wait_until(
            lambda: marked(kafka, TOPIC, 999),
            timeout_s=120,
            what="the changes",
            alive=worker.check_alive,
        )
        run_available(spark, options, sink, tmp_path / "chk")
        judge(spark, sink, db, "users")
        assert sink.log().where("value IS NULL").count() > 0  # deletes went through
        events = kafka.consume_all(TOPIC)
        toasted = [r for r in events if r.value and UNAVAILABLE_VALUE.encode() in r.value]
        assert len(toasted) >= 2  # ids 1 and 3 updated with big unchanged

        # The connector killed and restarted: what it had not flushed it sends again. And
        # every event so far sent again (Kafka Connect delivers at least once): they all lose.
        worker.kill()
        kafka.produce(TOPIC, [(None, r.key, r.value) for r in events])
        worker.start()
        db.execute("UPDATE users SET name = 'after-restart' WHERE id = 1")
        db.execute("DELETE FROM users WHERE id = 5")
        db.execute("INSERT INTO users VALUES (40, 'user-40', NULL, 400)")
        db.execute("INSERT INTO users VALUES (1000, 'marker', NULL, NULL)")
        wait_until(
            lambda: marked(kafka, TOPIC, 1000),
            timeout_s=180,
            what="the restart",
            alive=worker.check_alive,
        )
        run_available(spark, options, sink, tmp_path / "chk")
        rows = judge(spark, sink, db, "users")
        SUMMARY.append(
            f"Debezium pipeline: snapshot in {pipeline.snapshot_s:.1f} s after the worker's start; "
            f"{len(events)} events sent again; {rows} rows equal to SELECT * FROM users"
        )
    finally:
        sink.close()


CHANGES = 25  # statements a round


def _rounds(seed: int) -> int:
    """Rounds of `CHANGES` statements: two for the seed ``make test`` runs, three for more."""
    return 2 if seed == 1 else 3


@pytest.mark.parametrize("seed", SEEDS)
def test_a_seeded_workload_gives_the_table_and_so_does_its_replay(
    spark: SparkSession, kafka: KafkaKit, pipeline: Pipeline, tmp_path: Path, seed: int
) -> None:
    table = f"workload_{seed}"
    topic = kafka.create_topic(f"dbz.public.{table}", 1)
    workload = Workload(pipeline.db, table, seed)
    workload.create()
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    started = time.monotonic()
    query = (
        spark.readStream.format("kafka")
        .options(**kafka_options(kafka, topic))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        for round_ in range(_rounds(seed)):
            if round_ == 1:
                workload.add_column()
            workload.round(CHANGES)
            marker = workload.settle()
            wait_until(
                lambda marker=marker: tombstoned(kafka, topic, marker),
                timeout_s=120,
                what=f"round {round_} of seed {seed}",
                alive=pipeline.worker.check_alive,
            )
            query.processAllAvailable()  # the events as they come, into the running query
            judge(spark, sink, pipeline.db, table)
        query.stop()
        replayed = str(tmp_path / "replayed")
        replay(RestoreSource.of_log(spark, sink.path), replayed)
        rows = judge(
            spark,
            CompactedStateSink(replayed, ("id",), value_format="debezium-json"),
            pipeline.db,
            table,
        )
        changes = ", ".join(f"{n} {kind}" for kind, n in sorted(workload.counts.items()))
        SUMMARY.append(
            f"Debezium workload, seed {seed}: {changes}; {rows} rows equal to SELECT * FROM "
            f"{table}, and in the replayed log ({time.monotonic() - started:.1f} s)"
        )
    finally:
        query.stop()
        sink.close()
