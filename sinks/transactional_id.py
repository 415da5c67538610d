"""The id a batch commits under: Kafka's ``transactional.id``, Delta's ``txn`` app id.

Exactly once: each append commits a Delta ``txn`` action (app id, batch id); a batch
id already recorded for its app id is skipped, also by a new sink on the same path.
Inside a streaming query the app id is ``<sink_id>/query=<query id>``: a restarted
query keeps its id, a query from a fresh checkpoint (batch ids from 0 again) is a new
one. Under Spark Connect the query id is read from the query's checkpoint
(`sinks.spark_session.streaming_query_id`). Outside a query (a direct call) the app id
is the sink id alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pyspark.sql import SparkSession

from sinks.log.location import LogLocation
from sinks.spark_session import streaming_query_id


@dataclass(frozen=True)
class TransactionalId:
    """A sink's identity as a producer: its sink id, and where its query's id comes from."""

    sink_id: str
    explicit: bool = False  # given by the user, not derived from the path
    checkpoint_location: LogLocation | None = None  # the query's checkpointLocation

    @classmethod
    def of(
        cls,
        location: LogLocation,
        sink_id: str | None,
        checkpoint_location: LogLocation | None,
    ) -> TransactionalId:
        """``sink_id``, or one derived from the log's URI (the same for every sink on it)."""
        derived = f"compacted-sink-{hashlib.sha256(location.uri.encode()).hexdigest()[:12]}"
        return cls(sink_id or derived, sink_id is not None, checkpoint_location)

    def query_id(self, spark: SparkSession, batch_id: int) -> str | None:
        """The id of the streaming query running ``batch_id``; None for a direct call."""
        return streaming_query_id(
            spark,
            batch_id,
            checkpoint_location=self.checkpoint_location,
            explicit_sink_id=self.explicit,
        )

    def app_id(self, query_id: str | None) -> str:
        """The ``txn`` app id of a batch run by ``query_id`` (None: a direct call)."""
        return f"{self.sink_id}/query={query_id}" if query_id else self.sink_id
