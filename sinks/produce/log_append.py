"""Appending a batch to a compacted log: Kafka's partition leader (``UnifiedLog.appendAsLeader``).

`LogAppender.append` is the log's one produce path, for the ``foreachBatch`` hook
and the data source sink alike: skip a batch already committed, recover the log on
first use, refuse a schema change, split bad rows to the dead-letter table, then
validate, number, write and commit (`sinks.produce.append_batch` says where the rows come
from, `sinks.produce.log_commit` how they are committed).

An append is one Spark job. The prepared batch is shuffled once by ``partition``
and sorted within partitions by input order (Kafka input: by offset); each task
runs `AppendTask`, which checks, numbers from the partition's log end offset and
writes the segments in one pass, and sends back the files it wrote beside its
per-partition counts. The driver turns the counts into a `BatchReport`: on a bad
batch it deletes the files just written and raises `BadInputError`; otherwise it
commits them in one Delta commit. The data source's driver runs the same task
over Arrow tables (`sinks.produce.append_batch.ArrowRecords`), so both paths share
every check.

What the log keeps true:

- *Never half-written.* Data files become live only through the commit, so a bad
  batch (found after its files were written) or a killed append leaves at most
  files no commit names, which the append deletes or recovery removes. A bad first
  batch leaves nothing: the table is created only once a batch has passed.
- *Exactly once.* The commit carries a ``txn`` (app id, batch id) and each
  written partition's new log end offset; `committed` tells whether a batch id
  already went in, and `LogAppender.append` checks it first. Idempotent per
  (app id, batch id).
- *Offsets never repeat.* When a commit conflicts (another writer or a cleaner
  committed first), the snapshot is refreshed; if another writer moved the log
  end offset of a partition this batch wrote, the files are deleted and the batch
  is numbered and written again; otherwise the same files are committed again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import types as T

from sinks.config import CleanerConfig, topic_table_properties
from sinks.crash_points import (
    APPEND_BEFORE_COMMIT,
    DEAD_LETTER_BEFORE_APPEND,
    SCHEMA_BEFORE_APPEND,
    crash_point,
)
from sinks.errors import CommitConflictError, ConcurrentCommitError, SchemaMismatchError
from sinks.log.history_window import table_properties
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import (
    LogSnapshot,
    LogTable,
    log_arrow_schema,
    now_ms,
)
from sinks.log.ownership import check_new_log_location
from sinks.log.records import (
    TRANSIENT_COLUMNS,
    BatchReport,
    raise_for_problems,
)
from sinks.log.segment_writer import SegmentWriterTask, WrittenSegment, stats_columns
from sinks.log.storage import missing_files
from sinks.produce.append_batch import ArrowRecords, SparkRecords, TaskRunner
from sinks.produce.append_task import AppendTask, read_task_output
from sinks.produce.dead_letter import DeadLetterTable
from sinks.produce.log_commit import commit_append, commit_empty, discard, moved, overlapping
from sinks.produce.schema_commit import commit_schema
from sinks.produce.schema_evolution import (
    DEFAULT_SCHEMA_EVOLUTION,
    SchemaEvolution,
    check_mode,
    evolve_schema,
    schema_changes,
)

logger = logging.getLogger("compacted_sink")

APPEND_ATTEMPTS = 8
"""How many times an append is numbered and written, and each commit tried, before giving up."""

Records = SparkRecords | ArrowRecords


@dataclass(frozen=True)
class LogAppendInfo:
    """What one append did (Kafka's ``LogAppendInfo``).

    ``snapshot`` is the log after it. ``already_committed`` when the batch id was
    found committed (by an earlier attempt or another writer) and nothing was added.
    ``redelivered`` counts Kafka records dropped because their offsets lay below the
    log end offset (a query from a fresh checkpoint reading the topic again).
    """

    snapshot: LogSnapshot | None  # None: no log, and an empty batch did not create one
    written: tuple[WrittenSegment, ...] = ()
    already_committed: bool = False
    redelivered: int = 0  # Kafka records the log already held (a redelivery), dropped


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
    ) -> None:
        self.log = log
        self.keys = keys
        self.config = config
        self.schema_evolution = check_mode(schema_evolution)
        self.dead_letters = dead_letters
        self.recover = recover
        self.clock = clock

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
        snapshot = self.log.snapshot()
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
            commit_empty(snapshot, app_id, batch_id)
            return LogAppendInfo(self._fresh())
        prepared = records.prepare(keys=self.keys, now_ms=self.clock())
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
            )
        finally:
            prepared.release()

    def append_as_leader(
        self,
        snapshot: LogSnapshot | None,
        schema: T.StructType,
        run: TaskRunner,
        *,
        has_offsets: bool,
        app_id: str,
        batch_id: int,
    ) -> LogAppendInfo:
        """Validate, number and write with ``run``, then commit; number again after a conflict.

        ``schema`` is the batch's log columns (it creates the log when ``snapshot``
        is None). Checks `committed` only after a conflict or a creation race: `append`
        checks it first.
        """
        if snapshot is None:
            # Never create a log over someone else's files (sinks.log.ownership).
            check_new_log_location(self.log.location)
        for _attempt in range(APPEND_ATTEMPTS):
            end_offsets = snapshot.log_end_offsets() if snapshot is not None else {}
            target = self.evolved_schema(snapshot, schema) if snapshot is not None else schema
            task = self._task(target, end_offsets, has_offsets)
            written, report, problems = self._write(run, task, new_log=snapshot is None)
            if problems:
                discard(self.log, written, new_log=snapshot is None)
                raise_for_problems(problems, batch_id=batch_id)
            if snapshot is None:
                # Only a valid batch creates the log: bad input leaves no trace at all.
                snapshot = self.log.create(
                    schema,
                    {
                        **table_properties(self.config.file_delete_delay_ms),
                        **self.keys.to_properties(),
                        **topic_table_properties(self.config),
                    },
                )
                try:
                    created = self.evolved_schema(snapshot, schema) == snapshot.spark_schema
                except SchemaMismatchError:
                    discard(self.log, written)  # another writer created it with other columns
                    raise
                if committed(snapshot, app_id, batch_id):
                    discard(self.log, written)
                    return LogAppendInfo(snapshot, already_committed=True)
                if not created or moved(snapshot, written, end_offsets):
                    discard(self.log, written)  # another writer created it and appended first
                    continue
                target = snapshot.spark_schema  # the batch's own: nothing to evolve
            if not written:
                commit_empty(snapshot, app_id, batch_id)
                return LogAppendInfo(self._fresh(), redelivered=report.redelivered)
            if target != snapshot.spark_schema:
                evolved = self._commit_schema(snapshot, target, app_id, batch_id)
                if evolved is None or moved(evolved, written, end_offsets):
                    discard(self.log, written)  # another writer changed the log first: again
                    snapshot = self._fresh()
                    continue
                snapshot = evolved
            outcome = self._commit_until_settled(snapshot, written, end_offsets, app_id, batch_id)
            if isinstance(outcome, LogAppendInfo):
                if outcome.already_committed:
                    return outcome
                return dataclasses.replace(outcome, redelivered=report.redelivered)
            if outcome is None:
                break
            snapshot = outcome
        raise CommitConflictError(
            f"batch {batch_id} of {self.log.uri}: append kept conflicting after "
            f"{APPEND_ATTEMPTS} attempts; nothing was committed"
        )

    def _write(
        self, run: TaskRunner, task: AppendTask, *, new_log: bool
    ) -> tuple[list[WrittenSegment], BatchReport, list[str]]:
        """Run ``task`` over the batch: the files written, the checks' report, its problems.

        Kafka input is first written where it was read (no shuffle). Its tasks each saw
        their own rows: a repeat across tasks (overlapping files) and the whole count of
        a bad batch take one task per partition, so then the batch goes through the shuffle.
        """
        rounds = (False, True) if task.has_offsets else (True,)
        for exchange in rounds:
            written, report = read_task_output(run(task, exchange=exchange))
            problems = report.problems(
                keys=self.keys, message_max_bytes=self.config.message_max_bytes
            )
            if exchange or not (problems or overlapping(written)):
                break
            discard(self.log, written, new_log=new_log)
        return written, report, problems

    def _commit_until_settled(
        self,
        snapshot: LogSnapshot,
        written: list[WrittenSegment],
        end_offsets: Mapping[int, int],
        app_id: str,
        batch_id: int,
    ) -> LogAppendInfo | LogSnapshot | None:
        """Commit ``written``, retrying conflicts that leave our offsets valid.

        Returns the append's outcome, a fresh snapshot to number the batch again
        from (the files are deleted), or None when conflicts never settle.
        """
        for _retry in range(APPEND_ATTEMPTS):
            crash_point(APPEND_BEFORE_COMMIT)
            gone = missing_files(self.log.uri, [w.path for w in written], self.log.storage_options)
            if gone:
                # A recovery took our files for orphans (this append stalled past
                # file.delete.delay.ms): committing them would lose the batch.
                logger.warning("batch %s: %d file(s) vanished; rewriting", batch_id, len(gone))
                discard(self.log, written)
                return snapshot
            try:
                commit_append(snapshot, written, app_id, batch_id)
                return LogAppendInfo(self._fresh(), tuple(written))
            except ConcurrentCommitError as e:
                logger.info("append of batch %s conflicted (%s); refreshing", batch_id, e)
                snapshot = self._fresh()
                if committed(snapshot, app_id, batch_id):
                    discard(self.log, written)
                    return LogAppendInfo(snapshot, already_committed=True)
                if moved(snapshot, written, end_offsets):
                    discard(self.log, written)
                    return snapshot  # offsets taken by another writer: number the batch again
        discard(self.log, written)  # conflicts that never settle: give up, bounded
        return None

    def _commit_schema(
        self, snapshot: LogSnapshot, schema: T.StructType, app_id: str, batch_id: int
    ) -> LogSnapshot | None:
        """Commit the schema a batch evolves the log to, before the batch; the log after.

        None when the commit conflicted (another writer changed the log first). The
        batch's files are written with ``schema``: its commit comes next, so a crash
        between the two leaves an evolved log without the batch, which its retry appends.
        """
        changes = schema_changes(snapshot.spark_schema, schema)
        try:
            commit_schema(
                snapshot,
                schema,
                info={
                    "operation": "schema",
                    "appId": app_id,
                    "batchId": batch_id,
                    "changes": changes,
                },
            )
        except ConcurrentCommitError as e:
            logger.info("schema change of batch %s conflicted (%s); refreshing", batch_id, e)
            return None
        logger.info(
            "batch %s evolved the schema of %s: %s", batch_id, self.log.uri, "; ".join(changes)
        )
        crash_point(SCHEMA_BEFORE_APPEND)
        return self._fresh()

    def _task(
        self, log_schema: T.StructType, end_offsets: Mapping[int, int], has_offsets: bool
    ) -> AppendTask:
        # Files are written with the log's schema after the batch (the writer casts fields
        # by name, widening types); a first batch's own columns create the log.
        return AppendTask(
            writer=SegmentWriterTask(
                table_uri=self.log.uri,
                schema=log_arrow_schema(log_schema),
                stats_columns=tuple(stats_columns(log_schema, self.keys)),
                max_file_bytes=self.config.segment_bytes,
                group_column=None,
                storage_options=self.log.storage_options,
                key_columns=self.keys.key_columns,
            ),
            log_end_offsets=dict(end_offsets),
            keys=self.keys,
            has_offsets=has_offsets,
            message_max_bytes=self.config.message_max_bytes,
            log_schema=log_schema,
        )

    def _fresh(self) -> LogSnapshot:
        snapshot = self.log.snapshot()
        assert snapshot is not None
        return snapshot
