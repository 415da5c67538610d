"""`CompactedStateSink`: the foreachBatch hook and the front object over one compacted log.

The hook is Kafka's produce path: it appends the batch to the dirty end of the
log (`sinks.log.log_append`: validate, assign offsets, write, commit, in one
Spark job) and hands the log to its `LogCleaner` (`sinks.cleaner.log_cleaner`),
as a broker hands its logs to the cleaner threads. Inside a streaming query
cleaning runs on a worker thread beside the query, so a batch never waits for
a pass; called directly (or with ``cleaning="inline"``) the hook cleans in the
same call. The front also reads the log and its state back.

Exactly once: each append commits a Delta ``txn`` action (app id, batch id).
A batch id already recorded for the app id is skipped, by this object or by a
new one on the same path after a restart. Inside a streaming query the app id is
``<sink_id>/query=<query id>``: a restarted query keeps its id (it lives in the
query's checkpoint), and a query started from a fresh checkpoint, whose batch ids
restart at 0, is not mistaken for the old one. Under Spark Connect, which tells a
``foreachBatch`` function nothing about its query, the id is read from the
query's checkpoint (``checkpoint_location``).

Reliability (SPEC rules 10-12): the first append, pass or ``delete_records`` of a
sink object recovers the log (`sinks.maintenance.recovery`); with a
``dead_letter_table`` bad rows are quarantined before the append
(`sinks.log.dead_letter`); retention and passes belong to the cleaner.
`sinks.crash_points` marks where the crash tests kill it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame, SparkSession

from checkpoints import CleanerOffsetCheckpoint
from sinks.cleaner.cleaner import Cleaner
from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_cleaner import CleaningMode, LogCleaner
from sinks.cleaner.log_to_clean import (
    LogToClean,
)
from sinks.config import CleanerConfig
from sinks.crash_points import (
    DEAD_LETTER_BEFORE_APPEND,
    crash_point,
)
from sinks.log.dead_letter import DeadLetterTable, split_batch
from sinks.log.log_append import AppendReport, LogAppender, committed
from sinks.log.log_keys import opened_log_keys
from sinks.log.log_table import AsOf, LogSnapshot, LogTable, now_ms
from sinks.log.records import PreparedBatch, log_columns, prepare_batch
from sinks.log.schema_evolution import DEFAULT_SCHEMA_EVOLUTION, SchemaEvolution
from sinks.log.segment_writer import WrittenSegment
from sinks.log.storage import normalize_uri, sibling
from sinks.maintenance import foreign_changes, retention
from sinks.maintenance.recovery import RecoveryReport, recover_log, write_clean_shutdown_marker
from sinks.maintenance.retention import RetentionPlan
from sinks.maintenance.segment_deleter import DeletionReport
from sinks.python_workers import check_python_workers
from sinks.reading.state_reader import read_state
from sinks.shutdown import finished_before_exit
from sinks.spark_session import active_session, streaming_query_id

logger = logging.getLogger("compacted_sink")

CHECKPOINT_TABLE_NAME = "_cleaner-offset-checkpoint"


class CompactedStateSink:
    """A compacted log of keyed records in a Delta table, fed by ``foreachBatch``.

    ``path`` is the table's location (created on the first batch). ``key_columns``
    are compared exactly; None (the default) takes the log's, recorded on it as a
    table property, or ``("key",)`` for a new log; other key columns than an existing
    log's raise `KeyColumnsMismatchError` (see `sinks.log.log_keys`); so does another
    sequence column. ``sequence_column`` orders records instead of the offset (ties
    broken by offset; None takes the log's). ``checkpoint_table`` defaults to
    ``_cleaner-offset-checkpoint`` beside the table. ``sink_id`` defaults to one
    derived from the path. ``clock`` returns epoch milliseconds. ``cleaning`` says
    where passes run: ``"auto"`` (the default) on a background worker inside a
    streaming query and in the hook's call otherwise, or always ``"background"`` or
    ``"inline"``; `close` stops the worker. ``checkpoint_location`` is the streaming
    query's ``checkpointLocation``: under Spark Connect, where a ``foreachBatch``
    function is not told its query, the sink reads the query id from it (needed
    there unless ``sink_id`` is given; see `sinks.spark_session.streaming_query_id`).
    ``schema_evolution`` is ``"additive"`` (a batch may add fields at any depth, relax
    nullability and widen types; the log's schema evolves with it) or ``"none"`` (every
    change is refused); see `sinks.log.schema_evolution`.
    """

    def __init__(
        self,
        path: str,
        key_columns: Sequence[str] | None = None,
        config: CleanerConfig | None = None,
        *,
        sequence_column: str | None = None,
        checkpoint_table: str | None = None,
        dead_letter_table: str | None = None,
        sink_id: str | None = None,
        clock: Callable[[], int] | None = None,
        storage_options: dict[str, str] | None = None,
        cleaning: CleaningMode = "auto",
        checkpoint_location: str | None = None,
        schema_evolution: SchemaEvolution = DEFAULT_SCHEMA_EVOLUTION,
    ) -> None:
        if isinstance(key_columns, str):
            key_columns = (key_columns,)
        if key_columns is not None and not key_columns:
            raise ValueError("key_columns must name at least one column")
        self.path = normalize_uri(path)
        self.storage_options = dict(storage_options or {})
        self.log_table = LogTable(self.path, self.storage_options)
        keys = opened_log_keys(self.log_table, key_columns, sequence_column)
        self.key_columns = keys.key_columns
        self.config = config or CleanerConfig()
        self.sequence_column = sequence_column = keys.sequence_column
        self.checkpoint_path = normalize_uri(
            checkpoint_table or sibling(self.path, CHECKPOINT_TABLE_NAME)
        )
        self.dead_letter_table = normalize_uri(dead_letter_table) if dead_letter_table else None
        self.sink_id = sink_id or _default_sink_id(self.path)
        self._explicit_sink_id = sink_id is not None
        self.checkpoint_location = (
            normalize_uri(checkpoint_location) if checkpoint_location else None
        )
        self.clock = clock or now_ms
        self.checkpoints = CleanerOffsetCheckpoint(self.checkpoint_path, self.storage_options)
        self.cleaner = Cleaner(
            self.log_table,
            key_columns=self.key_columns,
            sequence_column=sequence_column,
            delete_retention_ms=self.config.delete_retention_ms,
            segment_bytes=self.config.segment_bytes,
            dedupe_buffer_size=self.config.dedupe_buffer_size,
        )
        self.appender = LogAppender(
            self.log_table,
            key_columns=self.key_columns,
            sequence_column=sequence_column,
            config=self.config,
            schema_evolution=schema_evolution,
        )
        self.schema_evolution = self.appender.schema_evolution
        self.last_append: AppendReport | None = None
        self.dead_letters = (
            DeadLetterTable(self.dead_letter_table, self.storage_options)
            if self.dead_letter_table
            else None
        )
        self.manager = CleanerManager(self.checkpoints, self.path, clock=self.clock)
        self.cleaning: CleaningMode = cleaning
        self._log_cleaner: LogCleaner | None = None
        self.last_recovery: RecoveryReport | None = None
        self.last_retention: RetentionPlan | None = None

    def __repr__(self) -> str:
        return f"CompactedStateSink({self.path!r}, key_columns={self.key_columns!r})"

    # -- the foreachBatch hook ---------------------------------------------------------

    @finished_before_exit
    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Append one micro-batch exactly once, then hand the log to its cleaner.

        Inside a streaming query (``cleaning="auto"``) the cleaner's thread is woken and
        the call returns; otherwise the call cleans what became cleanable before it
        returns. Idempotent per (app id, batch id): a batch already committed writes
        nothing, not even to the dead-letter table.
        Bad input raises `BadInputError` (null keys, repeated or null Kafka offsets,
        oversized values, undecodable payloads) and commits nothing; a schema change that
        ``schema_evolution`` refuses raises `SchemaMismatchError` before anything is
        written, dead-letter table or not; see `sinks.log.log_append` for how the append
        itself runs (and commits an evolved schema before the batch).
        """
        started = time.monotonic()
        spark = batch_df.sparkSession
        query_id = self._query_id(spark, batch_id)
        app_id = self._app_id(query_id)
        snapshot = self.log_table.snapshot()
        if committed(snapshot, app_id, batch_id):
            logger.info("batch %s of %s already committed; skipped", batch_id, app_id)
            assert snapshot is not None
            self._finish(spark, batch_id, snapshot, started, skipped=True, query_id=query_id)
            return

        check_python_workers(spark)  # once per SparkContext: a one-line error, not a trace
        if snapshot is not None:
            self._ensure_recovered()
        # One walk forward: prepare and check once, split good from bad once (the
        # split is cached, so the batch is evaluated once for both tables), append.
        # Without a dead-letter table, bad rows (and rows a decoder flagged in
        # _decode_error) stay in the batch: the append counts them and fails it whole.
        # A schema the log refuses fails the batch before anything is written, also with
        # a dead-letter table: a schema change is not a bad row.
        prepared = prepare_batch(
            batch_df,
            key_columns=self.key_columns,
            sequence_column=self.sequence_column,
            now_ms=self.clock(),
        )
        if snapshot is not None:
            self.appender.evolved_schema(snapshot, log_columns(prepared.df).schema)
        split = None
        if self.dead_letters is not None:
            split = split_batch(
                prepared.df,
                key_columns=self.key_columns,
                has_offsets=prepared.has_offsets,
                message_max_bytes=self.config.message_max_bytes,
                record_columns=batch_df.columns,
            )
            self._dead_letter(split.bad, app_id, batch_id)
            prepared = PreparedBatch(split.good, prepared.has_offsets)
        try:
            info = self.appender.append(snapshot, prepared, app_id=app_id, batch_id=batch_id)
        finally:
            if split is not None:
                split.release()
        self._finish(
            spark,
            batch_id,
            info.snapshot,
            started,
            skipped=info.already_committed,
            query_id=query_id,
            written=list(info.written),
            redelivered=info.redelivered,
        )

    def _finish(
        self,
        spark: SparkSession,
        batch_id: int,
        snapshot: LogSnapshot,
        started: float,
        *,
        skipped: bool,
        query_id: str | None,
        written: list[WrittenSegment] | None = None,
        redelivered: int = 0,
    ) -> None:
        """Report the batch, then hand the log to its cleaner (inline, or wake the worker)."""
        append_ms = int((time.monotonic() - started) * 1000)
        cleaner = self.log_cleaner
        stats = None
        if skipped or not cleaner.has_work(snapshot):
            pass  # nothing to clean or retain: the batch costs no round
        elif self._cleans_in_background(query_id):
            cleaner.wakeup(spark)
        else:
            stats = cleaner.maintain(spark).clean
            if stats is not None:
                snapshot = self.log_table.snapshot() or snapshot
        written = written or []
        self.last_append = AppendReport(
            batch_id=batch_id,
            records=sum(w.num_records for w in written),
            partitions=tuple(sorted({w.partition for w in written})),
            files=len(written),
            bytes=sum(w.size_bytes for w in written),
            skipped=skipped,
            dirty_ratio=cleaner.dirty_ratio(snapshot, fresh_checkpoints=False),
            duration_ms=append_ms,
            delta_version=snapshot.version,
            clean=stats,
            redelivered=redelivered,
        )
        logger.info("%s", self.last_append.summary())

    def _cleans_in_background(self, query_id: str | None) -> bool:
        if self.cleaning == "auto":
            return query_id is not None
        return self.cleaning == "background"

    # -- cleaning ----------------------------------------------------------------------

    @property
    def log_cleaner(self) -> LogCleaner:
        """This log's cleaner (created on first use; not part of the pickled sink)."""
        if self._log_cleaner is None:
            self._log_cleaner = LogCleaner(
                self.log_table,
                self.checkpoints,
                self.manager,
                self.cleaner,
                self.config,
                clock=self.clock,
            )
        return self._log_cleaner

    def logs_to_clean(self, snapshot: LogSnapshot | None = None) -> list[LogToClean]:
        """Every partition as a cleaning candidate, measured now (no Spark job)."""
        return self.log_cleaner.logs_to_clean(snapshot)

    def dirty_ratio(self) -> float:
        """The dirty ratio over all partitions: cleanable bytes over clean plus cleanable."""
        return self.log_cleaner.dirty_ratio()

    @finished_before_exit
    def clean(self, force: bool = False) -> CleanerStats | None:
        """Clean every cleanable partition in one pass now; None when nothing is cleanable.

        Synchronous whatever the cleaning mode: waits for a pass of the background
        worker to end, then runs its own. Without ``force`` a partition qualifies by
        SPEC rule 4 (ratio, max lag, or an expired tombstone); with it, any cleanable
        bytes or expired tombstone will do. The returned stats cover every partition
        the pass cleaned. Raises `CleanerError` when the pass fails; the log is then
        unchanged.
        """
        if self.log_table.snapshot() is None:
            return None
        self._ensure_recovered()
        cleaner = self.log_cleaner
        if self.config.delete:
            self.last_retention = cleaner.retain()
        if not self.config.compact:
            return None
        return cleaner.clean(active_session(), force=force)

    def vacuum(self) -> DeletionReport:
        """Delete now what left the log longer than ``file.delete.delay.ms`` ago (bounded per
        call; see `sinks.maintenance.segment_deleter`); the cleaner also does it on its own,
        every ``log.retention.check.interval.ms``. Idempotent."""
        if self.log_table.snapshot() is None:
            raise FileNotFoundError(f"no compacted log at {self.path}")
        return self.log_cleaner.segment_deleter.run(self.manager.busy_partitions)

    def add_pass_listener(self, listener: Callable[[CleanerStats], None]) -> None:
        """Call ``listener`` with the figures of every pass this sink's cleaner commits,
        from the thread that ran it (the background worker inside a streaming query)."""
        self.log_cleaner.listeners.append(listener)

    def await_cleaner(self, timeout_s: float | None = None) -> bool:
        """Wait until the background cleaner has no round running or pending; False on timeout."""
        return self._log_cleaner is None or self._log_cleaner.await_idle(timeout_s)

    # -- recovery, retention, cleaner states --------------------------------------------

    def recover(self) -> RecoveryReport:
        """Recover the log now (see `sinks.maintenance.recovery`): orphans, checkpoint, offsets.

        Runs by itself once per sink object, before its first append, pass or
        ``delete_records``. Idempotent. Raises `LogCorruptedError` when offsets are
        broken; the sink then refuses to write.
        """
        self.last_recovery = recover_log(
            self.log_table,
            self.checkpoints,
            file_delete_delay_ms=self.config.file_delete_delay_ms,
            manager=self.manager,
        )
        return self.last_recovery

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the background cleaner after its current pass, then write the clean-shutdown
        marker, so the next open skips the full offset check. Idempotent."""
        if self._log_cleaner is not None:
            self._log_cleaner.shutdown(timeout_s)
        snapshot = self.log_table.snapshot()
        if snapshot is not None:
            write_clean_shutdown_marker(self.log_table, snapshot.version)

    def __enter__(self) -> CompactedStateSink:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()

    def delete_records(self, partition: int, before_offset: int) -> RetentionPlan:
        """Move ``partition``'s log start offset to ``before_offset`` (Kafka's DeleteRecords).

        Records below it leave ``log()`` and ``state()`` at once; files wholly below
        it are removed. Cleaning of the partition is paused meanwhile. Idempotent;
        an offset at or below the log start changes nothing. Raises
        `OffsetOutOfRangeError` above the log end offset.
        """
        if self.log_table.snapshot() is None:
            raise FileNotFoundError(f"no compacted log at {self.path}")
        self._ensure_recovered()
        self.manager.pause_cleaning([partition])
        try:
            return retention.delete_records(self.log_table, partition, before_offset)
        finally:
            self.manager.resume_cleaning([partition])

    def pause_cleaning(self, partitions: Sequence[int] | None = None) -> None:
        """Stop passes over ``partitions`` (default: all) until `resume_cleaning`.

        Waits for a pass that is running elsewhere (see `CleanerManager.pause_cleaning`).
        """
        self.manager.pause_cleaning(self._partitions(partitions))

    def resume_cleaning(self, partitions: Sequence[int] | None = None) -> None:
        """Let paused ``partitions`` (default: all) be cleaned again."""
        self.manager.resume_cleaning(self._partitions(partitions))

    def _partitions(self, partitions: Sequence[int] | None) -> list[int]:
        if partitions is not None:
            return list(partitions)
        snapshot = self.log_table.snapshot()
        return snapshot.partitions if snapshot is not None else []

    def _ensure_recovered(self) -> None:
        if self.last_recovery is None:
            self.recover()

    def _dead_letter(self, dead_letters: DataFrame, app_id: str, batch_id: int) -> None:
        """Commit a batch's dead letters (once per app id and batch id), before its append.

        Both commits are keyed by (app id, batch id), so a crash between the two is
        repaired by the batch's replay.
        """
        assert self.dead_letters is not None
        self.dead_letters.write(
            dead_letters, log_path=self.path, app_id=app_id, batch_id=batch_id, now_ms=self.clock()
        )
        crash_point(DEAD_LETTER_BEFORE_APPEND)

    # -- other engines on the log --------------------------------------------------------

    def accept_foreign_changes(self, through_version: int | None = None) -> int:
        """Accept the records as they are after another engine's data change, and go on.

        Every commit up to ``through_version`` (default: the current version) is taken
        as it is; the sink stops at later ones again. Returns the accepted version.
        What another engine deleted stays deleted; a key whose newest record it removed
        shows its previous value. See `sinks.log.foreign_commits`.
        """
        return foreign_changes.accept(self.log_table, through_version)

    def restore(self, version: int) -> int:
        """Bring the log back to Delta ``version`` (inside the history window), undoing
        everything committed after it: another engine's change, and the sink's own appends
        and passes. Offsets keep counting from the log end offset. Returns the new version.

        Cleaning is paused meanwhile; the log is recovered afterwards.
        """
        snapshot = self.log_table.snapshot(verify=False)
        if snapshot is None:
            raise FileNotFoundError(f"no compacted log at {self.path}")
        self.manager.pause_cleaning(snapshot.partitions)
        try:
            restored = foreign_changes.restore(self.log_table, version)
        finally:
            self.manager.resume_cleaning(snapshot.partitions)
        self.recover()
        return restored

    # -- reading -----------------------------------------------------------------------

    def log(self, as_of: AsOf | None = None) -> DataFrame:
        """Every stored record at or above its partition's log start offset, with metadata."""
        spark = active_session()
        snapshot = self.log_table.snapshot(as_of)
        if snapshot is None:
            raise FileNotFoundError(f"no compacted log at {self.path}")
        return self.log_table.read(spark, snapshot)

    def state(self, as_of: AsOf | None = None) -> DataFrame:
        """One row per live key (key columns + ``value``): the latest record unless a tombstone.

        ``as_of`` (a Delta version, or a timestamp) reads the log as it was then.
        """
        snapshot = self.log_table.snapshot(as_of)
        if snapshot is None:
            raise FileNotFoundError(f"no compacted log at {self.path}")
        return read_state(
            active_session(), self.log_table, snapshot, self.key_columns, self.sequence_column
        )

    def _query_id(self, spark: SparkSession, batch_id: int) -> str | None:
        """The id of the streaming query running this batch; None for a direct call.

        Under Spark Connect it comes from ``checkpoint_location`` (see
        `sinks.spark_session.streaming_query_id`).
        """
        return streaming_query_id(
            spark,
            batch_id,
            checkpoint_location=self.checkpoint_location,
            explicit_sink_id=self._explicit_sink_id,
            storage_options=self.storage_options,
        )

    def _app_id(self, query_id: str | None) -> str:
        return f"{self.sink_id}/query={query_id}" if query_id else self.sink_id

    def __getstate__(self) -> dict[str, object]:
        # The cleaner's worker thread and locks live in one process; a sink shipped to
        # another (Spark Connect's foreachBatch worker) makes its own on first use.
        state = dict(self.__dict__)
        state["_log_cleaner"] = None
        return state


def _default_sink_id(path: str) -> str:
    digest = hashlib.sha256(path.encode()).hexdigest()[:12]
    return f"compacted-sink-{digest}"
