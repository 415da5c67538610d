"""Commits the sink did not make: which only rearrange records, and which change them.

The log is a plain Delta table, so other engines write to it: Databricks'
predictive optimization and auto compaction, a user's OPTIMIZE or Z-order, and
also DELETE, UPDATE, MERGE, an overwrite or a RESTORE. Every commit this sink
makes carries its own metadata (``compactedSink`` in the commit info), so each
commit is one of three kinds:

- *ours*: carries the sink's metadata;
- *a rearrangement*: every file it adds or removes says ``dataChange=false``
  (bin-packing, Z-order, clustering), or it touches no data file at all (table
  properties, a schema change, VACUUM's bookkeeping). The records stay the same;
  the files that hold them are absorbed by the next pass
  (`sinks.maintenance.rearrangement`);
- *a data change*: anything else. Records were added or taken away behind the
  sink's back: the newest record of a key may be gone, which would bring an older
  value back as the state. The sink stops with `ForeignChangeError` rather than
  guess.

The check reads each commit once, in order: a `CommitGuard` remembers the last
version it checked, and every commit the sink makes records, in a ``txn``
action, the version it was planned from (`CHECKED_VERSION_TXN`), so a new
process starts from there instead of from the table's first version.
`ACCEPTED_VERSION_TXN` records the last foreign change an operator accepted
(`sinks.sink.CompactedStateSink.accept_foreign_changes`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sinks.errors import ForeignChangeError
from sinks.log.storage import arrow_filesystem

COMMIT_INFO_KEY = "compactedSink"
CHECKED_VERSION_TXN = "compacted-sink/checked-version"
ACCEPTED_VERSION_TXN = "compacted-sink/accepted-version"
DELTA_LOG = "_delta_log"


@dataclass(frozen=True)
class ForeignChange:
    """A commit another engine made that added or removed records (``dataChange=true``)."""

    version: int
    operation: str
    engine: str
    files_added: int
    files_removed: int


def foreign_change(version: int, actions: Iterable[Mapping[str, Any]]) -> ForeignChange | None:
    """The data change a commit's actions make, when another engine made it; else None. Pure."""
    info: Mapping[str, Any] = {}
    added = removed = 0
    for action in actions:
        if "commitInfo" in action:
            info = action["commitInfo"] or {}
        elif "add" in action and action["add"].get("dataChange", True):
            added += 1
        elif "remove" in action and action["remove"].get("dataChange", True):
            removed += 1
    if COMMIT_INFO_KEY in info or added + removed == 0:
        return None
    engine = info.get("engineInfo") or info.get("clientVersion") or "an unknown engine"
    return ForeignChange(version, str(info.get("operation", "unknown")), engine, added, removed)


def describe(change: ForeignChange, *, log_path: str, current_version: int) -> str:
    """The error text for a foreign data change: what, where, and the two ways on."""
    before = change.version - 1
    return (
        f"log {log_path}: Delta version {change.version} was written by {change.engine} "
        f"({change.operation}: {change.files_removed} file(s) removed and "
        f"{change.files_added} added with dataChange=true), not by this sink. Records changed "
        "behind the sink's back can bring an older value of a key back as its state, so the "
        "sink stops here. To go on, either accept the log as it now is "
        f"(sink.accept_foreign_changes({current_version}), or `compacted-sink accept "
        f"{log_path} --through-version {current_version}`), or restore it to the version "
        f"before the change (sink.restore({before}), or `compacted-sink restore {log_path} "
        f"--to-version {before}`; within the history window). See docs/operations.md, "
        '"Other engines on the log".'
    )


def read_commit(
    uri: str, version: int, storage_options: Mapping[str, str] | None = None
) -> list[dict[str, Any]] | None:
    """The actions of one commit file; None when the Delta log no longer holds it."""
    fs, root = arrow_filesystem(uri, dict(storage_options or {}))
    try:
        with fs.open_input_stream(f"{root}/{DELTA_LOG}/{version:020d}.json") as stream:
            text = stream.read().decode()
    except (FileNotFoundError, OSError):
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class CommitGuard:
    """Checks each commit of one log once, oldest first; raises on a foreign data change.

    ``checked`` is the newest version known to hold no unaccepted foreign change.
    """

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options or {})
        self.checked: int | None = None

    def check(self, version: int, *, checked: int | None, accepted: int | None) -> None:
        """Check the commits after the last checked one, through ``version``.

        ``checked`` and ``accepted`` are the versions the log's own ``txn`` actions
        record (at ``version``); with neither and no earlier check in this process (a
        log written before the sink recorded them), history up to ``version`` is trusted.
        """
        start = max((v for v in (self.checked, checked, accepted) if v is not None), default=None)
        if start is None:
            self.checked = version
            return
        for v in range(start + 1, version + 1):
            actions = read_commit(self.uri, v, self.storage_options)
            change = foreign_change(v, actions or [])
            if change is not None:
                raise ForeignChangeError(
                    describe(change, log_path=self.uri, current_version=version),
                    log_path=self.uri,
                    version=v,
                )
            self.checked = v
