"""Prototype: replay that does not shuffle the compacted section (no core edits).

`CompactedStateSink.state()` groups the whole log by key, clean section
included, although a pass leaves at most one record per key below its end
offset (SPEC rule 6). Here only the dirty tail is resolved by key; the clean
section is kept by a broadcast anti-join against the tail's keys, so its wide
rows are scanned once and never shuffled:

    state = latest(dirty) ∪ (clean ▷ keys(dirty)), without tombstones

The split is per partition at the cleaner offset the log records (``txn``).
With no pass yet, everything is dirty and this is `state()` as it is.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks import CompactedStateSink
from sinks.cleaner import drop_tombstones, latest_records
from sinks.records import PARTITION, VALUE


def fast_state(spark: SparkSession, sink: CompactedStateSink) -> DataFrame:
    snapshot = sink.log_table.snapshot()
    assert snapshot is not None
    keys = [*sink.key_columns]
    clean, dirty = [], []
    for p, segments in snapshot.segments.items():
        end = snapshot.cleaner_offset(p) or 0
        clean += [s for s in segments if s.last_offset < end]
        dirty += [s for s in segments if s.last_offset >= end]
    tail = sink.log_table.read(spark, snapshot, dirty).transform(
        lambda d: latest_records(d, [PARTITION, *keys], sink.sequence_column)
    )
    if not clean:
        return tail.transform(drop_tombstones).select(*keys, VALUE)
    compacted = sink.log_table.read(spark, snapshot, clean)
    superseded = F.broadcast(tail.select(PARTITION, *keys))
    kept = compacted.join(superseded, [PARTITION, *keys], "left_anti")
    return (
        kept.select(*keys, VALUE)
        .unionByName(tail.select(*keys, VALUE))
        .filter(F.col(VALUE).isNotNull())
    )
