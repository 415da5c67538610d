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
  (`sinks.log.foreign.rearrangement`);
- *a data change*: anything else. Records were added or taken away behind the
  sink's back: the newest record of a key may be gone, which would bring an older
  value back as the state. The sink stops with `ForeignChangeError` rather than
  guess.

A rearrangement can still be wrong: one planned from a version older than a commit
that already rewrote its files (delta-rs lets it through) brings their records back.
The guard finds such a *stale rewrite* by its removes (`sinks.log.foreign.stale_rewrites`) and
keeps it as pending until a commit of the sink's undoes it (`sinks.log.foreign.stale_revert`,
called by `sinks.log.log_table.LogTable.snapshot`).

The check reads each commit once, in order: a `CommitGuard` remembers the last
version it checked, and every commit the sink makes records, in a ``txn``
action, the version it was planned from (`CHECKED_VERSION_TXN`), so a new
process starts from there instead of from the table's first version. The sink
records a version only from a snapshot with no stale rewrite pending (or from the
commit that undoes them), so a stale rewrite at or below a recorded version is
already undone. `ACCEPTED_VERSION_TXN` records the last foreign change an operator
accepted (`sinks.sink.CompactedStateSink.accept_foreign_changes`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable

from sinks.errors import ForeignChangeError, TableFeatureError
from sinks.log.foreign.stale_rewrites import (
    UNDO_OPERATION,
    WINDOW_MAX,
    CommitSummary,
    StaleRewrite,
    gone_after,
    stale_rewrite,
)
from sinks.log.location import LogLocation
from sinks.log.log_format import COMMIT_INFO_KEY, DELTA_LOG_DIR
from sinks.log.segment import add_action_paths
from sinks.warn_once import warn_once

logger = logging.getLogger("compacted_sink")


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
        f"--to-version {before}`; within the history window; it undoes that change and every "
        "later commit). See docs/operations.md, "
        '"Other engines on the log".'
    )


def read_commit(location: LogLocation, version: int) -> list[dict[str, Any]] | None:
    """The actions of one commit file of the log at ``location``; None when the Delta log
    no longer holds it."""
    fs, root = location.filesystem()
    try:
        with fs.open_input_stream(f"{root}/{DELTA_LOG_DIR}/{version:020d}.json") as stream:
            text = stream.read().decode()
    except (FileNotFoundError, OSError):
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


SUMMARIES_KEPT = 256
"""How many commits' summaries a guard keeps, to find what commits since a rewrite's read
version removed without reading them again."""


class CommitGuard:
    """Checks each commit of one log once, oldest first; raises on a foreign data change,
    and keeps the stale rewrites it finds (``pending``) until a commit undoes them.

    ``checked`` is the newest version known to hold no unaccepted foreign change.
    """

    def __init__(self, location: LogLocation) -> None:
        self.location = location
        self.checked: int | None = None
        self.pending: dict[int, StaleRewrite] = {}
        self._commits: OrderedDict[int, tuple[CommitSummary, ForeignChange | None]] = OrderedDict()
        self._lock = threading.RLock()  # a sink's query and cleaner threads share a log

    @property
    def uri(self) -> str:
        return self.location.uri

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with the sink (a ``foreachBatch`` function, a data source): no lock."""
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def check(self, version: int, *, checked: int | None, accepted: int | None) -> None:
        """Check the commits after the last checked one, through ``version``.

        ``checked`` and ``accepted`` are the versions the log's own ``txn`` actions
        record (at ``version``); with neither and no earlier check in this process (a
        log written before the sink recorded them), history up to ``version`` is trusted.
        """
        with self._lock:
            floor = _newest(checked, accepted)
            start = _newest(self.checked, floor)
            if start is None:
                self.checked = version
                return
            if floor is not None:  # undone (or accepted) by the commit that recorded it
                self.pending = {v: r for v, r in self.pending.items() if v > floor}
            for v in range(start + 1, version + 1):
                self._read(v, self.pending, current=version)
                self.checked = v

    def stale(
        self, version: int, *, checked: int | None, accepted: int | None
    ) -> list[StaleRewrite]:
        """The stale rewrites at or below ``version`` that no commit up to it undid, oldest
        first (after `check` of ``version``). Past ``version`` already (a time-travel read),
        the commits since the version ``version`` records as checked are read again."""
        with self._lock:
            if self.checked == version:
                return [self.pending[v] for v in sorted(self.pending) if v <= version]
            floor = _newest(checked, accepted)
            if floor is None:
                return []
            pending: dict[int, StaleRewrite] = {}
            for v in range(floor + 1, version + 1):
                self._read(v, pending, current=None)
            return [pending[v] for v in sorted(pending)]

    def _read(self, version: int, pending: dict[int, StaleRewrite], *, current: int | None) -> None:
        """Check one commit: raise on a foreign data change (unless ``current`` is None),
        record a stale rewrite in ``pending``, or clear those an undo of the sink's undid."""
        commit, change = self._commit(version)
        own = commit.info.get(COMMIT_INFO_KEY)
        if own is not None:
            if isinstance(own, Mapping) and own.get("operation") == UNDO_OPERATION:
                for undone in own.get("staleVersions") or []:
                    pending.pop(int(undone), None)
            return
        if change is not None:
            if current is None:
                return
            raise ForeignChangeError(
                describe(change, log_path=self.uri, current_version=current),
                log_path=self.uri,
                version=version,
            )
        if not commit.changes_data and commit.removed:
            rewrite = self._stale(commit)
            if rewrite is not None:
                warn_once(
                    ("stale rewrite", self.uri, version),
                    "log %s: Delta version %d (%s by %s, planned from version %s) rewrote "
                    "%d file(s) an earlier commit had already rewritten: reads see through it "
                    "until the sink's next write, or `compacted-sink repair %s`, undoes it",
                    self.uri,
                    version,
                    rewrite.operation,
                    rewrite.engine,
                    rewrite.read_version,
                    len(rewrite.superseded),
                    self.uri,
                )
                pending[version] = rewrite
            else:
                # A later rearrangement that rewrote what one pending rewrite added joins
                # it (`StaleRewrite.followed`); one that mixed the files of two is left
                # out, and undoing either is then no longer exact.
                touched = [v for v, r in pending.items() if commit.removed & set(r.added)]
                if len(touched) == 1:
                    pending[touched[0]] = pending[touched[0]].followed(commit)

    def _stale(self, commit: CommitSummary) -> StaleRewrite | None:
        """``commit`` as a stale rewrite, or None (`sinks.log.foreign.stale_rewrites`)."""
        read = commit.read_version
        if read is not None and read >= commit.version - 1:
            return None  # nothing committed between its read and its commit
        if read is not None and commit.version - 1 - read <= WINDOW_MAX:
            window = [self._commit(v)[0] for v in range(read + 1, commit.version)]
            if all(w.version >= 0 for w in window):
                return stale_rewrite(commit, gone_after(window))
        live = self._live_paths(commit.version - 1)
        if live is None:
            logger.warning(
                "log %s: cannot read version %d to check Delta version %d for a stale rewrite",
                self.uri,
                commit.version - 1,
                commit.version,
            )
            return None
        return stale_rewrite(commit, dict.fromkeys(commit.removed - live))

    def _commit(self, version: int) -> tuple[CommitSummary, ForeignChange | None]:
        """One commit's summary and foreign change, read once (kept for `SUMMARIES_KEPT`);
        a summary of version -1 when the Delta log no longer holds it."""
        if version in self._commits:
            self._commits.move_to_end(version)
            return self._commits[version]
        actions = read_commit(self.location, version)
        if actions is None:
            return CommitSummary(-1, {}, frozenset(), frozenset(), False), None
        entry = CommitSummary.of(version, actions), foreign_change(version, actions)
        self._commits[version] = entry
        while len(self._commits) > SUMMARIES_KEPT:
            self._commits.popitem(last=False)
        return entry

    def _live_paths(self, version: int) -> set[str] | None:
        try:
            table = self.location.delta_table(version)
        except Exception:  # an expired version fails in several ways
            return None
        return add_action_paths(table.get_add_actions(flatten=True))


def _newest(*versions: int | None) -> int | None:
    return max((v for v in versions if v is not None), default=None)


# Writer features delta-rs 1.6, the sink's committer, refuses to write ("Unsupported table
# features required"): a log another engine upgraded with one stays readable, not writable.
UNWRITABLE_FEATURES = (  # the one a user turned on first, the one it depends on last
    "clustering",
    "rowTracking",
    "typeWidening",
    "identityColumns",
    "inCommitTimestamp",
    "domainMetadata",
)


def check_writable(location: LogLocation, table: DeltaTable) -> None:
    """Raise `TableFeatureError` when the log's protocol names a writer feature the
    sink cannot commit to; names the feature and the version and operation that added it."""
    present = set(table.protocol().writer_features or ())
    found = [f for f in UNWRITABLE_FEATURES if f in present]
    if not found:
        return
    feature, uri = found[0], location.uri
    version, operation, engine = _added_by(location, feature, table.version())
    raise TableFeatureError(
        f"log {uri}: Delta version {version} ({operation}, by {engine}) added the table "
        f"feature {feature!r}{' (and ' + ', '.join(found[1:]) + ')' if found[1:] else ''}, "
        "which delta-rs, the sink's committer, cannot write. Reading the log (state(), "
        "log(), read_state, consumers) still works; appends and passes are refused. To go on, "
        f"drop the feature with delta-spark where Delta can (ALTER TABLE delta.`{uri}` DROP "
        f"FEATURE {feature}; "
        "for clustering, ALTER TABLE ... CLUSTER BY NONE first), or restore the log to the "
        f"version before it (sink.restore({version - 1}), or `compacted-sink restore {uri} "
        f"--to-version {version - 1}`; it undoes every later commit too). See "
        'docs/operations.md, "Spark\'s own Delta on the log".',
        log_path=uri,
        version=version,
    )


def _added_by(location: LogLocation, feature: str, current: int) -> tuple[int, str, str]:
    """The version whose protocol action first named ``feature``, its operation and engine
    (walking back from ``current``; the oldest commit still in the Delta log when older)."""
    found = (current, "unknown operation", "an unknown engine")
    for version in range(current, -1, -1):
        actions = read_commit(location, version)
        if actions is None:
            break
        protocols = [a["protocol"] for a in actions if "protocol" in a]
        if protocols and feature not in (protocols[-1].get("writerFeatures") or ()):
            break
        if protocols:
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {}) or {}
            engine = info.get("engineInfo") or info.get("clientVersion") or "an unknown engine"
            found = (version, str(info.get("operation", "unknown operation")), engine)
    return found


def check_readable(uri: str, table: DeltaTable, paths: Iterable[str] = ()) -> None:
    """Raise `TableFeatureError` when the log holds what the sink's readers, which read each
    Parquet file whole and by column name, would read wrong: a file with a deletion vector
    (rows another engine deleted in place), or a column stored under another physical name
    (column mapping). Reads deletion vectors only when the protocol allows them."""
    version = table.version()
    outside = next((p for p in paths if "://" in p or p.startswith(("/", "file:"))), None)
    if outside is not None:
        raise TableFeatureError(
            f"log {uri}: at Delta version {version} the log names data files outside its own "
            f"directory (e.g. {outside}), as a SHALLOW CLONE does: the sink reads, cleans and "
            "deletes only files under the log. To restore a log elsewhere, replay it into a new "
            f"log (`compacted-sink replay <source log> --as-of <version> --to {uri}-copy`), "
            'which copies the records. See docs/operations.md, "Spark\'s own Delta on the log".',
            log_path=uri,
            version=version,
        )
    renamed = _physical_names(json.loads(table.schema().to_json()))
    if renamed:
        logical, physical = renamed[0]
        raise TableFeatureError(
            f"log {uri}: at Delta version {version} column {logical!r} is stored as "
            f"{physical!r} (the table feature 'columnMapping', by name or id, as Databricks "
            "creates tables): the sink reads and writes Parquet columns by their names, so it "
            "refuses this log rather than read nulls. Let the sink create the log (a new "
            "location), or copy the records into a table without column mapping. See "
            'docs/operations.md, "Spark\'s own Delta on the log".',
            log_path=uri,
            version=version,
        )
    with_dv: list[str] = []
    if "deletionVectors" in (table.protocol().reader_features or ()):
        vectors = pa.table(table.deletion_vectors())
        with_dv = [str(p) for p in vectors.column(0).to_pylist()] if vectors.num_rows else []
    if with_dv:
        raise TableFeatureError(
            f"log {uri}: at Delta version {version}, {len(with_dv)} live file(s) carry a "
            f"deletion vector (the table feature 'deletionVectors'; e.g. {with_dv[0]}): rows "
            "another engine deleted in place, which the sink's readers would bring back. To "
            f"go on, purge them with delta-spark (REORG TABLE delta.`{uri}` APPLY (PURGE), "
            "which the sink absorbs), or restore the log to a version before them. See "
            'docs/operations.md, "Spark\'s own Delta on the log".',
            log_path=uri,
            version=version,
        )


def _physical_names(schema: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(logical, physical) of every field, at any depth, stored under another name."""
    found = []
    for field in schema.get("fields", ()):
        physical = (field.get("metadata") or {}).get("delta.columnMapping.physicalName")
        if physical and physical != field["name"]:
            found.append((field["name"], physical))
        if isinstance(field.get("type"), Mapping):
            found += _physical_names(field["type"])
    return found


_SEARCH_COMMITS = 2_000  # how far back the commit that added a file is looked for


def check_placed(location: LogLocation, version: int, rows: Iterable[Mapping[str, Any]]) -> None:
    """Raise `ForeignChangeError` when a live file's statistics count rows with a null
    ``partition`` or ``offset`` (rows another engine inserted with only some of the log's
    columns, accepted before the accept refused them); names the file, the rows' count
    and the version that added it. Every reader and writer refuses such a log alike,
    rather than one skipping the rows and another failing on them. Metadata only."""
    for row in rows:
        nulls = max(int(row.get(f"null_count.{c}") or 0) for c in ("partition", "offset"))
        if not nulls:
            continue
        path, uri = unquote(str(row["path"])), location.uri
        added = _added_at(location, path, version)
        at = f"Delta version {added}" if added is not None else "an earlier commit"
        before = (added if added is not None else version) - 1
        raise ForeignChangeError(
            f"log {uri}: {at} added {path}, whose {nulls} row(s) have no partition or offset "
            "(null): another engine's rows without the columns a log's record needs. The "
            "sink reads no log with such rows. To go on, delete or fix them with that engine "
            f"(DELETE FROM delta.`{uri}` WHERE partition IS NULL OR offset IS NULL), then "
            f"sink.accept_foreign_changes(); or restore the log to version {before} "
            f"(sink.restore({before})), which undoes every commit after it. See "
            'docs/operations.md, "Other engines on the log".',
            log_path=uri,
            version=added if added is not None else version,
        )


def _added_at(location: LogLocation, path: str, version: int) -> int | None:
    for v in range(version, max(-1, version - _SEARCH_COMMITS), -1):
        actions = read_commit(location, v)
        if actions is None:
            return None
        if any(unquote(a["add"]["path"]) == path for a in actions if "add" in a):
            return v
    return None
