"""What a log's directory holds against what its snapshot uses: live, removed, untracked.

Kafka knows each segment's fate from the log itself (in the log, or renamed
``.deleted`` and waiting ``file.delete.delay.ms``). Here the same split comes from
the Delta log, read at a bounded cost: the latest Delta checkpoint (live files and
the *tombstones*, the remove actions still inside the window) plus the commits
after it, never every commit ever made. Each file on disk is then

- **live**: named by an add action of the current snapshot;
- **removed**: named by a tombstone; it leaves storage ``window`` after its removal;
- **untracked**: named by no action still in the log (an orphan of a killed writer,
  or a removed file whose tombstone already expired) and named as the sink names its
  files (`sinks.log.ownership.is_own_data_path`); it leaves storage once its
  modification time is ``window`` old;
- **not ours**: any other file, someone else's: it never leaves storage by the sink's hand.

Nothing here deletes; `segment_deleter` does, and ``status`` reports these figures.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sinks.log.history_window import DeltaLogListing, list_delta_log
from sinks.log.log_format import DELTA_LOG_DIR
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.ownership import foreign_files, is_own_data_path


@dataclass(frozen=True)
class FileOnDisk:
    """A data file found in the table's directory, relative to the table root."""

    path: str
    size_bytes: int
    mtime_ms: int


@dataclass(frozen=True)
class Tombstone:
    """A remove action still in the Delta log: the file and when it left the log."""

    path: str
    size_bytes: int
    deletion_ms: int


@dataclass(frozen=True)
class FileInventory:
    """The files of one log version, split by fate (see the module docstring)."""

    live: Mapping[str, int]
    tombstones: Mapping[str, Tombstone]
    on_disk: tuple[FileOnDisk, ...]
    delta_log: DeltaLogListing

    @property
    def live_bytes(self) -> int:
        return sum(self.live.values())

    @property
    def disk_bytes(self) -> int:
        return sum(f.size_bytes for f in self.on_disk)

    def awaiting_deletion(self, window_ms: int) -> list[tuple[FileOnDisk, int]]:
        """Files on disk the snapshot does not use, each with when it may leave storage."""
        waiting = []
        for f in self.on_disk:
            if f.path in self.live:
                continue
            tombstone = self.tombstones.get(f.path)
            if tombstone is None and not is_own_data_path(f.path):
                continue  # not ours: left alone
            since = tombstone.deletion_ms if tombstone is not None else f.mtime_ms
            waiting.append((f, since + window_ms))
        return waiting

    def not_ours(self) -> list[FileOnDisk]:
        """Files on disk no action names and not named as the sink names its files."""
        named = set(self.live) | set(self.tombstones)
        others = set(foreign_files((f.path for f in self.on_disk), named))
        return [f for f in self.on_disk if f.path in others]


def take_inventory(log: LogTable, snapshot: LogSnapshot) -> FileInventory:
    """List the data files and read the tombstones of ``snapshot``; no data file is opened."""
    on_disk = tuple(list_data_files(log))
    listing = list_delta_log(log.location)
    live = {unquote(s.path): s.size_bytes for s in snapshot.data_files()}
    tombstones = read_tombstones(log, snapshot.version)
    return FileInventory(live, tombstones, on_disk, listing)


def list_data_files(log: LogTable) -> list[FileOnDisk]:
    """Every Parquet file under the table root outside ``_``- and ``.``-prefixed directories."""
    fs, root = log.location.filesystem()
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    found = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.endswith(".parquet"):
            continue
        relative = info.path[len(root) :].lstrip("/")
        if any(part.startswith(("_", ".")) for part in relative.split("/")):
            continue
        mtime = info.mtime.timestamp() * 1000 if info.mtime is not None else 0
        found.append(FileOnDisk(relative, info.size or 0, int(mtime)))
    return found


def read_tombstones(log: LogTable, version: int) -> dict[str, Tombstone]:
    """The remove actions in force at ``version``: from the last Delta checkpoint at or
    before it, then the commits after it (an add of the same path cancels a remove).

    Cost: one checkpoint and at most ``delta.checkpointInterval`` commits.
    """
    fs, root = log.location.filesystem()
    base = _last_checkpoint(fs, root, version)
    tombstones: dict[str, Tombstone] = {}
    if base is not None:
        for part in _checkpoint_parts(fs, root, base):
            table = pq.read_table(part, filesystem=fs, columns=["remove"])
            for remove in table.column("remove").to_pylist():
                if remove and remove.get("path"):
                    _add_tombstone(tombstones, remove)
    for v in range((base or -1) + 1, version + 1):
        try:
            with fs.open_input_stream(f"{root}/{DELTA_LOG_DIR}/{v:020d}.json") as stream:
                lines = stream.read().decode().splitlines()
        except (FileNotFoundError, OSError):
            continue  # cleaned up: the checkpoint already holds what it said
        for line in lines:
            action = json.loads(line) if line.strip() else {}
            if "remove" in action:
                _add_tombstone(tombstones, action["remove"])
            elif "add" in action:
                tombstones.pop(unquote(action["add"]["path"]), None)
    return tombstones


def referenced_paths(log: LogTable, snapshot: LogSnapshot) -> set[str]:
    """Every data file the log still names at ``snapshot``: live, or removed inside the window."""
    live = {unquote(s.path) for s in snapshot.data_files()}
    return live | set(read_tombstones(log, snapshot.version))


def _add_tombstone(tombstones: dict[str, Tombstone], remove: Mapping) -> None:
    path = unquote(remove["path"])
    tombstones[path] = Tombstone(
        path, int(remove.get("size") or 0), int(remove.get("deletionTimestamp") or 0)
    )


def _last_checkpoint(fs: pafs.FileSystem, root: str, version: int) -> int | None:
    """The newest checkpoint version at or below ``version`` (None: read from version 0)."""
    try:
        with fs.open_input_stream(f"{root}/{DELTA_LOG_DIR}/_last_checkpoint") as stream:
            hinted = int(json.loads(stream.read().decode())["version"])
        if hinted <= version and _checkpoint_parts(fs, root, hinted):
            return hinted
    except (FileNotFoundError, OSError, ValueError, KeyError):
        pass
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/{DELTA_LOG_DIR}", allow_not_found=True))
    found = [
        int(i.base_name[:20])
        for i in infos
        if ".checkpoint" in i.base_name and i.base_name[:20].isdigit()
    ]
    candidates = [v for v in found if v <= version]
    return max(candidates) if candidates else None


def _checkpoint_parts(fs: pafs.FileSystem, root: str, version: int) -> list[str]:
    single = f"{root}/{DELTA_LOG_DIR}/{version:020d}.checkpoint.parquet"
    if fs.get_file_info(single).type == pafs.FileType.File:
        return [single]
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/{DELTA_LOG_DIR}", allow_not_found=True))
    prefix = f"{version:020d}.checkpoint."
    return sorted(
        i.path for i in infos if i.base_name.startswith(prefix) and i.base_name.endswith(".parquet")
    )


def total_bytes(files: Iterable[FileOnDisk]) -> int:
    return sum(f.size_bytes for f in files)
