"""Which record of a key is its latest: the rule every reader and the cleaner share.

Kafka's invariant (``LogCleaner``): *a record with key K and offset O is obsolete
if there is a record with key K and offset O' such that O < O'*. Keys are
compared by value within a partition, so the group is (partition, key columns).
With a ``sequence_column`` (SPEC: an event-time or version column a producer
sets), the latest is the highest (sequence, offset): the sequence decides, a
null sequence ranks lowest, and a tie goes to the higher offset. An offset is
unique within a partition, so there is always exactly one winner.

The rule runs in Spark (`spark_latest_offsets`: ``sinks.reading.state_reader``)
and in Arrow (`arrow_latest_offsets`: ``sinks.reading.arrow_state`` and the
cleaner's offset map); ``tests/log/test_latest.py`` holds both to the same winners
on the same rows, ties and null sequences included.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sinks.log.records import OFFSET

_ORDER = "_order"


def spark_latest_offsets(
    records: DataFrame, group: Sequence[str], sequence_column: str | None
) -> DataFrame:
    """(group columns, offset) of each group's latest record, from narrow columns only.

    Without a sequence, ``max(offset)``, a hash aggregate on a long; with one,
    ``max(struct(sequence, offset))``, which orders a null sequence lowest.
    """
    group = list(group)
    if sequence_column is None or sequence_column in (*group, OFFSET):
        return records.groupBy(*group).agg(F.max(OFFSET).alias(OFFSET))
    order = F.struct(F.col(sequence_column), F.col(OFFSET))
    latest = records.groupBy(*group).agg(F.max(order).alias(_ORDER))
    return latest.select(*group, F.col(f"{_ORDER}.{OFFSET}").alias(OFFSET))


def arrow_latest_offsets(
    records: pa.Table,
    group: Sequence[str],
    sequence_column: str | None,
    *,
    use_threads: bool = False,
) -> pa.Table:
    """(group columns, offset) of each group's latest record. Pure.

    Without a sequence, a hash ``max(offset)`` (``use_threads`` lets Arrow use its
    pool); with one, a sort by (sequence, offset) descending, null sequences last,
    and the first per group.
    """
    group = list(group)
    if sequence_column is None or sequence_column in (*group, OFFSET):
        latest = records.group_by(group, use_threads=use_threads).aggregate([(OFFSET, "max")])
        return latest.rename_columns([*group, OFFSET])
    ordered = records.take(
        pc.sort_indices(
            records,
            sort_keys=[(sequence_column, "descending", "at_end"), (OFFSET, "descending", "at_end")],
        )
    )
    first = ordered.group_by(group, use_threads=False).aggregate([(OFFSET, "first")])
    return first.rename_columns([*group, OFFSET])
