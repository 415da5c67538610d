"""The two ways on after another engine changed a log's records: accept, or restore.

`sinks.log.foreign.commits` stops the sink at a commit another engine made that
added or removed records (DELETE, UPDATE, MERGE, an overwrite, RESTORE). An
operator then chooses:

- `accept`: the records are what they now are. The sink records the accepted
  version in the log (``compacted-sink/accepted-version``) and checks only later
  commits. Files the other engine wrote are rewritten into segments by the next
  pass; what it deleted stays deleted.
- `restore_version`: the log goes back to a version before the change (Delta's RESTORE,
  made by the sink so it is its own commit), inside the history window. The
  sink's offsets are set as they were then, except the log end offset, which keeps
  counting (offsets never repeat). Everything after that version is undone,
  including batches the sink appended since.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sinks.errors import CompactedSinkError
from sinks.log.foreign.acceptance import Acceptance, plan_acceptance
from sinks.log.log_format import (
    ACCEPTED_VERSION_TXN,
    CHECKED_VERSION_TXN,
    CLEANER_OFFSET_TXN,
    LOG_END_OFFSET_TXN,
    LOG_START_OFFSET_TXN,
    commit_metadata,
)
from sinks.log.log_table import LogSnapshot, LogTable, now_ms

logger = logging.getLogger("compacted_sink")


def accept(
    log: LogTable, through_version: int | None = None, *, key_columns: Sequence[str] = ("key",)
) -> Acceptance:
    """Accept every commit up to ``through_version`` (default: the current one) as it is,
    re-deriving the log's offsets from its records in the same commit
    (`sinks.log.foreign.acceptance`); returns what was committed.

    Raises `ForeignChangeError` for rows the log cannot take (a null partition, offset or
    key; an offset another live record holds), naming the version and the rows' count;
    ``ValueError`` for a version the log does not have. Idempotent.
    """
    snapshot = _current(log)
    version = snapshot.version if through_version is None else through_version
    if not 0 <= version <= snapshot.version:
        raise ValueError(f"log {log.uri} has versions 0 to {snapshot.version}, not {version}")
    plan = plan_acceptance(log, snapshot, version, key_columns)
    snapshot.commit(data_change=False, transactions=plan.transactions(), info=plan.info())
    if plan.reset:
        logger.warning(
            "log %s: accepted through version %d; partition(s) %s are dirty again (%s): "
            "readers merge them whole until the next pass cleans them",
            log.uri,
            version,
            ", ".join(map(str, sorted(plan.reset))),
            "; ".join(f"{p}: {why}" for p, why in sorted(plan.reset.items())),
        )
    return plan


def restore_version(log: LogTable, version: int) -> int:
    """Restore the log to ``version`` in one commit of the sink's own; returns the new version.

    Raises `HistoryExpiredError` when ``version`` lies before the history window, and
    `CompactedSinkError` when a file that version needs is gone.
    """
    current = _current(log)
    target = log.snapshot(version, verify=False)
    assert target is not None
    offsets = {CHECKED_VERSION_TXN: current.version, ACCEPTED_VERSION_TXN: current.version}
    for p in current.partitions:
        offsets[LOG_END_OFFSET_TXN.format(p)] = current.log_end_offset(p)
        offsets[LOG_START_OFFSET_TXN.format(p)] = target.log_start_offset(p)
        # No pass recorded then: a cleaner offset of 0 makes every segment dirty.
        offsets[CLEANER_OFFSET_TXN.format(p)] = target.cleaner_offset(p) or 0
    stamp = now_ms()
    try:
        current.committer.restore(
            current.table_to_change(),
            version,
            transactions=offsets,
            metadata=commit_metadata({"operation": "restore", "toVersion": version}),
            timestamp_ms=stamp,
        )
    except Exception as e:  # delta-rs reports missing files in several ways
        raise CompactedSinkError(
            f"log {log.uri}: cannot restore version {version} ({e}); the files it needs "
            "must still be on storage (inside the history window)"
        ) from e
    after = log.snapshot()
    assert after is not None
    return after.version


def _current(log: LogTable) -> LogSnapshot:
    snapshot = log.snapshot(verify=False)
    if snapshot is None:
        raise FileNotFoundError(f"no compacted log at {log.uri}")
    return snapshot
