"""The consumer-offsets table: Kafka's ``__consumer_offsets``, as a Delta table.

One row per (log, consumer, partition): the consumer's committed offset (the
position of the next record it reads, as in Kafka), when it committed, and how long
it stays registered without committing (``consumer.expiration.ms``, chosen by the
consumer). It lives beside the cleaner-offset checkpoint (``_consumer-offsets`` in
the same directory) and, like it, is shared by many logs.

A registered consumer holds deletes: a pass keeps a tombstone whose delete horizon
has passed while a live consumer's committed offset is at or below it
(`held_below`). A consumer that has not committed for its expiration time holds
nothing any more (Paimon's ``consumer.expiration-time``; Kafka expires idle groups'
offsets after ``offsets.retention.minutes``, 7 days). Rows are upserted in one commit
that rewrites the table (`checkpoints.keyed_table`), so a reader sees a consumer's old
offsets or its new ones, never a mix; committing the same offsets twice is harmless
(idempotent).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

import pyarrow as pa
from deltalake import DeltaTable

from checkpoints.checkpoint_table import (
    DELTA_CHECKPOINT_INTERVAL,
    HANDS_OFF_PROPERTIES,
    other_history,
)
from checkpoints.clock import now_ms
from checkpoints.keyed_table import KeyedTable

CONSUMER_OFFSETS_TABLE_NAME = "_consumer-offsets"
DEFAULT_CONSUMER_EXPIRATION_MS = 7 * 24 * 3_600_000  # Kafka's offsets.retention.minutes

CONSUMER_OFFSETS_SCHEMA = pa.schema(
    [
        ("log_path", pa.string()),
        ("consumer_id", pa.string()),
        ("partition", pa.int32()),
        ("committed_offset", pa.int64()),
        ("committed_ms", pa.int64()),
        ("expiration_ms", pa.int64()),
        ("table_id", pa.string()),
        ("table_version", pa.int64()),
    ]
)
# Kept small: no one time-travels this table; each micro-batch of each consumer merges once.
CONSUMER_OFFSETS_PROPERTIES = {
    **HANDS_OFF_PROPERTIES,
    "delta.deletedFileRetentionDuration": "interval 1 hour",
    "delta.logRetentionDuration": "interval 1 hour",
    "delta.checkpointInterval": str(DELTA_CHECKPOINT_INTERVAL),
    "delta.enableExpiredLogCleanup": "true",
}


@dataclass(frozen=True, kw_only=True)
class CommittedOffset:
    """One (log, consumer, partition) row: the consumer's next offset in that partition."""

    log_path: str
    consumer_id: str
    partition: int
    committed_offset: int
    committed_ms: int
    expiration_ms: int = DEFAULT_CONSUMER_EXPIRATION_MS
    table_id: str | None = None  # the Delta table the offsets are of (None: not recorded)
    table_version: int | None = None  # the log's version when they were committed

    def expired(self, now_ms: int) -> bool:
        """True when the consumer has not committed for longer than its expiration time."""
        return now_ms - self.committed_ms > self.expiration_ms

    def other_history(self, *, table_id: str, version: int) -> str | None:
        """Why these offsets are of another table or history than the log's (None: they are
        of this one, or cannot tell); see `checkpoints.checkpoint_table.other_history`."""
        return other_history(self.table_id, self.table_version, table_id=table_id, version=version)


@dataclass(frozen=True)
class ConsumerState:
    """One consumer of one log: its committed offsets and whether it still holds deletes."""

    consumer_id: str
    committed: dict[int, int]
    committed_ms: int
    expiration_ms: int
    expired: bool


def held_below(
    offsets: Iterable[CommittedOffset], partitions: Iterable[int], *, now_ms: int
) -> dict[int, int]:
    """Per partition, the lowest committed offset of the live (unexpired) consumers. Pure.

    A pass must not drop an expired tombstone at or above it: some registered consumer
    has not read it yet. A live consumer with no row for a partition holds it from 0
    (it reads a partition it has not seen from the start). Empty when no consumer is live.
    """
    live = [o for o in offsets if not o.expired(now_ms)]
    consumers = {o.consumer_id for o in live}
    if not consumers:
        return {}
    committed = {(o.consumer_id, o.partition): o.committed_offset for o in live}
    return {p: min(committed.get((c, p), 0) for c in consumers) for p in sorted(set(partitions))}


class ConsumerOffsets:
    """The consumer-offsets table at ``uri``, created on first commit. Safe to share."""

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options or {})
        self._keyed = KeyedTable(
            uri,
            CONSUMER_OFFSETS_SCHEMA,
            ("log_path", "consumer_id", "partition"),
            name="consumer-offsets",
            properties=CONSUMER_OFFSETS_PROPERTIES,
            storage_options=self.storage_options,
            vacuum_hours=1,  # no segment deleter looks after this table
        )

    def read(self, log_path: str | None = None) -> list[CommittedOffset]:
        """Every row (or one log's rows)."""
        rows = self._keyed.rows(None if log_path is None else {"log_path": log_path})
        names = CONSUMER_OFFSETS_SCHEMA.names
        return [CommittedOffset(**{k: r.get(k) for k in names}) for r in rows]

    def consumers(self, log_path: str, *, now_ms: int) -> list[ConsumerState]:
        """The consumers of ``log_path``, sorted by id."""
        by_id: dict[str, list[CommittedOffset]] = {}
        for row in self.read(log_path):
            by_id.setdefault(row.consumer_id, []).append(row)
        states = []
        for consumer_id, rows in sorted(by_id.items()):
            last = max(r.committed_ms for r in rows)
            expiration = max(r.expiration_ms for r in rows)
            states.append(
                ConsumerState(
                    consumer_id=consumer_id,
                    committed={r.partition: r.committed_offset for r in rows},
                    committed_ms=last,
                    expiration_ms=expiration,
                    expired=now_ms - last > expiration,
                )
            )
        return states

    def committed(self, log_path: str, consumer_id: str) -> dict[int, int]:
        """A consumer's committed offsets per partition; empty when it never committed."""
        return {
            r.partition: r.committed_offset
            for r in self.read(log_path)
            if r.consumer_id == consumer_id
        }

    def held_below(
        self,
        log_path: str,
        partitions: Iterable[int],
        *,
        now_ms: int,
        table_id: str | None = None,
        version: int | None = None,
    ) -> dict[int, int]:
        """`held_below` over this table's rows for ``log_path``; with ``table_id`` and
        ``version`` (the log's), rows of another table or history hold nothing."""
        rows = self.read(log_path)
        if table_id is not None and version is not None:
            rows = [r for r in rows if r.other_history(table_id=table_id, version=version) is None]
        return held_below(rows, partitions, now_ms=now_ms)

    def commit(
        self,
        log_path: str,
        consumer_id: str,
        offsets: Mapping[int, int],
        *,
        expiration_ms: int = DEFAULT_CONSUMER_EXPIRATION_MS,
        clock: Callable[[], int] | None = None,
        table_id: str | None = None,
        table_version: int | None = None,
    ) -> None:
        """Upsert a consumer's committed offsets in one commit; retried on conflicts.
        ``table_id`` and ``table_version`` name the log's Delta table and the version the
        offsets were read at, so offsets of another table at the path are told apart.

        Idempotent: committing the same offsets again only moves ``committed_ms``.
        """
        stamp = (clock or now_ms)()
        rows = [
            asdict(
                CommittedOffset(
                    log_path=log_path,
                    consumer_id=consumer_id,
                    partition=int(p),
                    committed_offset=int(o),
                    committed_ms=stamp,
                    expiration_ms=expiration_ms,
                    table_id=table_id,
                    table_version=table_version,
                )
            )
            for p, o in sorted(offsets.items())
        ]
        if rows:
            self._merge(pa.Table.from_pylist(rows, schema=CONSUMER_OFFSETS_SCHEMA))

    def delete(self, log_path: str, consumer_id: str) -> int:
        """Unregister a consumer of ``log_path``: it holds nothing any more; returns rows gone."""
        table = self._table()
        if table is None:
            return 0
        predicate = f"log_path = '{_quote(log_path)}' AND consumer_id = '{_quote(consumer_id)}'"
        metrics = table.delete(predicate)
        return int(metrics.get("num_deleted_rows", 0))

    def _merge(self, source: pa.Table) -> None:
        self._keyed.upsert(source)

    def _table(self) -> DeltaTable | None:
        return self._keyed.table()


def _quote(text: str) -> str:
    return text.replace("'", "''")


def consumer_offsets_uri(checkpoint_table_uri: str) -> str:
    """Where the consumer offsets live: ``_consumer-offsets`` beside the checkpoint table."""
    parent = checkpoint_table_uri.rstrip("/").rsplit("/", 1)[0]
    return f"{parent}/{CONSUMER_OFFSETS_TABLE_NAME}"
