"""`CompactedStateSink`: the foreachBatch hook and the front object over one compacted log.

The hook orchestrates one log's life: the append (Kafka's partition leader,
`sinks.log.log_append`: validate, assign offsets, write, commit, in one Spark job),
then the role of `LogCleanerManager` for this log (measure dirtiness, pick the
filthiest partitions, clean them, checkpoint where cleaning ended), and reading
the log and its state back. Appends go to the dirty end of the log; when a
partition's dirty ratio passes ``min.cleanable.dirty.ratio`` the hook cleans it
in the same call.

Exactly once: each append commits a Delta ``txn`` action (app id, batch id).
A batch id already recorded for the app id is skipped, by this object or by a
new one on the same path after a restart. Inside a streaming query the app id is
``<sink_id>/query=<query id>``: a restarted query keeps its id (it lives in the
query's checkpoint), and a query started from a fresh checkpoint, whose batch ids
restart at 0, is not mistaken for the old one.

Reliability (SPEC rules 10-12): the first append, pass or ``delete_records`` of a
sink object recovers the log (`sinks.maintenance.recovery`); passes claim their partitions
in the checkpoint table (`sinks.cleaner.cleaner_manager`), so paused and uncleanable
partitions are skipped; with ``cleanup.policy`` containing ``delete`` each
append and each ``clean()`` applies retention (`sinks.maintenance.retention`); with a
``dead_letter_table`` bad rows are quarantined before the append
(`sinks.log.dead_letter`). `sinks.crash_points` marks where the crash tests kill it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence

from deltalake.exceptions import CommitFailedError
from pyspark.sql import DataFrame, SparkSession

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint
from sinks.cleaner.cleaner import Cleaner
from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_to_clean import (
    LogToClean,
    cleanable_offsets,
    dirty_ratio,
    filthiest_first,
    log_to_clean,
)
from sinks.config import CleanerConfig
from sinks.crash_points import (
    CLEAN_BEFORE_CHECKPOINT,
    DEAD_LETTER_BEFORE_APPEND,
    crash_point,
)
from sinks.errors import CleanerError, CommitConflictError, SchemaMismatchError
from sinks.log.dead_letter import DECODE_ERROR, DeadLetterTable, as_dead_letters, split_batch
from sinks.log.log_append import AppendReport, LogAppender, committed
from sinks.log.log_table import AsOf, LogSnapshot, LogTable, now_ms
from sinks.log.records import check_schema, prepare_batch
from sinks.log.segment_writer import WrittenSegment
from sinks.log.storage import normalize_uri, sibling
from sinks.maintenance import retention
from sinks.maintenance.recovery import RecoveryReport, recover_log, write_clean_shutdown_marker
from sinks.maintenance.retention import RetentionPlan
from sinks.reading.state_reader import read_state

logger = logging.getLogger("compacted_sink")

CHECKPOINT_TABLE_NAME = "_cleaner-offset-checkpoint"
_QUERY_ID_PROPERTY = "sql.streaming.queryId"


class CompactedStateSink:
    """A compacted log of keyed records in a Delta table, fed by ``foreachBatch``.

    ``path`` is the table's location (created on the first batch). ``key_columns``
    are compared exactly. ``sequence_column`` orders records instead of the offset
    (ties broken by offset). ``checkpoint_table`` defaults to
    ``_cleaner-offset-checkpoint`` beside the table. ``sink_id`` defaults to one
    derived from the path. ``clock`` returns epoch milliseconds.
    """

    def __init__(
        self,
        path: str,
        key_columns: Sequence[str] = ("key",),
        config: CleanerConfig | None = None,
        *,
        sequence_column: str | None = None,
        checkpoint_table: str | None = None,
        dead_letter_table: str | None = None,
        sink_id: str | None = None,
        clock: Callable[[], int] | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        if isinstance(key_columns, str):
            key_columns = (key_columns,)
        if not key_columns:
            raise ValueError("key_columns must name at least one column")
        self.path = normalize_uri(path)
        self.key_columns = tuple(key_columns)
        self.config = config or CleanerConfig()
        self.sequence_column = sequence_column
        self.checkpoint_path = normalize_uri(
            checkpoint_table or sibling(self.path, CHECKPOINT_TABLE_NAME)
        )
        self.dead_letter_table = normalize_uri(dead_letter_table) if dead_letter_table else None
        self.sink_id = sink_id or _default_sink_id(self.path)
        self.clock = clock or now_ms
        self.storage_options = dict(storage_options or {})
        self.log_table = LogTable(self.path, self.storage_options)
        self.checkpoints = CleanerOffsetCheckpoint(self.checkpoint_path, self.storage_options)
        self.cleaner = Cleaner(
            self.log_table,
            key_columns=self.key_columns,
            sequence_column=sequence_column,
            delete_retention_ms=self.config.delete_retention_ms,
            segment_bytes=self.config.segment_bytes,
        )
        self.appender = LogAppender(
            self.log_table,
            key_columns=self.key_columns,
            sequence_column=sequence_column,
            config=self.config,
        )
        self.last_append: AppendReport | None = None
        self.dead_letters = (
            DeadLetterTable(self.dead_letter_table, self.storage_options)
            if self.dead_letter_table
            else None
        )
        self.manager = CleanerManager(self.checkpoints, self.path, clock=self.clock)
        self.last_recovery: RecoveryReport | None = None
        self.last_retention: RetentionPlan | None = None

    def __repr__(self) -> str:
        return f"CompactedStateSink({self.path!r}, key_columns={self.key_columns!r})"

    # -- the foreachBatch hook ---------------------------------------------------------

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Append one micro-batch exactly once, then clean what became cleanable.

        Idempotent per (app id, batch id): a batch already committed writes nothing.
        Bad input raises `BadInputError` (null keys, wrong schema, repeated or null
        Kafka offsets, oversized values, undecodable payloads) and commits nothing;
        see `sinks.log.log_append` for how the append itself runs.
        """
        started = time.monotonic()
        app_id = self._app_id(batch_df.sparkSession)
        snapshot = self.log_table.snapshot()
        if committed(snapshot, app_id, batch_id):
            logger.info("batch %s of %s already committed; skipped", batch_id, app_id)
            assert snapshot is not None
            self._finish(batch_id, snapshot, started, skipped=True)
            return

        if snapshot is not None:
            self._ensure_recovered()
        if self.dead_letters is not None:
            good = self._quarantine(batch_df, snapshot, app_id, batch_id)
            if good is None:  # the whole batch was dead-lettered
                if snapshot is not None:
                    snapshot = self.appender.commit_empty(snapshot, app_id, batch_id)
                    self._finish(batch_id, snapshot, started, skipped=False)
                return
            batch_df = good
        # Without a dead-letter table, rows a decoder flagged in _decode_error stay
        # in the batch: the append's checks count them and fail the batch.
        prepared = prepare_batch(
            batch_df,
            key_columns=self.key_columns,
            sequence_column=self.sequence_column,
            now_ms=self.clock(),
        )
        if snapshot is not None:
            check_schema(prepared.df.schema, snapshot.spark_schema)
        info = self.appender.append(snapshot, prepared, app_id=app_id, batch_id=batch_id)
        self._finish(
            batch_id,
            info.snapshot,
            started,
            skipped=info.already_committed,
            written=list(info.written),
        )

    def _finish(
        self,
        batch_id: int,
        snapshot: LogSnapshot,
        started: float,
        *,
        skipped: bool,
        written: list[WrittenSegment] | None = None,
    ) -> None:
        append_ms = int((time.monotonic() - started) * 1000)
        candidates = self.logs_to_clean(snapshot)
        stats = None
        if self.config.delete and not skipped:
            try:
                self._retain()
            except CommitConflictError as e:
                # The batch is committed; retention runs again with the next one.
                logger.warning("retention after batch %s gave up: %s", batch_id, e)
            snapshot = self._refreshed(snapshot)
            candidates = self.logs_to_clean(snapshot)
        if self.config.compact:
            try:
                stats = self._clean(snapshot, candidates, force=False)
            except CleanerError as e:
                # The batch is committed; a failed pass must not fail the query.
                logger.warning("cleaning after batch %s failed: %s", batch_id, e)
        written = written or []
        self.last_append = AppendReport(
            batch_id=batch_id,
            records=sum(w.num_records for w in written),
            partitions=tuple(sorted({w.partition for w in written})),
            files=len(written),
            bytes=sum(w.size_bytes for w in written),
            skipped=skipped,
            dirty_ratio=dirty_ratio(candidates) if stats is None else self.dirty_ratio(),
            duration_ms=append_ms,
            delta_version=snapshot.version,
            clean=stats,
        )
        logger.info("%s", self.last_append.summary())

    # -- cleaning ----------------------------------------------------------------------

    def logs_to_clean(self, snapshot: LogSnapshot | None = None) -> list[LogToClean]:
        """Every partition as a cleaning candidate, measured now (no Spark job).

        The first dirty offset comes from the cleaner's ``txn`` entry in the log;
        the checkpoint table is read only for partitions the log has none for
        (a log cleaned before the log carried it, or a checkpoint set by hand).
        """
        snapshot = snapshot or self.log_table.snapshot()
        if snapshot is None:
            return []
        recorded = {p: snapshot.cleaner_offset(p) for p in snapshot.partitions}
        if any(offset is None for offset in recorded.values()):
            for (_, p), entry in self.checkpoints.read(self.path).items():
                if recorded.get(p, 0) is None:
                    recorded[p] = entry.first_dirty_offset
        now = self.clock()
        candidates = []
        for p in snapshot.partitions:
            segments = snapshot.segments.get(p, [])
            offsets = cleanable_offsets(
                segments,
                checkpoint_dirty_offset=recorded[p],
                log_start_offset=snapshot.log_start_offset(p),
                log_end_offset=snapshot.log_end_offset(p),
                now_ms=now,
                min_compaction_lag_ms=self.config.min_compaction_lag_ms,
            )
            candidates.append(log_to_clean(self.path, p, segments, offsets))
        return candidates

    def dirty_ratio(self) -> float:
        """The dirty ratio over all partitions: cleanable bytes over clean plus cleanable."""
        return dirty_ratio(self.logs_to_clean())

    def clean(self, force: bool = False) -> CleanerStats | None:
        """Clean every cleanable partition in one pass now; None when nothing is cleanable.

        Without ``force`` a partition qualifies by SPEC rule 4 (ratio, max lag, or an
        expired tombstone); with it, any cleanable bytes or expired tombstone will do.
        The returned stats cover every partition the pass cleaned. Raises
        `CleanerError` when the pass fails; the log is then unchanged.
        """
        snapshot = self.log_table.snapshot()
        if snapshot is None:
            return None
        self._ensure_recovered()
        if self.config.delete:
            self._retain()
            snapshot = self._refreshed(snapshot)
        if not self.config.compact:
            return None
        return self._clean(snapshot, self.logs_to_clean(snapshot), force=force)

    def _clean(
        self, snapshot: LogSnapshot, candidates: Sequence[LogToClean], *, force: bool
    ) -> CleanerStats | None:
        """One pass over the cleanable ``candidates``, planned from ``snapshot``."""
        start = self.clock()
        chosen = [
            log
            for log in filthiest_first(candidates)
            if log.is_cleanable(
                now_ms=start,
                min_cleanable_dirty_ratio=self.config.min_cleanable_dirty_ratio,
                max_compaction_lag_ms=self.config.max_compaction_lag_ms,
                force=force,
            )
        ]
        reset = [log for log in candidates if log.force_checkpoint and log not in chosen]
        if reset:
            self._checkpoint_resets(reset)
        if not chosen:
            return None
        claimed = set(self.manager.start_cleaning([log.partition for log in chosen]))
        if not claimed:
            return None  # paused, cleaned by a live cleaner elsewhere, or backing off
        if claimed != {log.partition for log in chosen}:
            logger.info("cleaning only %s of %s: the others are busy", claimed, self.path)
        fresh = self.log_table.snapshot()
        assert fresh is not None
        if fresh.version != snapshot.version:  # plan again after the claim: less to conflict
            snapshot = fresh
            chosen = [
                log
                for log in self.logs_to_clean(snapshot)
                if log.partition in claimed
                and log.is_cleanable(
                    now_ms=start,
                    min_cleanable_dirty_ratio=self.config.min_cleanable_dirty_ratio,
                    max_compaction_lag_ms=self.config.max_compaction_lag_ms,
                    force=force,
                )
            ]
        else:
            chosen = [log for log in chosen if log.partition in claimed]
        if not chosen:
            self.manager.abort_cleaning(claimed)
            return None
        spark = SparkSession.active()
        try:
            with self.manager.heartbeating(claimed):
                stats = self.cleaner.clean(spark, snapshot, chosen, pass_start_ms=start)
        except CommitFailedError as e:
            self.manager.abort_cleaning(claimed)
            raise CleanerError(
                f"another cleaner committed first ({e}); this pass was dropped",
                log_path=self.path,
                partition=chosen[0].partition,
            ) from e
        except Exception as e:
            self.manager.mark_uncleanable(claimed, e)
            raise CleanerError(
                f"pass failed ({type(e).__name__}: {str(e)[:500]}); marked uncleanable, "
                "retried with backoff",
                log_path=self.path,
                partition=chosen[0].partition,
            ) from e
        crash_point(CLEAN_BEFORE_CHECKPOINT)
        self._checkpoint(chosen, stats)
        logger.info("%s", stats.summary())
        return stats

    def _checkpoint_resets(self, reset: Sequence[LogToClean]) -> None:
        """Rewrite checkpoints found out of range, as Kafka does even when nothing is cleaned."""
        rows = self.checkpoints.read(self.path)
        entries = []
        for log in reset:
            entry = rows.get((self.path, log.partition)) or CheckpointEntry(
                log_path=self.path, partition=log.partition, first_dirty_offset=0
            )
            entries.append(
                entry.with_changes(
                    first_dirty_offset=log.first_dirty_offset,
                    first_uncleanable_offset=log.first_uncleanable_offset,
                )
            )
        self.checkpoints.write(entries)

    def _checkpoint(self, cleaned: Sequence[LogToClean], stats: CleanerStats) -> None:
        self.manager.done_cleaning(
            CheckpointEntry(
                log_path=self.path,
                partition=log.partition,
                first_dirty_offset=stats.end_offsets[log.partition],
                first_uncleanable_offset=log.first_uncleanable_offset,
                last_clean_ms=stats.start_ms,
                last_pass_duration_ms=stats.duration_ms,
                bytes_read=stats.bytes_read,
                bytes_written=stats.bytes_written,
                records_read=stats.records_read,
                records_written=stats.records_written,
                max_dirty_ratio=log.cleanable_ratio,
                log_version=stats.delta_version,
            )
            for log in cleaned
        )

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

    def close(self) -> None:
        """Write the clean-shutdown marker, so the next open skips the full offset check."""
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

    def _retain(self) -> RetentionPlan:
        """Time and size retention now (cleanup.policy contains delete)."""
        self.last_retention = retention.apply_retention(
            self.log_table,
            now_ms=self.clock(),
            retention_ms=self.config.retention_ms,
            retention_bytes=self.config.retention_bytes,
        )
        return self.last_retention

    def _quarantine(
        self, batch_df: DataFrame, snapshot: LogSnapshot | None, app_id: str, batch_id: int
    ) -> DataFrame | None:
        """Commit the batch's bad rows to the dead-letter table (once); return the good rows.

        None when the whole batch went there (its columns do not match the log).
        The dead letters are committed before the append, both keyed by (app id,
        batch id), so a crash between the two is repaired by the batch's replay.
        """
        assert self.dead_letters is not None
        now = self.clock()
        try:
            prepared = prepare_batch(
                batch_df.drop(DECODE_ERROR) if DECODE_ERROR in batch_df.columns else batch_df,
                key_columns=self.key_columns,
                sequence_column=self.sequence_column,
                now_ms=now,
            )
            if snapshot is not None:
                check_schema(prepared.df.schema, snapshot.spark_schema)
        except SchemaMismatchError as e:
            self.dead_letters.write(
                as_dead_letters(batch_df, reason=str(e)),
                log_path=self.path,
                app_id=app_id,
                batch_id=batch_id,
                now_ms=now,
            )
            crash_point(DEAD_LETTER_BEFORE_APPEND)
            return None
        split = split_batch(
            batch_df,
            key_columns=self.key_columns,
            has_offsets=prepared.has_offsets,
            message_max_bytes=self.config.message_max_bytes,
        )
        self.dead_letters.write(
            as_dead_letters(split.bad),
            log_path=self.path,
            app_id=app_id,
            batch_id=batch_id,
            now_ms=now,
        )
        crash_point(DEAD_LETTER_BEFORE_APPEND)
        return split.good

    # -- reading -----------------------------------------------------------------------

    def log(self, as_of: AsOf | None = None) -> DataFrame:
        """Every stored record at or above its partition's log start offset, with metadata."""
        spark = SparkSession.active()
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
            SparkSession.active(), self.log_table, snapshot, self.key_columns, self.sequence_column
        )

    def _refreshed(self, snapshot: LogSnapshot) -> LogSnapshot:
        fresh = self.log_table.snapshot()
        assert fresh is not None
        return fresh

    def _app_id(self, spark: SparkSession) -> str:
        query_id = spark.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
        return f"{self.sink_id}/query={query_id}" if query_id else self.sink_id


def _default_sink_id(path: str) -> str:
    digest = hashlib.sha256(path.encode()).hexdigest()[:12]
    return f"compacted-sink-{digest}"
