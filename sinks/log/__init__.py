"""The log: Kafka's ``UnifiedLog`` over a Delta table.

Records and their columns (`records`), segments (one Parquet file each,
`segment`, written by `segment_writer` and read by `file_reader`), the table
with its snapshots and commits (`log_table`), the topic's config and keys kept
on the log (`log_config`, `log_keys`), where files live (`location`, `uris`,
`store_options`, `filesystems`) and what the log owns (`ownership`). Commits other
engines make to the log are read in `sinks.log.foreign`. Nothing here appends or cleans:
the produce path (`sinks.produce`) and the cleaner build on it.
"""

from sinks.log.file_reader import conform
from sinks.log.filesystems import arrow_filesystem, delete_files
from sinks.log.foreign.commits import read_commit
from sinks.log.history_window import (
    list_delta_log,
    oldest_reachable_version,
    reachable_commits,
    window_of,
)
from sinks.log.location import LogLocation
from sinks.log.log_config import LogConfig, alter_log_config, resolve, topic_table_properties
from sinks.log.log_format import COMMIT_INFO_KEY, DELTA_LOG_DIR
from sinks.log.log_keys import LogKeys, log_keys
from sinks.log.log_table import LogSnapshot, LogTable, log_arrow_schema, now_ms
from sinks.log.ownership import (
    check_log_location,
    check_new_log_location,
    foreign_entries,
    is_delta_rs_data_path,
    is_own_data_path,
)
from sinks.log.records import DECODE_ERROR, DELETE_HORIZON_MS, OFFSET, PARTITION, TIMESTAMP, VALUE
from sinks.log.segment import Segment, is_segment_path
from sinks.log.segment_writer import WrittenSegment
from sinks.log.uris import join, normalize_uri, sibling

__all__ = [
    "COMMIT_INFO_KEY",
    "DECODE_ERROR",
    "DELETE_HORIZON_MS",
    "DELTA_LOG_DIR",
    "OFFSET",
    "PARTITION",
    "TIMESTAMP",
    "VALUE",
    "LogKeys",
    "log_keys",
    "read_commit",
    "LogLocation",
    "LogSnapshot",
    "LogTable",
    "Segment",
    "WrittenSegment",
    "alter_log_config",
    "LogConfig",
    "resolve",
    "topic_table_properties",
    "arrow_filesystem",
    "check_log_location",
    "check_new_log_location",
    "conform",
    "delete_files",
    "foreign_entries",
    "is_delta_rs_data_path",
    "is_own_data_path",
    "is_segment_path",
    "join",
    "list_delta_log",
    "log_arrow_schema",
    "normalize_uri",
    "now_ms",
    "oldest_reachable_version",
    "reachable_commits",
    "sibling",
    "window_of",
]
