"""Operating registered consumers: Kafka's ``kafka-consumer-groups.sh`` for one log.

`consumer_report` lists a log's registered consumers (`checkpoints.consumer_offsets`)
with their lag per partition (log end offset minus committed offset), whether they
expired (no commit for ``consumer.expiration.ms``: they hold nothing any more), and
how many expired tombstones they hold (delete horizon passed, at or above their
committed offset: a pass keeps them until they read on). `reset_offsets` moves a
consumer's committed offsets (``earliest``, ``latest`` or a JSON map); it takes
effect when the consumer starts a query with a new checkpoint (a running query
follows its own checkpoint), and a tombstone dropped before cannot come back.
`delete_consumer` unregisters one. These back ``compacted-sink consumers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow.compute as pc
import pyarrow.parquet as pq

from checkpoints import ConsumerOffsets, ConsumerState, consumer_offsets_uri
from sinks.log import (
    DELETE_HORIZON_MS,
    OFFSET,
    PARTITION,
    LogSnapshot,
    LogTable,
    arrow_filesystem,
    normalize_uri,
    now_ms,
    sibling,
)
from streaming.consumers.consumer_position import lag, parse_starting_offsets, starting_positions
from streaming.consumers.source_options import CHECKPOINT_TABLE_DIR


@dataclass(frozen=True)
class ConsumerLag:
    """One registered consumer of a log, as ``consumers`` shows it."""

    consumer: ConsumerState
    lag: dict[int, int]
    tombstones_held: int

    def line(self) -> str:
        state = "expired" if self.consumer.expired else "live"
        lags = ", ".join(f"p{p} {n}" for p, n in sorted(self.lag.items()))
        return (
            f"{self.consumer.consumer_id}: {state}, lag {sum(self.lag.values())} ({lags}), "
            f"holds {self.tombstones_held} tombstones"
        )


def consumer_offsets(log_path: str, checkpoint_table: str | None = None) -> ConsumerOffsets:
    path = normalize_uri(log_path)
    checkpoint = normalize_uri(checkpoint_table or sibling(path, CHECKPOINT_TABLE_DIR))
    return ConsumerOffsets(consumer_offsets_uri(checkpoint))


def consumer_report(
    log_path: str, checkpoint_table: str | None = None, *, now: int | None = None
) -> list[ConsumerLag]:
    """Every registered consumer of the log, with its lag and the tombstones it holds."""
    path = normalize_uri(log_path)
    at = now if now is not None else now_ms()
    snapshot = LogTable(path).snapshot()
    ends = snapshot.log_end_offsets() if snapshot else {}
    expired = _expired_tombstones(snapshot, at) if snapshot else []
    report = []
    for consumer in consumer_offsets(path, checkpoint_table).consumers(path, now_ms=at):
        held = 0
        if not consumer.expired:
            held = sum(1 for p, o in expired if o >= consumer.committed.get(p, 0))
        report.append(ConsumerLag(consumer, lag(consumer.committed, ends), held))
    return report


def reset_offsets(
    log_path: str, consumer_id: str, to: str, checkpoint_table: str | None = None
) -> dict[int, int]:
    """Set a consumer's committed offsets to ``to`` (earliest | latest | JSON); returns them."""
    path = normalize_uri(log_path)
    snapshot = LogTable(path).snapshot()
    if snapshot is None:
        raise FileNotFoundError(f"no compacted log at {path}")
    positions = starting_positions(
        parse_starting_offsets(to),
        log_start_offsets={p: snapshot.log_start_offset(p) for p in snapshot.partitions},
        log_end_offsets=snapshot.log_end_offsets(),
    )
    consumer_offsets(path, checkpoint_table).commit(path, consumer_id, positions)
    return positions


def delete_consumer(log_path: str, consumer_id: str, checkpoint_table: str | None = None) -> int:
    """Unregister a consumer: it holds nothing from now on. Returns the rows deleted."""
    path = normalize_uri(log_path)
    return consumer_offsets(path, checkpoint_table).delete(path, consumer_id)


def _expired_tombstones(snapshot: LogSnapshot, at: int) -> list[tuple[int, int]]:
    """(partition, offset) of every tombstone whose delete horizon lies before ``at``."""
    fs, root = arrow_filesystem(snapshot.uri)
    found: list[tuple[int, int]] = []
    for segment in snapshot.all_segments():
        if segment.min_delete_horizon_ms is None or segment.min_delete_horizon_ms >= at:
            continue
        table = pq.read_table(
            f"{root}/{segment.path}", filesystem=fs, columns=[PARTITION, OFFSET, DELETE_HORIZON_MS]
        )
        table = table.filter(pc.less(table.column(DELETE_HORIZON_MS), at))
        starts: Mapping[int, int] = {
            segment.partition: snapshot.log_start_offset(segment.partition)
        }
        found += [
            (p, o)
            for p, o in zip(
                table.column(PARTITION).to_pylist(), table.column(OFFSET).to_pylist(), strict=True
            )
            if o >= starts.get(p, 0)
        ]
    return found
