"""Appending a batch to a compacted log: Kafka's partition leader (``UnifiedLog.appendAsLeader``).

`LogAppender.append` is the log's one produce path, for the ``foreachBatch`` hook and
the data source sink alike. In order: skip a batch already committed, recover the log
on first use, refuse a schema change, split bad rows to the dead-letter table, then
`LogAppender.append_as_leader`: one retry loop, each round one `AppendAttempt`:

1. ``write``: the batch's tasks check, number from the log end offsets and write the
   segments (`sinks.produce.append_batch` runs them with one of two writers, chosen when
   the appender is built; both answer with a `sinks.produce.append_task.TaskOutput`).
   A bad batch raises `BadInputError`;
2. ``create_log`` when there was none, ``evolve_schema`` when the batch evolves it
   (committed before the files, design.md §18);
3. ``commit`` (`sinks.produce.log_commit`), retried while a conflict leaves the files'
   offsets valid; the attempt ``refresh``-es the log, ``validate``-s its files against
   it and ``clean_up``-s the files it will not commit, in one place.

Contract (design.md §1, §2, §10, §11, §12):

- *Never half-written.* Files become live only through the commit: a bad batch, a
  conflict or a killed append leaves at most files no commit names, which the attempt
  deletes or recovery removes. A bad first batch leaves nothing: the log is created
  only once a batch has passed.
- *Exactly once.* The commit carries a ``txn`` (app id, batch id) and each written
  partition's new log end offset; `committed` tells whether a batch id already went
  in. Idempotent per (app id, batch id).
- *Offsets never repeat.* After a conflict, when another writer moved the log end
  offset of a partition the batch wrote, the files are deleted and the batch numbered
  again; otherwise the same files are committed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import types as T

from sinks.config import CleanerConfig
from sinks.crash_points import (
    APPEND_BEFORE_COMMIT,
    DEAD_LETTER_BEFORE_APPEND,
    SCHEMA_BEFORE_APPEND,
    crash_point,
)
from sinks.errors import (
    BadInputError,
    CommitConflictError,
    ConcurrentCommitError,
    SchemaMismatchError,
)
from sinks.log.history_window import table_properties
from sinks.log.log_config import topic_table_properties
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import (
    LogSnapshot,
    LogTable,
    log_arrow_schema,
    now_ms,
)
from sinks.log.ownership import check_new_log_location
from sinks.log.records import TRANSIENT_COLUMNS
from sinks.log.segment_writer import SegmentWriterTask, WrittenSegment, stats_columns
from sinks.produce.append_batch import ArrowRecords, SparkRecords, TaskRunner
from sinks.produce.append_task import AppendTask
from sinks.produce.dead_letter import DeadLetterTable
from sinks.produce.log_commit import commit_append, commit_empty, discard, moved, overlapping
from sinks.produce.log_validator import raise_for_problems
from sinks.produce.redelivery import (
    Redeliveries,
    RowsBelow,
    key_on,
    prove_redeliveries,
    record_columns,
)
from sinks.produce.schema_commit import commit_schema
from sinks.produce.schema_evolution import (
    DEFAULT_SCHEMA_EVOLUTION,
    SchemaEvolution,
    check_mode,
    evolve_schema,
    schema_changes,
)
from sinks.produce.spark_append import append_writer, check_writer

logger = logging.getLogger("compacted_sink")

APPEND_ATTEMPTS = 8
"""How many times an append is numbered and written, and each commit tried, before giving up."""

Records = SparkRecords | ArrowRecords


@dataclass(frozen=True)
class LogAppendInfo:
    """What one append did (Kafka's ``LogAppendInfo``).

    ``snapshot`` is the log after it. ``already_committed`` when the batch id was
    found committed (by an earlier attempt or another writer) and nothing was added.
    ``redeliveries`` counts the Kafka records dropped because their offsets lay below the
    log end offset and the log proved them obsolete, by reason (`sinks.produce.redelivery`).
    """

    snapshot: LogSnapshot | None  # None: no log, and an empty batch did not create one
    written: tuple[WrittenSegment, ...] = ()
    already_committed: bool = False
    redeliveries: Redeliveries = Redeliveries()

    @property
    def redelivered(self) -> int:
        """How many Kafka records were dropped as redelivered (every reason)."""
        return self.redeliveries.total


def committed(snapshot: LogSnapshot | None, app_id: str, batch_id: int) -> bool:
    """True when ``snapshot`` records ``batch_id`` (or a later one) for ``app_id``."""
    recorded = snapshot.txn_version(app_id) if snapshot is not None else None
    return recorded is not None and recorded >= batch_id


class LogAppender:
    """Validates, numbers, writes and commits batches to one log: the leader's append.

    ``config`` gives ``message.max.bytes`` (the per-value limit) and ``segment.bytes``
    (where a written file rolls). ``schema_evolution`` says which schema changes a
    batch may bring (`sinks.produce.schema_evolution`); an evolved schema is committed
    before the batch's files (`sinks.produce.schema_commit`), and the files are written
    with it. ``dead_letters`` quarantines bad rows instead of failing the batch;
    ``recover`` runs before the first append to an existing log (the front passes
    `sinks.maintenance.recovery`, a layer above this one); ``clock`` gives epoch ms.
    ``writer`` says which writer writes a Spark batch's files (`sinks.produce.spark_append`,
    "Which writer runs"), chosen here once: by default from ``COMPACTED_SINK_APPEND_WRITER``
    as it is when the appender is built. Raises `ConfigError` for an unknown writer.
    """

    def __init__(
        self,
        log: LogTable,
        *,
        keys: LogKeys,
        config: CleanerConfig,
        schema_evolution: SchemaEvolution = DEFAULT_SCHEMA_EVOLUTION,
        dead_letters: DeadLetterTable | None = None,
        recover: Callable[[], object] | None = None,
        clock: Callable[[], int] = now_ms,
        writer: str | None = None,
    ) -> None:
        self.log = log
        self.keys = keys
        self.config = config
        self.schema_evolution = check_mode(schema_evolution)
        self.dead_letters = dead_letters
        self.recover = recover
        self.clock = clock
        self.writer = check_writer(writer) if writer is not None else append_writer()

    def evolved_schema(self, snapshot: LogSnapshot, schema: T.StructType) -> T.StructType:
        """The log's schema once a batch of ``schema`` is appended (the log's own when equal).

        Pure. Raises `SchemaMismatchError` for a change ``schema_evolution`` refuses.
        """
        return evolve_schema(
            snapshot.spark_schema,
            schema,
            mode=self.schema_evolution,
            fixed_columns=(*self.keys.key_columns, *filter(None, [self.keys.sequence_column])),
            ignored_columns=TRANSIENT_COLUMNS,
        )

    def append(
        self,
        records: Records,
        *,
        app_id: str,
        batch_id: int,
        older_app_ids: Sequence[str] = (),
    ) -> LogAppendInfo:
        """Append one batch exactly once per (app id, batch id): the one produce path.

        Skips a batch already committed under ``app_id`` (or one of ``older_app_ids``,
        ids earlier versions keyed the same batches by): nothing is written, not even
        dead letters. Otherwise, in order: recover the log on first use, refuse a schema
        change before anything is written (dead-letter table or not: a schema change is
        not a bad row), split bad rows to the dead-letter table (when one is set; without
        one they stay and fail the batch whole), then validate, number, write and commit
        (`append_as_leader`). Raises `BadInputError` (nothing written),
        `SchemaMismatchError` or `CommitConflictError`.
        """
        snapshot = self.log.snapshot(repair=True)
        if snapshot is not None:
            done = next(
                (a for a in (app_id, *older_app_ids) if committed(snapshot, a, batch_id)), None
            )
            if done is not None:
                logger.info("batch %s of %s already committed; skipped", batch_id, done)
                return LogAppendInfo(snapshot, already_committed=True)
            if self.recover is not None:
                self.recover()
        if records.empty:
            if snapshot is None:
                return LogAppendInfo(None)  # no log and nothing to create it with
            return self.commit_empty(snapshot, app_id=app_id, batch_id=batch_id)
        prepared = records.prepare(keys=self.keys, now_ms=self.clock(), writer=self.writer)
        try:
            if snapshot is not None:
                self.evolved_schema(snapshot, prepared.schema)  # refused: fail before any file
            if self.dead_letters is not None:
                bad = prepared.quarantine(
                    keys=self.keys, message_max_bytes=self.config.message_max_bytes
                )
                self.dead_letters.write(
                    bad,
                    log_path=self.log.uri,
                    app_id=app_id,
                    batch_id=batch_id,
                    now_ms=self.clock(),
                )
                crash_point(DEAD_LETTER_BEFORE_APPEND)
            return self.append_as_leader(
                snapshot,
                prepared.schema,
                prepared.run,
                has_offsets=prepared.has_offsets,
                app_id=app_id,
                batch_id=batch_id,
                rows_below=prepared.redelivery_rows,
            )
        finally:
            prepared.release()

    def commit_empty(
        self,
        snapshot: LogSnapshot,
        *,
        app_id: str,
        batch_id: int,
        redeliveries: Redeliveries | None = None,
    ) -> LogAppendInfo:
        """Record a batch that adds no file (empty, or only redeliveries), retrying conflicts
        as an append of files does: a pass or another writer may commit first, and nothing
        this commit holds can clash with theirs. Raises `CommitConflictError` when conflicts
        never settle in `APPEND_ATTEMPTS` commits. Idempotent per (app id, batch id)."""
        for _retry in range(APPEND_ATTEMPTS):
            try:
                commit_empty(snapshot, app_id, batch_id)
            except ConcurrentCommitError as e:
                logger.info("empty batch %s conflicted (%s); refreshing", batch_id, e)
                snapshot = self.fresh_snapshot()
                if committed(snapshot, app_id, batch_id):
                    return LogAppendInfo(snapshot, already_committed=True)
                continue
            return LogAppendInfo(self.fresh_snapshot(), redeliveries=redeliveries or Redeliveries())
        raise CommitConflictError(
            f"batch {batch_id} of {self.log.uri}: an empty commit kept conflicting after "
            f"{APPEND_ATTEMPTS} attempts; nothing was committed"
        )

    def append_as_leader(
        self,
        snapshot: LogSnapshot | None,
        schema: T.StructType,
        run: TaskRunner,
        *,
        has_offsets: bool,
        app_id: str,
        batch_id: int,
        rows_below: RowsBelow | None = None,
    ) -> LogAppendInfo:
        """Number, write and commit the batch: one retry loop over `AppendAttempt`.

        Takes the log as `append` read it (None: the batch creates the log with
        ``schema``, the batch's log columns) and the batch's task runner. Each round
        numbers and writes the batch from ``snapshot`` and commits it
        (`AppendAttempt.commit`); when another writer took the offsets it was numbered
        with, the next round numbers it again from the log as refreshed. Returns what
        the append did. Raises `BadInputError` (nothing written), `SchemaMismatchError`
        (another writer created the log with other columns) or `CommitConflictError`
        (conflicts never settled in `APPEND_ATTEMPTS` rounds or commits). Idempotent per
        (app id, batch id): a batch found committed after a conflict is not added again.
        Kafka input below the log end offset is dropped only as the log proves it obsolete
        (``rows_below`` gives those rows of the batch, `sinks.produce.redelivery`); without
        ``rows_below`` none may be dropped.
        """
        if snapshot is None:
            # Never create a log over someone else's files (sinks.log.ownership).
            check_new_log_location(self.log.location)
        for _round in range(APPEND_ATTEMPTS):
            with AppendAttempt(self, snapshot, schema, app_id=app_id, batch_id=batch_id) as attempt:
                attempt.write(run, has_offsets=has_offsets, rows_below=rows_below)
                if attempt.create_log() and attempt.evolve_schema():
                    attempt.commit()
                if attempt.outcome is not None:
                    return attempt.outcome
            snapshot = attempt.snapshot  # our offsets were taken: number again from here
        raise CommitConflictError(
            f"batch {batch_id} of {self.log.uri}: append kept conflicting after "
            f"{APPEND_ATTEMPTS} attempts; nothing was committed"
        )

    def task(
        self, log_schema: T.StructType, end_offsets: Mapping[int, int], has_offsets: bool
    ) -> AppendTask:
        """The task that writes a batch with ``log_schema`` (the log's after the batch, or a
        first batch's own columns), numbering from ``end_offsets``. Pure."""
        return AppendTask(
            writer=SegmentWriterTask(
                table_uri=self.log.location.uri,
                schema=log_arrow_schema(log_schema),
                stats_columns=tuple(stats_columns(log_schema, self.keys)),
                max_file_bytes=self.config.segment_bytes,
                group_column=None,
                storage_options=dict(self.log.location.storage_options),
                key_columns=self.keys.key_columns,
                compression=self.config.parquet_codec,
            ),
            log_end_offsets=dict(end_offsets),
            keys=self.keys,
            has_offsets=has_offsets,
            message_max_bytes=self.config.message_max_bytes,
            log_schema=log_schema,
            combine=self.config.combine_before_append,
        )

    def fresh_snapshot(self) -> LogSnapshot:
        """The log as it is now, a stale rewrite undone; it exists (an append reads it only
        once it made or saw it)."""
        snapshot = self.log.snapshot(repair=True)
        assert snapshot is not None
        return snapshot


class AppendAttempt:
    """One numbering of a batch: the log it numbers from, the offsets it took, the files it wrote.

    The attempt state of `LogAppender.append_as_leader`'s retry loop (as pyiceberg's
    snapshot producer holds a commit's): `refresh` reads the log again after a conflict,
    `validate` tells whether the files can still be committed, `clean_up` deletes the
    files it will not commit. Used as a context manager: leaving it without a commit of
    its files, or with `BadInputError` or `CommitConflictError`, cleans up. Any other
    error leaves the files where they are: a commit that failed in flight may have gone
    in, and files no commit names are recovery's (`sinks.maintenance.recovery`).

    ``outcome`` is set once the append is settled (committed, or found committed);
    ``snapshot`` is the log as this attempt last read it, where the next one numbers
    from when it is not.
    """

    def __init__(
        self,
        appender: LogAppender,
        snapshot: LogSnapshot | None,
        schema: T.StructType,
        *,
        app_id: str,
        batch_id: int,
    ) -> None:
        self.appender = appender
        self.log = appender.log
        self.snapshot = snapshot
        self.schema = schema  # the batch's log columns
        self.app_id = app_id
        self.batch_id = batch_id
        self.new_log = snapshot is None  # no table: clean-up removes the directories too
        self.end_offsets = snapshot.log_end_offsets() if snapshot is not None else {}
        # The log's schema after the batch: the files are written with it.
        self.target = appender.evolved_schema(snapshot, schema) if snapshot is not None else schema
        self.written: list[WrittenSegment] = []
        self.redeliveries = Redeliveries()
        self.outcome: LogAppendInfo | None = None

    def __enter__(self) -> AppendAttempt:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        settled_by_us = self.outcome is not None and not self.outcome.already_committed
        if (kind is None and not settled_by_us) or (kind and issubclass(kind, _CLEAN_UP_ON)):
            self.clean_up()

    # -- the steps, in order -------------------------------------------------------------------

    def write(
        self, run: TaskRunner, *, has_offsets: bool, rows_below: RowsBelow | None = None
    ) -> None:
        """Validate, number and write the batch with ``run``, from `end_offsets`.

        Kafka input is first written where it was read (no shuffle). Its tasks each saw
        their own rows: a repeat across tasks (overlapping files) and the whole count of
        a bad batch take one task per partition, so then the batch goes through the shuffle.
        Kafka records the tasks dropped below the log end offset must be proven obsolete
        (`prove_redeliveries`, from ``rows_below``). Raises `BadInputError` listing what the
        checks found, or the records below the log end the log cannot account for (the
        files are cleaned up).
        """
        task = self.appender.task(self.target, self.end_offsets, has_offsets)
        for exchange in (False, True) if has_offsets else (True,):
            output = run(task, exchange=exchange)
            self.written, redelivered = output.written, output.report.redelivered
            problems = output.report.problems(
                keys=self.appender.keys, message_max_bytes=self.appender.config.message_max_bytes
            )
            if exchange or not (problems or overlapping(self.written)):
                break
            self.clean_up()
        raise_for_problems(problems, batch_id=self.batch_id)
        if redelivered:
            self.prove(redelivered, rows_below)

    def prove(self, redelivered: int, rows_below: RowsBelow | None) -> None:
        """Check the ``redelivered`` records the tasks dropped below the log end offset
        against the log (`prove_redeliveries`); raises `BadInputError` for any it cannot
        account for."""
        if self.snapshot is None or rows_below is None:
            raise BadInputError(
                f"batch {self.batch_id}: {redelivered} record(s) lie below the log end offset "
                "and cannot be checked against the log; nothing was written"
            )
        keys = self.appender.keys
        rows = rows_below(self.end_offsets, columns=record_columns(keys), on=key_on(keys))
        self.redeliveries = prove_redeliveries(
            self.snapshot, rows, self.end_offsets, keys, batch_id=self.batch_id
        )

    def create_log(self) -> bool:
        """Create the log when none existed (only a valid batch creates it); True to go on.

        False when another writer created it first and then committed this batch (the
        outcome says so) or appended to a partition this batch wrote: number again.
        Raises `SchemaMismatchError` when that writer created it with other columns.
        """
        if self.snapshot is not None:
            return True
        config = self.appender.config
        self.snapshot = self.log.create(
            self.schema,
            {
                **table_properties(config.file_delete_delay_ms),
                **self.appender.keys.to_properties(),
                **topic_table_properties(config),
            },
        )
        self.new_log = False
        created = self.appender.evolved_schema(self.snapshot, self.schema)
        if not self.validate() or created != self.snapshot.spark_schema:
            return False
        self.target = self.snapshot.spark_schema  # the batch's own: nothing to evolve
        return True

    def evolve_schema(self) -> bool:
        """Commit the schema the batch evolves the log to, before its files; True to go on.

        The files are written with it, and their commit comes next: a crash between the
        two leaves an evolved log without the batch, which its retry appends. False when
        the schema commit conflicted or the log moved under it: number again.
        """
        snapshot = self.snapshot
        assert snapshot is not None
        if not self.written or self.target == snapshot.spark_schema:
            return True
        changes = schema_changes(snapshot.spark_schema, self.target)
        info = {"operation": "schema", "appId": self.app_id, "batchId": self.batch_id}
        try:
            commit_schema(snapshot, self.target, info={**info, "changes": changes})
        except ConcurrentCommitError as e:
            logger.info("schema change of batch %s conflicted (%s); refreshing", self.batch_id, e)
            self.refresh()
            return False
        logger.info(
            "batch %s evolved the schema of %s: %s", self.batch_id, self.log.uri, "; ".join(changes)
        )
        crash_point(SCHEMA_BEFORE_APPEND)
        self.refresh()
        return not moved(self.snapshot, self.written, self.end_offsets)

    def commit(self) -> None:
        """Commit the files (an empty batch: its id), retrying conflicts that leave them valid.

        Sets `outcome` when settled. Leaves it None when the files must be written again:
        another writer took the offsets, or a recovery took the files for orphans (this
        append stalled past ``file.delete.delay.ms``). Raises `CommitConflictError` when
        conflicts never settle in `APPEND_ATTEMPTS` commits.
        """
        snapshot = self.snapshot
        assert snapshot is not None
        if not self.written:
            self.outcome = self.appender.commit_empty(
                snapshot, app_id=self.app_id, batch_id=self.batch_id, redeliveries=self.redeliveries
            )
            return
        for _retry in range(APPEND_ATTEMPTS):
            crash_point(APPEND_BEFORE_COMMIT)
            paths = [w.path for w in self.written]
            gone = self.log.location.missing_files(paths)
            if gone:
                logger.warning("batch %s: %d file(s) vanished; rewriting", self.batch_id, len(gone))
                return
            try:
                commit_append(self.snapshot, self.written, self.app_id, self.batch_id)
            except ConcurrentCommitError as e:
                logger.info("append of batch %s conflicted (%s); refreshing", self.batch_id, e)
                self.refresh()
                if not self.validate():
                    return
                continue
            self.outcome = LogAppendInfo(
                self.appender.fresh_snapshot(), tuple(self.written), redeliveries=self.redeliveries
            )
            return
        raise CommitConflictError(
            f"batch {self.batch_id} of {self.log.uri}: append kept conflicting after "
            f"{APPEND_ATTEMPTS} attempts; nothing was committed"
        )

    # -- refresh, validate, clean up -----------------------------------------------------------

    def refresh(self) -> None:
        """Read the log again (after a conflict)."""
        self.snapshot = self.appender.fresh_snapshot()

    def validate(self) -> bool:
        """Whether the files can still be committed against `snapshot`.

        False when the batch is already in (`outcome` says so: another attempt or writer
        committed it) or another writer moved the log end offset of a partition the files
        hold (their offsets are taken).
        """
        assert self.snapshot is not None
        if committed(self.snapshot, self.app_id, self.batch_id):
            self.outcome = LogAppendInfo(self.snapshot, already_committed=True)
            return False
        return not moved(self.snapshot, self.written, self.end_offsets)

    def clean_up(self) -> None:
        """Delete the files this attempt wrote and will not commit. Idempotent."""
        discard(self.log, self.written, new_log=self.new_log)
        self.written = []


_CLEAN_UP_ON = (BadInputError, SchemaMismatchError, CommitConflictError)
