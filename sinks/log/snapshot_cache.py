"""The latest snapshot of a log, read once and given out again until the next commit.

Between two commits a `LogTable` is asked for its latest snapshot many times: an append
checks its batch and then commits, a round finds the filthiest partitions and a pass plans,
the deleter, recovery and status read it. Opening the Delta table replays its log (a
checkpoint and up to ``delta.checkpointInterval`` commits), and every ``txn`` lookup on it
replays it again. The cache keeps the latest snapshot with the stamp of its commit's file
and gives it out again while that file is unchanged and no next commit's file exists
(design.md §46).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinks.log.history_window import CommitStamp, commit_stamps
from sinks.log.location import LogLocation

if TYPE_CHECKING:
    from sinks.log.log_table import LogSnapshot


@dataclass(frozen=True)
class _Kept:
    snapshot: LogSnapshot
    stamp: CommitStamp


class SnapshotCache:
    """One log's latest snapshot, verified and unverified apart; safe to share between threads.

    Pickled empty (with a sink that ``foreachBatch`` or a data source ships).
    """

    def __init__(self) -> None:
        self._kept: dict[bool, _Kept] = {}
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type[SnapshotCache], tuple[()]]:
        return SnapshotCache, ()  # a new, empty cache where it is unpickled

    def get(self, location: LogLocation, *, verified: bool) -> LogSnapshot | None:
        """The kept snapshot while it is still the latest version, else None.

        Two metadata reads (the kept version's commit file, the next one's); a store error
        on either is a miss. Read-only.
        """
        with self._lock:
            kept = self._kept.get(verified)
        if kept is None:
            return None
        version = kept.snapshot.version
        try:
            now, after = commit_stamps(location, [version, version + 1])
        except OSError:
            return None
        if now == kept.stamp and after is None:
            return kept.snapshot
        with self._lock:
            if self._kept.get(verified) is kept:
                del self._kept[verified]
        return None

    def keep(self, location: LogLocation, snapshot: LogSnapshot, *, verified: bool) -> None:
        """Keep ``snapshot``, the latest version when it was read, for `get`; one metadata
        read. A snapshot whose commit file cannot be read is not kept."""
        try:
            (stamp,) = commit_stamps(location, [snapshot.version])
        except OSError:
            return
        if stamp is None:
            return
        with self._lock:
            self._kept[verified] = _Kept(snapshot, stamp)
