"""What the produce path takes: a batch from Spark or from Arrow, in the log's columns.

The one append (`sinks.produce.log_append.LogAppender.append`) does not care where a
batch comes from; it asks the batch to prepare itself (the log's metadata columns),
to split off its bad rows when a dead-letter table is set, and to run the append
task over its rows:

- `SparkRecords`: the ``foreachBatch`` hook's DataFrame. Prepared by
  `sinks.produce.log_validator.prepare_batch`; the task runs on the executors (``mapInArrow``).
- `ArrowRecords`: rows the data source's executors staged, read on its driver
  (a Python worker without a SparkSession). Prepared here into the same columns, in
  the same order; the task runs in this process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from sinks.errors import SchemaMismatchError
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import log_arrow_schema
from sinks.log.records import (
    DELETE_HORIZON_MS,
    INPUT_ORDER,
    METADATA_COLUMNS,
    OFFSET,
    PARTITION,
    TIMESTAMP,
    VALUE,
    below,
    sql_map,
    sql_name,
)
from sinks.produce.append_task import APPEND_TASK_DDL, AppendTask, TaskOutput
from sinks.produce.dead_letter import SplitBatch, split_arrow_batch, split_batch
from sinks.produce.log_validator import PreparedBatch, log_columns, prepare_batch
from sinks.produce.spark_append import PYTHON_WRITER, run_in_jvm
from sinks.spark_compat import to_arrow


class TaskRunner(Protocol):
    """Runs an `AppendTask` over every row of a batch; returns what the tasks wrote and counted.

    ``exchange`` false lets a batch that carries Kafka offsets skip the shuffle by
    partition: each task then writes the partitions it holds, which is right only when
    no two tasks hold overlapping offsets of one partition (the caller checks the files
    written, `sinks.produce.log_commit.overlapping`, and runs again with an exchange).
    """

    def __call__(self, task: AppendTask, *, exchange: bool = True) -> TaskOutput: ...


# -- from Spark: the foreachBatch hook ---------------------------------------------------------


@dataclass
class SparkRecords:
    """A micro-batch DataFrame as ``foreachBatch`` hands it over.

    ``before_prepare`` runs once the batch is known not to be committed yet (the
    hook checks Spark's Python workers there).
    """

    df: DataFrame
    before_prepare: Callable[[], None] | None = None
    empty: bool = False  # not known without a Spark job: an empty batch is appended as one

    def prepare(self, *, keys: LogKeys, now_ms: int, writer: str) -> SparkPrepared:
        """The batch in the log's columns, to be written by ``writer`` (an appender's choice,
        `sinks.produce.spark_append.append_writer`). Lazy: no Spark job runs."""
        if self.before_prepare is not None:
            self.before_prepare()
        batch = prepare_batch(self.df, keys=keys, now_ms=now_ms)
        return SparkPrepared(batch, record_columns=list(self.df.columns), writer=writer)


@dataclass
class SparkPrepared:
    """A prepared Spark batch: its log columns, its bad rows split off on request.

    ``writer`` is the appender's (`sinks.produce.spark_append`, "Which writer runs").
    """

    batch: PreparedBatch
    record_columns: list[str]
    writer: str
    _split: SplitBatch | None = field(default=None, repr=False)
    _in_jvm: bool = field(default=True, repr=False)  # until Spark's writer declines the batch

    @property
    def schema(self) -> T.StructType:
        """The batch's log columns (no Spark job)."""
        return log_columns(self.batch.df).schema

    @property
    def has_offsets(self) -> bool:
        """Whether the batch brings Kafka's offsets (else the append assigns them)."""
        return self.batch.has_offsets

    def quarantine(self, *, keys: LogKeys, message_max_bytes: int) -> DataFrame:
        """Keep the good rows for the append; return the bad ones as dead letters.

        One cached evaluation of the batch serves both (`release` frees it).
        """
        self._split = split_batch(
            self.batch.df,
            keys=keys,
            has_offsets=self.batch.has_offsets,
            message_max_bytes=message_max_bytes,
            record_columns=self.record_columns,
        )
        self.batch = PreparedBatch(self._split.good, self.batch.has_offsets)
        return self._split.bad

    def run(self, task: AppendTask, *, exchange: bool = True) -> TaskOutput:
        """Shuffle once by partition, sort by input order (Kafka input: offset), run ``task``.

        Kafka input without ``exchange``: each input partition is sorted where it is, no
        shuffle. Spark's Kafka source reads each topic-partition's offset range as one
        input partition, so its rows never move; the values cross the network once less.

        Spark's own Parquet writer runs the task when ``writer`` lets it and it can
        (`sinks.produce.spark_append`: the rows never leave the JVM); the Python workers
        run it otherwise. Not idempotent: every call writes new files.
        """
        if task.log_schema is not None and self._in_jvm and self.writer != PYTHON_WRITER:
            output = run_in_jvm(
                self.batch.df, task, task.log_schema, exchange=exchange, writer=self.writer
            )
            if output is not None:
                return output
            self._in_jvm = False  # the Python task counts this batch's problems, if any
        if self.batch.has_offsets and not exchange:
            rows = self.batch.df.sortWithinPartitions(PARTITION, OFFSET)
        else:
            order = OFFSET if self.batch.has_offsets else INPUT_ORDER
            rows = self.batch.df.repartition(PARTITION).sortWithinPartitions(PARTITION, order)
        return TaskOutput.from_rows(
            r.asDict() for r in rows.mapInArrow(task, APPEND_TASK_DDL).collect()
        )

    def redelivery_rows(
        self, end_offsets: Mapping[int, int], *, columns: Sequence[str], on: Sequence[str]
    ) -> pa.Table:
        """The ``columns`` of every row whose ``on`` (partition and key) has a row below its
        partition's log end offset (``end_offsets``), those at or above it included: what
        the redelivery proof reads of the batch (`sinks.produce.redelivery`). One Spark job,
        run only when the writers dropped such rows."""
        df = self.batch.df
        under = df.filter(
            f"{sql_name(OFFSET)} < coalesce({sql_map(end_offsets)}[{sql_name(PARTITION)}], 0)"
        )
        rows = df.select(*columns).join(under.select(*on).distinct(), list(on), "left_semi")
        return to_arrow(rows)

    def release(self) -> None:
        """Free the cached evaluation `quarantine` made, if any. Idempotent."""
        if self._split is not None:
            self._split.release()


# -- from Arrow: the data source's driver ------------------------------------------------------


@dataclass
class ArrowRecords:
    """Rows of the input's columns (``input_schema``), in input order, in this process.

    For batches that fit in memory. A batch of no rows is empty: it creates no log.
    """

    table: pa.Table
    input_schema: T.StructType

    @property
    def empty(self) -> bool:
        """True for a batch of no rows."""
        return self.table.num_rows == 0

    def prepare(self, *, keys: LogKeys, now_ms: int, writer: str) -> ArrowPrepared:
        """The rows with the log's columns. ``writer`` changes nothing: Arrow rows are
        always written by the Python task, in this process."""
        del writer
        schema = log_schema(self.input_schema, keys)
        return ArrowPrepared(
            _with_log_columns(self.table, schema, now_ms),
            schema,
            OFFSET in self.table.column_names,
            record_columns=list(self.table.column_names),
        )


@dataclass
class ArrowPrepared:
    """Arrow rows with the log's columns (``schema``)."""

    table: pa.Table
    schema: T.StructType
    has_offsets: bool
    record_columns: list[str]

    def quarantine(self, *, keys: LogKeys, message_max_bytes: int) -> pa.Table:
        """Keep the good rows for the append; return the bad ones as dead letters."""
        self.table, letters = split_arrow_batch(
            self.table,
            keys=keys,
            has_offsets=self.has_offsets,
            message_max_bytes=message_max_bytes,
            record_columns=self.record_columns,
        )
        return letters

    def run(self, task: AppendTask, *, exchange: bool = True) -> TaskOutput:
        """Sort by (partition, input order or offset) and run ``task`` here: one task, so
        ``exchange`` changes nothing. Not idempotent: every call writes new files."""
        keys = [(PARTITION, "ascending"), *([(OFFSET, "ascending")] if self.has_offsets else [])]
        ordered = self.table.sort_by(keys)  # a stable sort: input order within a partition
        return TaskOutput.from_rows(
            row for out in task(iter(ordered.to_batches())) for row in out.to_pylist()
        )

    def redelivery_rows(
        self, end_offsets: Mapping[int, int], *, columns: Sequence[str], on: Sequence[str]
    ) -> pa.Table:
        """`SparkPrepared.redelivery_rows` on the rows in this process."""
        table = self.table.select(list(columns))
        under = table.filter(pa.array(below(table, end_offsets)))
        return table.join(under.select(list(on)), list(on), join_type="left semi")

    def release(self) -> None:
        """Nothing to free: the rows are this process's."""


def log_schema(input_schema: T.StructType, keys: LogKeys) -> T.StructType:
    """The log's columns for this input, in the order `prepare_batch` gives them."""
    key_columns = keys.key_columns
    fields = {f.name: f for f in input_schema.fields}
    for name in [*key_columns, VALUE]:
        if name not in fields:
            raise SchemaMismatchError(
                f"batch has no column {name!r}; it has {sorted(fields)}; nothing was written"
            )
    payload = [
        f for f in input_schema.fields if f.name not in (*key_columns, VALUE, *METADATA_COLUMNS)
    ]
    return T.StructType(
        [
            *[fields[k] for k in key_columns],
            fields[VALUE],
            T.StructField(PARTITION, T.IntegerType()),
            T.StructField(OFFSET, T.LongType()),
            T.StructField(TIMESTAMP, T.TimestampType()),
            *payload,
            T.StructField(DELETE_HORIZON_MS, T.LongType()),
        ]
    )


def _with_log_columns(table: pa.Table, schema: T.StructType, now_ms: int) -> pa.Table:
    """The rows with the log's columns (partition 0, timestamp now, no horizon)."""
    n = table.num_rows
    columns = {}
    for name in schema.names:
        if name in table.column_names:
            columns[name] = table.column(name)
        elif name == PARTITION:
            columns[name] = pa.array([0] * n, pa.int32())
        elif name == TIMESTAMP:
            columns[name] = pa.array([now_ms * 1000] * n, pa.timestamp("us", tz="UTC"))
        else:  # offset (assigned later) and delete_horizon_ms
            columns[name] = pa.nulls(n, pa.int64())
    return pa.table(columns).cast(log_arrow_schema(schema))
