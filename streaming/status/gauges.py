"""`status`: Kafka's log-cleaner gauges, per log and partition, read from Delta metadata alone.

Ports what Kafka's ``LogCleaner`` and ``LogCleanerManager`` publish as metrics:
``max-dirty-percent``, ``max-clean-time-secs``, ``max-buffer-utilization`` (here:
recopy percent, bytes written over bytes read), ``max-compaction-delay-secs``,
``uncleanable-partitions-count`` and ``uncleanable-bytes``. Every figure comes
from the Delta log's file statistics, the log's ``txn`` offsets and the
cleaner-offset checkpoint table: no Spark job runs, so status is cheap.

`StorageStatus` says what the log keeps on disk against what it uses: live
bytes and files, data bytes and files on disk, the bytes removed from the log
and awaiting deletion (and when they go: ``file.delete.delay.ms`` after their
removal), the Delta log's size, and the oldest version time travel still reaches.
It lists the table and reads the last Delta checkpoint plus the commits after it.

This module measures; `streaming.status.status_render` draws what it measures, and
`streaming.status.status_history` measures the log at its past versions.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from checkpoints import ConsumerOffsets, consumer_offsets_uri, split_histories
from sinks import CompactedStateSink
from sinks.cleaner import budget_summary
from sinks.log import COMMIT_INFO_KEY, LogSnapshot, now_ms, oldest_reachable_version, window_of
from sinks.maintenance import take_inventory
from streaming.consumers import consumer_report


@dataclass(frozen=True)
class PartitionStatus:
    """One partition's gauges. Offsets are half-open: the cleanable section is
    ``[first_dirty_offset, first_uncleanable_offset)``."""

    partition: int
    log_start_offset: int
    first_dirty_offset: int
    first_uncleanable_offset: int
    log_end_offset: int
    files: int
    records: int
    size_bytes: int
    dirty_ratio: float
    cleanable: bool
    cleanable_because: str | None
    max_dirty_ratio: float | None
    last_clean_ms: int | None
    last_pass_duration_ms: int | None
    recopy_ratio: float | None
    compaction_delay_ms: int
    cleaner_state: str
    uncleanable_reason: str | None


@dataclass(frozen=True)
class StorageStatus:
    """What one log holds on disk against what it uses, and how far back it reaches."""

    window_ms: int
    live_bytes: int
    live_files: int
    bytes_on_disk: int
    files_on_disk: int
    awaiting_deletion_bytes: int
    awaiting_deletion_files: int
    next_deletion_ms: int | None
    last_deletion_ms: int | None
    delta_log_bytes: int
    delta_log_files: int
    oldest_reachable_version: int
    oldest_reachable_ms: int | None


SCHEMA_LOOKBACK = 100
"""How many of the newest commits `status` searches for schema changes (it reads each
commit's info once: never the whole history)."""


@dataclass(frozen=True)
class SchemaChange:
    """A commit that evolved the log's schema (`sinks.produce.schema_evolution`)."""

    version: int
    timestamp_ms: int
    batch_id: int | None
    changes: tuple[str, ...]


def schema_history(snapshot: LogSnapshot, *, lookback: int = SCHEMA_LOOKBACK) -> list[SchemaChange]:
    """The schema changes among the newest ``lookback`` commits of ``snapshot``, newest first."""
    found = []
    for commit in snapshot.table.history(limit=lookback):
        info = commit.get(COMMIT_INFO_KEY) or {}
        if isinstance(info, str):
            info = json.loads(info)
        if info.get("operation") == "schema":
            found.append(
                SchemaChange(
                    version=int(commit["version"]),
                    timestamp_ms=int(commit["timestamp"]),
                    batch_id=info.get("batchId"),
                    changes=tuple(info.get("changes") or ()),
                )
            )
    return sorted(found, key=lambda c: -c.version)


@dataclass(frozen=True)
class LogStatus:
    """A log's gauges: its partitions, and Kafka's per-cleaner maxima over them."""

    path: str
    version: int
    min_cleanable_dirty_ratio: float
    partitions: tuple[PartitionStatus, ...]
    settings_inferred: bool = False
    storage: StorageStatus | None = None
    cleaner_budget: str = ""  # the Throttler and per-pass budget (`budget_summary`)
    foreign_files: int = 0  # files another engine wrote, for the next pass to rewrite
    foreign_bytes: int = 0
    consumers: tuple[str, ...] = ()  # registered consumers: lag and tombstones held
    schema_changes: tuple[SchemaChange, ...] = ()  # the newest first, within SCHEMA_LOOKBACK
    # (setting, value, source: log / override / default) per topic-level setting applied
    config: tuple[tuple[str, str, str], ...] = ()
    config_stored: bool = True  # False: a log created before topic configs were stored
    checkpoint_notes: tuple[str, ...] = ()  # checkpoint rows found describing another history

    @property
    def size_bytes(self) -> int:
        return sum(p.size_bytes for p in self.partitions)

    @property
    def dirty_ratio(self) -> float:
        cleanable = sum(p.dirty_ratio * p.size_bytes for p in self.partitions)
        return cleanable / self.size_bytes if self.size_bytes else 0.0

    @property
    def max_dirty_ratio(self) -> float:
        return max((p.dirty_ratio for p in self.partitions), default=0.0)

    @property
    def uncleanable(self) -> tuple[PartitionStatus, ...]:
        return tuple(p for p in self.partitions if p.cleaner_state == "uncleanable")

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "version": self.version,
            "min_cleanable_dirty_ratio": self.min_cleanable_dirty_ratio,
            "size_bytes": self.size_bytes,
            "dirty_ratio": round(self.dirty_ratio, 6),
            "max_dirty_ratio": round(self.max_dirty_ratio, 6),
            "uncleanable_partitions": [p.partition for p in self.uncleanable],
            "uncleanable_bytes": sum(p.size_bytes for p in self.uncleanable),
            "settings_inferred": self.settings_inferred,
            "storage": asdict(self.storage) if self.storage else None,
            "cleaner_budget": self.cleaner_budget or "unlimited",
            "foreign_files": self.foreign_files,
            "foreign_bytes": self.foreign_bytes,
            "consumers": list(self.consumers),
            "schema_changes": [asdict(c) for c in self.schema_changes],
            "config": {k: {"value": v, "source": src} for k, v, src in self.config},
            "config_stored": self.config_stored,
            "checkpoint_notes": list(self.checkpoint_notes),
            "partitions": [asdict(p) for p in self.partitions],
        }


def log_status(
    sink: CompactedStateSink, *, now: int | None = None, settings_inferred: bool = False
) -> LogStatus | None:
    """The gauges of ``sink``'s log now; None when the log does not exist yet. Read-only."""
    snapshot = sink.log_table.snapshot()  # status only reads (design.md §28)
    if snapshot is None:
        return None
    now = now_ms() if now is None else now
    config = sink.config
    entries, others = split_histories(
        sink.checkpoints.read(sink.path),
        table_id=snapshot.table_id,
        version=snapshot.version,
        latest_version=lambda: sink.log_table.snapshot(verify=False).version,  # type: ignore[union-attr]
    )
    notes = [
        f"p{p}: checkpoint {why}: ignored; the next pass starts from the log's own record"
        for (_, p), why in sorted(others.items())
    ]
    notes += [
        f"consumer {o.consumer_id} p{o.partition}: committed offset {o.committed_offset} "
        f"{why}: ignored (it holds nothing)"
        for o in ConsumerOffsets(
            consumer_offsets_uri(sink.checkpoint_path), sink.storage_options
        ).read(sink.path)
        if (why := o.other_history(table_id=snapshot.table_id, version=snapshot.version))
    ]
    partitions = []
    for log in sink.logs_to_clean(snapshot):
        segments = snapshot.segments.get(log.partition, [])
        entry = entries.get((sink.path, log.partition))
        because = log.cleanable_because(
            now_ms=now,
            min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
            max_compaction_lag_ms=config.max_compaction_lag_ms,
        )
        recopy = None
        if entry is not None and entry.bytes_read:
            recopy = (entry.bytes_written or 0) / entry.bytes_read
        partitions.append(
            PartitionStatus(
                partition=log.partition,
                log_start_offset=snapshot.log_start_offset(log.partition),
                first_dirty_offset=log.first_dirty_offset,
                first_uncleanable_offset=log.first_uncleanable_offset,
                log_end_offset=snapshot.log_end_offset(log.partition),
                files=len(segments),
                records=sum(s.num_records for s in segments),
                size_bytes=sum(s.size_bytes for s in segments),
                dirty_ratio=log.cleanable_ratio,
                cleanable=because is not None,
                cleanable_because=because,
                max_dirty_ratio=entry.max_dirty_ratio if entry else None,
                last_clean_ms=entry.last_clean_ms if entry else None,
                last_pass_duration_ms=entry.last_pass_duration_ms if entry else None,
                recopy_ratio=recopy,
                compaction_delay_ms=log.compaction_delay_ms(now),
                cleaner_state=entry.cleaner_state if entry else "idle",
                uncleanable_reason=entry.uncleanable_reason if entry else None,
            )
        )
    return LogStatus(
        path=sink.path,
        version=snapshot.version,
        min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
        partitions=tuple(partitions),
        settings_inferred=settings_inferred,
        storage=storage_status(sink, snapshot, now=now),
        cleaner_budget=budget_summary(config),
        foreign_files=len(snapshot.foreign_files),
        foreign_bytes=sum(f.size_bytes for f in snapshot.foreign_files),
        schema_changes=tuple(schema_history(snapshot)),
        consumers=tuple(
            c.line() for c in consumer_report(sink.path, sink.checkpoint_path, now=now)
        ),
        config=tuple(sink.log_config.describe()),
        config_stored=sink.log_config.recorded,
        checkpoint_notes=tuple(notes),
    )


def storage_status(sink: CompactedStateSink, snapshot: LogSnapshot, *, now: int) -> StorageStatus:
    """Disk against live for ``snapshot``, under the window the log's table properties set."""
    window = window_of(snapshot.table)
    inventory = take_inventory(sink.log_table, snapshot)
    waiting = inventory.awaiting_deletion(window)
    goes = [go for _, go in waiting]
    oldest = oldest_reachable_version(
        inventory.delta_log, current_version=snapshot.version, now_ms=now, window_ms=window
    )
    return StorageStatus(
        window_ms=window,
        live_bytes=inventory.live_bytes,
        live_files=len(inventory.live),
        bytes_on_disk=inventory.disk_bytes,
        files_on_disk=len(inventory.on_disk),
        awaiting_deletion_bytes=sum(f.size_bytes for f, _ in waiting),
        awaiting_deletion_files=len(waiting),
        next_deletion_ms=min(goes) if goes else None,
        last_deletion_ms=max(goes) if goes else None,
        delta_log_bytes=inventory.delta_log.size_bytes,
        delta_log_files=inventory.delta_log.files,
        oldest_reachable_version=oldest,
        oldest_reachable_ms=inventory.delta_log.commit_ms.get(oldest),
    )
