"""Why a partition is not cleanable now: design.md §4's three triggers, each said in numbers.

Kafka's cleaner says nothing when it skips a log; an operator who runs ``clean
--once`` and sees nothing cleaned wants to know which trigger is missing: the
dirty ratio against ``min.cleanable.dirty.ratio``, the oldest dirty record's age
against ``max.compaction.lag.ms``, and when the next stamped tombstone is due.
Pure: plain numbers from `LogToClean` and the config, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from sinks.cleaner.log_to_clean import LogToClean
from sinks.config import (
    LONG_MAX,
    MAX_COMPACTION_LAG_MS,
    MIN_CLEANABLE_DIRTY_RATIO,
    MIN_COMPACTION_LAG_MS,
    CleanerConfig,
)


def why_not_cleanable(log: LogToClean, config: CleanerConfig, *, now_ms: int) -> str:
    """One clause for partition ``log``: why none of design.md §4's triggers holds (``p0: ...``).

    Meant for a partition `LogToClean.is_cleanable` refused without ``force``.
    """
    reasons = []
    if log.cleanable_bytes == 0:
        if log.first_dirty_offset < log.first_uncleanable_offset:
            reasons.append("no cleanable bytes")
        elif config.min_compaction_lag_ms > 0:
            reasons.append(
                f"no cleanable bytes (dirty records are younger than {MIN_COMPACTION_LAG_MS} "
                f"{_duration(config.min_compaction_lag_ms)})"
            )
        else:
            reasons.append("no dirty records")
    else:
        reasons.append(
            f"dirty ratio {log.cleanable_ratio:.2f} not above "
            f"{MIN_CLEANABLE_DIRTY_RATIO} {config.min_cleanable_dirty_ratio:g}"
        )
        if config.max_compaction_lag_ms < LONG_MAX:
            reasons.append(
                f"oldest dirty record {_duration(log.compaction_delay_ms(now_ms))} old, "
                f"not past {MAX_COMPACTION_LAG_MS} {_duration(config.max_compaction_lag_ms)}"
            )
    horizon = log.earliest_delete_horizon_ms
    if horizon is not None:
        reasons.append(f"next tombstone due in {_duration(max(0, horizon - now_ms))}")
    return f"p{log.partition}: " + ", ".join(reasons)


def nothing_cleanable_line(
    log_path: str, logs: Iterable[LogToClean], config: CleanerConfig, *, now_ms: int
) -> str:
    """The line ``clean`` prints for a log it did not clean: each partition's reason."""
    if not config.compact:
        return f"{log_path}: not cleaned: cleanup.policy={config.cleanup_policy} (no compact)"
    clauses = [why_not_cleanable(log, config, now_ms=now_ms) for log in logs]
    if not clauses:
        return f"{log_path}: nothing to clean: the log has no records"
    return f"{log_path}: nothing to clean: " + "; ".join(clauses)


def _duration(ms: int) -> str:
    if ms < 1_000:
        return f"{ms} ms"
    seconds = ms / 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"
