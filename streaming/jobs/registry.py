"""Which logs an operator's command works on, and with what settings.

A cleaner-offset checkpoint table lists the logs it has cleaned (Kafka's
``cleaner-offset-checkpoint`` lists the partitions of a log dir), but not their
key columns or cleaner settings. Both are stored on the log itself: a registered log
no job file describes gets the key and sequence columns the log records
(`sinks.log.log_keys`; read from its schema for a log older than those properties) and
the topic config it stores (`sinks.log.log_config`; defaults for a log older than that),
and `LogRef.inferred` says that no job file was given. A job file's cleaner settings
override the log's, as a process's explicit settings do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from checkpoints import CleanerOffsetCheckpoint
from sinks import CleanerConfig, CompactedStateSink
from sinks.errors import ConfigError
from sinks.log import LogLocation, LogTable, check_new_log_location, normalize_uri
from sinks.log.log_keys import log_keys
from streaming.jobs.job import LogSpec, load_job


@dataclass(frozen=True)
class LogRef:
    """A log to operate on; ``inferred`` when its settings were not given by a job file."""

    spec: LogSpec
    inferred: bool = False

    def sink(self) -> CompactedStateSink:
        return self.spec.sink()


def discover_logs(
    *,
    paths: Sequence[str] = (),
    job_files: Sequence[str] = (),
    checkpoint_tables: Sequence[str] = (),
) -> list[LogRef]:
    """The logs named by path, by job file, or registered in a checkpoint table, deduplicated.

    Settings from a job file win; other logs get inferred settings. A log whose
    table does not exist (yet) is skipped. Raises `ConfigError` when nothing is named, and
    `NotACompactedLogError` for a path named here that is not a log (`sinks.log.ownership`).
    """
    specs: dict[str, LogRef] = {}
    for file in job_files:
        for spec in load_job(file).logs:
            specs.setdefault(normalize_uri(spec.path), LogRef(spec))
    candidates = [normalize_uri(p) for p in paths]
    for table in checkpoint_tables:
        checkpoint = CleanerOffsetCheckpoint(normalize_uri(table))
        for log in checkpoint.logs():
            candidates.append(log)
            if log not in specs:
                ref = infer_log(log, checkpoint_table=normalize_uri(table))
                if ref is not None:
                    specs[log] = ref
    named = {normalize_uri(p) for p in paths}
    for path in candidates:
        if path not in specs:
            ref = infer_log(path)
            if ref is not None:
                specs[path] = ref
            elif path in named:
                check_new_log_location(LogLocation(path))  # no table: someone else's files? say so
    if not specs and not (paths or job_files or checkpoint_tables):
        raise ConfigError("name at least one log path, --config job file or --checkpoint-table")
    return [specs[p] for p in sorted(specs)]


def infer_log(path: str, *, checkpoint_table: str | None = None) -> LogRef | None:
    """Settings for a log no job file describes; None when no table exists at ``path``."""
    snapshot = LogTable(normalize_uri(path)).snapshot()
    if snapshot is None:
        return None
    keys = log_keys(snapshot)  # recorded on the log; read from its schema for older logs
    spec = LogSpec(
        path=normalize_uri(path),
        key_columns=keys.key_columns,
        sequence_column=keys.sequence_column,
        # Nothing set here: the sink applies the log's own config (`sinks.log.log_config`).
        config=CleanerConfig(),
        checkpoint_table=checkpoint_table,
    )
    return LogRef(spec, inferred=True)
