"""What a log and a query report: the cleaner's gauges, their history, and progress lines.

`gauges`: Kafka's log-cleaner gauges per log and partition, from Delta metadata
alone; `status_history`: the same at each reachable Delta version;
`status_render`: a table, JSON or a plot of them; `progress`: a line per
micro-batch and per long piece of work.
"""

from streaming.status.gauges import LogStatus, PartitionStatus, StorageStatus, log_status
from streaming.status.progress import (
    ProgressHook,
    ProgressListener,
    query_progress,
    spark_progress,
)
from streaming.status.status_history import HistoryPoint, history
from streaming.status.status_render import plot_history, render_json, render_table

__all__ = [
    "HistoryPoint",
    "LogStatus",
    "PartitionStatus",
    "ProgressHook",
    "ProgressListener",
    "StorageStatus",
    "history",
    "log_status",
    "plot_history",
    "query_progress",
    "render_json",
    "render_table",
    "spark_progress",
]
