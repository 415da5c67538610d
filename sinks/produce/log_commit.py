"""The commit half of an append: the batch's Delta commit, and what an append leaves.

`commit_append` commits a batch's files with its ``txn`` (app id, batch id) and each
written partition's new log end offset; `commit_empty` records an empty batch's id;
`moved` tells whether another writer took the offsets a batch was numbered with;
`discard` deletes files an append will not commit. Used by
`sinks.produce.log_append.AppendAttempt`, which decides when.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import pyarrow.fs as pafs

from sinks.log.log_format import LOG_END_OFFSET_TXN, PARTITIONS_TXN
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.segment_writer import WrittenSegment

logger = logging.getLogger("compacted_sink")


def commit_append(
    snapshot: LogSnapshot, written: Sequence[WrittenSegment], app_id: str, batch_id: int
) -> None:
    """Commit ``written`` against ``snapshot`` with the batch's ``txn`` and new log end offsets.

    One Delta commit (design.md §2). Raises `ConcurrentCommitError` on a conflict; the
    caller refreshes and decides (`AppendAttempt.commit`). Not idempotent by itself:
    the caller checks `committed` first.
    """
    ends: dict[int, int] = {}
    for w in written:
        ends[w.partition] = max(ends.get(w.partition, 0), w.last_offset + 1)
    transactions = {app_id: batch_id}
    transactions.update({LOG_END_OFFSET_TXN.format(p): end for p, end in ends.items()})
    partitions = max([*ends, *snapshot.partitions, -1]) + 1
    if partitions > (snapshot.txn_version(PARTITIONS_TXN) or 0):
        transactions[PARTITIONS_TXN] = partitions
    snapshot.commit(
        adds=written,
        data_change=True,
        transactions=transactions,
        info={"operation": "append", "appId": app_id, "batchId": batch_id},
    )


def commit_empty(snapshot: LogSnapshot, app_id: str, batch_id: int) -> None:
    """Record an empty batch's id so that it stays skipped after a restart: one Delta commit
    of no file. Raises `ConcurrentCommitError` on a conflict."""
    snapshot.commit(
        data_change=False,
        transactions={app_id: batch_id},
        info={"operation": "append", "appId": app_id, "batchId": batch_id},
    )


def discard(log: LogTable, written: Sequence[WrittenSegment], *, new_log: bool = False) -> None:
    """Delete files an append wrote and will not commit.

    ``new_log``: no table existed, so the partition directories and the log's own
    directory go too when they are left empty (a bad first batch leaves no trace).
    Idempotent: a file already gone is skipped.
    """
    log.location.delete_files(w.path for w in written)
    if new_log:
        directories = sorted({w.path.rsplit("/", 1)[0] for w in written if "/" in w.path})
        _remove_empty_directories(log, [*directories, ""])


def moved(
    snapshot: LogSnapshot, written: Sequence[WrittenSegment], end_offsets: Mapping[int, int]
) -> bool:
    """True when another writer moved the log end offset of a partition ``written`` holds
    (``end_offsets`` are those the files were numbered from). Pure."""
    return any(
        snapshot.log_end_offset(p) != end_offsets.get(p, 0) for p in {w.partition for w in written}
    )


def overlapping(written: Sequence[WrittenSegment]) -> bool:
    """True when two of the files hold overlapping offsets of one partition (tasks that read
    Kafka input without a shuffle held the same offsets: a repeat the tasks could not see).
    Pure."""
    last_by_partition: dict[int, int] = {}
    for w in sorted(written, key=lambda w: (w.partition, w.base_offset)):
        if w.base_offset <= last_by_partition.get(w.partition, -1):
            return True
        last_by_partition[w.partition] = w.last_offset
    return False


def _remove_empty_directories(log: LogTable, directories: Sequence[str]) -> None:
    """Remove each directory (relative to the log; "" is the log's own) that holds nothing."""
    fs, root = log.location.filesystem()
    for relative in directories:
        path = f"{root}/{relative}".rstrip("/")
        try:
            if fs.get_file_info(path).type != pafs.FileType.Directory:
                continue  # object stores have no directories
            if not fs.get_file_info(pafs.FileSelector(path)):
                fs.delete_dir(path)
        except OSError as e:
            logger.info("could not remove empty directory %s: %s", path, e)
