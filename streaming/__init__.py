"""What sits around a streaming query: input shapes, decoding, progress and the job entry points."""

from streaming.avro import ConfluentAvroDecoder, DecodingHook
from streaming.datasource import CompactedStateDataSource
from streaming.job import JobConfig, JobConfigError, LogSpec, load_job
from streaming.kafka import KAFKA_SCHEMA, TopicRouter, kafka_shaped_files, kafka_stream
from streaming.progress import ProgressHook, ProgressListener, spark_progress
from streaming.registered_logs_cleaner import RegisteredLogsCleaner
from streaming.schema_registry import SchemaStore
from streaming.status import LogStatus, PartitionStatus, log_status

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
