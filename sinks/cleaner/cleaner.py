"""Kafka's `Cleaner`: the driver's half of one pass over a log, read top to bottom in the
order it runs (Kafka's ``clean → doClean → cleanSegments → replaceSegments``).

Invariant (Kafka's): *a record with key K and offset O is obsolete if there is a record
with key K and offset O' > O* (with a ``sequence_column``: a higher (sequence, offset));
the rules live once, in `sinks.cleaner.rules`.

1. `Cleaner.run_pass`: the pass a round asks for (its `RoundRequest`: what is forced, the
   plan, the budget), planned again from the new version when an attempt is aborted
   (`LogCleaningAbortedError`: another writer swapped its files first), at most
   ``PASS_ATTEMPTS`` times, then throttled (design.md §33);
2. `Cleaner.absorb_foreign_files`: another engine's files rewritten into segments first
   (design.md §14), then `Cleaner.claim_filthiest`: the filthiest cleanable partitions
   (the request's plan, or `LogPlanner.choose` for the pass's own version) claimed, which
   makes the `CleaningPass`, what the attempt knows;
3. `Cleaner.attempt`: under the claims, each claimed partition's share
   (`Cleaner.partition_plans`, `sinks.cleaner.pass_planning.plan_partition`), the inputs
   checked, the Spark job (`Cleaner.recopy`, Kafka's ``cleanSegments``, whose tasks are
   `sinks.cleaner.recopy_task.RecopyTask`), the figures (`CleanerStats`), the old files
   swapped for the new in one Delta commit with ``dataChange=false`` (Kafka's
   ``replaceSegments``, design.md §9), then the checkpoint
   (`CleanerManager.checkpoint_pass`, Kafka's ``doneCleaning``, design.md §8).

The driver plans from the Delta log alone and never holds a key (design.md §33). Not
idempotent: every pass writes new files, which only its commit makes part of the log; a
crash leaves the old files or the new ones live, never both (design.md §10).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_to_clean import (
    LogToClean,
    group_segments_by_size,
    within_budget,
)
from sinks.cleaner.pass_planning import LogPlanner, PartitionPlan, RoundRequest, plan_partition
from sinks.cleaner.recopy_task import RecopyTask, bin_rows, packed, partitions_to_clean
from sinks.cleaner.rules import spark_latest_offsets
from sinks.cleaner.throttler import TaskBudget, Throttler
from sinks.config import LONG_MAX, CleanerConfig
from sinks.crash_points import CLEAN_BEFORE_CHECKPOINT, CLEAN_BEFORE_COMMIT, crash_point
from sinks.errors import (
    CleanerError,
    ConcurrentCommitError,
    LogCleaningAbortedError,
    TableFeatureError,
)
from sinks.log.foreign.rearrangement import absorb
from sinks.log.location import LogLocation
from sinks.log.log_format import CLEANER_OFFSET_TXN
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.records import DELETE_HORIZON_MS
from sinks.log.segment_writer import WRITTEN_SEGMENT_DDL, WrittenSegment, stats_columns
from sinks.log.uris import normalize_uri
from sinks.spark_session import default_parallelism

logger = logging.getLogger("compacted_sink")

PASS_ATTEMPTS = 3
"""How many times `Cleaner.run_pass` plans a pass whose commit another writer's beat."""


@dataclass(frozen=True)
class CleaningPass:
    """What one attempt of a pass knows, fixed once its partitions are claimed (Kafka's
    ``doClean`` takes the ``LogToClean`` and the time): the ``snapshot`` it plans from and
    commits against, the claimed ``partitions`` (dirtiest first), when it started
    (``start_ms``, the delete horizon's "now"), the offsets below which registered
    consumers let expired tombstones go (``held_below``, empty: no live consumer) and its
    share of the cores (``budget``). ``work_left`` when the byte budget left cleanable
    partitions for the next pass.
    """

    snapshot: LogSnapshot
    partitions: tuple[LogToClean, ...]
    start_ms: int
    held_below: Mapping[int, int]
    budget: TaskBudget
    work_left: bool = False

    @property
    def claimed(self) -> set[int]:
        """The numbers of the claimed partitions."""
        return {candidate.partition for candidate in self.partitions}


class Cleaner:
    """Runs passes over one log; holds no state between passes but its throttler's.

    ``manager`` claims and checkpoints the partitions, ``planner`` measures them
    (`CleaningPlan`); ``config`` gives ``delete.retention.ms``, ``segment.bytes``,
    ``log.cleaner.dedupe.buffer.size`` (each task's offset map) and the throttler's rate.
    """

    def __init__(
        self,
        log: LogTable,
        manager: CleanerManager,
        planner: LogPlanner,
        config: CleanerConfig,
        *,
        keys: LogKeys,
        clock: Callable[[], int],
    ) -> None:
        self.log = log
        self.manager = manager
        self.planner = planner
        self.config = config
        self.clock = clock
        self.keys = keys
        self.delete_retention_ms = config.delete_retention_ms
        self.segment_bytes = config.segment_bytes
        self.compression = config.parquet_codec
        self.dedupe_buffer_size = config.dedupe_buffer_size
        self.throttler = Throttler(config.log_cleaner_io_max_bytes_per_second)

    # -- 1. the pass, planned again when another writer beat it ---------------------------

    def run_pass(self, spark: SparkSession, request: RoundRequest) -> CleanerStats | None:
        """One pass over the filthiest cleanable partitions now; None when none is.

        Takes the round's ``request``: its plan is used when it is of the version the pass
        starts from and was read fresh (design.md §43), what it forces qualifies
        partitions (design.md §4), its budget is the pass's share of the cores. Returns
        the pass's figures, throttled. Raises `CleanerError` when the pass fails or
        another writer beat it ``PASS_ATTEMPTS`` times; the log is then unchanged. Not
        idempotent.
        """
        stats = None
        for attempt in range(PASS_ATTEMPTS):
            snapshot = self.log.snapshot(repair=True)
            if snapshot is None:
                return None
            try:
                if snapshot.foreign_files:  # a pass plans over segments only
                    snapshot = self.absorb_foreign_files(spark, snapshot)
                    if snapshot is None:
                        return None
                # A beaten attempt's plan is of a version gone: the next one plans anew.
                asked = request if attempt == 0 else replace(request, plan=None)
                cleaning = self.claim_filthiest(snapshot, asked)
                if cleaning is None:
                    return None
                stats = self.attempt(spark, cleaning)
                break
            except LogCleaningAbortedError as e:
                if attempt + 1 == PASS_ATTEMPTS:
                    raise CleanerError(
                        f"{e}; this pass was dropped after {PASS_ATTEMPTS} attempts, each "
                        "beaten by another writer; the next round tries again",
                        log_path=self.log.uri,
                        partition=min(snapshot.partitions, default=0),
                    ) from e
                logger.info("pass over %s aborted; planning again: %s", self.log.uri, e)
        if stats is not None:
            slept = self.throttler.maybe_throttle(stats.bytes_read + stats.bytes_written)
            if slept:
                stats = replace(stats, throttled_ms=int(slept * 1000))
        return stats

    # -- 2. another engine's files, then choose and claim ---------------------------------

    def absorb_foreign_files(
        self, spark: SparkSession, snapshot: LogSnapshot
    ) -> LogSnapshot | None:
        """Rewrite another engine's files into segments (`sinks.log.foreign.rearrangement`,
        design.md §14), holding every partition of the log. Returns the log after it;
        None when some partition is busy elsewhere.

        Raises `LogCleaningAbortedError` when another writer rewrote the same files first.
        """
        partitions = snapshot.partitions
        claimed = set(self.manager.start_cleaning(partitions))
        if claimed != set(partitions):
            self.manager.abort_cleaning(claimed)
            logger.info("files another engine wrote in %s wait: partitions busy", self.log.uri)
            return None
        try:
            with self.manager.heartbeating(claimed):
                fresh = self.log.snapshot(repair=True) or snapshot
                report = absorb(
                    spark,
                    self.log,
                    fresh,
                    stats_columns=self.stats_columns(fresh),
                    segment_bytes=self.segment_bytes,
                    keys=self.keys,
                    latest_offsets=spark_latest_offsets,
                )
        except ConcurrentCommitError as e:
            raise LogCleaningAbortedError(
                f"another writer rewrote the same files first while another engine's files "
                f"were rewritten ({e})"
            ) from e
        finally:
            self.manager.abort_cleaning(claimed)
        if report is not None:
            logger.info("cleaner: %s: %s", self.log.uri, report.summary())
        return self.log.snapshot(repair=True)

    def claim_filthiest(self, snapshot: LogSnapshot, request: RoundRequest) -> CleaningPass | None:
        """Kafka's ``grabFilthiestCompactedLog``: claim the cleanable partitions of
        ``snapshot``, dirtiest first, plan again if the log moved meanwhile, and cut the
        choice to the pass's byte budget (``log.cleaner.max.bytes.per.pass``).

        The choice is the ``request``'s plan when it is of ``snapshot``'s version and its
        checkpoint rows were read fresh (`RoundRequest.plan_of`); else the log is measured
        and chosen here (`LogPlanner.choose`). Returns the attempt, its partitions claimed
        (``held_below`` not read yet); None: nothing to do. Checkpoints found out of range
        are rewritten on the way, as Kafka does. Raises `LogCleaningAbortedError` (the
        partitions released) when another engine rewrote files after the choice.
        """
        now_ms = self.clock()
        plan = request.plan_of(snapshot) or self.planner.choose(snapshot, force=request.force)
        assert plan is not None and plan.filthiest is not None
        chosen = list(plan.filthiest)
        reset = [p for p in plan.partitions if p.force_checkpoint and p not in chosen]
        if reset:
            self.manager.reset_checkpoints(
                reset, table_id=snapshot.table_id, version=snapshot.version
            )
        if not chosen:
            return None
        claimed = set(self.manager.start_cleaning([p.partition for p in chosen]))
        if not claimed:
            return None  # paused, cleaned by a live cleaner elsewhere, or backing off
        if claimed != {p.partition for p in chosen}:
            logger.info("cleaning only %s of %s: the others are busy", claimed, self.log.uri)
        fresh = self.log.snapshot(repair=True)
        assert fresh is not None
        if fresh.foreign_files:  # another engine rewrote files since: absorb them first
            self.manager.abort_cleaning(claimed)
            raise LogCleaningAbortedError(
                f"another engine rewrote files of {self.log.uri} (version {fresh.version}) "
                f"while a pass over partitions {sorted(claimed)} was planned"
            )
        if fresh.version != snapshot.version:  # plan again after the claim: less to conflict
            snapshot = fresh
            replanned = self.planner.choose(snapshot, force=request.force)
            assert replanned is not None
            chosen = list(replanned.filthiest or ())
        chosen = [p for p in chosen if p.partition in claimed]
        budgeted = within_budget(
            chosen, snapshot.segments, self.config.log_cleaner_max_bytes_per_pass
        )
        unused = claimed - {p.partition for p in budgeted.partitions}
        if unused:
            self.manager.abort_cleaning(unused)
        if not budgeted.partitions:
            return None
        return CleaningPass(
            snapshot,
            budgeted.partitions,
            start_ms=now_ms,
            held_below={},
            budget=request.budget,
            work_left=budgeted.work_left,
        )

    # -- 3. the claimed partitions: plan, recopy, swap, checkpoint ------------------------

    def attempt(self, spark: SparkSession, cleaning: CleaningPass) -> CleanerStats:
        """One attempt of the pass over the partitions ``cleaning`` claimed (Kafka's
        ``doClean`` to ``doneCleaning``): run while heartbeating the claims, committed
        atomically against ``cleaning.snapshot``, then checkpointed (design.md §8);
        returns its figures.

        Each partition's pass ends at its first uncleanable offset, or earlier where its
        offset map fills (``work_left`` is then True and the rest waits for the next pass).
        Raises `LogCleaningAbortedError` (the partitions released, the files this attempt
        wrote deleted) when another writer committed first, `TableFeatureError` as it is
        (released), and `CleanerError` for any other failure (the partitions marked
        uncleanable, retried with backoff), among them a `MissingDataFileError` or
        `CorruptDataFileError` naming a lost or truncated input before anything is
        written. A crash anywhere leaves either the old files or the new ones live, never
        both.
        """
        claimed = cleaning.claimed
        try:
            with self.manager.heartbeating(claimed):
                snapshot = cleaning.snapshot
                held_below = self.planner.consumer_holds(snapshot, now_ms=cleaning.start_ms)
                cleaning = replace(cleaning, held_below=held_below)
                started = time.monotonic()
                if snapshot.foreign_files:
                    raise ValueError("a pass plans over segments: rewrite the foreign files first")
                plans = self.partition_plans(snapshot, cleaning.partitions)
                inputs = [s for plan in plans for s in plan.inputs]
                snapshot.check_files(inputs)
                written = self.recopy(spark, cleaning, plans)
                end_offsets = {plan.partition: plan.end_offset for plan in plans}
                stats = CleanerStats(
                    log_path=self.log.uri,
                    start_ms=cleaning.start_ms,
                    duration_ms=0,
                    end_offsets=end_offsets,
                    first_dirty_offsets={
                        c.partition: c.first_dirty_offset for c in cleaning.partitions
                    },
                    segments_read=len(inputs),
                    segments_written=len(written),
                    bytes_read=sum(s.size_bytes for s in inputs),
                    bytes_written=sum(w.size_bytes for w in written),
                    records_read=sum(s.num_records for s in inputs),
                    records_written=sum(w.num_records for w in written),
                    work_left=any(plan.cut for plan in plans),
                    tombstones_held=held_tombstones(
                        self.log.location, written, pass_start_ms=cleaning.start_ms
                    )
                    if cleaning.held_below
                    else 0,
                )
                crash_point(CLEAN_BEFORE_COMMIT)
                try:  # Kafka's replaceSegments: the inputs swapped for the written files
                    snapshot.commit(
                        adds=written,
                        removes=inputs,
                        data_change=False,
                        transactions={
                            CLEANER_OFFSET_TXN.format(p): e for p, e in end_offsets.items()
                        },
                        info={
                            "operation": "clean",
                            "passStartMs": stats.start_ms,
                            "endOffsets": {str(p): e for p, e in end_offsets.items()},
                            "recordsRead": stats.records_read,
                            "recordsWritten": stats.records_written,
                            "bytesRead": stats.bytes_read,
                            "bytesWritten": stats.bytes_written,
                        },
                    )
                except ConcurrentCommitError:
                    # Nothing was committed: the files this attempt wrote are garbage now.
                    self.log.location.delete_files([w.path for w in written])
                    raise
                duration = int((time.monotonic() - started) * 1000)
                # The planned-from snapshot stays a value; the version after the pass comes
                # from a fresh read (at or after the pass's own commit when others appended).
                after = self.log.snapshot()
                stats = replace(
                    stats, duration_ms=duration, delta_version=after.version if after else None
                )
        except ConcurrentCommitError as e:
            self.manager.abort_cleaning(claimed)
            raise LogCleaningAbortedError(
                f"another cleaner committed first over partitions {sorted(claimed)} ({e})"
            ) from e
        except TableFeatureError:
            # Not this partition's failure: no commit to the log can succeed until the
            # feature goes, and the error says how.
            self.manager.abort_cleaning(claimed)
            raise
        except Exception as e:
            self.manager.mark_uncleanable(claimed, e)
            raise CleanerError(
                f"pass failed ({type(e).__name__}: {str(e)[:500]}); marked uncleanable, "
                "retried with backoff",
                log_path=self.log.uri,
                partition=cleaning.partitions[0].partition,
            ) from e
        budget_bytes = self.config.log_cleaner_max_bytes_per_pass
        if budget_bytes < LONG_MAX:
            work_left = cleaning.work_left or stats.work_left
            stats = replace(stats, budget_bytes=budget_bytes, work_left=work_left)
        crash_point(CLEAN_BEFORE_CHECKPOINT)
        self.manager.checkpoint_pass(
            cleaning.partitions, stats, table_id=cleaning.snapshot.table_id
        )
        logger.info("%s", stats.summary())
        return stats

    def partition_plans(
        self, snapshot: LogSnapshot, partitions: Sequence[LogToClean]
    ) -> list[PartitionPlan]:
        """Each of ``partitions``' share of an attempt over ``snapshot`` (`plan_partition`),
        from the Delta log only. Pure."""
        return [
            plan_partition(
                candidate,
                snapshot.segments.get(candidate.partition, []),
                cleaner_offset=snapshot.cleaner_offset(candidate.partition),
                keys=self.keys,
                dedupe_buffer_size=self.dedupe_buffer_size,
            )
            for candidate in partitions
        ]

    def recopy(
        self, spark: SparkSession, cleaning: CleaningPass, plans: Sequence[PartitionPlan]
    ) -> list[WrittenSegment]:
        """Kafka's ``cleanSegments``: one Spark job, each task (`RecopyTask`) cleaning its
        partitions in turn; returns the files written (none for an empty plan). The files
        are not part of the log until the attempt commits them."""
        # A partition is one task's work (`partitions_to_clean`), so its groups only size
        # its output files: segment.bytes each, as Kafka groups segments.
        groups = {
            plan.partition: group_segments_by_size(plan.inputs, self.segment_bytes)
            for plan in plans
            if plan.inputs
        }
        if not groups:
            return []
        tasks = partitions_to_clean(
            {plan.partition: plan.mapped for plan in plans},
            groups,
            buckets={plan.partition: plan.buckets for plan in plans},
        )
        snapshot = cleaning.snapshot
        slots = min(default_parallelism(spark), cleaning.budget.max_tasks or LONG_MAX)
        task = RecopyTask(
            table_uri=normalize_uri(snapshot.uri),
            storage_options=dict(snapshot.location.storage_options),
            schema=snapshot.arrow_schema,
            key_columns=self.keys.key_columns,
            sequence_column=self.keys.sequence_column,
            tasks=tuple(tasks),
            bins=tuple(tuple(b) for b in packed(tasks, slots)),
            log_start_offsets={p: snapshot.log_start_offset(p) for p in sorted(groups)},
            pass_start_ms=cleaning.start_ms,
            delete_retention_ms=self.delete_retention_ms,
            stats_columns=tuple(self.stats_columns(snapshot)),
            max_file_bytes=self.segment_bytes,
            compression=self.compression,
            niceness=cleaning.budget.niceness,
            held_below=dict(cleaning.held_below),
        )
        written = bin_rows(spark, len(task.bins)).mapInArrow(task, WRITTEN_SEGMENT_DDL).collect()
        return [WrittenSegment(**row.asDict()) for row in written]

    def stats_columns(self, snapshot: LogSnapshot) -> list[str]:
        """The columns whose statistics each file this log's passes write carries."""
        return stats_columns(snapshot.spark_schema, self.keys)


def held_tombstones(
    log: LogLocation, written: Sequence[WrittenSegment], *, pass_start_ms: int
) -> int:
    """How many tombstones a pass starting at ``pass_start_ms`` kept past their delete
    horizon (only those held for a consumer survive it), in the files it ``written``.

    Reads the ``delete_horizon_ms`` column of the written files whose statistics say they
    may hold one (only tombstones carry a horizon). Read-only.
    """
    fs, root = log.filesystem()
    held = 0
    for segment in written:
        low = json.loads(segment.stats or "{}").get("minValues", {}).get(DELETE_HORIZON_MS)
        if low is None or low >= pass_start_ms:
            continue
        column = pq.read_table(
            f"{root}/{segment.path}", filesystem=fs, columns=[DELETE_HORIZON_MS]
        ).column(DELETE_HORIZON_MS)
        held += pc.sum(pc.less(column, pass_start_ms)).as_py() or 0
    return held
