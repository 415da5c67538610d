"""A real Kafka broker for the ``kafka`` tests, and Spark's Kafka source on the classic session.

The broker (`streaming.inputs.local_kafka.LocalKafka`: KRaft, broker and controller in one JVM, on
free ports of 127.0.0.1) starts once per session from the jars `make jars` fetched into
``.jars/kafka/``, with ``server.properties`` and ``log4j2.properties`` beside this file. The
classic session gets Spark's Kafka source from ``.jars/spark-kafka-<pyspark version>/``
(`conftest.session_jars`): on a pyspark nothing was fetched for, the tests cannot run. Under
``make test`` (``COMPACTED_SINK_KAFKA_TESTS=required``) missing jars fail the tests; elsewhere
they skip with the reason.

The ``kafka`` fixture is a `kafka_kit.KafkaKit` on that broker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from streaming.inputs.local_kafka import LocalKafka

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jvm_archive import BASE_OPTIONS
from kafka_kit import SUMMARY, KafkaKit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KAFKA_JARS = ROOT / ".jars" / "kafka"
SPARK_KAFKA_JARS = ROOT / ".jars" / f"spark-kafka-{pyspark.__version__}"
REQUIRED = os.environ.get("COMPACTED_SINK_KAFKA_TESTS") == "required"


def _missing(what: str) -> None:
    message = (
        f"{what}: run `make jars` (or `make test`, which runs the kafka tests on "
        f"pyspark 4.2 in .venv-spark4.2)"
    )
    if REQUIRED:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    if not any(KAFKA_JARS.glob("kafka_2.13-*.jar")):
        _missing(f"no Kafka broker jars in {KAFKA_JARS}")
    kafka = LocalKafka(
        KAFKA_JARS,
        tmp_path_factory.mktemp("kafka-broker"),
        HERE / "server.properties",
        HERE / "log4j2.properties",
        jvm_options=BASE_OPTIONS.split(),  # as the tests' Spark JVMs (tests/conftest.py)
    )
    kafka.start()  # BrokerStartError (with the log's last lines) fails the run
    SUMMARY.append(f"Kafka broker on {kafka.bootstrap}: started in {kafka.start_seconds:.1f} s")
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def kafka_spark(classic_spark: SparkSession) -> SparkSession:
    """The classic session, with Spark's Kafka source on it (local jars, `session_jars`)."""
    if not any(SPARK_KAFKA_JARS.glob("spark-sql-kafka-0-10_*.jar")):
        _missing(f"no Spark Kafka source for pyspark {pyspark.__version__} in {SPARK_KAFKA_JARS}")
    return classic_spark


@pytest.fixture
def spark(kafka_spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> SparkSession:
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    return kafka_spark


@pytest.fixture(scope="session")
def kafka(broker: LocalKafka) -> KafkaKit:
    return KafkaKit(broker)


def pytest_terminal_summary(terminalreporter) -> None:
    """The broker's start time and each judge workload's figures, also under ``-q``."""
    if SUMMARY:
        terminalreporter.section("kafka")
        for line in SUMMARY:
            terminalreporter.write_line(line)
