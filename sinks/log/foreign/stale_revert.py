"""Undoing stale rewrites exactly (`sinks.log.foreign.stale_rewrites`), or reading past them.

A stale rewrite at version s added files (A) that hold the records of the files it
removed (a rearrangement keeps every record it removes): its *restored* files, still
live before s, and its *superseded* ones, which an earlier commit had already removed
and whose records must not come back. One commit of the sink's own, ``dataChange=false``,
undoes it: it removes A and adds the restored files back, with the add actions they had
at s - 1 (statistics rebuilt from delta-rs's typed ones, the file's own modification
time). What A held minus what the restored files hold is exactly what the superseded
files held, so the log's records after the undo are those it had before s, plus every
commit since s (appends, passes, which the undo does not touch).

Later rearrangements that rewrote files of A are undone with it (A is then the files
they left in A's place, and the files they removed beside A's are added back too).
Exact only when, at the version the undo commits against, every file of A is still
live (no later commit other than such a rearrangement rewrote them), no
restored file is live again, the snapshot at s - 1 can still be read, and every
restored file is still on storage at its recorded size (inside the history window,
nothing deletes it). Otherwise `plan_undo` raises `ForeignChangeError`, which names the
version, the operation and the engine and says how to go on.

A writer's snapshot (`sinks.log.log_table.LogTable.snapshot` with ``repair=True``) and
`LogTable.repair` commit the undo against the snapshot checked (`LogSnapshot.commit`: a
compare-and-set on the version, rebased only over commits that removed none of A, a lost
answer recognised by the commit's token) and read the log again. Every other read, time
travel included, sees the snapshot through the undo instead: the files the undo would
leave live (design.md §66).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from deltalake.transaction import AddAction

from sinks.errors import ForeignChangeError
from sinks.log.bad_files import find_bad_files
from sinks.log.foreign.stale_rewrites import UNDO_OPERATION, StaleRewrite, describe_stale
from sinks.log.location import LogLocation
from sinks.log.segment import DataFile, add_action_rows, add_action_table, data_file
from sinks.log.segment_writer import stat_value


@dataclass(frozen=True)
class RestoredFile:
    """A file a stale rewrite removed while it was live, as its add action had it then.

    ``row`` is its row of `sinks.log.segment.add_action_rows` at that version.
    """

    row: Mapping[str, Any]
    stats: str
    modification_time: int

    @property
    def path(self) -> str:
        return str(self.row["path"])

    @property
    def file(self) -> DataFile:
        return data_file(self.row)

    def add_action(self, *, data_change: bool, modification_time: int) -> AddAction:
        """Its add action again; ``modification_time`` is ignored (the file is unchanged)."""
        del modification_time
        return AddAction(
            self.path,
            int(self.row["size_bytes"]),
            {},
            self.modification_time,
            data_change,
            self.stats,
        )


@dataclass(frozen=True)
class Undo:
    """What undoing ``rewrites`` takes: remove ``removes`` (live files they added), add
    ``restored`` back."""

    rewrites: tuple[StaleRewrite, ...]
    removes: tuple[DataFile, ...]
    restored: tuple[RestoredFile, ...]

    @property
    def hidden(self) -> frozenset[str]:
        """The (unquoted) paths the undo removes."""
        return frozenset(unquote(f.path) for f in self.removes)

    def info(self) -> dict[str, Any]:
        """The undo commit's ``compactedSink`` metadata."""
        return {
            "operation": UNDO_OPERATION,
            "staleVersions": [r.version for r in self.rewrites],
            "followedBy": [list(r.followed_by) for r in self.rewrites],
            "readVersions": [r.read_version for r in self.rewrites],
            "engines": [r.engine for r in self.rewrites],
            "filesRemoved": len(self.removes),
            "filesRestored": len(self.restored),
        }

    def summary(self) -> str:
        versions = ", ".join(str(r.version) for r in self.rewrites)
        return (
            f"undid stale rewrite(s) at Delta version(s) {versions}: removed "
            f"{len(self.removes)} file(s) they added, restored {len(self.restored)} file(s) "
            "they removed that were still live"
        )


def plan_undo(
    location: LogLocation,
    live: Sequence[DataFile],
    rewrites: Sequence[StaleRewrite],
    *,
    current_version: int,
) -> Undo:
    """The undo of ``rewrites`` (oldest first) over the live files ``live`` of version
    ``current_version``; raises `ForeignChangeError` when it would not be exact.

    Reads the snapshot before each rewrite that removed live files, and the storage
    metadata of those files (one ``stat`` or ``HEAD`` each).
    """
    by_path = {unquote(f.path): f for f in live}
    uri = location.uri
    removes: list[DataFile] = []
    restored: list[RestoredFile] = []
    for rewrite in rewrites:

        def stop(why: str, rewrite: StaleRewrite = rewrite) -> ForeignChangeError:
            return ForeignChangeError(
                describe_stale(rewrite, log_path=uri, current_version=current_version, why=why),
                log_path=uri,
                version=rewrite.version,
            )

        moved = [p for p in rewrite.added if p not in by_path]
        if moved:
            raise stop(
                f"{len(moved)} file(s) it added are no longer live: a later commit other than "
                "another engine's rearrangement rewrote them, with the records it brought back"
            )
        files: list[RestoredFile] = []
        for version, paths in rewrite.restored_at():
            back = [p for p in paths if p in by_path]
            if back:
                raise stop(f"{len(back)} file(s) it removed are live again")
            before = _files_before(location, version, paths)
            if before is None or len(before) != len(paths):
                raise stop(
                    f"the add actions of {len(paths)} file(s) removed while they were live "
                    f"cannot be read at version {version - 1} any more"
                )
            files += before
        bad = find_bad_files(location, [f.file for f in files])
        if bad:
            raise stop(
                f"{len(bad)} file(s) it removed while they were live are gone from storage "
                f"or truncated (first: {bad[0].path})"
            )
        removes += [by_path[p] for p in rewrite.added]
        restored += files
    return Undo(tuple(rewrites), tuple(removes), tuple(restored))


def _files_before(
    location: LogLocation, version: int, paths: Sequence[str]
) -> list[RestoredFile] | None:
    """The add actions, at the version before ``version``, of ``paths`` (files live then)."""
    try:
        table = location.delta_table(version - 1)
    except Exception:  # an expired version fails in several ways
        return None
    wanted = set(paths)
    flat = add_action_rows(table.get_add_actions(flatten=True))
    typed = {
        r["path"]: r for r in add_action_table(table.get_add_actions(flatten=False)).to_pylist()
    }
    return [
        RestoredFile(row, stats_json(typed[row["path"]]), int(row["modification_time"]))
        for row in flat
        if unquote(row["path"]) in wanted
    ]


def stats_json(row: Mapping[str, Any]) -> str:
    """A file's Delta statistics as JSON again, from its row of delta-rs's
    ``get_add_actions(flatten=False)`` (typed ``min``, ``max``, ``null_count``). Pure.

    Values Delta's JSON cannot state safely (a truncated string maximum, a decimal, a
    binary) are left out: statistics only bound a file's values, and fewer bound less.
    """
    stats: dict[str, Any] = {}
    if row.get("num_records") is not None:
        stats["numRecords"] = int(row["num_records"])
    stats["minValues"] = _values(row.get("min"), low=True)
    stats["maxValues"] = _values(row.get("max"), low=False)
    stats["nullCount"] = _counts(row.get("null_count"))
    return json.dumps(stats, separators=(",", ":"))


def _values(values: Any, *, low: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in (values or {}).items():
        if isinstance(value, Mapping):
            nested = _values(value, low=low)
            if nested:
                out[name] = nested
            continue
        stated = None if value is None else stat_value(value, low=low)
        if isinstance(stated, int | float | str) and not isinstance(stated, bool):
            out[name] = stated
    return out


def _counts(counts: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, count in (counts or {}).items():
        if isinstance(count, Mapping):
            nested = _counts(count)
            if nested:
                out[name] = nested
        elif count is not None:
            out[name] = int(count)
    return out
