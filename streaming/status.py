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

`history` walks the log's Delta versions still reachable (each commit's
``compactedSink`` metadata says whether it was an append or a pass) and `plot_history` draws
dirty ratio and log size over time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from deltalake import DeltaTable

from sinks import CompactedStateSink
from sinks.cleaner.cleaner_stats import format_bytes
from sinks.cleaner.log_to_clean import LogToClean, cleanable_offsets, dirty_ratio, log_to_clean
from sinks.cleaner.throttler import budget_summary
from sinks.log.history_window import list_delta_log, oldest_reachable_version, window_of
from sinks.log.log_table import COMMIT_INFO_KEY, LogSnapshot, now_ms
from sinks.maintenance.file_inventory import take_inventory
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
    """A commit that evolved the log's schema (`sinks.log.schema_evolution`)."""

    version: int
    timestamp_ms: int
    batch_id: int | None
    changes: tuple[str, ...]


def schema_changes(snapshot: LogSnapshot, *, lookback: int = SCHEMA_LOOKBACK) -> list[SchemaChange]:
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
            "partitions": [asdict(p) for p in self.partitions],
        }


def log_status(
    sink: CompactedStateSink, *, now: int | None = None, settings_inferred: bool = False
) -> LogStatus | None:
    """The gauges of ``sink``'s log now; None when the log does not exist yet. Read-only."""
    snapshot = sink.log_table.snapshot()
    if snapshot is None:
        return None
    now = now_ms() if now is None else now
    config = sink.config
    entries = sink.checkpoints.read(sink.path)
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
        schema_changes=tuple(schema_changes(snapshot)),
        consumers=tuple(
            c.line() for c in consumer_report(sink.path, sink.checkpoint_path, now=now)
        ),
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


def render_storage(storage: StorageStatus) -> str:
    """One line: disk against live, what awaits deletion and when, the Delta log, time travel."""
    waiting = "nothing awaits deletion"
    if storage.awaiting_deletion_files:
        waiting = (
            f"{format_bytes(storage.awaiting_deletion_bytes)} in "
            f"{storage.awaiting_deletion_files} removed file(s) await deletion, from "
            f"{_time(storage.next_deletion_ms)} to {_time(storage.last_deletion_ms)}"
        )
    return (
        f"  storage: live {format_bytes(storage.live_bytes)} in {storage.live_files} file(s); "
        f"on disk {format_bytes(storage.bytes_on_disk)} in {storage.files_on_disk} file(s); "
        f"{waiting}; Delta log {format_bytes(storage.delta_log_bytes)} in "
        f"{storage.delta_log_files} file(s); time travel reaches v"
        f"{storage.oldest_reachable_version} ({_time(storage.oldest_reachable_ms)}), window "
        f"{_duration(storage.window_ms)}"
    )


_COLUMNS = (
    ("part", ">"),
    ("start", ">"),
    ("first dirty", ">"),
    ("uncleanable", ">"),
    ("end", ">"),
    ("files", ">"),
    ("size", ">"),
    ("dirty %", ">"),
    ("max dirty %", ">"),
    ("last pass (UTC)", "<"),
    ("took", ">"),
    ("recopy %", ">"),
    ("delay", ">"),
    ("state", "<"),
)


def render_table(statuses: Sequence[LogStatus]) -> str:
    """A plain-text report: one heading line per log, one row per partition, reasons below."""
    blocks = []
    for status in statuses:
        cleanable = [
            f"p{p.partition} ({p.cleanable_because})" for p in status.partitions if p.cleanable
        ]
        heading = (
            f"{status.path}  (Delta v{status.version}, {len(status.partitions)} partitions, "
            f"{format_bytes(status.size_bytes)}; dirty {status.dirty_ratio:.1%}, max dirty "
            f"{status.max_dirty_ratio:.1%}, min.cleanable.dirty.ratio "
            f"{status.min_cleanable_dirty_ratio}; cleanable now: {' '.join(cleanable) or 'none'}; "
            f"uncleanable: {len(status.uncleanable)})"
        )
        if status.settings_inferred:
            heading += "  [settings inferred: no job file given]"
        if status.cleaner_budget:
            heading += f"\n  cleaner limits: {status.cleaner_budget}"
        rows = [[name for name, _ in _COLUMNS]]
        for p in status.partitions:
            rows.append(
                [
                    str(p.partition),
                    str(p.log_start_offset),
                    str(p.first_dirty_offset),
                    str(p.first_uncleanable_offset),
                    str(p.log_end_offset),
                    str(p.files),
                    format_bytes(p.size_bytes),
                    f"{p.dirty_ratio:.1%}",
                    "-" if p.max_dirty_ratio is None else f"{p.max_dirty_ratio:.1%}",
                    _time(p.last_clean_ms),
                    "-"
                    if p.last_pass_duration_ms is None
                    else f"{p.last_pass_duration_ms / 1000:.1f} s",
                    "-" if p.recopy_ratio is None else f"{p.recopy_ratio:.0%}",
                    _duration(p.compaction_delay_ms),
                    p.cleaner_state,
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
        lines = [heading]
        for row in rows:
            cells = [
                cell.rjust(w) if align == ">" else cell.ljust(w)
                for cell, w, (_, align) in zip(row, widths, _COLUMNS, strict=True)
            ]
            lines.append("  " + "  ".join(cells).rstrip())
        if status.storage is not None:
            lines.append(render_storage(status.storage))
        if status.foreign_files:
            lines.append(
                f"  another engine's files: {status.foreign_files} "
                f"({format_bytes(status.foreign_bytes)}), read as dirty; the next pass rewrites "
                "them into segments"
            )
        lines += [f"  consumer {line}" for line in status.consumers]
        lines += [
            f"  schema changed at v{c.version} ({_time(c.timestamp_ms)}, batch {c.batch_id}): "
            + "; ".join(c.changes)
            for c in status.schema_changes
        ]
        for p in status.uncleanable:
            lines.append(
                f"  p{p.partition} uncleanable: {p.uncleanable_reason or 'no reason recorded'}"
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "no logs found"


def render_json(statuses: Sequence[LogStatus]) -> str:
    return json.dumps({"logs": [s.to_dict() for s in statuses]}, indent=2)


@dataclass(frozen=True)
class HistoryPoint:
    """The log at one Delta version: its size and dirty ratio, and what the commit was."""

    version: int
    timestamp_ms: int
    operation: str
    size_bytes: int
    dirty_ratio: float


def history(sink: CompactedStateSink, *, max_points: int = 120) -> list[HistoryPoint]:
    """Size and dirty ratio of the log at (at most ``max_points``) versions, oldest first.

    The first dirty offset at each version comes from the cleaner-offset ``txn``
    the log recorded by then, so the ratio is the one the cleaner saw at the time
    (the checkpoint table only holds today's rows).
    """
    table = DeltaTable(sink.path, storage_options=sink.storage_options or None)
    listing = list_delta_log(sink.path, sink.storage_options)
    oldest = oldest_reachable_version(
        listing, current_version=table.version(), now_ms=now_ms(), window_ms=window_of(table)
    )
    commits = {
        c["version"]: c for c in table.history() if "version" in c and c["version"] >= oldest
    }
    versions = sorted(commits)
    if len(versions) > max_points:
        step = (len(versions) - 1) / (max_points - 1)
        versions = sorted({versions[round(i * step)] for i in range(max_points)})
    points = []
    for version in versions:
        snapshot = sink.log_table.snapshot(version)
        if snapshot is None:
            continue
        info = commits[version].get(COMMIT_INFO_KEY) or {}
        if isinstance(info, str):
            info = json.loads(info)
        at = int(commits[version]["timestamp"])
        logs = [
            _as_it_was(snapshot, p, now=at, min_compaction_lag_ms=sink.config.min_compaction_lag_ms)
            for p in snapshot.partitions
        ]
        points.append(
            HistoryPoint(
                version=version,
                timestamp_ms=at,
                operation=info.get("operation", commits[version].get("operation", "?")),
                size_bytes=sum(s.size_bytes for s in snapshot.data_files()),
                dirty_ratio=dirty_ratio(logs),
            )
        )
    return points


def _as_it_was(
    snapshot: LogSnapshot, partition: int, *, now: int, min_compaction_lag_ms: int
) -> LogToClean:
    """A partition measured from one version alone: the cleaner offset the log recorded
    by then (the log start before any pass), never today's checkpoint row."""
    segments = snapshot.segments.get(partition, [])
    offsets = cleanable_offsets(
        segments,
        checkpoint_dirty_offset=snapshot.cleaner_offset(partition),
        log_start_offset=snapshot.log_start_offset(partition),
        log_end_offset=snapshot.log_end_offset(partition),
        now_ms=now,
        min_compaction_lag_ms=min_compaction_lag_ms,
    )
    return log_to_clean(snapshot.uri, partition, segments, offsets)


def plot_history(
    series: dict[str, list[HistoryPoint]], file: str, *, threshold: float | None
) -> str:
    """Draw dirty ratio and log size over time for each log into a PNG; returns the file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (ratio_axis, size_axis) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for path, points in series.items():
        if not points:
            continue
        name = path.rstrip("/").rsplit("/", 1)[-1]
        times = [datetime.fromtimestamp(p.timestamp_ms / 1000, UTC) for p in points]
        ratio_axis.plot(
            times, [100 * p.dirty_ratio for p in points], drawstyle="steps-post", label=name
        )
        size_axis.plot(
            times, [p.size_bytes / 1024 for p in points], drawstyle="steps-post", label=name
        )
        passes = [(t, p) for t, p in zip(times, points, strict=True) if p.operation == "clean"]
        if passes:
            size_axis.plot(
                [t for t, _ in passes],
                [p.size_bytes / 1024 for _, p in passes],
                "v",
                markersize=4,
                label=f"{name}: cleaning pass",
            )
    if threshold is not None:
        ratio_axis.axhline(
            100 * threshold, linestyle="--", color="grey", label="min.cleanable.dirty.ratio"
        )
    ratio_axis.set_ylabel("dirty ratio (%)")
    ratio_axis.set_title("compacted log: dirty ratio and size per Delta commit")
    size_axis.set_ylabel("log size (KiB)")
    size_axis.set_xlabel("commit time (UTC)")
    for axis in (ratio_axis, size_axis):
        axis.grid(alpha=0.3)
        # Beside the plot, not over it: a log's first spike sits in the upper left corner.
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", borderaxespad=0)
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(file, dpi=110)
    plt.close(figure)
    return file


def _time(ms: int | None) -> str:
    if ms is None:
        return "never"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(ms: int) -> str:
    if ms <= 0:
        return "0 s"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
