"""The log: Kafka's ``UnifiedLog`` over a Delta table.

Records and their checks (`records`), segments (one Parquet file each,
`segment`, written by `segment_writer`), the table with its snapshots and
commits (`log_table`), the append of a batch (`log_append`, `append_task`),
where files live (`storage`, `file_reader`) and quarantined rows (`dead_letter`).
Nothing here cleans; the cleaner builds on it.
"""

from sinks.log.dead_letter import DeadLetterTable
from sinks.log.log_append import LogAppender, LogAppendInfo
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.segment import Segment
from sinks.log.segment_writer import WrittenSegment

__all__ = [
    "DeadLetterTable",
    "LogAppendInfo",
    "LogAppender",
    "LogSnapshot",
    "LogTable",
    "Segment",
    "WrittenSegment",
]
