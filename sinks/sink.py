"""`CompactedStateSink`: the foreachBatch hook and the front object over one compacted log.

A front, as delta-rs's ``DeltaTable`` is. The hook is Kafka's produce path: it appends
the batch exactly once (`sinks.log.log_append.LogAppender.append`) and hands the log
to its `LogCleaner` (`sinks.cleaner.log_cleaner`), which owns the cleaning: beside
a streaming query on a worker thread, or in the hook's call. Reads go to
`sinks.reading`, recovery and retention to `sinks.maintenance`.

Exactly once: each append commits a Delta ``txn`` (app id, batch id); a batch id
already recorded for the app id is skipped, also by a new sink on the same path.
Inside a streaming query the app id is ``<sink_id>/query=<query id>``: a restarted
query keeps its id, a query from a fresh checkpoint (batch ids from 0 again) is a
new one. Under Spark Connect the id is read from the query's checkpoint
(``checkpoint_location``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame, SparkSession

from checkpoints import CleanerOffsetCheckpoint
from sinks.append_report import AppendReport
from sinks.cleaner.cleaner import Cleaner
from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_cleaner import CleaningMode, LogCleaner
from sinks.cleaner.log_to_clean import LogToClean
from sinks.config import CleanerConfig
from sinks.log.append_batch import SparkRecords
from sinks.log.dead_letter import DeadLetterTable
from sinks.log.log_append import LogAppender
from sinks.log.log_keys import opened_log_keys
from sinks.log.log_table import AsOf, LogSnapshot, LogTable, now_ms
from sinks.log.schema_evolution import DEFAULT_SCHEMA_EVOLUTION, SchemaEvolution
from sinks.log.storage import normalize_uri, sibling
from sinks.maintenance import foreign_changes, retention
from sinks.maintenance.recovery import RecoveryReport, recover_log, write_clean_shutdown_marker
from sinks.maintenance.retention import RetentionPlan
from sinks.maintenance.segment_deleter import DeletionReport
from sinks.python_workers import check_python_workers
from sinks.reading.state_reader import read_state
from sinks.shutdown import finished_before_exit
from sinks.spark_session import active_session, streaming_query_id

__all__ = ["AppendReport", "CompactedStateSink"]

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
        self.key_columns, self.sequence_column = keys.key_columns, keys.sequence_column
        self.config = config or CleanerConfig()
        checkpoint_table = checkpoint_table or sibling(self.path, CHECKPOINT_TABLE_NAME)
        self.checkpoint_path = normalize_uri(checkpoint_table)
        self.checkpoints = CleanerOffsetCheckpoint(self.checkpoint_path, self.storage_options)
        self.dead_letter_table = normalize_uri(dead_letter_table) if dead_letter_table else None
        self.sink_id = sink_id or _default_sink_id(self.path)
        self._explicit_sink_id = sink_id is not None
        self.checkpoint_location = (
            normalize_uri(checkpoint_location) if checkpoint_location else None
        )
        self.clock = clock or now_ms
        self.cleaning: CleaningMode = cleaning
        self.appender = LogAppender(
            self.log_table,
            key_columns=self.key_columns,
            sequence_column=self.sequence_column,
            config=self.config,
            schema_evolution=schema_evolution,
            dead_letters=DeadLetterTable(self.dead_letter_table, self.storage_options)
            if self.dead_letter_table
            else None,
            recover=self._ensure_recovered,
            clock=self.clock,
        )
        self.schema_evolution = self.appender.schema_evolution
        self.last_append: AppendReport | None = None
        self.last_recovery: RecoveryReport | None = None
        self._log_cleaner: LogCleaner | None = None

    def __repr__(self) -> str:
        return f"CompactedStateSink({self.path!r}, key_columns={self.key_columns!r})"

    @finished_before_exit
    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Append one micro-batch exactly once, then hand the log to its cleaner.

        Inside a streaming query (``cleaning="auto"``) the cleaner's thread is woken and
        the call returns; otherwise the call cleans what became cleanable before it
        returns. A batch already committed writes nothing, not even dead letters. Bad
        input raises `BadInputError` and commits nothing; a schema change that
        ``schema_evolution`` refuses raises `SchemaMismatchError` before anything is
        written (see `LogAppender.append`).
        """
        started = time.monotonic()
        spark = batch_df.sparkSession
        query_id = self._query_id(spark, batch_id)
        records = SparkRecords(batch_df, before_prepare=lambda: check_python_workers(spark))
        info = self.appender.append(records, app_id=self._app_id(query_id), batch_id=batch_id)
        assert info.snapshot is not None
        duration_ms = int((time.monotonic() - started) * 1000)
        stats, snapshot, ratio = self.log_cleaner.hand_over(
            spark,
            info.snapshot,
            background=self._cleans_in_background(query_id),
            appended=not info.already_committed,
        )
        self.last_append = AppendReport.of(
            batch_id,
            info,
            dirty_ratio=ratio,
            duration_ms=duration_ms,
            delta_version=snapshot.version,
            clean=stats,
        )
        logger.info("%s", self.last_append.summary())

    def _cleans_in_background(self, query_id: str | None) -> bool:
        if self.cleaning == "auto":
            return query_id is not None
        return self.cleaning == "background"

    # -- cleaning: the log's `LogCleaner` ----------------------------------------------------

    @property
    def log_cleaner(self) -> LogCleaner:
        """This log's cleaner (created on first use; not part of the pickled sink)."""
        if self._log_cleaner is None:
            self._log_cleaner = LogCleaner(
                self.log_table,
                self.checkpoints,
                self.config,
                key_columns=self.key_columns,
                sequence_column=self.sequence_column,
                clock=self.clock,
                recover=self._ensure_recovered,
            )
        return self._log_cleaner

    @property
    def cleaner(self) -> Cleaner:
        return self.log_cleaner.cleaner

    @property
    def manager(self) -> CleanerManager:
        return self.log_cleaner.manager

    def logs_to_clean(self, snapshot: LogSnapshot | None = None) -> list[LogToClean]:
        """Every partition as a cleaning candidate, measured now (no Spark job)."""
        return self.log_cleaner.logs_to_clean(snapshot)

    def dirty_ratio(self) -> float:
        """Cleanable bytes over clean plus cleanable bytes, over all partitions."""
        return self.log_cleaner.dirty_ratio()

    @finished_before_exit
    def clean(self, force: bool = False) -> CleanerStats | None:
        """One round now (retention, a pass over every cleanable partition, expired files);
        the pass's figures, or None when nothing was cleanable.

        Synchronous whatever the cleaning mode: waits for a pass of the background
        worker to end, then runs its own. Without ``force`` a partition qualifies by
        SPEC rule 4 (ratio, max lag, or an expired tombstone); with it, any cleanable
        bytes or expired tombstone will do. Raises `CleanerError` when the pass fails;
        the log is then unchanged.
        """
        if self.log_table.snapshot() is None:
            return None
        self._ensure_recovered()
        return self.log_cleaner.maintain(active_session(), force=force, raise_errors=True).clean

    def vacuum(self) -> DeletionReport:
        """Delete now what left the log longer than ``file.delete.delay.ms`` ago (bounded;
        the cleaner does it every ``log.retention.check.interval.ms``). Idempotent."""
        self._existing()
        return self.log_cleaner.segment_deleter.run(self.manager.busy_partitions)

    def add_pass_listener(self, listener: Callable[[CleanerStats], None]) -> None:
        """Call ``listener`` with the figures of every pass this sink's cleaner commits,
        from the thread that ran it (the background worker inside a streaming query)."""
        self.log_cleaner.listeners.append(listener)

    def await_cleaner(self, timeout_s: float | None = None) -> bool:
        """Wait until the background cleaner has no round running or pending; False on timeout."""
        return self._log_cleaner is None or self._log_cleaner.await_idle(timeout_s)

    def pause_cleaning(self, partitions: Sequence[int] | None = None) -> None:
        """Stop passes over ``partitions`` (default: all) until `resume_cleaning`; waits for a
        pass running elsewhere (see `CleanerManager.pause_cleaning`)."""
        self.manager.pause_cleaning(self._partitions(partitions))

    def resume_cleaning(self, partitions: Sequence[int] | None = None) -> None:
        """Let paused ``partitions`` (default: all) be cleaned again."""
        self.manager.resume_cleaning(self._partitions(partitions))

    # -- maintenance: recovery, retention, other engines ----------------------------------

    def recover(self) -> RecoveryReport:
        """Recover the log now (`sinks.maintenance.recovery`): orphans, checkpoint, offsets.
        Runs by itself before a sink's first append, round or ``delete_records``.
        Idempotent. Raises `LogCorruptedError` when offsets are broken."""
        self.last_recovery = recover_log(
            self.log_table,
            self.checkpoints,
            file_delete_delay_ms=self.config.file_delete_delay_ms,
            busy_partitions=self.manager.busy_partitions(),
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
        """Move ``partition``'s log start offset to ``before_offset`` (Kafka's DeleteRecords):
        records below it leave ``log()`` and ``state()`` at once, files wholly below it are
        removed, cleaning of the partition is paused meanwhile. Idempotent. Raises
        `OffsetOutOfRangeError` above the log end offset."""
        self._existing()
        self._ensure_recovered()
        with self.manager.paused([partition]):
            return retention.delete_records(self.log_table, partition, before_offset)

    def accept_foreign_changes(self, through_version: int | None = None) -> int:
        """Accept the records as they are after another engine's data change, and go on:
        every commit up to ``through_version`` (default: now) is taken as it is. Returns
        the accepted version. See `sinks.log.foreign_commits`."""
        return foreign_changes.accept(self.log_table, through_version)

    def restore(self, version: int) -> int:
        """Bring the log back to Delta ``version`` (inside the history window), undoing
        everything committed after it; offsets keep counting from the log end offset.
        Cleaning is paused meanwhile; the log is recovered afterwards. Returns the new
        version."""
        snapshot = self.log_table.snapshot(verify=False)
        if snapshot is None:
            raise FileNotFoundError(f"no compacted log at {self.path}")
        with self.manager.paused(snapshot.partitions):
            restored = foreign_changes.restore(self.log_table, version)
        self.recover()
        return restored

    # -- reading -----------------------------------------------------------------------

    def log(self, as_of: AsOf | None = None) -> DataFrame:
        """Every stored record at or above its partition's log start offset, with metadata."""
        return self.log_table.read(active_session(), self._existing(as_of))

    def state(self, as_of: AsOf | None = None) -> DataFrame:
        """One row per live key (key columns + ``value``): the latest record unless a
        tombstone. ``as_of`` (a Delta version, or a timestamp) reads the log as it was."""
        snapshot = self._existing(as_of)
        return read_state(
            active_session(), self.log_table, snapshot, self.key_columns, self.sequence_column
        )

    # -- helpers -----------------------------------------------------------------------

    def _existing(self, as_of: AsOf | None = None) -> LogSnapshot:
        snapshot = self.log_table.snapshot(as_of)
        if snapshot is None:
            raise FileNotFoundError(f"no compacted log at {self.path}")
        return snapshot

    def _partitions(self, partitions: Sequence[int] | None) -> list[int]:
        if partitions is not None:
            return list(partitions)
        snapshot = self.log_table.snapshot()
        return snapshot.partitions if snapshot is not None else []

    def _ensure_recovered(self) -> None:
        if self.last_recovery is None or self.last_recovery.version is None:
            self.recover()  # once per sink object and log: the first append, round or delete

    def _query_id(self, spark: SparkSession, batch_id: int) -> str | None:
        """The id of the streaming query running this batch; None for a direct call (under
        Spark Connect read from ``checkpoint_location``, `streaming_query_id`)."""
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
