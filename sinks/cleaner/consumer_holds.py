"""Deletes held for registered consumers: what Kafka's cleaner cannot promise.

Kafka drops a tombstone once its delete horizon has passed (KIP-534), so "a consumer
that lags by more than ``delete.retention.ms`` may miss delete markers". Here a
consumer reading the log with ``consumer.id`` commits its offsets in the
consumer-offsets table (`checkpoints.consumer_offsets`), and a pass gets, per
partition, the offset its live consumers have all read up to (``held_below``, the
lowest committed offset). The invariant:

    a tombstone at offset O of partition p whose delete horizon has passed is dropped
    only when O < held_below[p] (every live consumer has read it); a partition with no
    live consumer has no entry, and Kafka's rule applies unchanged.

Only tombstones are held; a superseded record goes as before, files and Delta
versions are never held beyond the history window. A consumer that has not
committed for ``consumer.expiration.ms`` holds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pyarrow.compute as pc
import pyarrow.parquet as pq

from checkpoints.consumer_offsets import ConsumerOffsets, consumer_offsets_uri
from sinks.cleaner.log_to_clean import LogToClean
from sinks.log.records import DELETE_HORIZON_MS
from sinks.log.segment import Segment
from sinks.log.segment_writer import WrittenSegment
from sinks.log.storage import arrow_filesystem


def consumer_holds(
    checkpoint_table_uri: str,
    log_path: str,
    partitions: Sequence[int],
    *,
    now_ms: int,
    storage_options: Mapping[str, str] | None = None,
    table_id: str | None = None,
    version: int | None = None,
) -> dict[int, int]:
    """Per partition, the offset below which expired tombstones may go (empty: no consumer).
    Offsets committed for another table or history of the log (``table_id``, ``version``)
    hold nothing."""
    offsets = ConsumerOffsets(consumer_offsets_uri(checkpoint_table_uri), storage_options)
    return offsets.held_below(
        log_path, partitions, now_ms=now_ms, table_id=table_id, version=version
    )


def without_held_tombstones(
    log: LogToClean, segments: Sequence[Segment], held_below: int | None
) -> LogToClean:
    """``log`` with only the tombstones a pass may drop counted as a reason to clean. Pure.

    A tombstone held for a consumer is no reason for a pass: the earliest delete horizon
    counts only segments that start below ``held_below`` (and below the first uncleanable
    offset, as `log_to_clean` counts them). Without this a held tombstone would make its
    partition cleanable on every check, and each pass would copy it again.
    """
    if held_below is None or log.earliest_delete_horizon_ms is None:
        return log
    horizons = [
        s.min_delete_horizon_ms
        for s in segments
        if s.min_delete_horizon_ms is not None
        and s.base_offset < min(held_below, log.first_uncleanable_offset)
    ]
    return replace(log, earliest_delete_horizon_ms=min(horizons, default=None))


def held_tombstones(
    table_uri: str,
    written: Sequence[WrittenSegment],
    *,
    pass_start_ms: int,
    storage_options: Mapping[str, str] | None = None,
) -> int:
    """How many tombstones a pass kept past their delete horizon: only held ones survive it.

    Reads the ``delete_horizon_ms`` column of the written files whose statistics say
    they may hold one (only tombstones carry a horizon).
    """
    fs, root = arrow_filesystem(table_uri, storage_options)
    held = 0
    for segment in written:
        low = json.loads(segment.stats or "{}").get("minValues", {}).get(DELETE_HORIZON_MS)
        if low is None or low >= pass_start_ms:
            continue
        column = pq.read_table(
            f"{root}/{segment.path}", filesystem=fs, columns=[DELETE_HORIZON_MS]
        ).column(DELETE_HORIZON_MS)
        held += pc.sum(pc.less(column, pass_start_ms)).as_py() or 0
    return held
