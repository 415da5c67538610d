"""Prototype: replay that neither sorts nor shuffles values (no core edits).

`CompactedStateSink.state()` groups the whole log by key with
``max_by(struct(every column), offset)``, which Spark runs as a SortAggregate:
every record is sorted twice and shuffled with its value, clean section
included, although a pass leaves at most one record per key below its end
offset (SPEC rule 6). Here:

- the dirty tail is resolved from its narrow columns only: ``max(offset)`` per
  (partition, key), a hash aggregate, then a broadcast semi-join on
  (partition, offset) keeps the tail's latest records;
- the clean section is kept by a broadcast anti-join against the tail's keys,
  so its rows are scanned once and never shuffled;

    state = latest(dirty) ∪ (clean ▷ keys(dirty)), without tombstones

The split is per partition at the cleaner offset the log records (``txn``).
With no pass yet (an append-only log) everything is dirty. Logs with a
``sequence_column`` are not covered by the prototype.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks import CompactedStateSink
from sinks.records import OFFSET, PARTITION, VALUE


def fast_state(spark: SparkSession, sink: CompactedStateSink) -> DataFrame:
    if sink.sequence_column:
        return sink.state()
    snapshot = sink.log_table.snapshot()
    assert snapshot is not None
    keys = [*sink.key_columns]
    clean, dirty = [], []
    for p, segments in snapshot.segments.items():
        end = snapshot.cleaner_offset(p) or 0
        clean += [s for s in segments if s.last_offset < end]
        dirty += [s for s in segments if s.last_offset >= end]
    scan = sink.log_table.read(spark, snapshot, dirty)
    latest = (
        scan.select(PARTITION, *keys, OFFSET)
        .groupBy(PARTITION, *keys)
        .agg(F.max(OFFSET).alias(OFFSET))
    )
    tail = scan.join(
        F.broadcast(latest.select(PARTITION, OFFSET)), [PARTITION, OFFSET], "left_semi"
    )
    live = tail.select(*keys, VALUE)
    if clean:
        compacted = sink.log_table.read(spark, snapshot, clean)
        superseded = F.broadcast(latest.select(PARTITION, *keys))
        kept = compacted.join(superseded, [PARTITION, *keys], "left_anti")
        live = kept.select(*keys, VALUE).unionByName(live)
    return live.filter(F.col(VALUE).isNotNull())
