"""The log read as Kafka consumers read it, and the ``compacted-state`` data source.

`datasource`: ``format("compacted-state")``, the Python data source whose readers
are the consumers' (and whose writer appends with the log's produce path);
`consumer_source`: the readers Spark calls; `consumer_position`: a consumer's
position per partition, pure; `source_options`: the source's options; `fetch_plan`:
the files each task reads, planned on the driver; `fetcher`: the tasks' reads and
``offsetsForTimes``; `change_feed_source`, `change_feed`, `change_commits`:
``readChangeFeed``, Delta's Change Data Feed of the log; `consumer_groups`: Kafka's
``kafka-consumer-groups.sh`` for a log.
"""

from sinks.errors import DataLossError
from streaming.consumers.consumer_groups import (
    ConsumerLag,
    consumer_report,
    delete_consumer,
    reset_offsets,
)
from streaming.consumers.consumer_source import ConsumerBatchReader, ConsumerStreamReader
from streaming.consumers.datasource import CompactedStateDataSource, register
from streaming.consumers.source_options import SourceOptions

__all__ = [
    "CompactedStateDataSource",
    "ConsumerBatchReader",
    "ConsumerLag",
    "ConsumerStreamReader",
    "DataLossError",
    "SourceOptions",
    "consumer_report",
    "delete_consumer",
    "register",
    "reset_offsets",
]
