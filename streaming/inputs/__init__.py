"""Kafka-shaped input: the Kafka source's columns, a router from topics to logs, a local broker.

`kafka`: the columns of Spark's Kafka source, the same read from files, and
`TopicRouter`; `local_kafka`: a local broker for the tests and ``make demo-kafka``.
"""

from sinks.errors import BrokerStartError
from streaming.inputs.kafka import (
    KAFKA_SCHEMA,
    TopicRouter,
    file_columns,
    kafka_shaped_files,
    kafka_stream,
    write_kafka_files,
)
from streaming.inputs.local_kafka import LocalKafka

__all__ = [
    "KAFKA_SCHEMA",
    "BrokerStartError",
    "LocalKafka",
    "TopicRouter",
    "file_columns",
    "kafka_shaped_files",
    "kafka_stream",
    "write_kafka_files",
]
