"""Bad data files: a live file that is missing or shorter than its add action says.

Kafka's log recovery finds a truncated segment by reading it; a Delta log records
each file's size in its add action, so here one metadata call per file (a ``stat``
on disk, a ``HEAD`` or a listing on an object store) finds a file someone deleted or
a copy that stopped halfway, before anything reads it. The check is exact for
those two faults: a file of the recorded size is taken as written (its Parquet
footer and checksums guard the rest).

The error names the file, the Delta version whose ``add`` brought it in (read back
from the ``_delta_log`` commits, newest first, only once a file is found bad) and
the versions that reference it since, and says how to repair
(``docs/operations.md``, "Bad files").
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow.fs as pafs
from deltalake import DeltaTable

from sinks.errors import CorruptDataFileError, MissingDataFileError
from sinks.log.foreign.commits import read_commit
from sinks.log.foreign.stale_rewrites import CommitSummary
from sinks.log.location import LogLocation
from sinks.log.segment import DataFile, add_action_rows, data_file
from sinks.log.uris import is_local

# Past this many files on an object store, list their directories (1,000 keys a request)
# instead of one HEAD a file.
_HEADS_MAX = 32
# How far back the Delta log is searched for the add of a bad file.
_SEARCH_COMMITS = 2_000


@dataclass(frozen=True)
class BadFile:
    """A live data file whose storage object is missing (``found_bytes`` None) or short."""

    path: str
    expected_bytes: int
    found_bytes: int | None


def find_bad_files(location: LogLocation, files: Sequence[DataFile]) -> list[BadFile]:
    """The files of ``files`` that are gone or whose size differs from their add action's.

    Reads metadata only. On a local disk, one ``stat`` a file; on an object store, one
    ``HEAD`` a file up to a few dozen, else one listing per directory.
    """
    if not files:
        return []
    fs, root = location.filesystem()
    listing = not is_local(location.uri)
    sizes = _sizes(fs, root, [unquote(f.path) for f in files], listing=listing)
    bad = []
    for file in files:
        found = sizes.get(unquote(file.path))
        if found != file.size_bytes:
            bad.append(BadFile(file.path, file.size_bytes, found))
    return bad


def repair_advice(location: LogLocation, before: int | None, *, read_version: int) -> str:
    """What to do about a bad file found reading ``read_version``, safe to follow.

    Never proposes a version whose live records differ from the current ones without
    saying so: when the log as it is now has every file (an older version was read, whose
    files a VACUUM deleted), there is nothing to repair; a restore is proposed only to a
    version whose files are all on storage, with what it undoes in records.
    """
    uri = location.uri
    try:
        latest = location.delta_table()
        live_now = _live_files(latest)
    except Exception:  # the log cannot be opened: no advice to check
        return "To repair, restore the log to a version whose files are all on storage; "
    if read_version < latest.version() and not find_bad_files(location, live_now):
        return (
            f"The log as it is now (version {latest.version()}) has all its files: nothing "
            f"needs repair, but version {read_version} can no longer be read (a VACUUM, or "
            "a deletion, removed files only older versions use); read a newer version. "
        )
    records_now = sum(f.num_records for f in live_now)
    target = None
    if before is not None and before >= 0:
        try:
            target = _live_files(location.delta_table(before))
        except Exception:  # an expired version fails in several ways
            target = None
    if target is None or find_bad_files(location, target):
        return (
            "No version before it is known to have all its files; put the file back from a "
            "copy of the storage, or replay what remains into a new log (`compacted-sink "
            "replay`); "
        )
    if not target:
        return (
            f"Version {before}, before the file was added, holds no record: restoring it "
            "would empty the log, so put the file back from a copy of the storage, or "
            "replay what remains into a new log (`compacted-sink replay`); "
        )
    changed = _data_changes(location, before, latest.version())
    if changed is None:
        undone = "every commit after it (the Delta log no longer says which changed records)"
    elif not changed:
        undone = (
            f"versions {before + 1} to {latest.version()}, which only rearranged records (a "
            "pass, an OPTIMIZE): no record is lost"
        )
    else:
        shown = ", ".join(map(str, changed[:10])) + (" ..." if len(changed) > 10 else "")
        undone = (
            f"versions {before + 1} to {latest.version()}, {len(changed)} of which changed "
            f"records (version(s) {shown}: appended batches, deletes): their records are lost "
            f"({sum(f.num_records for f in target)} stored record(s) then, {records_now} now)"
        )
    return (
        f"To repair, put the file back from a copy of the storage, or restore version "
        f"{before} (`compacted-sink restore {uri} --to-version {before}`), which undoes "
        f"{undone}; compare sink.state(as_of={before}) with the state you expect first; "
    )


def _data_changes(location: LogLocation, after: int, through: int) -> list[int] | None:
    """The versions in (``after``, ``through``] whose commit added or removed records
    (``dataChange=true``); None when the Delta log no longer holds one of them."""
    changed = []
    for version in range(after + 1, through + 1):
        actions = read_commit(location, version)
        if actions is None:
            return None
        if CommitSummary.of(version, actions).changes_data:
            changed.append(version)
    return changed


def _live_files(table: DeltaTable) -> list[DataFile]:
    return [data_file(r) for r in add_action_rows(table.get_add_actions(flatten=True))]


def check_files(location: LogLocation, files: Sequence[DataFile], *, current_version: int) -> None:
    """Raise `MissingDataFileError` or `CorruptDataFileError` for the first bad file of
    ``files`` (of the log at ``location``, version ``current_version``); reads nothing else."""
    bad = find_bad_files(location, files)
    if bad:
        raise bad_file_error(location, bad, current_version=current_version)


def bad_file_error(
    location: LogLocation, bad: Sequence[BadFile], *, current_version: int
) -> MissingDataFileError | CorruptDataFileError:
    """The error for ``bad`` (its first file named in full, the count of the others)."""
    first, uri = bad[0], location.uri
    added = added_in(location, first.path, current_version)
    if first.found_bytes is None:
        what = "is missing (deleted from storage)"
        cls: type[MissingDataFileError] | type[CorruptDataFileError] = MissingDataFileError
    else:
        what = (
            f"is {first.found_bytes} bytes where its add action says {first.expected_bytes} "
            "(truncated: a copy stopped halfway, or the file was overwritten)"
        )
        cls = CorruptDataFileError
    if added is None:
        origin = f"added before version {max(0, current_version - _SEARCH_COMMITS + 1)}"
        referenced = f"live through version {current_version}"
        before = None
    else:
        origin = f"added by version {added.version} ({added.operation})"
        referenced = f"referenced by versions {added.version} to {current_version}"
        before = added.version - 1
    others = f"; {len(bad) - 1} more file(s) are bad too" if len(bad) > 1 else ""
    repair = repair_advice(location, before, read_version=current_version)
    message = (
        f"log {uri}: data file {first.path} {what}; {origin}, {referenced}{others}. "
        f'{repair}see docs/operations.md, "Bad files".'
    )
    return cls(
        message,
        log_path=uri,
        path=first.path,
        added_version=None if added is None else added.version,
        current_version=current_version,
    )


@dataclass(frozen=True)
class Addition:
    """The commit whose ``add`` action brought a file into the log."""

    version: int
    operation: str


def added_in(location: LogLocation, path: str, current_version: int) -> Addition | None:
    """The newest commit at or before ``current_version`` that added ``path``; None when
    the commits still in the Delta log (searched back `_SEARCH_COMMITS`) do not say."""
    wanted = unquote(path)
    oldest = max(0, current_version - _SEARCH_COMMITS + 1)
    for version in range(current_version, oldest - 1, -1):
        actions = read_commit(location, version)
        if actions is None:
            return None
        if any(unquote(a.get("add", {}).get("path", "")) == wanted for a in actions):
            return Addition(version, _operation(actions))
    return None


def _operation(actions: Iterable[dict]) -> str:
    for action in actions:
        info = action.get("commitInfo")
        if info is not None:
            own = (info.get("compactedSink") or {}).get("operation")
            return own or info.get("operation") or "unknown operation"
    return "unknown operation"


def _sizes(
    fs: pafs.FileSystem, root: str, paths: Sequence[str], *, listing: bool
) -> dict[str, int]:
    """Size of each of ``paths`` (relative to ``root``) that exists as a file."""
    if not listing or len(paths) <= _HEADS_MAX:
        infos = fs.get_file_info([f"{root}/{p}" for p in paths])
        return {
            p: i.size for p, i in zip(paths, infos, strict=True) if i.type == pafs.FileType.File
        }
    sizes: dict[str, int] = {}
    for directory in sorted({posixpath.dirname(p) for p in paths}):
        base = f"{root}/{directory}" if directory else root
        selector = pafs.FileSelector(base, allow_not_found=True)
        for info in fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                relative = info.path[len(root) + 1 :]
                sizes[relative] = info.size
    return sizes
