"""``df.writeStream.format("compacted-state")``: the sink as a Python data source.

For Spark Declarative Pipelines' ``create_sink`` and for writers that prefer a
format name to ``foreachBatch``. Executors stage each task's rows as one Parquet
file under the log's ``_staging/`` directory and send its path to the driver;
the driver's ``commit(messages, batch_id)`` appends them with the log's one
produce path (`sinks.produce.log_append.LogAppender.append`, the hook's: skip a batch
already committed, recover the log on first use, refuse a schema change, validate,
number, write, commit; Delta ``txn`` per batch id, scoped to the query id its
checkpoint records: exactly once, on a classic session and under Spark Connect
alike), then deletes the staged files; ``abort`` deletes them too.

Spark runs a Python data source's ``commit`` in a Python worker process that has
no SparkSession, so the append task runs over Arrow, on the driver
(`sinks.produce.append_batch.ArrowRecords`). Two consequences, by design:

- it suits micro-batches that fit in the driver's memory; the ``foreachBatch``
  hook stays the path for large batches;
- it appends and does not clean: run ``compacted-sink clean`` (or ``sink.clean()``)
  beside the query, as a cleaner job beside a writer (design.md §11).

Options: ``path`` (the log), ``key_columns`` (comma-separated, default ``key``),
``sequence_column``, ``checkpoint_table``, ``sink_id``, ``schema_evolution``
(``additive``, the default, or ``none``), and any Kafka dotted
cleaner property (``min.cleanable.dirty.ratio``, ``segment.bytes``, …).
"""

from __future__ import annotations

import functools
import hashlib
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from sinks import CleanerConfig, CompactedStateSink
from sinks.errors import ConfigError, SchemaMismatchError
from sinks.log import (
    LogKeys,
    LogLocation,
    arrow_filesystem,
    check_log_location,
    delete_files,
    is_own_data_path,
    join,
    normalize_uri,
)
from sinks.produce import (
    DEFAULT_SCHEMA_EVOLUTION,
    ArrowRecords,
    SchemaEvolution,
    check_mode,
    log_schema,
)
from sinks.python_tasks import freeze_imports
from sinks.python_workers import check_python_workers
from sinks.spark_compat import (
    DATA_SOURCE,
    STREAM_READER,
    STREAM_WRITER,
    DataSource,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    WriterCommitMessage,
    require,
)
from sinks.spark_session import checkpoint_query_id
from streaming.consumers import change_feed_source, consumer_source
from streaming.consumers.source_options import SourceOptions

FORMAT = "compacted-state"
PACKAGES = ("sinks", "streaming")  # what the format's readers and writer import in a worker
STAGING = "_staging"
_SINK_OPTIONS = {
    "path",
    "key_columns",
    "sequence_column",
    "checkpoint_table",
    "sink_id",
    "schema_evolution",
    "dead_letter_table",
}
STALE_STAGED_MS = 3_600_000  # staged files this old belong to no live commit (a killed query)


def register(spark: SparkSession) -> None:
    """Make ``format("compacted-state")`` available in this session.

    Spark runs the format's readers and writer in its Python workers, with the
    interpreter the session names when the format is registered: the sink's check
    (`sinks.python_workers.check_python_workers`) runs first, so a local session
    whose ``PYSPARK_PYTHON`` cannot import this project is pointed at this process's
    Python, and a cluster's fails in one line, exactly as the sink's first batch does.

    Raises `SparkVersionError` on a pyspark without Python data sources (before 4.0).
    """
    require(
        DATA_SOURCE,
        "Write with writeStream.foreachBatch(CompactedStateSink(...)); read with sink.log(), "
        "sink.state() or read_state().",
    )
    check_python_workers(spark, PACKAGES)
    spark.dataSource.register(CompactedStateDataSource)


class CompactedStateDataSource(DataSource):
    """The ``compacted-state`` format: a streaming sink over one compacted log, and its
    consumers' reader (``readStream`` / ``read``, see `streaming.consumers.consumer_source`);
    with ``readChangeFeed`` its change feed (`streaming.consumers.change_feed_source`)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> T.StructType:
        options = SourceOptions.parse(self.options)
        if options.read_change_feed:
            return change_feed_source.change_feed_schema(options.path)
        return consumer_source.source_schema(options.path)

    def streamReader(self, schema: T.StructType) -> DataSourceStreamReader:
        require(
            STREAM_READER,
            "Read the log with spark.read.format('compacted-state') (a batch read), "
            "sink.log() or read_state().",
        )
        options = SourceOptions.parse(self.options)
        if options.read_change_feed:
            return change_feed_source.ChangeFeedStreamReader(options, schema)
        return consumer_source.ConsumerStreamReader(options, schema)

    def reader(self, schema: T.StructType) -> DataSourceReader:
        options = SourceOptions.parse(self.options)
        if options.read_change_feed:
            return change_feed_source.ChangeFeedBatchReader(options, schema)
        return consumer_source.ConsumerBatchReader(options, schema)

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> CompactedStateStreamWriter:
        require(STREAM_WRITER, "Write with writeStream.foreachBatch(CompactedStateSink(...)).")
        options = SinkOptions.parse(self.options)
        check_log_location(
            LogLocation(options.path)
        )  # refuse someone else's table or files at the start
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
    schema_evolution: SchemaEvolution = DEFAULT_SCHEMA_EVOLUTION
    dead_letter_table: str | None = None

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
            schema_evolution=check_mode(
                options.get("schema_evolution", DEFAULT_SCHEMA_EVOLUTION).strip()
            ),
            dead_letter_table=options.get("dead_letter_table"),
        )

    def sink(self) -> CompactedStateSink:
        """The sink over the log (one per process and options: it recovers the log once)."""
        return _sink(self)

    def new_sink(self) -> CompactedStateSink:
        return CompactedStateSink(
            self.path,
            key_columns=self.key_columns,
            config=CleanerConfig.from_properties(dict(self.properties)),
            sequence_column=self.sequence_column,
            checkpoint_table=self.checkpoint_table,
            sink_id=self.sink_id,
            schema_evolution=self.schema_evolution,
            dead_letter_table=self.dead_letter_table,
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
        try:
            log_schema(schema, LogKeys(key_columns=options.key_columns))  # fail at the start
        except SchemaMismatchError:
            missing = [c for c in [*options.key_columns, "value"] if c not in schema.names]
            raise ConfigError(
                f"format {FORMAT!r}: the stream has no column {missing[0]!r}"
            ) from None

    # -- executors -----------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        freeze_imports()
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

    def commit(self, messages: list[StagedFile | None], batchId: int) -> None:
        staged = [m for m in messages if m is not None]
        try:
            append_staged(self.options, self.input_schema, staged, batchId)
        finally:
            _delete_staged(self.options.path, staged)

    def abort(self, messages: list[StagedFile | None], batchId: int) -> None:
        _delete_staged(self.options.path, [m for m in messages if m is not None])


def append_staged(
    options: SinkOptions, input_schema: T.StructType, staged: list[StagedFile], batch_id: int
) -> None:
    """Append the staged rows as one batch, exactly once per (app id, batch id), with the
    log's one produce path (`LogAppender.append`, on Arrow here)."""
    sink = options.sink()
    app_id, *older_ids = _app_ids(sink, options, batch_id)
    records = ArrowRecords(_read_staged(options.path, staged), input_schema)
    sink.appender.append(records, app_id=app_id, batch_id=batch_id, older_app_ids=older_ids)


@functools.lru_cache(maxsize=16)
def _sink(options: SinkOptions) -> CompactedStateSink:
    return options.new_sink()


def _read_staged(path: str, staged: list[StagedFile]) -> pa.Table:
    fs, root = arrow_filesystem(path)
    tables = [pq.read_table(f"{root}/{m.path}", filesystem=fs) for m in staged if m.rows]
    return pa.concat_tables(tables) if tables else pa.table({})


def _delete_staged(path: str, staged: list[StagedFile]) -> None:
    delete_files(path, [m.path for m in staged])


def _app_ids(sink: CompactedStateSink, options: SinkOptions, batch_id: int) -> tuple[str, ...]:
    """The app id of this query's appends, then the older ids its batches may carry.

    With a checkpoint location the id is ``<sink id>/query=<query id>``, the query id
    read from the checkpoint (`checkpoint_query_id`, which also checks the checkpoint
    planned the batch), as the ``foreachBatch`` hook scopes it: a restarted query
    keeps its id, a fresh checkpoint (batch ids from 0 again) is a new query, also
    at the same location; a classic session and Spark Connect alike (a data source's
    ``commit`` runs in a Python worker without a session or local properties). Logs
    written before this keyed the batch by a digest of the location: that id is
    checked too, so an upgrade writes no batch twice.
    """
    producer = sink.transactional_id
    if options.checkpoint_location is None:
        return (producer.app_id(None),)
    query_id = checkpoint_query_id(options.checkpoint_location, batch_id)
    digest = hashlib.sha256(options.checkpoint_location.encode()).hexdigest()[:12]
    return (producer.app_id(query_id), f"{producer.sink_id}/checkpoint={digest}")


def staged_files(path: str) -> list[str]:
    """Files in a log's ``_staging/`` directory (recovery skips ``_`` directories)."""
    fs, root = arrow_filesystem(normalize_uri(path))
    selector = pa.fs.FileSelector(join(root, STAGING), allow_not_found=True)
    return [info.path for info in fs.get_file_info(selector)]


def remove_stale_staged(path: str, *, older_than_ms: int) -> int:
    """Delete staged files a killed query left behind; a query calls this when it starts.

    Only files named as this sink stages them (`sinks.log.ownership.is_own_data_path`):
    anything else in ``_staging/`` is someone else's and stays."""
    fs, root = arrow_filesystem(normalize_uri(path))
    selector = pa.fs.FileSelector(join(root, STAGING), allow_not_found=True)
    cutoff = time.time() - older_than_ms / 1000
    removed = 0
    for info in fs.get_file_info(selector):
        if not is_own_data_path(f"{STAGING}/{info.base_name}"):
            continue
        if info.mtime is not None and info.mtime.timestamp() < cutoff:
            fs.delete_file(info.path)
            removed += 1
    return removed
