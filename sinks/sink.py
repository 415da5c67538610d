"""`CompactedStateSink`: the foreachBatch hook and the front object over one compacted log.

A front, as delta-rs's ``DeltaTable`` is. The hook is Kafka's produce path: it appends
the batch exactly once (`sinks.produce.log_append.LogAppender.append`, under the sink's
`sinks.transactional_id.TransactionalId`) and hands the log to its `LogCleaner`
(`sinks.cleaner.log_cleaner`), which owns the cleaning: beside a streaming query on a
worker thread, or in the hook's call. Reads go to `sinks.reading`, recovery, retention
and other engines' changes to `sinks.maintenance`. Every parameter and method is
described in ``docs/api.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from checkpoints import CleanerOffsetCheckpoint
from sinks.append_report import AppendReport
from sinks.cleaner.cleaner import Cleaner
from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_cleaner import CleaningMode, LogCleaner
from sinks.cleaner.log_to_clean import LogToClean
from sinks.cleaner.pass_planning import RoundRequest
from sinks.config import CleanerConfig
from sinks.erasure import (
    ErasureReport,
    ErasureStatus,
    erase_dead_letters,
    erasure_status,
    erasures_after,
    vacuum_dead_letters,
)
from sinks.erasure import erase as erase_tombstones
from sinks.erasure.tombstones import key_list
from sinks.errors import (
    CompactedSinkError,
    ErasureRestoreError,
    ForeignChangeError,
    TableFeatureError,
)
from sinks.log.foreign import changes as foreign_changes
from sinks.log.location import LogLocation
from sinks.log.log_config import opened_log_config
from sinks.log.log_format import PARTITIONS_TXN
from sinks.log.log_keys import opened_log_keys
from sinks.log.log_table import AsOf, LogSnapshot, LogTable, now_ms
from sinks.log.records import VALUE
from sinks.log.s3a_options import (
    S3A_PREFIX,
    credential_setting_names,
    credentials_checked,
    resolve_storage_options,
)
from sinks.log.uris import normalize_uri, sibling
from sinks.maintenance import retention
from sinks.maintenance.recovery import RecoveryReport, recover_log, write_clean_shutdown_marker
from sinks.maintenance.retention import RetentionPlan
from sinks.maintenance.segment_deleter import DeletionReport
from sinks.produce.append_batch import SparkRecords
from sinks.produce.dead_letter import DeadLetterTable
from sinks.produce.debezium_json import (
    SOURCE_POSITION,
    DebeziumBatch,
    check_value_format,
)
from sinks.produce.debezium_json import unwrap as unwrap_debezium_json
from sinks.produce.log_append import LogAppender, Records
from sinks.produce.schema_evolution import DEFAULT_SCHEMA_EVOLUTION, SchemaEvolution
from sinks.python_workers import check_python_workers
from sinks.reading.lookup import lookup
from sinks.reading.state_reader import spark_state
from sinks.shutdown import finished_before_exit
from sinks.spark_session import active_session, hadoop_settings, warn_unsafe_beside_delta_spark
from sinks.transactional_id import TransactionalId
from sinks.warn_once import warn_once

__all__ = ["AppendReport", "CompactedStateSink"]

logger = logging.getLogger("compacted_sink")

CHECKPOINT_TABLE_DIR = "_cleaner-offset-checkpoint"


class CompactedStateSink:
    """A compacted log of keyed records in a Delta table at ``path``, fed by ``foreachBatch``.

    Parameters:

    - ``path``: the log's Delta table, a local path or an object-store URI; created by
      the first batch.
    - ``key_columns``: the key, compared exactly. None takes the log's own (a table
      property), or ``("key",)`` for a new log; others than an existing log's raise
      `KeyColumnsMismatchError`.
    - ``config``: a `CleanerConfig` (Kafka's settings); the log's stored topic config
      applies where this one does not name a setting.
    - ``sequence_column``: orders a key's records instead of the offset, ties broken by
      the offset (a null ranks lowest); None takes the log's.
    - ``checkpoint_table``: the cleaner-offset checkpoint table; default
      ``_cleaner-offset-checkpoint`` beside the log.
    - ``dead_letter_table``: when set, bad rows go there with their reason instead of
      failing the batch.
    - ``sink_id``: the producer's identity for exactly once; default from the path.
    - ``clock``: epoch milliseconds for every timestamp the sink writes; default the
      wall clock.
    - ``storage_options``: object-store credentials and endpoints for delta-rs and
      pyarrow; on S3, default from the session's ``fs.s3a.*`` settings.
    - ``cleaning``: where passes run: ``"auto"`` (a background worker inside a streaming
      query, the hook's own call otherwise), ``"background"`` or ``"inline"``.
    - ``checkpoint_location``: the streaming query's; under Spark Connect the sink reads
      the query's id from it (needed there unless ``sink_id`` is given).
    - ``schema_evolution``: ``"additive"`` (a batch may add fields, relax nullability,
      widen types) or ``"none"`` (every change refused).
    - ``value_format``: None (the batch's columns as they are) or ``"debezium-json"``
      (Debezium's change events; ordered by the source position, design.md §52).

    docs/api.md says the same with the rules each follows.
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
        value_format: str | None = None,
    ) -> None:
        self.value_format = check_value_format(value_format)
        if self.value_format is not None:
            # Debezium's events are ordered by their source position (design.md §52).
            if sequence_column not in (None, SOURCE_POSITION):
                raise ValueError(
                    f"value_format={value_format!r} orders a key's events by "
                    f"{SOURCE_POSITION!r}; sequence_column={sequence_column!r} cannot be used"
                )
            sequence_column = SOURCE_POSITION
        self.path = normalize_uri(path)
        # Given, else (on S3) from the session's fs.s3a.* settings (said in one line).
        resolved = resolve_storage_options(
            self.path, storage_options, lambda: _session_s3a_settings(self.path)
        )
        self.storage_options = resolved.options
        # The one place the sink's addresses are built; below, each is handed down whole.
        location = LogLocation(self.path, self.storage_options)
        with credentials_checked(self.path, resolved):
            self.log_table = LogTable(location)
            keys = opened_log_keys(self.log_table, key_columns, sequence_column)
            # The log's topic config, unless this process overrides it (said in one line).
            self.log_config = opened_log_config(self.log_table, config)
        self.keys = keys
        self.key_columns, self.sequence_column = keys.key_columns, keys.sequence_column
        self.config: CleanerConfig = self.log_config.config
        checkpoint_table = checkpoint_table or sibling(self.path, CHECKPOINT_TABLE_DIR)
        self.checkpoint_path = normalize_uri(checkpoint_table)
        self.clock = clock or now_ms
        # A checkpoint table is below `LogLocation`'s layer: it takes the two parts.
        self.checkpoints = CleanerOffsetCheckpoint(
            self.checkpoint_path, self.storage_options, clock=self.clock
        )
        self.dead_letter_table = _uri(dead_letter_table)
        self.dead_letter_location = (
            replace(location, uri=self.dead_letter_table) if self.dead_letter_table else None
        )
        self.checkpoint_location = _uri(checkpoint_location)
        self.transactional_id = TransactionalId.of(
            location,
            sink_id,
            replace(location, uri=self.checkpoint_location) if self.checkpoint_location else None,
        )
        self.sink_id = self.transactional_id.sink_id
        self.cleaning: CleaningMode = cleaning
        dead_letters = (
            DeadLetterTable(self.dead_letter_location)
            if self.dead_letter_location is not None
            else None
        )
        self.appender = LogAppender(
            self.log_table,
            keys=self.keys,
            config=self.config,
            schema_evolution=schema_evolution,
            dead_letters=dead_letters,
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
        """Append one micro-batch exactly once, then hand the log to its cleaner: wake its
        worker inside a streaming query (``cleaning="auto"``), else clean before returning."""
        started = time.monotonic()
        spark = batch_df.sparkSession
        warn_unsafe_beside_delta_spark(spark, self.path)
        query_id = self.transactional_id.query_id(spark, batch_id)
        unwrapped = self._unwrapped(batch_df)
        if unwrapped is not None:
            batch_df = unwrapped.records
        records = SparkRecords(
            batch_df,
            before_prepare=lambda: check_python_workers(spark),
            empty=unwrapped is not None and unwrapped.empty,
        )
        background = self.cleaning == "background" or (
            self.cleaning == "auto" and query_id is not None
        )
        try:
            self._append(
                spark,
                records,
                app_id=self.transactional_id.app_id(query_id),
                batch_id=batch_id,
                background=background,
                started=started,
            )
        finally:
            if unwrapped is not None:
                unwrapped.release()

    def _log_value_type(self) -> object:
        """The log's ``value`` type, or None before the log exists."""
        snapshot = self.log_table.snapshot()
        return None if snapshot is None else snapshot.spark_schema[VALUE].dataType

    def _unwrapped(self, batch_df: DataFrame) -> DebeziumBatch | None:
        """The batch's change events as records under ``value_format`` (design.md §52), or
        None without one. A tombstone's and a TOAST value's previous state is the log's."""
        if self.value_format is None:
            return None

        def previous_state(keys: list[dict[str, object]]) -> pa.Table:
            try:
                return lookup(self.path, keys, storage_options=self.storage_options)
            except FileNotFoundError:  # no log yet: no previous state
                return pa.table({})

        return unwrap_debezium_json(
            batch_df,
            key_columns=self.key_columns,
            previous_state=previous_state,
            log_value=self._log_value_type(),
            refuse=self.dead_letter_table is None,
        )

    def _append(
        self,
        spark: SparkSession | None,
        records: Records,
        *,
        app_id: str,
        batch_id: int,
        background: bool,
        started: float,
    ) -> None:
        """Append ``records`` once as ``batch_id`` of ``app_id``, hand the log to its cleaner
        (a pass it runs needs ``spark``) and set ``last_append``; ``started`` is the call's
        `time.monotonic`. What a call does once it has its records."""
        info = self.appender.append(records, app_id=app_id, batch_id=batch_id)
        if info.snapshot is None:  # an empty batch of change events, and no log to hold it
            return
        duration_ms = int((time.monotonic() - started) * 1000)
        stats, snapshot, ratio = self.log_cleaner.hand_over(
            spark, info.snapshot, background=background, appended=not info.already_committed
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

    # -- cleaning: the log's `LogCleaner` ----------------------------------------------------

    @property
    def log_cleaner(self) -> LogCleaner:
        """This log's cleaner (created on first use; not part of the pickled sink)."""
        if self._log_cleaner is None:
            self._log_cleaner = LogCleaner(
                self.log_table,
                self.checkpoints,
                self.config,
                keys=self.keys,
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
        """`LogCleaner.candidates`: the log's partitions as candidates. Read-only."""
        return self.log_cleaner.candidates(snapshot)

    def dirty_ratio(self) -> float:
        """Cleanable bytes over clean plus cleanable bytes, over all partitions.

        Raises `FileNotFoundError` when no log exists at the path yet, as `state()` and
        `log()` do: a missing log has no ratio, and a mistyped path must not read as clean.
        """
        return self.log_cleaner.dirty_ratio(self._existing())

    @finished_before_exit
    def clean(self, force: bool = False) -> CleanerStats | None:
        """One round now, whatever the cleaning mode (`LogCleaner.run_round`), asked with
        ``force`` (`RoundRequest`).

        Returns the pass's figures, or None when nothing was cleanable. Raises what
        ``run_round`` raises with ``raise_errors`` (design.md §43). Not idempotent.
        """
        if self.log_table.snapshot() is None:
            return None
        self._ensure_recovered()
        request = RoundRequest(force=force)
        return self.log_cleaner.run_round(active_session(), request, raise_errors=True).clean

    def vacuum(self) -> DeletionReport:
        """Delete what left the log longer than ``file.delete.delay.ms`` ago. Idempotent."""
        self._existing(repair=True)  # a restored file of a stale rewrite must not go first
        report = self.log_cleaner.segment_deleter.run(self.manager.busy_partitions)
        if self.dead_letter_location:  # an erasure's rewritten dead letters (design.md §54)
            vacuum_dead_letters(
                self.dead_letter_location,
                window_ms=self.config.file_delete_delay_ms,
            )
        return report

    def add_pass_listener(self, listener: Callable[[CleanerStats], None]) -> None:
        """Call ``listener`` with the figures of every pass this sink's cleaner commits."""
        self.log_cleaner.listeners.append(listener)

    def await_cleaner(self, timeout_s: float | None = None) -> bool:
        """Wait until the background cleaner has no round running or pending; False on timeout."""
        return self._log_cleaner is None or self._log_cleaner.await_idle(timeout_s)

    def pause_cleaning(self, partitions: Sequence[int] | None = None) -> None:
        """Stop passes over ``partitions`` (default: all), waiting for one running elsewhere."""
        self.manager.pause_cleaning(self._partitions(partitions))

    def resume_cleaning(self, partitions: Sequence[int] | None = None) -> None:
        """Let paused ``partitions`` (default: all) be cleaned again."""
        self.manager.resume_cleaning(self._partitions(partitions))

    # -- maintenance: recovery, retention, other engines ----------------------------------

    def recover(self) -> RecoveryReport:
        """Orphans, checkpoint and offsets made right (`sinks.maintenance.recovery`). Idempotent;
        runs by itself before a sink's first append, round or ``delete_records``."""
        self.last_recovery = recover_log(
            self.log_table,
            self.checkpoints,
            file_delete_delay_ms=self.config.file_delete_delay_ms,
            busy_partitions=self.manager.busy_partitions(),
        )
        return self.last_recovery

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the background cleaner after its pass; mark a clean shutdown, only on a log
        the sink reads (never on one it refuses, such as a shallow clone). Idempotent.

        Does not raise over another engine's change to the log (`ForeignChangeError`):
        closing has nothing to undo, so no clean-shutdown marker is written (the next open
        checks the log in full), and one warning per change and process says what to do
        (the error's own message). The next write or read raises it as before.
        """
        if self._log_cleaner is not None:
            self._log_cleaner.shutdown(timeout_s)
        try:
            snapshot = self.log_table.snapshot()
            if snapshot is not None:
                snapshot.data_files()  # raises for a log the sink refuses to own
        except ForeignChangeError as e:
            warn_once(
                ("closed over a foreign change", e.log_path, e.version),
                "closed %s without a clean-shutdown marker: %s",
                self.path,
                e,
            )
            return
        except CompactedSinkError as refused:
            logger.info("%s: no clean-shutdown marker on a log the sink refuses: %s", self, refused)
            return
        if snapshot is not None:
            write_clean_shutdown_marker(self.log_table, snapshot.version)

    def __enter__(self) -> CompactedStateSink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """`close`; with an exception in flight, a failure to close is logged, never raised
        over it (the exception in flight is what the caller must see)."""
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception as e:  # the exception in flight wins
            logger.warning(
                "closing %s after %s failed too: %s: %s",
                self.path,
                exc_type.__name__,
                type(e).__name__,
                e,
            )

    def delete_records(self, partition: int, before_offset: int) -> RetentionPlan:
        """Move ``partition``'s log start offset to ``before_offset`` (Kafka's DeleteRecords),
        cleaning of it paused meanwhile. Idempotent."""
        self._existing()
        self._ensure_recovered()
        with self.manager.paused([partition]):
            return retention.delete_records(self.log_table, partition, before_offset)

    def accept_foreign_changes(self, through_version: int | None = None) -> int:
        """Take every commit up to ``through_version`` (default: now) as it is; that version.

        The log's offsets follow its records in the same commit (cleaner offsets, log end
        offsets, partitions: design.md §41), cleaning paused meanwhile, and the cleaner's
        checkpoint follows the log. Raises `ForeignChangeError` for rows the log cannot take,
        naming the version and how many. Idempotent.
        """
        snapshot = self._existing(verify=False)
        try:
            partitions = snapshot.partitions
        except TableFeatureError:  # files the readers refuse (deletion vectors): all of them
            partitions = list(range(snapshot.txn_version(PARTITIONS_TXN) or 0))
        with self.manager.paused(partitions):
            accepted = foreign_changes.accept(
                self.log_table, through_version, key_columns=self.key_columns
            )
        self.last_recovery = None  # the checkpoint follows the log before the next pass
        if accepted.version == snapshot.version:  # else later commits are still refused
            try:
                self.recover()
            except TableFeatureError:
                pass  # not readable yet (deletion vectors): recovered on first use after
        return accepted.version

    def repair(self) -> int:
        """Undo another engine's stale rewrites of the log in one commit of the sink's own
        (`LogTable.repair`, design.md §66); the log's version after. Readers see through
        such a rewrite without committing; a writer of the sink undoes it by itself.
        Raises `ForeignChangeError` when the undo would not be exact. Idempotent."""
        self.log_table.repair()  # logs what it undid
        return self._existing().version

    def restore(self, version: int, *, reerase: bool = False) -> int:
        """Bring the log back to Delta ``version``, cleaning paused meanwhile; the new version.

        Across an erasure (design.md §64): raises `ErasureRestoreError`, naming the erasures
        committed after ``version`` and how many keys they erased, unless ``reerase``; then
        restores and erases those keys again in the next commits (their keys read from the
        erasures' tombstone batches). `HistoryExpiredError` for a version before the window.
        """
        snapshot = self._existing(verify=False)
        self._existing(version, verify=False)  # a version outside the window: refused first
        erased = erasures_after(snapshot, version, key_columns=self.key_columns)
        if erased and not reerase:
            raise ErasureRestoreError(
                f"log {self.path}: restoring version {version} would bring back erased keys: "
                f"{erased.describe()}; restore(..., reerase=True) (`compacted-sink restore "
                f"--reerase`) restores and erases them again in the next commit"
            )
        with self.manager.paused(snapshot.partitions):
            restored = foreign_changes.restore_version(self.log_table, version)
        self.recover()
        if erased:
            self.erase(erased.keys)
            after = self.log_table.snapshot()
            return after.version if after is not None else restored
        return restored

    # -- reading -----------------------------------------------------------------------

    def log(self, as_of: AsOf | None = None) -> DataFrame:
        """Every stored record at or above its partition's log start offset, with metadata."""
        return self.log_table.read(active_session(), self._existing(as_of))

    def state(self, as_of: AsOf | None = None) -> DataFrame:
        """One row per live key (key columns + ``value``), as of now or ``as_of``."""
        snapshot = self._existing(as_of)
        return spark_state(
            active_session(),
            self.log_table,
            snapshot,
            self.keys,
            dedupe_buffer_size=self.config.dedupe_buffer_size,
        )

    # -- forgetting keys (design.md §54, §55) ---------------------------------------------

    @finished_before_exit
    def erase(self, keys: Any) -> ErasureReport:
        """Forget ``keys``: one key value, a tuple for a log with several key columns, or a
        list of them (design.md §54).

        Appends a tombstone for each key in each partition where its latest record holds a
        value (one batch under ``compacted-sink/erase``), records per partition the offset
        below which it must be cleaned (so the next round cleans it whatever its dirty
        ratio, once ``min.compaction.lag.ms`` has passed), deletes the key's dead letters
        when ``dead_letter_table`` is set, then hands the log to its cleaner as an append
        does (with a Spark session; without one the next round cleans it). Idempotent: a
        key already erased gets no second tombstone. Raises `BadInputError` for a key that
        does not fit the key columns, `FileNotFoundError` without a log.
        """
        self._existing()
        self._ensure_recovered()
        written, marked, snapshot = erase_tombstones(
            self.appender, keys, key_columns=self.key_columns
        )
        removed = 0
        if self.dead_letter_location:
            removed = erase_dead_letters(
                self.dead_letter_location,
                keys,
                key_columns=self.key_columns,
                log_path=self.log_table.uri,
            )
        try:
            spark: SparkSession | None = active_session()
        except RuntimeError:
            spark = None
        if spark is not None and marked and snapshot is not None:
            background = self.cleaning == "background"
            self.log_cleaner.hand_over(spark, snapshot, background=background, appended=True)
        after = self.log_table.snapshot()
        report = ErasureReport(
            keys=len(key_list(keys)),
            tombstones=written,
            marked=marked,
            dead_letters_removed=removed,
            version=after.version if after is not None else None,
        )
        logger.info("%s: %s", self.path, report.summary())
        return report

    def erasure_status(self, keys: Any) -> ErasureStatus:
        """Per key of ``keys``, every file under the log's path (and the dead-letter table's)
        that still holds its records or names its value, each with the time it goes by the
        log's config, and the overall deadline (design.md §55). Read from storage, not
        trusted from the Delta log. Reads only; no Spark."""
        snapshot = self._existing()
        now = self.clock()
        return erasure_status(
            snapshot,
            keys,
            key_columns=self.key_columns,
            config=self.config,
            now_ms=now,
            dead_letter_table=self.dead_letter_location,
            consumer_holds=lambda: self.log_cleaner.planner.consumer_holds(snapshot, now_ms=now),
        )

    # -- helpers -----------------------------------------------------------------------

    def _existing(
        self, as_of: AsOf | None = None, *, verify: bool = True, repair: bool = False
    ) -> LogSnapshot:
        snapshot = self.log_table.snapshot(as_of, verify=verify, repair=repair)
        if snapshot is None:
            raise FileNotFoundError(
                f"no compacted log at {self.path} (no batch appended there yet, or another path)"
            )
        return snapshot

    def _partitions(self, partitions: Sequence[int] | None) -> list[int]:
        if partitions is not None:
            return list(partitions)
        snapshot = self.log_table.snapshot()
        return snapshot.partitions if snapshot is not None else []

    def _ensure_recovered(self) -> None:
        if self.last_recovery is None or self.last_recovery.version is None:
            self.recover()  # once per sink object and log: the first append, round or delete

    def __getstate__(self) -> dict[str, object]:
        # The cleaner's worker thread and locks live in one process; a sink shipped to
        # another (Spark Connect's foreachBatch worker) makes its own on first use.
        state = dict(self.__dict__)
        state["_log_cleaner"] = None
        return state


def _uri(path: str | None) -> str | None:
    return normalize_uri(path) if path else None


def _session_s3a_settings(uri: str) -> dict[str, str]:
    """The active session's ``fs.s3a.*`` settings for the bucket of ``uri``; none without one."""
    try:
        spark = active_session()
    except RuntimeError:
        return {}
    return hadoop_settings(spark, S3A_PREFIX, credential_setting_names(urlparse(uri).netloc))
