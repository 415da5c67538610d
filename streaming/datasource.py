"""``df.writeStream.format("compacted-state")``: the sink as a Python data source.

For Spark Declarative Pipelines' ``create_sink`` and for writers that prefer a
format name to ``foreachBatch``. Executors stage each task's rows as one Parquet
file under the log's ``_staging/`` directory and send its path to the driver;
the driver's ``commit(messages, batch_id)`` numbers the records, writes the
log's segment files with the core's `SegmentWriterTask`, and commits them with
the core's append commit (Delta ``txn`` per batch id: exactly once), then
deletes the staged files; ``abort`` deletes them too.

Spark runs a Python data source's ``commit`` in a Python worker process that has
no SparkSession, so this path does not call the Spark hook: it validates and
numbers the batch with Arrow, on the driver. Two consequences, by design:

- it suits micro-batches that fit in the driver's memory; the ``foreachBatch``
  hook stays the path for large batches;
- it appends and does not clean: run ``compacted-sink clean`` (or ``sink.clean()``)
  beside the query, as a cleaner job beside a writer (SPEC rule 11).

Options: ``path`` (the log), ``key_columns`` (comma-separated, default ``key``),
``sequence_column``, ``checkpoint_table``, ``sink_id``, and any Kafka dotted
cleaner property (``min.cleanable.dirty.ratio``, ``segment.bytes``, …).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.exceptions import CommitFailedError
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from sinks import CleanerConfig, CompactedStateSink
from sinks.cleaner import stats_columns
from sinks.errors import BadInputError, CommitConflictError, ConfigError
from sinks.log_table import log_arrow_schema
from sinks.records import (
    DELETE_HORIZON_MS,
    METADATA_COLUMNS,
    OFFSET,
    PARTITION,
    TIMESTAMP,
    VALUE,
    check_schema,
)
from sinks.segment_writer import SegmentWriterTask, WrittenSegment
from sinks.storage import arrow_filesystem, delete_files, join, normalize_uri

FORMAT = "compacted-state"
STAGING = "_staging"
_SINK_OPTIONS = {"path", "key_columns", "sequence_column", "checkpoint_table", "sink_id"}
_ATTEMPTS = 8
STALE_STAGED_MS = 3_600_000  # staged files this old belong to no live commit (a killed query)


def register(spark: SparkSession) -> None:
    """Make ``format("compacted-state")`` available in this session."""
    spark.dataSource.register(CompactedStateDataSource)


class CompactedStateDataSource(DataSource):
    """The ``compacted-state`` format: a streaming sink over one compacted log."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> CompactedStateStreamWriter:  # noqa: N802
        options = SinkOptions.parse(self.options)
        remove_stale_staged(options.path, older_than_ms=STALE_STAGED_MS)
        return CompactedStateStreamWriter(options, schema)


@dataclass(frozen=True)
class SinkOptions:
    """The writer's options, parsed on the driver; errors name the option."""

    path: str
    key_columns: tuple[str, ...]
    sequence_column: str | None
    checkpoint_table: str | None
    sink_id: str | None
    properties: tuple[tuple[str, str], ...]
    checkpoint_location: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        if not options.get("path"):
            raise ConfigError(f"format {FORMAT!r} needs option 'path' (the log's location)")
        properties = {
            k: v
            for k, v in options.items()
            if k not in _SINK_OPTIONS and "." in k and not k.startswith("spark.")
        }
        CleanerConfig.from_properties(properties)  # fail at start, naming the key
        keys = tuple(k.strip() for k in options.get("key_columns", "key").split(",") if k.strip())
        if not keys:
            raise ConfigError(f"format {FORMAT!r}: option 'key_columns' names no column")
        return cls(
            path=normalize_uri(options["path"]),
            key_columns=keys,
            sequence_column=options.get("sequence_column"),
            checkpoint_table=options.get("checkpoint_table"),
            sink_id=options.get("sink_id"),
            properties=tuple(sorted(properties.items())),
            checkpoint_location=options.get("checkpointLocation"),
        )

    def sink(self) -> CompactedStateSink:
        return CompactedStateSink(
            self.path,
            key_columns=self.key_columns,
            config=CleanerConfig.from_properties(dict(self.properties)),
            sequence_column=self.sequence_column,
            checkpoint_table=self.checkpoint_table,
            sink_id=self.sink_id,
        )


@dataclass
class StagedFile(WriterCommitMessage):
    """One task's rows, staged as Parquet (path relative to the log), in input order."""

    path: str
    rows: int


class CompactedStateStreamWriter(DataSourceStreamArrowWriter):
    """Executors stage; the driver validates, numbers, writes segments and commits exactly once."""

    def __init__(self, options: SinkOptions, schema: T.StructType) -> None:
        self.options = options
        self.input_schema = schema
        self.log_schema = log_schema(schema, options.key_columns)

    # -- executors -----------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        fs, root = arrow_filesystem(self.options.path)
        relative = f"{STAGING}/{uuid.uuid4().hex}.parquet"
        fs.create_dir(f"{root}/{STAGING}", recursive=True)
        rows = 0
        with fs.open_output_stream(f"{root}/{relative}") as out:
            writer: pq.ParquetWriter | None = None
            for batch in iterator:
                if writer is None:
                    writer = pq.ParquetWriter(out, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
            if writer is not None:
                writer.close()
        return StagedFile(relative, rows)

    # -- driver ----------------------------------------------------------------------------

    def commit(self, messages: list[StagedFile | None], batchId: int) -> None:  # noqa: N803
        staged = [m for m in messages if m is not None]
        try:
            append_staged(self.options, self.log_schema, staged, batchId)
        finally:
            _delete_staged(self.options.path, staged)

    def abort(self, messages: list[StagedFile | None], batchId: int) -> None:  # noqa: N803
        _delete_staged(self.options.path, [m for m in messages if m is not None])


def log_schema(input_schema: T.StructType, key_columns: tuple[str, ...]) -> T.StructType:
    """The log's columns for this input, in the order the foreachBatch hook creates them."""
    fields = {f.name: f for f in input_schema.fields}
    for name in [*key_columns, VALUE]:
        if name not in fields:
            raise ConfigError(f"format {FORMAT!r}: the stream has no column {name!r}")
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


def append_staged(
    options: SinkOptions, schema: T.StructType, staged: list[StagedFile], batch_id: int
) -> None:
    """Append the staged rows as one batch, exactly once per (app id, batch id)."""
    sink = options.sink()
    app_id = _app_id(sink, options)
    snapshot = sink.log_table.snapshot()
    if _committed(snapshot, app_id, batch_id):
        return
    table = _read_staged(options.path, staged)
    if table.num_rows == 0:
        if snapshot is not None:
            sink._commit_empty(snapshot, app_id, batch_id)  # keeps the batch id recorded
        return
    has_offsets = OFFSET in table.column_names
    records = prepare(table, schema, options.key_columns, sink.clock())
    _raise_for_problems(
        records, options.key_columns, has_offsets, sink.config.message_max_bytes, batch_id
    )
    if snapshot is None:
        snapshot = sink.log_table.create(schema)
    check_schema(schema, snapshot.spark_schema)
    for _attempt in range(_ATTEMPTS):
        numbered = number(records, snapshot.log_end_offsets(), has_offsets)
        written = _write_segments(sink, snapshot, numbered)
        try:
            sink._commit_append(snapshot, written, app_id, batch_id)  # the core's append commit
            return
        except CommitFailedError:
            sink._discard(written)
            snapshot = sink.log_table.snapshot()
            if _committed(snapshot, app_id, batch_id):
                return
    raise CommitConflictError(
        f"batch {batch_id} of {sink.path}: append kept conflicting after {_ATTEMPTS} attempts"
    )


def prepare(
    table: pa.Table, schema: T.StructType, key_columns: tuple[str, ...], now_ms: int
) -> pa.Table:
    """The staged rows with the log's columns (partition 0, timestamp now, no horizon)."""
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


def number(records: pa.Table, log_end_offsets: Mapping[int, int], has_offsets: bool) -> pa.Table:
    """Kafka offsets kept (rows below the log end dropped) or assigned from it, in input order."""
    partitions = records.column(PARTITION).to_pylist()
    if has_offsets:
        offsets = records.column(OFFSET).to_pylist()
        keep = [o >= log_end_offsets.get(p, 0) for p, o in zip(partitions, offsets, strict=True)]
        records = records.filter(pa.array(keep))
    else:
        following = dict(log_end_offsets)
        assigned = []
        for p in partitions:
            assigned.append(following.get(p, 0))
            following[p] = assigned[-1] + 1
        index = records.schema.get_field_index(OFFSET)
        records = records.set_column(index, OFFSET, pa.array(assigned, pa.int64()))
    return records.sort_by([(PARTITION, "ascending"), (OFFSET, "ascending")])


def _raise_for_problems(
    records: pa.Table,
    key_columns: tuple[str, ...],
    has_offsets: bool,
    message_max_bytes: int,
    batch_id: int,
) -> None:
    rows = records.num_rows
    problems = []
    null_key = pa.array([False] * rows)
    for k in key_columns:
        null_key = pc.or_(null_key, pc.is_null(records.column(k)))
    if (count := pc.sum(null_key).as_py() or 0) > 0:
        problems.append(f"{count} of {rows} rows have a null key ({', '.join(key_columns)})")
    partition = records.column(PARTITION)
    if (count := partition.null_count) > 0:
        problems.append(f"{count} of {rows} rows have a null 'partition'")
    if (count := pc.sum(pc.less(partition, 0)).as_py() or 0) > 0:
        problems.append(f"{count} of {rows} rows have a negative 'partition'")
    value = records.column(VALUE)
    if pa.types.is_binary(value.type) or pa.types.is_string(value.type):
        lengths = pc.fill_null(pc.binary_length(value), 0)
        if (count := pc.sum(pc.greater(lengths, message_max_bytes)).as_py() or 0) > 0:
            problems.append(
                f"{count} of {rows} rows have a value larger than message.max.bytes "
                f"({message_max_bytes} bytes)"
            )
    if has_offsets:
        offsets = records.column(OFFSET)
        if offsets.null_count:
            problems.append(f"{offsets.null_count} rows have a null 'offset'")
        pairs = pa.table({"p": partition, "o": offsets}).group_by(["p", "o"]).aggregate([])
        if pairs.num_rows != rows - offsets.null_count:
            problems.append(f"{rows - pairs.num_rows} rows repeat another row's 'offset'")
    if problems:
        raise BadInputError(f"batch {batch_id}: " + "; ".join(problems) + "; nothing was written")


def _write_segments(sink: CompactedStateSink, snapshot, numbered: pa.Table) -> list[WrittenSegment]:
    task = SegmentWriterTask(
        table_uri=sink.path,
        schema=snapshot.arrow_schema,
        stats_columns=tuple(stats_columns(snapshot, sink.key_columns, sink.sequence_column)),
        max_file_bytes=sink.config.segment_bytes,
        group_column=None,
        storage_options=sink.storage_options,
    )
    described = [row for batch in task(iter(numbered.to_batches())) for row in batch.to_pylist()]
    return [WrittenSegment(**row) for row in described]


def _read_staged(path: str, staged: list[StagedFile]) -> pa.Table:
    fs, root = arrow_filesystem(path)
    tables = [pq.read_table(f"{root}/{m.path}", filesystem=fs) for m in staged if m.rows]
    return pa.concat_tables(tables) if tables else pa.table({})


def _delete_staged(path: str, staged: list[StagedFile]) -> None:
    delete_files(path, [m.path for m in staged])


def _committed(snapshot, app_id: str, batch_id: int) -> bool:
    recorded = snapshot.txn_version(app_id) if snapshot is not None else None
    return recorded is not None and recorded >= batch_id


def _app_id(sink: CompactedStateSink, options: SinkOptions) -> str:
    """The sink id, scoped to the query's checkpoint: a fresh checkpoint restarts batch ids at 0."""
    if options.checkpoint_location is None:
        return sink.sink_id
    digest = hashlib.sha256(options.checkpoint_location.encode()).hexdigest()[:12]
    return f"{sink.sink_id}/checkpoint={digest}"


def staged_files(path: str) -> list[str]:
    """Files in a log's ``_staging/`` directory (recovery skips ``_`` directories)."""
    fs, root = arrow_filesystem(normalize_uri(path))
    selector = pa.fs.FileSelector(join(root, STAGING), allow_not_found=True)
    return [info.path for info in fs.get_file_info(selector)]


def remove_stale_staged(path: str, *, older_than_ms: int) -> int:
    """Delete staged files a killed query left behind; a query calls this when it starts."""
    fs, root = arrow_filesystem(normalize_uri(path))
    selector = pa.fs.FileSelector(join(root, STAGING), allow_not_found=True)
    cutoff = time.time() - older_than_ms / 1000
    removed = 0
    for info in fs.get_file_info(selector):
        if info.mtime is not None and info.mtime.timestamp() < cutoff:
            fs.delete_file(info.path)
            removed += 1
    return removed
