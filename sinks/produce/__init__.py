"""The produce path: a micro-batch into the log, as Kafka's partition leader appends.

What a batch is (`append_batch`), the producer-side checks Kafka's broker makes
(`validity`) and where refused rows go (`dead_letter`), a schema change a batch
may make (`schema_evolution`, committed by `schema_commit`), the executor half
that assigns offsets and writes segments (`append_task`, or `spark_append` in the
JVM; both answer with an `append_task.TaskOutput`), the batch's commit (`log_commit`)
and the one append that ties them together (`log_append.LogAppender`, whose retry loop
runs one `log_append.AppendAttempt` a round). Debezium's change events become records in
`debezium_json` first (``value_format="debezium-json"``).
"""

from sinks.produce.append_batch import ArrowRecords, log_schema
from sinks.produce.dead_letter import DeadLetterTable
from sinks.produce.debezium_json import DEBEZIUM_JSON, SOURCE_POSITION, check_value_format
from sinks.produce.log_append import LogAppender, LogAppendInfo, committed
from sinks.produce.schema_evolution import DEFAULT_SCHEMA_EVOLUTION, SchemaEvolution, check_mode

__all__ = [
    "DEBEZIUM_JSON",
    "DEFAULT_SCHEMA_EVOLUTION",
    "SOURCE_POSITION",
    "ArrowRecords",
    "DeadLetterTable",
    "LogAppendInfo",
    "LogAppender",
    "SchemaEvolution",
    "check_mode",
    "check_value_format",
    "committed",
    "log_schema",
]
