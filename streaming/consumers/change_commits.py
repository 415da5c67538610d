"""The change feed's commits, read from the Delta log on the driver: what each append added.

An append is one Delta commit (design.md §2) that adds the batch's segments; their
statistics give, per partition, the offsets it added, ``[first, until)``. Every other
commit of the sink (a pass, retention, ``delete_records``, a schema change) adds no
offset and changes no key's state, so the feed skips it (design.md §56). A commit file
the Delta log no longer holds is outside the history window: `ChangeDataExpiredError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from sinks.config import DELETED_FILE_RETENTION_DURATION, format_interval
from sinks.errors import ChangeDataExpiredError
from sinks.log import (
    COMMIT_INFO_KEY,
    LogTable,
    list_delta_log,
    now_ms,
    oldest_reachable_version,
    read_commit,
    window_of,
)

CHANGE_FEED_RETENTION = f"file.delete.delay.ms ({DELETED_FILE_RETENTION_DURATION})"


@dataclass(frozen=True)
class AppendCommit:
    """One append's commit: its version, time, and per partition its files and offsets."""

    version: int
    timestamp_ms: int
    paths: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    ranges: Mapping[int, tuple[int, int]] = field(default_factory=dict)  # p -> [first, until)


class ChangeCommits:
    """The append commits of one log, read from its Delta log once and kept (a commit file
    never changes once written)."""

    def __init__(self, log: LogTable) -> None:
        self.log = log
        self._read: dict[int, AppendCommit | None] = {}

    def commit(self, version: int) -> AppendCommit | None:
        """The append committed at ``version``; None when that commit added no offset.
        Raises `ChangeDataExpiredError` when the Delta log no longer holds it."""
        if version not in self._read:
            actions = read_commit(self.log.location, version)
            if actions is None:
                raise self.expired(version)
            self._read[version] = parse_append(version, actions)
        return self._read[version]

    def appends(self, after: int, through: int) -> list[AppendCommit]:
        """The appends committed in ``(after, through]``, in version order."""
        found = (self.commit(v) for v in range(max(after, -1) + 1, through + 1))
        return [c for c in found if c is not None]

    def version_at(self, positions: Mapping[int, int], latest: int, ends: Mapping[int, int]) -> int:
        """The newest version whose log end offsets are all at or below ``positions``: the
        version a consumer at ``positions`` has read through (``ends``: those of ``latest``)."""
        ends = dict(ends)
        version = latest
        while version >= 0 and any(e > positions.get(p, 0) for p, e in ends.items()):
            append = self.commit(version)
            if append is not None:
                ends.update({p: first for p, (first, _) in append.ranges.items()})
            version -= 1
        return version

    def ends_at(self, version: int, latest: int, ends: Mapping[int, int]) -> dict[int, int]:
        """The log end offsets at ``version`` (``ends``: those of ``latest``), from the
        appends after it: no time travel, so a version past the window still has them."""
        ends = dict(ends)
        for v in range(latest, version, -1):
            append = self.commit(v)
            if append is not None:
                ends.update({p: first for p, (first, _) in append.ranges.items()})
        return ends

    def check_reachable(self, version: int) -> None:
        """Raise `ChangeDataExpiredError` when time travel no longer reaches ``version`` (a
        change's before-images are read there, design.md §57)."""
        if version < 0:
            return
        table = self.log.location.delta_table()
        oldest = oldest_reachable_version(
            list_delta_log(self.log.location),
            current_version=table.version(),
            now_ms=now_ms(),
            window_ms=window_of(table),
        )
        if version < oldest:
            raise self.expired(version, oldest=oldest, window_ms=window_of(table))

    def expired(
        self, version: int, *, oldest: int | None = None, window_ms: int | None = None
    ) -> ChangeDataExpiredError:
        window = "" if window_ms is None else f" = {format_interval(window_ms)}"
        reach = "" if oldest is None else f"; the feed reaches back to version {oldest + 1}"
        return ChangeDataExpiredError(
            f"{self.log.uri}: the change feed at version {version + 1} is past its retention, "
            f"the history window {CHANGE_FEED_RETENTION}{window}{reach}. Start a new query "
            "(fresh checkpoint) with startingOffsets=earliest: the state as inserts, then changes"
        )


def parse_append(version: int, actions: list[dict[str, Any]]) -> AppendCommit | None:
    """An append's files and offset ranges from its commit's actions; None for any other
    commit (no data-changing add of the sink's append). Pure."""
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    own = info.get(COMMIT_INFO_KEY) or {}
    if not isinstance(own, Mapping) or own.get("operation") != "append":
        return None
    paths: dict[int, list[str]] = {}
    ranges: dict[int, tuple[int, int]] = {}
    for action in actions:
        add = action.get("add")
        if not add or not add.get("dataChange", True):
            continue
        stats = json.loads(add.get("stats") or "{}")
        low, high = stats.get("minValues", {}), stats.get("maxValues", {})
        partition = low.get("partition")
        if partition is None or partition != high.get("partition"):
            continue  # the sink writes one partition a segment
        partition = int(partition)
        paths.setdefault(partition, []).append(unquote(add["path"]))
        first, until = int(low["offset"]), int(high["offset"]) + 1
        old = ranges.get(partition)
        ranges[partition] = (
            (first, until) if old is None else (min(old[0], first), max(old[1], until))
        )
    if not ranges:
        return None
    timestamp = int(info.get("timestamp") or 0)
    return AppendCommit(version, timestamp, {p: tuple(v) for p, v in paths.items()}, ranges)
