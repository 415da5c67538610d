"""The log's own format on disk: what the sink writes into a Delta table besides records.

A compacted log is a plain Delta table; what makes it one is written here, in one place:

- the Delta ``txn`` app ids the sink commits beside its data (each a version per app id,
  Delta's way of recording an application's progress with a commit): each partition's log
  end offset, log start offset and cleaner offset, how many partitions were ever written,
  the last version checked for other engines' changes and the last accepted, and a
  restore's app id. A batch's own ``txn`` (its app id and batch id, design.md §2) is
  `sinks.transactional_id`'s;
- the commit info of the sink's commits (`commit_metadata`: how it knows its own commits,
  and the line other engines' history shows);
- the directories beside the data files: the Delta log, the sink's markers, staging.

Every module that reads or writes one of these names takes it from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TXN_PREFIX = "compacted-sink/"
"""What every ``txn`` app id of the sink's own starts with (a batch's excepted)."""
LOG_END_OFFSET_TXN = TXN_PREFIX + "log-end-offset/{}"
"""Partition p's next offset: offsets keep counting after a restart or after retention
deleted every file."""
LOG_START_OFFSET_TXN = TXN_PREFIX + "log-start-offset/{}"
"""Partition p's first visible offset, set by retention and ``delete_records``."""
CLEANER_OFFSET_TXN = TXN_PREFIX + "cleaner-offset/{}"
"""Where the last committed pass over partition p ended: a crash between a pass's commit and
its checkpoint row is repaired from the log."""
ERASURE_TXN = TXN_PREFIX + "erasure/{}"  # clean below it: an erasure (design.md §54)
PARTITIONS_TXN = TXN_PREFIX + "partitions"  # committed with every append (produce.log_commit)
CHECKED_VERSION_TXN = TXN_PREFIX + "checked-version"
"""The version a commit was planned from: every commit before it was checked for other
engines' data changes (`sinks.log.foreign.commits`)."""
ACCEPTED_VERSION_TXN = TXN_PREFIX + "accepted-version"
RESTORE_APP_ID = TXN_PREFIX + "replay"
ERASE_APP_ID = TXN_PREFIX + "erase"  # the tombstones of an erasure (design.md §54)

DELTA_LOG_DIR = "_delta_log"
MARKER_DIR = "_compacted_sink"
STAGING_DIR = "_staging"

COMMIT_INFO_KEY = "compactedSink"
"""The commit-info entry that marks a commit as the sink's own, with what it did."""

HISTORY_OPERATION_KEY = "compactedSinkOperation"
"""The ``operationParameters`` entry naming a sink commit's operation (``append``, ``clean``,
``absorb``, ``retention``, ``accept-foreign-changes``, ``restore``...): delta-rs writes
every commit's ``operation`` itself (``WRITE``, ``RESTORE``) and refuses to let a writer
set it, so ``DESCRIBE HISTORY`` tells the sink's commits apart by this parameter and by
``userMetadata``."""


def commit_metadata(info: Mapping[str, Any]) -> dict[str, Any]:
    """The commit-info entries of one of the sink's commits: ``info`` under `COMMIT_INFO_KEY`
    (how the sink knows its own commits), Delta's ``userMetadata``, the line other engines'
    history shows, and the operation among ``operationParameters`` (`HISTORY_OPERATION_KEY`;
    ``DESCRIBE HISTORY``'s ``operation`` is delta-rs's ``WRITE`` for every file commit)."""
    return {
        COMMIT_INFO_KEY: dict(info),
        "userMetadata": history_line(info),
        "operationParameters": {HISTORY_OPERATION_KEY: str(info.get("operation", "commit"))},
    }


def history_line(info: Mapping[str, Any]) -> str:
    """One line that tells a person what a commit of the sink did. Pure."""
    operation = str(info.get("operation", "commit"))
    if operation == "append":
        return f"compacted-sink append: batch {info.get('batchId')} of {info.get('appId')}"
    if operation == "clean":
        ends = info.get("endOffsets") or {}
        partitions = ", ".join(f"{p} to offset {e}" for p, e in sorted(ends.items()))
        return (
            f"compacted-sink clean: pass over partition(s) {partitions}; records "
            f"{info.get('recordsRead')} read, {info.get('recordsWritten')} written "
            "(dataChange=false)"
        )
    if operation == "schema":
        return f"compacted-sink schema change: before batch {info.get('batchId')}"
    if operation == "accept-foreign-changes":
        return (
            f"compacted-sink accept: other engines' changes through version "
            f"{info.get('throughVersion')}, offsets re-derived from the records"
        )
    if operation == "restore":
        return f"compacted-sink restore: back to version {info.get('toVersion')}"
    return f"compacted-sink {operation}"
