"""Recovery when a sink or cleaner opens a log (Kafka's ``LogLoader``): design.md §25.

`recover_log` deletes the sink's own orphan files and killed appends' staging
directories, reconciles the checkpoint rows with the log, verifies offsets and writes
the clean-shutdown marker last. The planning helpers (`find_orphans`,
`reconciled_dirty_offset`, `offset_problems`) are pure; the rest read or write storage.
Every step is idempotent: a crash during recovery is recovered by the next open.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint, split_histories
from checkpoints import now_ms as wall_clock_ms
from checkpoints.cleaner_states import live_claims
from sinks.crash_points import RECOVERY_AFTER_ORPHAN_DELETED, RECOVERY_BEFORE_MARKER, crash_point
from sinks.errors import LogCorruptedError
from sinks.log.log_format import MARKER_DIR, STAGING_DIR
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.ownership import foreign_files, is_own_data_path, is_staged_write
from sinks.log.segment import Segment
from sinks.maintenance.file_inventory import FileOnDisk, list_data_files, referenced_paths

logger = logging.getLogger("compacted_sink")

CLEAN_SHUTDOWN_MARKER = f"{MARKER_DIR}/clean-shutdown.json"


@dataclass(frozen=True)
class RecoveryReport:
    """What one recovery did; ``full`` when it read every file's offsets."""

    version: int | None
    orphans_removed: tuple[str, ...] = ()
    orphans_kept_young: tuple[str, ...] = ()
    not_ours: tuple[str, ...] = ()
    checkpoint_changes: Mapping[int, tuple[int | None, int]] = field(default_factory=dict)
    files_checked: int = 0
    full: bool = False
    duration_ms: int = 0

    def summary(self) -> str:
        """One line for the log saying what this recovery did; pure."""
        return (
            f"recovered at version {self.version}: {len(self.orphans_removed)} orphan file(s) "
            f"removed ({len(self.orphans_kept_young)} too young), "
            f"{len(self.not_ours)} file(s) not ours left alone, checkpoint changes "
            f"{dict(self.checkpoint_changes)}, {self.files_checked} file(s) "
            f"{'fully ' if self.full else ''}checked in {self.duration_ms} ms"
        )


# -- pure planning ---------------------------------------------------------------------------


def find_orphans(
    files: Iterable[FileOnDisk],
    referenced: set[str],
    *,
    now_ms: int,
    file_delete_delay_ms: int,
    protected_partitions: Iterable[int] = (),
) -> tuple[list[str], list[str]]:
    """The sink's own data files not in ``referenced``: (old enough to delete, too young).

    Never returns a file outside the sink's naming (`is_own_data_path`) or under a
    ``protected_partitions`` directory (a live pass may be about to commit it).
    Pure; raises nothing.
    """
    protected = {f"partition-{p}/" for p in protected_partitions}
    old, young = [], []
    for f in sorted(files, key=lambda f: f.path):
        if f.path in referenced or any(f.path.startswith(d) for d in protected):
            continue
        if not is_own_data_path(f.path):
            continue
        (old if now_ms - f.mtime_ms >= file_delete_delay_ms else young).append(f.path)
    return old, young


def reconciled_dirty_offset(
    *,
    log_cleaner_offset: int | None,
    checkpointed: int | None,
    log_start_offset: int,
    log_end_offset: int,
) -> int | None:
    """The first dirty offset the checkpoint must hold (None: leave the partition unrecorded).

    ``log_cleaner_offset`` (the log's own record of the last pass) wins over
    ``checkpointed``; an offset outside ``[log_start_offset, log_end_offset]`` resets to
    the log start. Pure; raises nothing.
    """
    target = log_cleaner_offset if log_cleaner_offset is not None else checkpointed
    if target is None:
        return None
    if target < log_start_offset or target > log_end_offset:
        return log_start_offset
    return target


def offset_problems(
    segments: Mapping[int, Sequence[Segment]], log_end_offsets: Mapping[int, int]
) -> list[str]:
    """What is wrong with each partition's file offset ranges: one message per problem,
    empty when the ranges are disjoint, increasing and below ``log_end_offsets``.

    Reads metadata only; pure; raises nothing.
    """
    problems = []
    for partition, files in sorted(segments.items()):
        previous: Segment | None = None
        for s in sorted(files):
            if s.last_offset < s.base_offset or s.num_records > s.last_offset - s.base_offset + 1:
                problems.append(
                    f"partition {partition}: {s.path} claims {s.num_records} records in "
                    f"[{s.base_offset}, {s.last_offset}]"
                )
            if previous is not None and s.base_offset <= previous.last_offset:
                problems.append(
                    f"partition {partition}: {s.path} [{s.base_offset}, {s.last_offset}] "
                    f"overlaps {previous.path} [{previous.base_offset}, {previous.last_offset}]"
                )
            previous = s
        end = log_end_offsets.get(partition)
        if previous is not None and end is not None and previous.last_offset >= end:
            problems.append(
                f"partition {partition}: offset {previous.last_offset} is at or above "
                f"the log end offset {end}"
            )
    return problems


# -- I/O -------------------------------------------------------------------------------------


def recover_log(
    log: LogTable,
    checkpoints: CleanerOffsetCheckpoint,
    *,
    file_delete_delay_ms: int,
    busy_partitions: Iterable[int] | None = None,
    now_ms: int | None = None,
) -> RecoveryReport:
    """Bring a log and its checkpoint rows back to a consistent state (design.md §25).

    ``now_ms`` (default: wall clock, as file modification times are) ages orphans;
    ``busy_partitions`` (default: the partitions with a live claim in ``checkpoints``)
    are spared. Returns a `RecoveryReport` (``version`` None for a log with no commit).
    Raises `LogCorruptedError` when offsets are broken, before the marker is written;
    orphans are deleted by then, nothing else. Idempotent, safe to retry.
    """
    started = time.monotonic()
    snapshot = log.snapshot(repair=True)  # a writer's first step (design.md §66)
    if snapshot is None:
        return RecoveryReport(version=None)
    now = wall_clock_ms() if now_ms is None else now_ms
    if busy_partitions is None:
        busy_partitions = live_claims(checkpoints.read(log.uri).values(), now_ms=now)
    removed, young, not_ours = remove_orphans(
        log,
        snapshot,
        file_delete_delay_ms=file_delete_delay_ms,
        now_ms=now,
        protected_partitions=busy_partitions,
    )
    staged_removed, staged_young = remove_staged_writes(
        log, file_delete_delay_ms=file_delete_delay_ms, now_ms=now
    )
    removed, young = [*removed, *staged_removed], [*young, *staged_young]
    changes = reconcile_checkpoint(snapshot, checkpoints)
    verified = read_clean_shutdown_marker(log)
    problems = offset_problems(snapshot.segments, snapshot.log_end_offsets())
    to_check = _files_added_since(log, snapshot, verified)
    problems += [p for s in to_check for p in file_offset_problems(log, s)]
    if problems:
        raise LogCorruptedError(
            f"log {log.uri} at version {snapshot.version}: " + "; ".join(problems[:20])
        )
    crash_point(RECOVERY_BEFORE_MARKER)
    write_clean_shutdown_marker(log, snapshot.version)
    report = RecoveryReport(
        version=snapshot.version,
        orphans_removed=tuple(removed),
        orphans_kept_young=tuple(young),
        not_ours=tuple(not_ours),
        checkpoint_changes=changes,
        files_checked=len(to_check),
        full=verified is None,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    logger.info("%s: %s", log.uri, report.summary())
    if not_ours:
        logger.warning(
            "%s: %d file(s) inside the log that it did not write and no commit names, not "
            "ours, left alone: %s",
            log.uri,
            len(not_ours),
            ", ".join(not_ours[:5]) + (" ..." if len(not_ours) > 5 else ""),
        )
    return report


def remove_orphans(
    log: LogTable,
    snapshot: LogSnapshot,
    *,
    file_delete_delay_ms: int,
    now_ms: int,
    protected_partitions: Iterable[int] = (),
) -> tuple[list[str], list[str], list[str]]:
    """Delete the sink's own data files no commit references and older than the grace period.

    Returns (deleted, kept because too young, someone else's: left alone). The directory
    is listed before the references are read (design.md §25). Idempotent: a file
    already gone is skipped.
    """
    files = list_data_files(log)
    referenced = referenced_paths(log, snapshot)
    old, young = find_orphans(
        files,
        referenced,
        now_ms=now_ms,
        file_delete_delay_ms=file_delete_delay_ms,
        protected_partitions=protected_partitions,
    )
    not_ours = foreign_files((f.path for f in files), referenced)
    fs, root = log.location.filesystem()
    for path in old:
        try:
            fs.delete_file(f"{root}/{path}")
        except FileNotFoundError:
            pass  # another recovery got there first
        crash_point(RECOVERY_AFTER_ORPHAN_DELETED)
    return old, young, not_ours


def remove_staged_writes(
    log: LogTable, *, file_delete_delay_ms: int, now_ms: int
) -> tuple[list[str], list[str]]:
    """Delete the staging directories of killed appends (``_staging/<32 hex>/``, written by
    `sinks.produce.spark_append`) whose newest entry is older than ``file_delete_delay_ms``.

    Returns (deleted, kept because too young); nothing else in ``_staging`` is touched
    (design.md §26). Idempotent: a directory already gone is skipped.
    """
    fs, root = log.location.filesystem()
    staging = f"{root}/{STAGING_DIR}"
    try:
        entries = fs.get_file_info(pafs.FileSelector(staging, allow_not_found=True))
    except NotADirectoryError:
        return [], []
    removed, young = [], []
    for entry in entries:
        relative = f"{STAGING_DIR}/{entry.base_name}"
        if entry.type != pafs.FileType.Directory or not is_staged_write(relative):
            continue
        inside = fs.get_file_info(pafs.FileSelector(entry.path, recursive=True))
        newest = max(
            (i.mtime.timestamp() * 1000 for i in [entry, *inside] if i.mtime is not None),
            default=0,
        )
        if now_ms - newest < file_delete_delay_ms:
            young.append(relative + "/")
            continue
        try:
            fs.delete_dir(entry.path)
        except FileNotFoundError:
            pass  # another recovery got there first
        removed.append(relative + "/")
    return removed, young


def reconcile_checkpoint(
    snapshot: LogSnapshot, checkpoints: CleanerOffsetCheckpoint
) -> dict[int, tuple[int | None, int]]:
    """Roll the checkpoint forward from the log, or reset it into range (design.md §25).

    Returns ``{partition: (old first dirty offset, new)}`` for the rows it moved. Each row
    moves by compare-and-set (up to 10 tries), so a pass finishing meanwhile is not
    overwritten. A row of another table or history (`checkpoints.split_histories`) is
    replaced by one starting at the log's own record or log start, with one warning.
    Idempotent: a second call changes nothing.
    """
    changes: dict[int, tuple[int | None, int]] = {}
    replaced: dict[str, list[int]] = {}  # why -> the partitions whose rows said it
    for partition in snapshot.partitions:
        for _attempt in range(10):
            rows = checkpoints.read(snapshot.uri)
            entry = rows.get((snapshot.uri, partition))
            _, other = split_histories(
                {partition: entry} if entry else {},
                table_id=snapshot.table_id,
                version=snapshot.version,
                latest_version=snapshot.location.latest_version,
            )
            if entry is not None and other:
                replaced.setdefault(other[partition], []).append(partition)
                start = snapshot.cleaner_offset(partition)
                target = start if start is not None else snapshot.log_start_offset(partition)
                fresh = CheckpointEntry(
                    log_path=snapshot.uri,
                    partition=partition,
                    first_dirty_offset=target,
                    table_id=snapshot.table_id,
                    log_version=snapshot.version,
                )
                if checkpoints.compare_and_set(entry, fresh):
                    changes[partition] = (entry.first_dirty_offset, target)
                    break
                continue
            current = entry.first_dirty_offset if entry else None
            target = reconciled_dirty_offset(
                log_cleaner_offset=snapshot.cleaner_offset(partition),
                checkpointed=current,
                log_start_offset=snapshot.log_start_offset(partition),
                log_end_offset=snapshot.log_end_offset(partition),
            )
            if target is None or target == current:
                break
            base = entry or CheckpointEntry(
                log_path=snapshot.uri, partition=partition, first_dirty_offset=target
            )
            new = base.with_changes(
                first_dirty_offset=target, log_version=snapshot.version, table_id=snapshot.table_id
            )
            if checkpoints.compare_and_set(entry, new):
                changes[partition] = (current, target)
                break
    for why, partitions in replaced.items():
        shown = ", ".join(str(p) for p in sorted(set(partitions)))
        logger.warning(
            "log %s: the cleaner checkpoint of partition%s %s %s: replaced by the log's own "
            "record (the next pass starts there)",
            snapshot.uri,
            "s" if len(set(partitions)) > 1 else "",
            shown,
            why,
        )
    return changes


def file_offset_problems(log: LogTable, segment: Segment) -> list[str]:
    """Read one file's ``partition`` and ``offset`` columns and compare them with its statistics.

    Returns the problems found (a file that cannot be read is one); raises nothing. Read-only.
    """
    fs, root = log.location.filesystem()
    where = f"partition {segment.partition}: {segment.path}"
    try:
        parquet = pq.ParquetFile(f"{root}/{unquote(segment.path)}", filesystem=fs)
    except (FileNotFoundError, OSError) as e:
        return [f"{where} is committed but cannot be read ({e})"]
    count, previous, first = 0, None, None
    for batch in parquet.iter_batches(columns=["partition", "offset"], batch_size=65_536):
        partitions = batch.column(0)
        offsets = batch.column(1)
        if partitions.null_count or offsets.null_count:
            return [f"{where} holds null partitions or offsets"]
        if pc.any(pc.not_equal(partitions, segment.partition)).as_py():
            return [f"{where} holds rows of another partition"]
        values = offsets.to_numpy()
        if len(values) == 0:
            continue
        if (previous is not None and values[0] <= previous) or (values[1:] <= values[:-1]).any():
            return [f"{where} has offsets that repeat or go down"]
        first = int(values[0]) if first is None else first
        previous = int(values[-1])
        count += len(values)
    if (count, first, previous) != (segment.num_records, segment.base_offset, segment.last_offset):
        return [
            f"{where} holds {count} records in [{first}, {previous}], its statistics say "
            f"{segment.num_records} in [{segment.base_offset}, {segment.last_offset}]"
        ]
    return []


# -- the clean-shutdown marker ---------------------------------------------------------------


def read_clean_shutdown_marker(log: LogTable) -> int | None:
    """The Delta version the marker vouches for, or None when there is no (readable) marker.

    Read-only; raises nothing.
    """
    fs, root = log.location.filesystem()
    try:
        with fs.open_input_stream(f"{root}/{CLEAN_SHUTDOWN_MARKER}") as stream:
            return int(json.loads(stream.read().decode())["version"])
    except (FileNotFoundError, OSError, ValueError, KeyError, TypeError):
        return None


def write_clean_shutdown_marker(log: LogTable, version: int) -> None:
    """Vouch that the log was consistent at ``version`` (written whole, then renamed in place).

    Idempotent (the marker is overwritten); storage errors propagate as ``OSError``.
    """
    fs, root = log.location.filesystem()
    fs.create_dir(f"{root}/{MARKER_DIR}", recursive=True)
    body = json.dumps({"version": version, "written_ms": wall_clock_ms()}).encode()
    final = f"{root}/{CLEAN_SHUTDOWN_MARKER}"
    temporary = f"{final}.{time.monotonic_ns()}.tmp"
    with fs.open_output_stream(temporary) as stream:
        stream.write(body)
    try:
        fs.move(temporary, final)
    except OSError:
        # Object stores overwrite with a single PUT; write in place there.
        with fs.open_output_stream(final) as stream:
            stream.write(body)
        fs.delete_file(temporary)


def _files_added_since(log: LogTable, snapshot: LogSnapshot, version: int | None) -> list[Segment]:
    segments = snapshot.all_segments()
    if version is None or version > snapshot.version:
        return segments
    known = log.file_paths(version)
    if known is None:  # the version's log entries were cleaned up: check everything
        return segments
    return [s for s in segments if unquote(s.path) not in known]
