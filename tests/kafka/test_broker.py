"""The tests' broker: a KRaft broker+controller from Maven's jars, on loopback only."""

from __future__ import annotations

import pytest

from streaming.inputs.local_kafka import BrokerStartError, LocalKafka

pytestmark = pytest.mark.kafka


def test_the_broker_answers_on_loopback_and_keeps_what_it_was_sent(kafka, broker) -> None:
    assert broker.bootstrap.startswith("127.0.0.1:")
    cluster = kafka.admin.describe_cluster().result(timeout=10)
    assert [(n.host, n.port) for n in cluster.nodes] == [("127.0.0.1", broker.port)]
    topic = kafka.create_topic(kafka.topic_name("hello"), 2)
    sent = kafka.produce(topic, [(0, b"k", b"v1"), (1, b"j", None), (0, b"k", b"v2")])
    assert [(r.partition, r.offset) for r in sent] == [(0, 0), (0, 1), (1, 0)]
    assert kafka.consume_all(topic) == sent


def test_a_broker_that_cannot_start_fails_with_its_logs_last_lines(broker, tmp_path) -> None:
    bad = tmp_path / "server.properties"
    bad.write_text(broker.template.read_text().replace("process.roles=", "process.roles=nonsense,"))
    kafka = LocalKafka(broker.jars, tmp_path / "work", bad, broker.log4j2)
    with pytest.raises(BrokerStartError) as failure:
        kafka.start()
    assert "process.roles" in str(failure.value)
    assert kafka.process is None
