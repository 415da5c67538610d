"""The append through Spark's own Parquet writer: a batch's rows never leave the JVM.

`run_in_jvm` is the executor half of an append (`sinks.produce.append_task.AppendTask`'s
job) as a plan of Spark's own (design.md §37): the log's columns in the log's order, the
offsets assigned in the plan, Kafka's producer-side checks as a guard in the same job
(the write fails on the first row a check refuses), and the files written by Spark's
Parquet writer. It answers with the same `sinks.produce.append_task.TaskOutput` the
Python task does, so the driver's numbering, commit and exactly-once logic
(`sinks.produce.log_append`) is one.

How the files become the log's (design.md §10, §26):

1. Spark writes into ``_staging/<32 hex>/``, a directory of this append alone; a
   staged write is the sink's own by its path (`sinks.log.ownership`), and recovery
   removes one left by a killed append (`sinks.maintenance.recovery`).
2. The driver reads each file's footer (rows, partition, statistics) and its offset
   column, and checks what the log requires of a segment (design.md §1): one
   partition a file, offsets strictly increasing, assigned offsets contiguous from
   the log end offset. A file that breaks it is never committed.
3. Each file is renamed to its segment name (``partition-<p>/<base>-<32 hex>.parquet``,
   `sinks.log.segment.segment_path`); the staging directory is removed. From here
   on it is an ordinary uncommitted segment, exactly as the Python task leaves one.

Offsets (design.md §1). Kafka input carries them: the write keeps Spark's input
partitioning (the Kafka source reads each topic-partition's range as one input
partition), a file per input task as Spark's plain write makes it; split by partition
only when a task held several, and sorted only when offsets were then out of order.
Assigned offsets number each partition's rows in input order from its log end
offset: a first, narrow job counts each input task's rows per partition, which gives
every (task, partition) run its first offset; the write then numbers a run's rows from
it by their position in the task (``monotonically_increasing_id``), with no shuffle.

The Python-worker path stays where this one cannot do the job; `run_in_jvm`
answers None and the caller takes it:

- the log is on an object store (Spark would need that store's Hadoop file system,
  and a rename there is a copy);
- the batch's columns need more than a cast of top-level atomic columns to become the
  log's (a nested column whose type the log widened, or that the batch lacks);
- a row broke a check, or an offset repeats: the Python task counts them per partition
  for the exact error (and for dead letters the batch was already split). Spark logs
  the failed write's task error first;
- the counting job and the write saw different rows (a source that is not
  deterministic), so the offsets do not tile;
- the log combines a batch before the append (``combine.before.append``, design.md §44):
  the Python task combines after its checks and numbering, so both writers' logs hold
  the same records.

Which writer runs (design.md §37; figures in docs/benchmarks.md): `append_writer` reads
``COMPACTED_SINK_APPEND_WRITER`` once, when an appender is built. ``auto``, the default,
takes this one for a batch of assigned offsets that Spark's optimizer estimates at
`SPARK_WRITER_MIN_BYTES` or more, and the Python task otherwise (Kafka input, a smaller
batch, a batch without an estimate: a Kafka or rate source, a Spark Connect session);
``spark`` takes this one wherever it can; ``python`` never.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sinks.crash_points import APPEND_AFTER_STAGED_WRITE, crash_point
from sinks.errors import ConfigError
from sinks.log.key_filter import spark_key_filter_options
from sinks.log.log_format import STAGING_DIR
from sinks.log.records import (
    INPUT_ORDER,
    OFFSET,
    PARTITION,
    at_or_above,
    spark_at_or_above,
    sql_map,
    sql_name,
)
from sinks.log.segment import segment_path
from sinks.log.segment_writer import WrittenSegment, stats_from_footer
from sinks.log.uris import is_local
from sinks.produce.append_task import AppendTask, TaskOutput
from sinks.produce.log_validator import BatchReport, PartitionCounts
from sinks.produce.validity import spark_row_problems_sql

# Spark's name of each Parquet codec pyarrow names (`CleanerConfig.parquet_codec`): Spark's
# "lz4" is Hadoop's framed LZ4, "lz4_raw" the LZ4_RAW pyarrow writes.
SPARK_CODECS = {
    "zstd": "zstd",
    "lz4": "lz4_raw",
    "snappy": "snappy",
    "gzip": "gzip",
    "none": "none",
}

logger = logging.getLogger("compacted_sink")

APPEND_WRITER_ENV = "COMPACTED_SINK_APPEND_WRITER"
SPARK_WRITER = "spark"
PYTHON_WRITER = "python"
AUTO_WRITER = "auto"
SPARK_WRITER_MIN_BYTES = 128 << 20
"""Under ``auto``, the estimated batch size from which assigned offsets take Spark's writer:
where the two writers measured level (docs/benchmarks.md)."""
CONCURRENT_WRITERS = 64
"""Files a task of Kafka input keeps open at once (partitions it holds) before Spark sorts."""
MAX_RUNS = 100_000
"""(input task, partition) runs an assigned-offsets batch may have (each is a map entry)."""

_STAGED_PARTITION = "_p"  # a copy of `partition` that Spark's writer splits files by
_STAGED_PARTITION_SQL = f"{sql_name(PARTITION)} AS {_STAGED_PARTITION}"
_TASK_BITS = 33  # monotonically_increasing_id: the task's index above 33 bits of position
_POSITION = "_position"
_BAD_ROW = "compacted-sink: a record the log refuses"  # the guard's error (`_guarded`)


def append_writer() -> str:
    """Which writer an append uses, from the environment as it is now: `AUTO_WRITER`
    unless ``COMPACTED_SINK_APPEND_WRITER`` says `SPARK_WRITER` or `PYTHON_WRITER`.

    Read once, when an appender is built (`sinks.produce.log_append.LogAppender`).
    Raises `ConfigError` for any other value.
    """
    return check_writer(os.environ.get(APPEND_WRITER_ENV, AUTO_WRITER), source=APPEND_WRITER_ENV)


def check_writer(name: str, *, source: str = "writer") -> str:
    """``name`` as a writer's name (trimmed, lower case; empty: `AUTO_WRITER`). Pure.

    Raises `ConfigError` when it names no writer; ``source`` says where it came from.
    """
    chosen = name.strip().lower() or AUTO_WRITER
    if chosen not in (AUTO_WRITER, SPARK_WRITER, PYTHON_WRITER):
        raise ConfigError(
            f"{source}={name!r} names no append writer: use {AUTO_WRITER!r}, "
            f"{SPARK_WRITER!r} or {PYTHON_WRITER!r}"
        )
    return chosen


def _takes_spark_writer(df: DataFrame, task: AppendTask, chosen: str) -> bool:
    """Whether this batch is Spark's writer's under ``chosen`` (module docstring, "Which
    writer runs")."""
    if chosen == PYTHON_WRITER or not is_local(task.writer.table_uri):
        return False
    if chosen == SPARK_WRITER:
        return True
    if task.has_offsets:
        return False
    estimate = estimated_bytes(df)
    return estimate is not None and estimate >= SPARK_WRITER_MIN_BYTES


def estimated_bytes(df: DataFrame) -> int | None:
    """Spark's optimizer's estimate of ``df``'s size, or None when it has none.

    A plan over files or a cached batch has one; a Kafka or rate source's micro-batch
    reports ``spark.sql.defaultSizeInBytes`` (no estimate), and a Spark Connect
    DataFrame has no plan in this process.
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return None
    try:
        size = int(str(jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
        unknown = jdf.sparkSession().sessionState().conf().defaultSizeInBytes()
    except Exception:  # no estimate is an answer: the Python task runs
        logger.debug("no size estimate for the batch", exc_info=True)
        return None
    return None if size >= int(unknown) else size


@dataclass(frozen=True)
class StagedSegment:
    """A file Spark's writer left in the staging directory, as its footer describes it."""

    path: str  # absolute, in the file system of `arrow_filesystem`
    partition: int
    base_offset: int
    last_offset: int
    num_records: int
    stats: str
    in_order: bool  # one partition, offsets strictly increasing: a segment (design.md §1)
    below_log_end: int = 0  # Kafka input: records the log already holds (a redelivery)


def run_in_jvm(
    df: DataFrame,
    task: AppendTask,
    log_schema: T.StructType,
    *,
    exchange: bool,
    writer: str,
) -> TaskOutput | None:
    """Write the prepared batch ``df`` with Spark's writer, as ``task`` would with Python.

    Returns what the Python task would (the segments written, uncommitted, and the
    per-partition counts), or None when this batch takes the Python path under the
    appender's ``writer`` (module docstring; nothing is left behind then). ``log_schema``
    is the log's schema the files are written with. Not idempotent: every call writes
    new files.
    """
    if task.combine or not _takes_spark_writer(df, task, writer):
        return None
    columns = _log_columns(df, log_schema)
    if columns is None:
        return None
    staging = _StagedWrite(task)
    try:
        if task.has_offsets:
            files, report = _write_kafka_input(df, columns, task, staging, exchange=exchange)
        else:
            files, report = _write_assigned(df, columns, task, staging)
        if files is None:
            return None
        crash_point(APPEND_AFTER_STAGED_WRITE)
        written = staging.publish(files)
    finally:
        staging.remove()
    return TaskOutput(written, report)


# -- the plan ----------------------------------------------------------------------------


def _log_columns(df: DataFrame, log_schema: T.StructType) -> list[str] | None:
    """The log's columns from ``df``'s, in the log's order, as SQL; None when a cast cannot
    do it."""
    have = {f.name: f.dataType for f in df.schema.fields}
    columns = []
    for field in log_schema.fields:
        name, sql_type = sql_name(field.name), field.dataType.simpleString()
        if field.name not in have:
            if not _atomic(field.dataType):
                return None
            columns.append(f"CAST(NULL AS {sql_type}) AS {name}")
        elif have[field.name] == field.dataType:
            columns.append(name)
        elif _atomic(have[field.name]) and _atomic(field.dataType):
            columns.append(f"CAST({name} AS {sql_type}) AS {name}")
        else:
            return None
    return columns


def _atomic(data_type: T.DataType) -> bool:
    return not isinstance(data_type, T.StructType | T.ArrayType | T.MapType)


def _guarded(df: DataFrame, task: AppendTask) -> DataFrame:
    """``df`` with Kafka's checks as a guard: the write fails on the first bad row.

    A predicate, not a count: it stays in the write's generated code, where an
    ``observe`` costs a pass of its own over every row. The Python task then counts
    the batch's problems for the exact error. Lazy: no Spark job runs.
    """
    problems = spark_row_problems_sql(
        df,
        keys=task.keys,
        has_offsets=task.has_offsets,
        message_max_bytes=task.message_max_bytes,
    )
    broken = " OR ".join(problems.values())
    return df.filter(f"CASE WHEN {broken} THEN raise_error('{_BAD_ROW}') ELSE true END")


def _failed_on_a_bad_row(error: Exception) -> bool:
    return _BAD_ROW in str(error)


def _write_kafka_input(
    df: DataFrame,
    columns: list[str],
    task: AppendTask,
    writer: _StagedWrite,
    *,
    exchange: bool,
) -> tuple[list[StagedSegment] | None, BatchReport]:
    """Kafka input: offsets given; records below the log end offset dropped (a redelivery).

    Without ``exchange``, first as Spark read them: a file per input task, unsorted and
    not split, which is a segment when the task held one partition in offset order (Spark's
    Kafka source reads each topic-partition's range as one input partition); else split by
    partition in input order (a file per partition and task); when a file's offsets are
    then out of order, sorted within each input partition. With ``exchange``, shuffled by
    partition and sorted. A redelivery is rare: the files written say how many records
    the log already held, and only then is the batch written again without them.
    """
    shapes = ("sorted",) if exchange else ("as read", "split", "sorted")
    redelivered: int | None = None  # unknown until a write's files say
    for shape in shapes:
        files = _write_shape(df, columns, task, writer, shape, exchange, redelivered)
        if files is not None and redelivered is None:
            redelivered = sum(f.below_log_end for f in files)
            if redelivered:
                writer.clear()
                files = _write_shape(df, columns, task, writer, shape, exchange, redelivered)
        if files is None:
            return None, BatchReport()
        if all(f.in_order for f in files):
            return files, _counts(files, redelivered=redelivered or 0)
        writer.clear()
    return None, BatchReport()  # a repeated offset: the Python task counts it per partition


def _write_shape(
    df: DataFrame,
    columns: list[str],
    task: AppendTask,
    writer: _StagedWrite,
    shape: str,
    exchange: bool,
    redelivered: int | None,
) -> list[StagedSegment] | None:
    """Kafka input written in one ``shape``; records below the log end offset filtered out
    once a first write found some (``redelivered``)."""
    rows = _guarded(df, task)
    if redelivered:
        rows = spark_at_or_above(rows, task.log_end_offsets)
    if exchange:
        rows = rows.repartition(PARTITION)
    if shape == "sorted":
        rows = rows.sortWithinPartitions(PARTITION, OFFSET)
    split = shape != "as read"
    staged = rows.selectExpr(*columns, *([_STAGED_PARTITION_SQL] if split else []))
    return writer.write(staged, split=split, in_input_order=shape == "split")


def _write_assigned(
    df: DataFrame, columns: list[str], task: AppendTask, writer: _StagedWrite
) -> tuple[list[StagedSegment] | None, BatchReport]:
    """No offsets given: number each partition from its log end offset, in input order.

    A first job counts each input task's rows per partition (only the ``partition``
    column is read); each (task, partition) run then starts where the runs of earlier
    tasks left the partition. The write numbers a run's rows by their position in
    their task, sorted by partition first when a task holds several.
    """
    runs: dict[tuple[int, int], int] = {}
    counted = df.selectExpr("spark_partition_id() AS t", f"{sql_name(PARTITION)} AS p")
    for row in counted.groupBy("t", "p").count().collect():
        if row["p"] is None or row["p"] < 0:
            return None, BatchReport()  # a bad partition: the Python task reports it
        runs[(int(row["t"]), int(row["p"]))] = int(row["count"])
    if not runs or len(runs) > MAX_RUNS:
        return ([], BatchReport()) if not runs else (None, BatchReport())
    split = len({t for t, _ in runs}) < len(runs)  # some task holds several partitions
    first = sql_map(_first_offsets(runs, task.log_end_offsets), long_keys=True)
    rows = _guarded(df, task)
    if split:
        rows = rows.sortWithinPartitions(PARTITION, INPUT_ORDER)
    # The row's place in its (sorted) task: the task's index above 33 bits of position.
    rows = rows.selectExpr("*", f"monotonically_increasing_id() AS {_POSITION}")
    task_index = f"shiftright({_POSITION}, {_TASK_BITS})"
    run = f"shiftleft({task_index}, 32) + CAST({sql_name(PARTITION)} AS BIGINT)"
    local = f"{_POSITION} & {(1 << _TASK_BITS) - 1}"
    rows = rows.withColumn(OFFSET, F.expr(f"{first}[{run}] + ({local})"))
    staged = rows.selectExpr(*columns, *([_STAGED_PARTITION_SQL] if split else []))
    files = writer.write(staged, split=split, rows_per_file=max(runs.values()))
    if files is None or not _tiles(files, runs, task.log_end_offsets):
        return None, BatchReport()
    return files, _counts(files, redelivered=0)


def _first_offsets(
    runs: Mapping[tuple[int, int], int], log_end_offsets: Mapping[int, int]
) -> dict[int, int]:
    """For each (task, partition) run, keyed ``task << 32 | partition``, the offset its
    first row would take, minus that row's position in its task.

    Partitions are numbered task by task in task order (input order). Within a task
    (sorted by partition when it holds several) a run starts after the task's runs of
    lower partitions.
    """
    next_offset = dict(log_end_offsets)
    before_in_task: dict[int, int] = {}
    firsts = {}
    for t, p in sorted(runs):
        start = next_offset.get(p, 0)
        firsts[(t << 32) | p] = start - before_in_task.get(t, 0)
        next_offset[p] = start + runs[(t, p)]
        before_in_task[t] = before_in_task.get(t, 0) + runs[(t, p)]
    return firsts


def _tiles(
    files: Sequence[StagedSegment],
    runs: Mapping[tuple[int, int], int],
    log_end_offsets: Mapping[int, int],
) -> bool:
    """Whether each partition's files hold exactly its offsets from its log end offset on,
    each file contiguous and strictly increasing, as the counting job numbered them."""
    expected: dict[int, int] = {}
    for (_t, p), n in runs.items():
        expected[p] = expected.get(p, 0) + n
    by_partition: dict[int, list[StagedSegment]] = {}
    for f in files:
        by_partition.setdefault(f.partition, []).append(f)
    if set(by_partition) != set(expected):
        return False
    for p, written in by_partition.items():
        offset = log_end_offsets.get(p, 0)
        for f in sorted(written, key=lambda f: f.base_offset):
            contiguous = f.last_offset - f.base_offset + 1 == f.num_records
            if f.base_offset != offset or not contiguous or not f.in_order:
                return False
            offset = f.last_offset + 1
        if offset != log_end_offsets.get(p, 0) + expected[p]:
            return False
    return True


def _counts(files: Sequence[StagedSegment], *, redelivered: int) -> BatchReport:
    """The checks' report, as the Python task would count: every row valid (the guard
    passed); ``redelivered`` counted on the first partition."""
    rows_by_partition: dict[int, int] = {}
    for f in files:
        rows_by_partition[f.partition] = rows_by_partition.get(f.partition, 0) + f.num_records
    if not rows_by_partition and redelivered:
        rows_by_partition[0] = 0
    return BatchReport.merged(
        (p, PartitionCounts(rows=n, redelivered=redelivered if i == 0 else 0))
        for i, (p, n) in enumerate(sorted(rows_by_partition.items()))
    )


# -- the staging directory ---------------------------------------------------------------


@contextmanager
def _session_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """The session's SQL settings changed for one write, then put back.

    Spark reads these when it plans the write, from the session; other queries of the
    session planned meanwhile see them too (all are harmless to a Parquet write).
    """
    conf = spark.conf
    before = {k: conf.get(k, None) for k in settings}
    for k, v in settings.items():
        conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                conf.unset(k)
            else:
                conf.set(k, v)


class _StagedWrite:
    """``_staging/<32 hex>/`` of one append: Spark writes there, the driver publishes from it."""

    def __init__(self, task: AppendTask) -> None:
        self.task = task
        self.fs, self.root = task.writer.location.filesystem()
        self.relative = f"{STAGING_DIR}/{uuid.uuid4().hex}"
        self.directory = f"{self.root}/{self.relative}"

    def write(
        self,
        rows: DataFrame,
        *,
        split: bool,
        in_input_order: bool = False,
        rows_per_file: int | None = None,
    ) -> list[StagedSegment] | None:
        """Write ``rows`` with Spark's Parquet writer; ``split``: a file per ``_p`` value.
        ``rows_per_file``: the most rows a file gets, when known (sizes the key filter).

        ``in_input_order``: the rows are not sorted by ``_p``; each task keeps a file open
        per partition (Spark's concurrent output writers) instead of sorting its rows.
        The staged files (empty ones left out), or None when a row broke a check
        (`_guarded`) or an offset is null.
        """
        key_filter = spark_key_filter_options(
            self.task.writer.schema, self.task.writer.key_columns, rows_per_file
        )
        writer = (
            rows.write.mode("overwrite")
            .option("compression", SPARK_CODECS[self.task.writer.compression])
            .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
            .options(**key_filter)
        )
        if split:
            writer = writer.partitionBy(_STAGED_PARTITION)
        conf = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}  # Delta's type
        if split and in_input_order:
            conf["spark.sql.optimizer.plannedWrite.enabled"] = "false"  # else Spark sorts
            conf["spark.sql.maxConcurrentOutputFileWriters"] = str(CONCURRENT_WRITERS)
        with _session_conf(rows.sparkSession, conf):
            try:
                writer.parquet(self.directory)
            except Exception as e:
                if not _failed_on_a_bad_row(e):
                    raise
                return None  # the Python task counts what is wrong, for the exact error
        staged = [self._describe(path) for path in self._parquet_files()]
        if any(f is None for f in staged):
            return None
        return [f for f in staged if f is not None and f.num_records > 0]

    def _parquet_files(self) -> list[str]:
        selector = pafs.FileSelector(self.directory, recursive=True, allow_not_found=True)
        return sorted(
            info.path
            for info in self.fs.get_file_info(selector)
            if info.type == pafs.FileType.File
            and info.path.endswith(".parquet")
            and not info.base_name.startswith((".", "_"))
        )

    def _describe(self, path: str) -> StagedSegment | None:
        """The file as its footer and offset column say; None when an offset is null."""
        metadata = pq.read_metadata(path, filesystem=self.fs)
        if metadata.num_rows == 0:
            return StagedSegment(path, 0, 0, 0, 0, "", True)
        writer = self.task.writer
        stats = stats_from_footer(metadata, writer.schema, writer.stats_columns)
        low, high = stats.minimum.get(PARTITION), stats.maximum.get(PARTITION)
        floors = self.task.log_end_offsets if self.task.has_offsets else {}
        read = [OFFSET, *([PARTITION] if any(floors.values()) else [])]
        table = pq.read_table(path, columns=read, filesystem=self.fs)
        if table.column(OFFSET).null_count or low is None:
            return None
        values = table.column(OFFSET).to_numpy()
        return StagedSegment(
            path=path,
            partition=int(low),
            base_offset=int(values[0]),
            last_offset=int(values[-1]),
            num_records=metadata.num_rows,
            stats=stats.to_json(),
            in_order=low == high and bool(np.all(values[1:] > values[:-1])),
            below_log_end=table.num_rows - at_or_above(table, floors).num_rows if floors else 0,
        )

    def publish(self, files: Sequence[StagedSegment]) -> list[WrittenSegment]:
        """Rename each file to its segment name; the segments, uncommitted."""
        written = []
        for f in files:
            relative = segment_path(f.partition, f.base_offset, uuid.uuid4().hex)
            self.fs.create_dir(f"{self.root}/partition-{f.partition}", recursive=True)
            size = self.fs.get_file_info(f.path).size
            self.fs.move(f.path, f"{self.root}/{relative}")
            written.append(
                WrittenSegment(
                    path=relative,
                    size_bytes=size,
                    partition=f.partition,
                    base_offset=f.base_offset,
                    last_offset=f.last_offset,
                    num_records=f.num_records,
                    stats=f.stats,
                )
            )
        return written

    def clear(self) -> None:
        """Delete what the last write staged (it will not be published)."""
        self.remove()

    def remove(self) -> None:
        """Remove the staging directory and, when nothing else is staged, ``_staging``."""
        try:
            self.fs.delete_dir(self.directory)
        except FileNotFoundError:
            pass
        parent = f"{self.root}/{STAGING_DIR}"
        try:
            if not self.fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
                self.fs.delete_dir(parent)
        except OSError as e:
            logger.info("could not remove empty directory %s: %s", parent, e)
