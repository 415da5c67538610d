"""What sits around a streaming query, by concern.

`consumers` (the log read as Kafka consumers read it, and the ``compacted-state``
data source), `decoding` (Confluent Avro), `status` (gauges, history, progress),
`inputs` (Kafka-shaped input, a local broker), `jobs` (job files, the query, the
registered logs' cleaner loop, the demo) and `cli` (the ``compacted-sink`` command).
"""

from streaming.consumers import CompactedStateDataSource
from streaming.decoding import ConfluentAvroDecoder, DecodingHook, SchemaStore
from streaming.inputs import KAFKA_SCHEMA, TopicRouter, kafka_shaped_files, kafka_stream
from streaming.jobs import JobConfig, JobConfigError, LogSpec, RegisteredLogsCleaner, load_job
from streaming.status import (
    LogStatus,
    PartitionStatus,
    ProgressHook,
    ProgressListener,
    log_status,
    spark_progress,
)

__all__ = [
    "KAFKA_SCHEMA",
    "CompactedStateDataSource",
    "ConfluentAvroDecoder",
    "DecodingHook",
    "JobConfig",
    "JobConfigError",
    "LogSpec",
    "LogStatus",
    "PartitionStatus",
    "ProgressHook",
    "ProgressListener",
    "RegisteredLogsCleaner",
    "SchemaStore",
    "TopicRouter",
    "kafka_shaped_files",
    "kafka_stream",
    "load_job",
    "log_status",
    "spark_progress",
]
