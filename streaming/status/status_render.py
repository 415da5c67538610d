"""The `status` report: the gauges of `streaming.status.gauges` as a table, as JSON, and as a plot.

Pure formatting over `LogStatus` values (and `HistoryPoint` series for the plot):
nothing here reads a log. Times are UTC.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sinks.cleaner import format_bytes
from sinks.errors import ConfigError

if TYPE_CHECKING:
    from streaming.status.gauges import LogStatus, PartitionStatus, StorageStatus
    from streaming.status.status_history import HistoryPoint


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


def render_config(status: LogStatus) -> str:
    """One line: every topic-level setting applied, and where it comes from."""
    where = "stored on the log" if status.config_stored else "not stored on the log"
    settings = ", ".join(f"{k}={v} ({source})" for k, v, source in status.config)
    return f"  config ({where}): {settings}"


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
    blocks = ["\n".join([_heading(s), *_partition_table(s), *_notes(s)]) for s in statuses]
    return "\n\n".join(blocks) if blocks else "no logs found"


def _heading(status: LogStatus) -> str:
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
        heading += "  [no job file given: the log's settings]"
    if status.cleaner_budget:
        heading += f"\n  cleaner limits: {status.cleaner_budget}"
    return heading


def _partition_table(status: LogStatus) -> list[str]:
    """The column names, then one row per partition, each column aligned as `_COLUMNS` says."""
    rows = [[name for name, _ in _COLUMNS], *(_partition_row(p) for p in status.partitions)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if align == ">" else cell.ljust(w)
            for cell, w, (_, align) in zip(row, widths, _COLUMNS, strict=True)
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def _partition_row(p: PartitionStatus) -> list[str]:
    return [
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
        "-" if p.last_pass_duration_ms is None else f"{p.last_pass_duration_ms / 1000:.1f} s",
        "-" if p.recopy_ratio is None else f"{p.recopy_ratio:.0%}",
        _duration(p.compaction_delay_ms),
        p.cleaner_state,
    ]


def _notes(status: LogStatus) -> list[str]:
    """The lines below the table: storage, foreign files, consumers, schema changes, reasons."""
    lines = [render_config(status), *(f"  {note}" for note in status.checkpoint_notes)]
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
    return lines


def render_json(statuses: Sequence[LogStatus]) -> str:
    return json.dumps({"logs": [s.to_dict() for s in statuses]}, indent=2)


def check_plotting() -> None:
    """Raise `ConfigError` when matplotlib, which `plot_history` draws with, is not installed
    (it is the ``plot`` extra, not a dependency of the sink)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            "status --plot needs matplotlib, which is not installed: "
            "pip install 'compacted-sink[plot]' (or pip install matplotlib)"
        ) from e


def plot_history(
    series: dict[str, list[HistoryPoint]], file: str, *, threshold: float | None
) -> str:
    """Draw dirty ratio and log size over time for each log into a PNG; returns the file.

    Raises `ConfigError` when matplotlib is not installed (`check_plotting`).
    """
    check_plotting()
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
