"""The log: one Delta table per state store, read and committed through delta-rs.

Ports the parts of Kafka's `UnifiedLog` the cleaner needs: its segments, the log
start and end offsets, and the atomic swap of cleaned segments. The log keeps its
own offsets (log end, log start, cleaner offset per partition; the partitions ever
written; the version checked for other engines' changes) in Delta ``txn`` actions,
committed in the same commit as the data: their ids and meanings are in
`sinks.log.log_format`.

Files another engine wrote (an OPTIMIZE's) are `ForeignFile`s beside the segments:
read like any file, never taken for a segment (`sinks.log.segment.classify`). Another
engine's stale rewrite (planned before a commit that already rewrote its files,
`sinks.log.foreign.stale_rewrites`) is seen through by a read and undone only by a
writer's snapshot (``repair=True``) or by `LogTable.repair`: a read never commits
(design.md §28, §66).

Every snapshot is read once and then used as a value: a pass commits against the
snapshot it planned from, never a refreshed one (delta-rs does not check that a
remove names a live file).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from checkpoints import now_ms
from sinks.errors import CompactedSinkError, ConcurrentCommitError
from sinks.log.bad_files import check_files
from sinks.log.committer import DELTA_RS, LogCommitter
from sinks.log.file_reader import read_files
from sinks.log.foreign.commits import CommitGuard, check_placed, check_readable, check_writable
from sinks.log.foreign.stale_revert import RestoredFile, Undo, plan_undo
from sinks.log.history_window import check_reachable
from sinks.log.landed_commits import COMMIT_TOKEN_KEY, check_removes, landed_version
from sinks.log.location import LogLocation
from sinks.log.log_format import (
    ACCEPTED_VERSION_TXN,
    CHECKED_VERSION_TXN,
    CLEANER_OFFSET_TXN,
    LOG_END_OFFSET_TXN,
    LOG_START_OFFSET_TXN,
    PARTITIONS_TXN,
    commit_metadata,
)
from sinks.log.ownership import LOG_DESCRIPTION
from sinks.log.records import spark_at_or_above
from sinks.log.segment import (
    DataFile,
    ForeignFile,
    Segment,
    add_action_paths,
    add_action_rows,
    data_file,
)
from sinks.log.segment_writer import WrittenSegment
from sinks.log.snapshot_cache import SnapshotCache
from sinks.log.trimmed_log import trimmed_under
from sinks.log.uris import is_local, join

if TYPE_CHECKING:  # the Arrow readers import this module without pyspark (design.md §59)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

AsOf = int | str | datetime

logger = logging.getLogger("compacted_sink")

REBASE_ATTEMPTS = 16
"""How many concurrent versions in a row a commit that removes files is rebased over."""


class LogTable:
    """A log's Delta table at ``location`` (a URI alone: no storage options): snapshots,
    reads into Spark, and commits."""

    def __init__(self, location: LogLocation | str, *, committer: LogCommitter = DELTA_RS) -> None:
        self.location = LogLocation.of(location)
        self.guard = CommitGuard(self.location)
        self.committer = committer  # the engine its commits go through (design.md §36)
        self.latest = SnapshotCache()  # the latest snapshot, until the next commit (§46)

    @property
    def uri(self) -> str:
        return self.location.uri

    def snapshot(
        self, as_of: AsOf | None = None, *, verify: bool = True, repair: bool = False
    ) -> LogSnapshot | None:
        """The log as of now (or a Delta version / timestamp); None when no table exists yet.

        Raises `ForeignChangeError` when a commit up to that version, not checked
        before, is another engine's data change (`sinks.log.foreign.commits`);
        ``verify=False`` skips that check (for the ways out of it). Another engine's
        stale rewrite (`sinks.log.foreign.stale_rewrites`) is seen through: the snapshot
        holds the files its undo would leave live (`sinks.log.foreign.stale_revert`) and
        cannot be committed against. Commits nothing unless ``repair``: a writer about to
        commit asks for it, and the undo is then committed (one commit of the sink's own)
        before the snapshot is returned (design.md §66). `ForeignChangeError` is raised
        when the undo would not be exact, for a read as for a writer. ``as_of`` is never
        repaired. The latest snapshot is read once and given out again until the next
        commit (`SnapshotCache`).
        """
        if as_of is None:
            kept = self.latest.get(self.location, verified=verify)
            if kept is not None and kept.committer is self.committer:
                return kept
        for _ in range(REBASE_ATTEMPTS):
            try:
                table = self.location.delta_table()
            except TableNotFoundError:
                return None
            if as_of is not None:
                self._travel(table, as_of)
            snapshot = LogSnapshot(self.location, table, committer=self.committer)
            if not verify:
                if as_of is None:
                    self.latest.keep(self.location, snapshot, verified=False)
                return snapshot
            checked = snapshot.txn_version(CHECKED_VERSION_TXN)
            accepted = snapshot.txn_version(ACCEPTED_VERSION_TXN)
            self.guard.check(snapshot.version, checked=checked, accepted=accepted)
            stale = self.guard.stale(snapshot.version, checked=checked, accepted=accepted)
            if not stale:
                snapshot.verified = True
                if as_of is None:
                    self.latest.keep(self.location, snapshot, verified=True)
                return snapshot
            undo = plan_undo(
                self.location, snapshot.data_files(), stale, current_version=snapshot.version
            )
            if as_of is not None or not repair:
                return LogSnapshot(
                    self.location, table, seen_through=undo, committer=self.committer
                )
            try:
                snapshot.commit(
                    adds=undo.restored,
                    removes=undo.removes,
                    data_change=False,
                    transactions={CHECKED_VERSION_TXN: snapshot.version},
                    info=undo.info(),
                )
            except ConcurrentCommitError:
                continue  # another commit came first (another process's undo?): check again
            logger.warning("log %s: %s", self.uri, undo.summary())
        raise ConcurrentCommitError(
            f"{self.uri}: could not undo a stale rewrite in {REBASE_ATTEMPTS} attempts"
        )

    def repair(self) -> Undo | None:
        """Undo every stale rewrite of another engine on the log (design.md §66): the undo
        the log needed (committed here, or by a writer that came first), None when it
        needed none and nothing was committed.

        Raises `FileNotFoundError` without a log, `ForeignChangeError` when the undo would
        not be exact or another engine's data change is not accepted yet. Idempotent.
        """
        seen = self.snapshot()
        if seen is None:
            raise FileNotFoundError(f"no compacted log at {self.uri}")
        if seen.seen_through is None:
            return None
        self.snapshot(repair=True)
        return seen.seen_through

    def file_paths(self, version: int) -> set[str] | None:
        """The paths (unquoted, relative to the table) of the data files live at ``version``;
        None when that version cannot be loaded any more (its commits were cleaned up).
        Read-only."""
        try:
            table = self.location.delta_table(version)
        except Exception:  # cleaned-up versions fail in several ways
            return None
        return add_action_paths(table.get_add_actions())

    def _travel(self, table: DeltaTable, as_of: AsOf) -> None:
        """Load ``as_of`` into ``table``; raises `HistoryExpiredError` before the history window."""
        current = self.location.delta_table()
        try:
            table.load_as_version(as_of)
        except Exception as e:  # cleaned-up versions fail in several ways
            check_reachable(
                self.location, as_of, version=None, current=current, now_ms=now_ms(), cause=e
            )
            raise
        check_reachable(
            self.location, as_of, version=table.version(), current=current, now_ms=now_ms()
        )

    def create(
        self, schema: StructType, configuration: Mapping[str, str] | None = None
    ) -> LogSnapshot:
        """Create the table with ``schema`` (and Delta table properties) unless it exists;
        returns the current snapshot."""
        try:
            self.committer.create_table(
                self.location,
                log_arrow_schema(schema),
                configuration=configuration,
                name=self.uri.rstrip("/").rsplit("/", 1)[-1],
                description=LOG_DESCRIPTION,  # a mark of the sink's logs (sinks.log.ownership)
            )
        except Exception:
            # Another writer may have created it between our check and our create.
            if self.snapshot() is None:
                raise
        snapshot = self.snapshot()
        assert snapshot is not None
        return snapshot

    def read(
        self,
        spark: SparkSession,
        snapshot: LogSnapshot,
        segments: Sequence[DataFile] | None = None,
    ) -> DataFrame:
        """The records of ``segments`` (default: every live file) as a DataFrame.

        Records below a partition's log start offset are filtered out (a foreign file
        may hold any partition's).
        """
        chosen = snapshot.data_files() if segments is None else list(segments)
        if not chosen:
            return spark.createDataFrame([], snapshot.spark_schema)
        snapshot.check_files(chosen)
        if is_local(self.uri):
            paths = [join(self.uri, s.path) for s in chosen]
            df = spark.read.schema(snapshot.spark_schema).parquet(*paths)
        else:
            # The pyspark wheel has no object-store file systems; executors read through pyarrow.
            df = read_files(spark, self.location, [s.path for s in chosen], snapshot.spark_schema)
        return spark_at_or_above(df, {p: snapshot.log_start_offset(p) for p in snapshot.partitions})


class LogSnapshot:
    """One version of a log: its segments per partition and its recorded offsets."""

    def __init__(
        self,
        location: LogLocation,
        table: DeltaTable,
        *,
        seen_through: Undo | None = None,
        committer: LogCommitter = DELTA_RS,
    ) -> None:
        self.location = location
        self.committer = committer
        self.uri = location.uri
        self.table = table
        self.version = table.version()
        self.verified = False  # every commit up to this version checked for foreign changes
        self.seen_through = seen_through  # files as an undo of stale rewrites leaves them
        self._transactions: dict[str, int | None] = {}

    def table_to_change(self) -> DeltaTable:
        """A Delta table of this version of its own, for a committer call that moves the table
        it is given to the version it commits (a schema, table properties, a restore):
        ``table`` may be shared with other readers of this snapshot (`SnapshotCache`) and
        stays at this version. One open of the log."""
        return self.location.delta_table(self.version)

    @cached_property
    def table_id(self) -> str:
        """The Delta table's id (``metaData.id``): new for every table created at any path."""
        return str(self.table.metadata().id)

    @cached_property
    def spark_schema(self) -> StructType:
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.table.schema().to_json()))

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the log's files (`log_arrow_schema`), from delta-rs's own
        conversion of the Delta schema: the same as pyspark's for every Delta type
        (tests/log/test_arrow_schema.py), and the Arrow readers need no pyspark for it
        (design.md §59)."""
        return arrow_schema_of(self.table)

    @cached_property
    def _files(self) -> tuple[dict[int, list[Segment]], list[ForeignFile]]:
        rows = add_action_rows(self.table.get_add_actions(flatten=True))
        check_readable(self.uri, self.table, [r["path"] for r in rows])
        check_placed(self.location, self.version, rows)
        if self.seen_through is not None:
            hidden = self.seen_through.hidden
            rows = [r for r in rows if unquote(r["path"]) not in hidden]
            rows += [f.row for f in self.seen_through.restored]
        by_partition: dict[int, list[Segment]] = {}
        foreign: list[ForeignFile] = []
        for row in rows:
            file = data_file(row)
            if isinstance(file, ForeignFile):
                foreign.append(file)
            else:
                by_partition.setdefault(file.partition, []).append(file)
        segments = {p: sorted(s) for p, s in sorted(by_partition.items())}
        return segments, sorted(foreign, key=lambda f: f.path)

    @property
    def segments(self) -> dict[int, list[Segment]]:
        """Live segments per partition, ordered by base offset (foreign files not included)."""
        return self._files[0]

    @property
    def foreign_files(self) -> list[ForeignFile]:
        """Live files another engine wrote, not yet rewritten into segments by a pass."""
        return self._files[1]

    def check_files(self, files: Sequence[DataFile]) -> None:
        """Raise `MissingDataFileError` or `CorruptDataFileError` when a file of ``files`` is
        gone or not the size its add action records (`sinks.log.bad_files`); metadata only."""
        check_files(self.location, files, current_version=self.version)

    def all_segments(self) -> list[Segment]:
        return [s for segments in self.segments.values() for s in segments]

    def data_files(self) -> list[DataFile]:
        """Every live data file: the segments, then the foreign files."""
        return [*self.all_segments(), *self.foreign_files]

    @cached_property
    def partitions(self) -> list[int]:
        """Every partition ever written, including those whose files are all gone."""
        known = self.txn_version(PARTITIONS_TXN) or 0
        foreign = {
            p
            for f in self.foreign_files
            if f.partitions
            for p in range(f.partitions[0], f.partitions[1] + 1)
        }
        return sorted(set(range(known)) | set(self.segments) | foreign)

    def txn_version(self, app_id: str) -> int | None:
        """The version recorded for ``app_id`` by a Delta ``txn`` action, if any.

        Read once per snapshot (a cache, not a refresh): delta-rs replays the log's txn
        actions on every lookup, and a batch asks for a few per partition. That replay
        reads the commit files (and the checkpoint) the table was opened from again; when
        they were trimmed since (a Delta checkpoint at this version or below, written
        after the open, made them removable, design.md §46), the table is opened again at
        this version, from that checkpoint. Raises delta-rs's error when the version itself
        is gone.
        """
        if app_id not in self._transactions:
            try:
                found = self.table.transaction_version(app_id)
            except DeltaError as e:
                if not trimmed_under(e):
                    raise
                self.table = self.location.delta_table(self.version)
                found = self.table.transaction_version(app_id)
            self._transactions[app_id] = found
        return self._transactions[app_id]

    def log_end_offset(self, partition: int) -> int:
        """The offset the next appended record of ``partition`` gets."""
        recorded = self.txn_version(LOG_END_OFFSET_TXN.format(partition)) or 0
        segments = self.segments.get(partition, [])
        return max(recorded, segments[-1].next_offset if segments else 0)

    def log_start_offset(self, partition: int) -> int:
        """The first visible offset of ``partition`` (moved by retention and delete_records)."""
        return self.txn_version(LOG_START_OFFSET_TXN.format(partition)) or 0

    def cleaner_offset(self, partition: int) -> int | None:
        """Where the last committed pass over ``partition`` ended, as the log records it."""
        return self.txn_version(CLEANER_OFFSET_TXN.format(partition))

    def log_end_offsets(self) -> dict[int, int]:
        return {p: self.log_end_offset(p) for p in self.partitions}

    def commit(
        self,
        *,
        adds: Iterable[WrittenSegment | RestoredFile] = (),
        removes: Iterable[DataFile] = (),
        data_change: bool,
        transactions: Mapping[str, int],
        info: Mapping[str, Any],
    ) -> None:
        """Commit adds and removes atomically against this snapshot's version.

        A commit that adds only is rebased by delta-rs over concurrent commits (an
        append beside a pass). A commit that removes files is rebased here instead, and
        only over commits that removed none of them: delta-rs lets a remove through
        after another engine's OPTIMIZE removed the same file, which would bring its
        records back twice. Raises `ConcurrentCommitError` when a concurrent commit
        removed a file this one removes; the caller decides whether to re-plan.
        ``info`` lands in the commit's metadata under ``compactedSink``; the commit also
        records this snapshot's version as checked for foreign changes, when it was.
        Idempotent against a lost answer: each commit carries a random token, and a commit
        that fails (a conflict, or a store error past the client's retries) after its
        conditional PUT reached the store is found by its token and counts as made.
        """
        if self.seen_through is not None:
            raise CompactedSinkError(
                f"log {self.uri}: version {self.version} is seen through an undo of stale "
                "rewrites for reading; a writer commits against a snapshot taken with "
                "repair=True"
            )
        check_writable(self.location, self.table)
        stamp = now_ms()
        if self.verified:
            transactions = {CHECKED_VERSION_TXN: self.version, **transactions}
        removes, adds = list(removes), list(adds)
        token = uuid.uuid4().hex
        metadata = commit_metadata({**info, COMMIT_TOKEN_KEY: token})

        def commit_at(table: DeltaTable) -> None:
            self.committer.commit_files(
                table,
                adds=adds,
                removes=removes,
                data_change=data_change,
                schema=self.arrow_schema,
                transactions=transactions,
                metadata=metadata,
                timestamp_ms=stamp,
            )

        if not removes:
            try:
                commit_at(self.table)
            # A conflict, or a store error after retries (delta-rs raises the store's as
            # OSError): did it land?
            except (ConcurrentCommitError, DeltaError, OSError):
                if landed_version(self.location, token, self.version) is None:
                    raise
            return
        removed = {unquote(s.path) for s in removes}
        table = self.table
        for _ in range(REBASE_ATTEMPTS):
            try:
                commit_at(table)
                return
            except ConcurrentCommitError:
                if landed_version(self.location, token, table.version()) is not None:
                    return
                latest = self.location.delta_table()
                if latest.version() == table.version():
                    raise
                check_removes(self.location, removed, table.version(), latest.version())
                table = latest
            except (DeltaError, OSError):
                if landed_version(self.location, token, table.version()) is None:
                    raise
                return
        raise ConcurrentCommitError(f"{self.uri}: still behind after {REBASE_ATTEMPTS} rebases")


def arrow_schema_of(table: DeltaTable) -> pa.Schema:
    """`log_arrow_schema` of ``table``'s Delta schema, converted by delta-rs, not pyspark."""
    arrow = pa.schema(table.schema().to_arrow())
    return pa.schema([f.with_nullable(True) for f in arrow])


def log_arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema data files are written with: Delta's types, every field nullable."""
    from sinks.spark_compat import utc_arrow_schema

    arrow = utc_arrow_schema(schema)
    return pa.schema([f.with_nullable(True) for f in arrow])
