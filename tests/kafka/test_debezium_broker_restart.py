"""The broker restarted while change events flow: the state still equals the table.

PostgreSQL 15, Debezium's PostgreSQL connector in Kafka's Connect worker, a KRaft broker of
this test's own (restarting the session's would disturb the other tests' clients) and a
running query of Spark's Kafka source into ``CompactedStateSink(...,
value_format="debezium-json")``. A seeded workload (`tests/kafka/debezium_workload.py`)
runs a round, then half a round, the broker is stopped (a controlled shutdown), changes
are made while it is down, it starts again on the same ports and data, and the rest of the
round follows: Connect and the query reconnect by themselves, and after each round
``state()`` and ``read_state`` equal ``SELECT * FROM`` the table. In ``make test-cdc``
(``COMPACTED_SINK_CDC_TESTS=required``) only: a broker and a worker of its own cost about a
minute.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sinks import CompactedStateSink
from streaming.inputs.local_debezium import (
    PG_BIN,
    ConnectWorker,
    LocalPostgres,
    postgres_connector,
    wait_until,
)
from streaming.inputs.local_kafka import LocalKafka

sys.path.insert(0, str(Path(__file__).resolve().parent))
from debezium_workload import Workload, judge, tombstoned
from jvm_archive import BASE_OPTIONS
from kafka_kit import SUMMARY, KafkaKit

pytestmark = pytest.mark.kafka

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEBEZIUM_JARS = ROOT / ".jars" / "debezium"
KAFKA_JARS = ROOT / ".jars" / "kafka"
TABLE = "restarted"
TOPIC = f"dbz.public.{TABLE}"
CHANGES = 30


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    if os.environ.get("COMPACTED_SINK_CDC_TESTS") != "required":
        pytest.skip("a broker of its own restarted: `make test-cdc` runs it")
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"no PostgreSQL 15 at {PG_BIN}", pytrace=False)
    if not (DEBEZIUM_JARS / "debezium-connector-postgres-3.6.1.Final.jar").exists():
        pytest.fail(f"no Debezium jars in {DEBEZIUM_JARS}: run `make jars`", pytrace=False)
    broker = LocalKafka(
        KAFKA_JARS,
        tmp_path_factory.mktemp("restarted-broker"),
        HERE / "server.properties",
        HERE / "log4j2.properties",
        jvm_options=BASE_OPTIONS.split(),
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def test_the_state_equals_the_table_across_a_broker_restart(
    spark: SparkSession, own_broker: LocalKafka, tmp_path: Path
) -> None:
    kafka = KafkaKit(own_broker)
    postgres = LocalPostgres()
    postgres.start()
    db = postgres.connect()
    worker = None
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    query = None
    try:
        workload = Workload(db, TABLE, seed=7)
        workload.create()
        workload.round(10)  # rows for the snapshot
        kafka.create_topic(TOPIC, 1)
        connector = postgres_connector(postgres, name="restarted", tables=rf"public\.{TABLE}")
        worker = ConnectWorker(DEBEZIUM_JARS, tmp_path / "connect", own_broker.bootstrap, connector)
        worker.start()
        rows = len(workload.ids)  # the snapshot's: its events come before any change's
        wait_until(
            lambda: len(kafka.consume_all(TOPIC)) >= rows,
            timeout_s=180,
            what="the snapshot",
            alive=worker.check_alive,
        )

        def settled(what: str) -> None:
            marker = workload.settle()
            wait_until(
                lambda: tombstoned(kafka, TOPIC, marker),
                timeout_s=180,
                what=what,
                alive=worker.check_alive,
            )
            query.processAllAvailable()
            judge(spark, sink, db, TABLE)

        query = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", own_broker.bootstrap)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            # A trigger that finds the broker down waits for it instead of failing the query.
            .option("fetchOffset.numRetries", "120")
            .option("fetchOffset.retryIntervalMs", "500")
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        workload.round(CHANGES)
        settled("a round")

        workload.round(CHANGES // 2)
        stopped = time.monotonic()
        own_broker.stop()
        workload.add_column()
        workload.round(CHANGES // 2)  # Debezium reads them while the broker is down
        own_broker.restart()
        down_s = time.monotonic() - stopped
        workload.round(CHANGES // 2)
        settled("the round across the restart")
        assert query.isActive and query.exception() is None

        workload.round(CHANGES)
        settled("a round after the restart")
        changes = ", ".join(f"{n} {kind}" for kind, n in sorted(workload.counts.items()))
        SUMMARY.append(
            f"Debezium across a broker restart (down {down_s:.1f} s, up again in "
            f"{own_broker.start_seconds:.1f} s): {changes}; the state equals SELECT * FROM {TABLE}"
        )
    finally:
        if query is not None:
            query.stop()
        sink.close()
        if worker is not None:
            worker.stop()
        db.close()
        postgres.stop()
