"""Prototype of a cheaper cleaning pass: shuffle (partition, key, offset), never the values.

`sinks.cleaner.retain_latest` aggregates ``max_by(struct(every column), offset)``
per key, which Spark runs as a SortAggregate over full rows. Here the latest
offset per (partition, key) comes from a hash aggregate over the narrow
columns, a broadcast left-semi join on (partition, offset) keeps those rows of
the scan, and the tombstone rules (which look at one row at a time) apply
after. Output rows are written with the sink's own writer; nothing is
committed (the prototype measures the work, not the swap).
"""

from __future__ import annotations

import functools
import os
import shutil
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks import CompactedStateSink
from sinks.cleaner import drop_expired_tombstones, stamp_delete_horizon, stats_columns
from sinks.log_table import LogSnapshot
from sinks.log_to_clean import group_segments_by_size
from sinks.records import OFFSET, PARTITION
from sinks.segment_writer import write_segments


def latest_offsets(df: DataFrame, key_columns: list[str]) -> DataFrame:
    """(partition, offset) of each key's latest record: a hash aggregate over narrow columns."""
    return (
        df.select(PARTITION, *key_columns, OFFSET)
        .groupBy(PARTITION, *key_columns)
        .agg(F.max(OFFSET).alias(OFFSET))
        .select(PARTITION, OFFSET)
    )


def narrow_retained(
    df: DataFrame, *, key_columns: list[str], pass_start_ms: int, delete_retention_ms: int
) -> DataFrame:
    """`retain_latest`'s rows, found by shuffling only (partition, key, offset)."""
    kept = df.join(F.broadcast(latest_offsets(df, key_columns)), [PARTITION, OFFSET], "left_semi")
    return kept.transform(
        lambda d: drop_expired_tombstones(d, pass_start_ms=pass_start_ms)
    ).transform(
        lambda d: stamp_delete_horizon(
            d, pass_start_ms=pass_start_ms, delete_retention_ms=delete_retention_ms
        )
    )


def write_uncommitted(df: DataFrame, out: str, snapshot: LogSnapshot, keys: list[str]) -> int:
    """Write ``df`` as segments under ``out`` with the sink's writer; returns the files written."""
    os.makedirs(out, exist_ok=True)
    written = write_segments(
        df,
        table_uri=out,
        schema=snapshot.arrow_schema,
        stats_columns=stats_columns(snapshot, keys, None),
        max_file_bytes=128 * 1024 * 1024,
    )
    return len(written)


def prototype_pass(spark: SparkSession, log_path: str, out: str) -> float:
    """Seconds the narrow pass takes over every segment of ``log_path`` (written, not committed).

    Each output group (consecutive input segments, `group_segments_by_size`) is
    read by one task (``coalesce(1)`` of that group's scan), so kept rows are never
    shuffled: the only shuffle carries (partition, key, offset).
    """
    shutil.rmtree(out, ignore_errors=True)
    sink = CompactedStateSink(log_path, key_columns=("key",))
    snapshot = sink.log_table.snapshot()
    assert snapshot is not None
    started = time.perf_counter()
    latest = F.broadcast(latest_offsets(sink.log_table.read(spark, snapshot), ["key"]))
    now = int(time.time() * 1000)
    parts = []
    for segments in snapshot.segments.values():
        for group in group_segments_by_size(segments, sink.config.segment_bytes):
            kept = (
                sink.log_table.read(spark, snapshot, group)
                .join(latest, [PARTITION, OFFSET], "left_semi")
                .transform(lambda d: drop_expired_tombstones(d, pass_start_ms=now))
                .transform(
                    lambda d: stamp_delete_horizon(
                        d, pass_start_ms=now, delete_retention_ms=sink.config.delete_retention_ms
                    )
                )
            )
            parts.append(kept.coalesce(1))
    write_uncommitted(functools.reduce(DataFrame.unionByName, parts), out, snapshot, ["key"])
    return time.perf_counter() - started
