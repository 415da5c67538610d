"""What became of a commit whose answer is in doubt: read back from the Delta log.

A commit whose answer the store lost counts once (design.md §39). Each commit the sink
makes carries a random token in its commit info (`COMMIT_TOKEN_KEY`); `landed_version`
finds it. `check_removes` tells whether a commit that removes files may be rebased over the
commits since its snapshot: only when none of them removed one of its files.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

from sinks.errors import ConcurrentCommitError
from sinks.log.foreign.commits import read_commit
from sinks.log.location import LogLocation
from sinks.log.log_format import COMMIT_INFO_KEY

COMMIT_TOKEN_KEY = "commitToken"
"""A random token in each commit's ``compactedSink`` info: a commit recognises itself by it."""


def landed_version(location: LogLocation, token: str, after: int) -> int | None:
    """The version after ``after`` that holds the commit carrying ``token``, if any."""
    latest = location.delta_table().version()
    for version in range(after + 1, latest + 1):
        for action in read_commit(location, version) or []:
            own = (action.get("commitInfo") or {}).get(COMMIT_INFO_KEY) or {}
            if isinstance(own, Mapping) and own.get(COMMIT_TOKEN_KEY) == token:
                return version
    return None


def check_removes(location: LogLocation, removed: set[str], after: int, through: int) -> None:
    """Raise `ConcurrentCommitError` when a commit in ``(after, through]`` removed a file of
    ``removed``, or cannot be read (trimmed from the Delta log since, or a store error): what
    it removed is then not known."""
    for version in range(after + 1, through + 1):
        actions = read_commit(location, version)
        if actions is None:
            raise ConcurrentCommitError(
                f"{location.uri}: version {version} cannot be read (trimmed from the Delta log "
                "since, or the store failed); what it removed is not known"
            )
        for action in actions:
            path = action.get("remove", {}).get("path")
            if path is not None and unquote(path) in removed:
                raise ConcurrentCommitError(
                    f"{location.uri}: version {version} removed {path}, "
                    "which this commit removes too"
                )
