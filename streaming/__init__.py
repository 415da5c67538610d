"""What sits around a streaming query: input shapes, decoding, progress and the job entry points.

The names below load on first use (PEP 562): Spark starts a fresh Python process for the
consumers' source's driver side on every query (``streaming.datasource``), and it should not
pay for the Kafka, Avro, job and status modules it never uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streaming.avro import ConfluentAvroDecoder, DecodingHook
    from streaming.datasource import CompactedStateDataSource
    from streaming.job import JobConfig, JobConfigError, LogSpec, load_job
    from streaming.kafka import KAFKA_SCHEMA, TopicRouter, kafka_shaped_files, kafka_stream
    from streaming.progress import ProgressHook, ProgressListener, spark_progress
    from streaming.registered_logs_cleaner import RegisteredLogsCleaner
    from streaming.schema_registry import SchemaStore
    from streaming.status import LogStatus, PartitionStatus, log_status

_MODULE_OF = {
    "ConfluentAvroDecoder": "streaming.avro",
    "DecodingHook": "streaming.avro",
    "CompactedStateDataSource": "streaming.datasource",
    "JobConfig": "streaming.job",
    "JobConfigError": "streaming.job",
    "LogSpec": "streaming.job",
    "load_job": "streaming.job",
    "KAFKA_SCHEMA": "streaming.kafka",
    "TopicRouter": "streaming.kafka",
    "kafka_shaped_files": "streaming.kafka",
    "kafka_stream": "streaming.kafka",
    "ProgressHook": "streaming.progress",
    "ProgressListener": "streaming.progress",
    "spark_progress": "streaming.progress",
    "RegisteredLogsCleaner": "streaming.registered_logs_cleaner",
    "SchemaStore": "streaming.schema_registry",
    "LogStatus": "streaming.status",
    "PartitionStatus": "streaming.status",
    "log_status": "streaming.status",
}

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


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'streaming' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})
