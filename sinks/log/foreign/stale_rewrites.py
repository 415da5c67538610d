"""Stale rewrites: another engine's rearrangement planned before a commit that already
rewrote its files. Pure.

delta-rs's conflict check does not see a concurrent remove marked ``dataChange=false``
(design.md §34). So an OPTIMIZE or a Z-order that read the log at version r,
before one of this sink's passes or absorbs committed at p > r, still commits after it,
at s > p: it removes files p had already removed, and adds files that hold their
records again beside p's output. Those records are values p cleaned away, and older
values of keys whose tombstone p dropped once its delete horizon had passed; nothing
newer in the log beats the latter, so such a key would come back. Two OPTIMIZEs planned
at the same version do the same to each other.

Such a commit is recognised by its removes alone: a rearrangement (no action with
``dataChange=true``) that removes a file which was no longer live at s - 1. Every file s
removes was live at r (its engine read it there), so it is gone at s - 1 exactly when a
commit in (r, s) removed it and none added it back. The commit's ``commitInfo`` carries r
as ``readVersion``: delta-rs writes it for OPTIMIZE and Z-order (an OPTIMIZE planned at
version 2 and committed at 4 says ``"operation":"OPTIMIZE", "readVersion":2``), and Delta
Spark for every commit planned from a snapshot. The check therefore reads the removes of
the commits in (r, s) (`gone_after`), which `sinks.log.foreign.commits.CommitGuard` has
mostly just read in order anyway. Without ``readVersion``, or when more than
`WINDOW_MAX` commits lie in between, it compares against the files live at s - 1
instead, which costs one Delta checkpoint and at most ``delta.checkpointInterval`` commits.

A later rearrangement that is not stale itself may rewrite the files a pending stale
rewrite added (the next scheduled OPTIMIZE, before the sink looked): it joins the stale
one (`StaleRewrite.followed`), and the two are undone together, which undoes nothing but
rearrangements. What the sink then does (undo exactly, or stop) is
`sinks.log.foreign.stale_revert`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

WINDOW_MAX = 100
"""The most commits between a rewrite's read version and its own that are read to find
what they removed, past which reading the snapshot before the rewrite (one checkpoint and
at most ``delta.checkpointInterval`` commits, 10) is the cheaper way."""

UNDO_OPERATION = "revert-stale-rewrite"
"""The ``operation`` of the sink's commit that undoes stale rewrites; its ``staleVersions``
lists the versions it undid."""


@dataclass(frozen=True)
class CommitSummary:
    """What a check needs of one commit: its info, and the paths it added and removed.

    Paths are unquoted (the Delta log URL-encodes them). ``changes_data``: an add or a
    remove says ``dataChange=true`` (Delta's default when it says nothing).
    """

    version: int
    info: Mapping[str, Any]
    added: frozenset[str]
    removed: frozenset[str]
    changes_data: bool

    @classmethod
    def of(cls, version: int, actions: Iterable[Mapping[str, Any]]) -> CommitSummary:
        info: Mapping[str, Any] = {}
        added: set[str] = set()
        removed: set[str] = set()
        changes = False
        for action in actions:
            if "commitInfo" in action:
                info = action["commitInfo"] or {}
            for kind, paths in (("add", added), ("remove", removed)):
                if kind in action:
                    paths.add(unquote(action[kind]["path"]))
                    changes = changes or bool(action[kind].get("dataChange", True))
        return cls(version, info, frozenset(added), frozenset(removed), changes)

    @property
    def read_version(self) -> int | None:
        """The version the commit was planned from, when its engine recorded it."""
        value = self.info.get("readVersion")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class StaleRewrite:
    """A rearrangement at ``version`` that removed files an earlier commit had removed.

    ``added``: the files it added, or, once later rearrangements rewrote some of them
    (``followed_by``, see `followed`), the files those left in their place. ``restored``:
    the files it removed that were still live before it; ``restored_later``: per later
    rearrangement, the files it removed that were live before it and not added by this
    chain (an exact undo adds all of them back). ``superseded``: the files an earlier
    commit had already removed; ``overtaken_by``, the first such commit, when known.
    """

    version: int
    read_version: int | None
    operation: str
    engine: str
    added: tuple[str, ...]
    restored: tuple[str, ...]
    superseded: tuple[str, ...]
    overtaken_by: int | None
    followed_by: tuple[int, ...] = ()
    restored_later: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def restored_at(self) -> list[tuple[int, tuple[str, ...]]]:
        """The files an undo adds back, grouped by the version whose predecessor holds
        their add actions."""
        return [
            (v, paths)
            for v, paths in ((self.version, self.restored), *self.restored_later)
            if paths
        ]

    def followed(self, commit: CommitSummary) -> StaleRewrite:
        """This rewrite after ``commit``, another engine's rearrangement that is not stale
        itself; unchanged unless ``commit`` rewrote some of the files in ``added``.

        Every record of the chain's files still comes from the files the chain removed,
        so undoing the whole chain at once stays exact (and undoes only rearrangements).
        """
        mine = set(self.added)
        if not commit.removed & mine:
            return self
        others = tuple(sorted(commit.removed - mine))
        return replace(
            self,
            added=tuple(sorted((mine - commit.removed) | commit.added)),
            followed_by=(*self.followed_by, commit.version),
            restored_later=(*self.restored_later, (commit.version, others)),
        )


def gone_after(window: Sequence[CommitSummary]) -> dict[str, int]:
    """Files the commits of ``window`` (in order) removed and did not add back: path ->
    the version that removed it."""
    gone: dict[str, int] = {}
    for commit in window:
        for path in commit.removed:
            gone.setdefault(path, commit.version)
        for path in commit.added:
            gone.pop(path, None)
    return gone


def stale_rewrite(commit: CommitSummary, gone: Mapping[str, int | None]) -> StaleRewrite | None:
    """``commit`` as a stale rewrite, when it removes a file of ``gone`` (files no longer
    live before it, with the version that removed each, when known); else None.

    Only for a commit another engine made that changes no data (the guard checks that).
    """
    superseded = sorted(p for p in commit.removed if p in gone)
    if not superseded:
        return None
    versions = [v for v in (gone[p] for p in superseded) if v is not None]
    info = commit.info
    return StaleRewrite(
        version=commit.version,
        read_version=commit.read_version,
        operation=str(info.get("operation", "unknown")),
        engine=str(info.get("engineInfo") or info.get("clientVersion") or "an unknown engine"),
        added=tuple(sorted(commit.added)),
        restored=tuple(sorted(commit.removed - set(superseded))),
        superseded=tuple(superseded),
        overtaken_by=min(versions) if versions else None,
    )


def describe_stale(rewrite: StaleRewrite, *, log_path: str, current_version: int, why: str) -> str:
    """The error text when a stale rewrite cannot be undone exactly: what, why, the ways on."""
    read = "" if rewrite.read_version is None else f", planned from version {rewrite.read_version}"
    later = (
        ""
        if not rewrite.followed_by
        else f" (rewritten again by version(s) {', '.join(map(str, rewrite.followed_by))})"
    )
    earlier = (
        "an earlier commit" if rewrite.overtaken_by is None else f"version {rewrite.overtaken_by}"
    )
    before = rewrite.version - 1
    return (
        f"log {log_path}: Delta version {rewrite.version} was written by {rewrite.engine} "
        f"({rewrite.operation}, dataChange=false{read}), not by this sink, and rewrote "
        f"{len(rewrite.superseded)} file(s) that {earlier} had already rewritten{later}: it brings "
        "back records a pass had cleaned away (delta-rs does not see a concurrent "
        "dataChange=false remove as a conflict), which can bring an older value of a key "
        "back as its state. Readers see through such a commit and a writer of the sink "
        f"undoes it (as `compacted-sink repair {log_path}` or sink.repair() does), but "
        f"this one cannot be undone exactly: {why}. So the sink stops here, readers "
        "too. To go on, either restore the log to "
        f"the version before it (sink.restore({before}), or `compacted-sink restore "
        f"{log_path} --to-version {before}`; within the history window; it undoes every "
        "later commit too), or accept the log as it now is "
        f"(sink.accept_foreign_changes({current_version}), or `compacted-sink accept "
        f"{log_path} --through-version {current_version}`; the records it brought back then "
        "count as the log's, so a key a pass had deleted may come back). Run OPTIMIZE on a "
        "log while its cleaner is paused. See "
        'docs/operations.md, "Other engines on the log".'
    )
