"""Starting the streaming query a job file describes: source → (Avro decoding) → sink(s).

One query per job. Its foreachBatch hook is the sink (wrapped to print one
progress line per micro-batch), or a `TopicRouter` over one sink per topic, with
`DecodingHook` in front when the job has an ``[avro]`` section. Exactly-once
comes from the sinks (their Delta ``txn`` per batch id) and the query's own
checkpoint location, which the job names or which defaults to ``_chk/<log name>``
beside the (first) log.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyarrow.fs import FileSelector
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from sinks import CompactedStateSink
from sinks.errors import BatchRefusedError, JobConfigError
from sinks.log import arrow_filesystem, join, normalize_uri, sibling
from streaming.inputs import TopicRouter, file_columns, kafka_shaped_files, kafka_stream
from streaming.inputs.kafka import TOPIC
from streaming.jobs.job import FILE_FORMATS, FileFormat, JobConfig
from streaming.status.progress import ProgressHook, stderr_line

Hook = Callable[[DataFrame, int], None]


def build_source(spark: SparkSession, job: JobConfig) -> DataFrame:
    """The job's input stream, in the Kafka source's shape."""
    source = job.source
    if source["format"] == "files":
        file_format = source.get("file_format") or infer_file_format(source["path"], job)
        return kafka_shaped_files(
            spark,
            source["path"],
            file_format=file_format,
            max_files_per_trigger=source.get("max_files_per_trigger"),
            columns=source_columns(source["path"], file_format, job),
        )
    if source["format"] == "kafka":
        return kafka_stream(spark, {str(k): str(v) for k, v in source["options"].items()})
    from streaming.jobs.demo import DemoSettings, keyed_updates

    settings = DemoSettings(
        keys=int(source.get("keys", 2_000)),
        partitions=int(source.get("partitions", 4)),
        rows_per_batch=int(source.get("rows_per_batch", 1_000)),
    )
    return keyed_updates(spark, settings)


PARQUET_MAGIC = b"PAR1"
_SIDE_FILES = ("_", ".")  # _SUCCESS, _spark_metadata, .crc files: not input


def infer_file_format(path: str, job: JobConfig | None = None) -> FileFormat:
    """``parquet`` or ``json`` (JSON lines), from the files already at ``path``.

    A file is Parquet when it starts with Parquet's magic bytes ``PAR1``, JSON lines
    when its first non-blank byte opens an object. An empty or missing directory
    reads as Parquet (the default). Raises `JobConfigError` when the files are of
    both kinds or neither, naming one of each and the key that settles it
    (``source.file_format``).
    """
    fs, files = _data_files(path)
    kinds: dict[str, str] = {}
    for file in files:
        with fs.open_input_stream(file) as f:
            head = f.read(64)
        kind = "parquet" if head.startswith(PARQUET_MAGIC) else None
        if kind is None and head.lstrip()[:1] == b"{":
            kind = "json"
        kinds.setdefault(kind or "neither Parquet nor JSON lines", file)
        if len(kinds) > 1:
            break
    where = f"{job.file}: source.file_format" if job is not None else "source.file_format"
    if len(kinds) > 1 or any(kind not in FILE_FORMATS for kind in kinds):
        found = "; ".join(f"{file} is {kind}" for kind, file in kinds.items())
        raise JobConfigError(
            f"{where}: the files at {path} are not all Parquet or all JSON lines ({found}); "
            "keep one format in the source directory, or set file_format"
        )
    return next(iter(kinds), "parquet")  # type: ignore[return-value]


def source_columns(path: str, file_format: FileFormat, job: JobConfig) -> frozenset[str] | None:
    """The Kafka columns the files at ``path`` hold (None: no file yet, all of them).

    Files without ``offset`` get offsets as the Python API gives them (assigned per
    partition from the log end offset, in input order) and the run says so in one line;
    a routed job (``[topics.*]``) whose files lack ``topic`` raises `JobConfigError`
    naming the column, before the query starts. Reads one file's footer or first line.
    """
    fs, files = _data_files(path)
    columns = file_columns(file_format, fs, files)
    if columns is None:
        return None
    if job.routed and TOPIC not in columns:
        raise JobConfigError(
            f"{job.file}: [topics.*] routes records by their {TOPIC!r} column, and the files "
            f"at {path} have none ({files[0]} holds {', '.join(sorted(columns))}); add the "
            "column, or write the job with one [sink]"
        )
    if "offset" not in columns:
        stderr_line(
            f"source: the files at {path} have no 'offset' column: offsets are assigned "
            "per partition from the log end offset, in input order"
        )
    return columns


def _data_files(path: str) -> tuple[Any, list[str]]:
    """The file system of ``path`` and its data files (not ``_SUCCESS``, ``.crc``, empty
    files), sorted; none for a missing directory."""
    fs, root = arrow_filesystem(normalize_uri(path))
    try:
        infos = fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
    except OSError:
        return fs, []
    files = []
    for info in sorted(infos, key=lambda i: i.path):
        name = info.path.rsplit("/", 1)[-1]
        if info.type.name == "File" and not name.startswith(_SIDE_FILES) and info.size:
            files.append(info.path)
    return fs, files


def build_hook(
    job: JobConfig, *, out: Callable[[str], None] = stderr_line
) -> tuple[Hook, list[CompactedStateSink]]:
    """The query's foreachBatch hook and the sinks behind it.

    Each sink is told the query's checkpoint location: under Spark Connect it reads
    the query's id there (exactly once across restarts, a fresh checkpoint is a new
    query). The hook holds no session, lock or thread, so Connect can pickle it to
    its foreachBatch worker.
    """
    location = checkpoint_location(job)
    sinks = [log.sink(checkpoint_location=location) for log in job.logs]
    if job.routed:
        routes: dict[str, Hook] = {
            log.topic or "": ProgressHook(sink, out=out, label=f"[{log.topic}] ")
            for log, sink in zip(job.logs, sinks, strict=True)
        }
        hook: Hook = TopicRouter(routes)
    else:
        hook = ProgressHook(sinks[0], out=out)
    if job.avro is not None:
        from streaming.decoding import ConfluentAvroDecoder, DecodingHook, SchemaStore

        avro = job.avro
        if "schemas" in avro:
            store = SchemaStore.from_path(avro["schemas"], registry_url=avro.get("registry_url"))
        else:
            store = SchemaStore(registry_url=avro.get("registry_url"))
        reader = None
        if "reader_schema" in avro:
            reader = json.loads(Path(avro["reader_schema"]).read_text())
        decoder = ConfluentAvroDecoder(
            store,
            reader_schema=reader,
            subject=avro.get("subject"),
            keep_raw=bool(avro.get("keep_raw", False)),
        )
        quarantine = all(log.dead_letter_table for log in job.logs)
        hook = DecodingHook(hook, decoder, quarantine=quarantine)
    return hook, sinks


def checkpoint_location(job: JobConfig) -> str:
    """Where the query keeps its offsets: the job's setting, or ``_chk/<log name>`` beside it."""
    for log in job.logs:
        if log.checkpoint_location:
            return log.checkpoint_location
    first = job.logs[0].path
    return join(sibling(first, "_chk"), first.rstrip("/").rsplit("/", 1)[-1])


class InFlightHook:
    """The query's hook, knowing whether a micro-batch is inside it, and able to refuse more.

    ``compacted-sink run`` stops a query on Ctrl-C between two batches: ``stop()``
    cancels the Spark jobs of a batch inside the hook, which then fails with a long
    error that Spark's streaming engine cannot even parse (a StackOverflowError on
    stderr). After `refuse_new` a batch that reaches the hook fails at once, before
    it writes anything, with one short line; it runs again on the next start (the
    query did not commit it), exactly once as every batch. Pickled without its state
    (under Spark Connect the hook runs in the server's foreachBatch worker, and the
    client stops at once, as before).
    """

    def __init__(self, hook: Hook) -> None:
        self.hook = hook
        self._inside = 0
        self._lock = threading.Lock()
        self._refusing = threading.Event()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        with self._lock:
            if self._refusing.is_set():
                raise BatchRefusedError(f"batch {batch_id} not started: the query is stopping")
            self._inside += 1
        try:
            self.hook(batch_df, batch_id)
        finally:
            with self._lock:
                self._inside -= 1

    def refuse_new(self) -> None:
        """From now on a micro-batch that reaches the hook fails before it writes anything."""
        self._refusing.set()

    @property
    def busy(self) -> bool:
        """True while a micro-batch runs inside the hook (in this process)."""
        with self._lock:
            return self._inside > 0

    def __getstate__(self) -> dict:
        return {"hook": self.hook}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["hook"])


def start(
    spark: SparkSession,
    job: JobConfig,
    *,
    out: Callable[[str], None] = stderr_line,
    wrap: Callable[[Hook], Hook] | None = None,
) -> tuple[StreamingQuery, list[CompactedStateSink]]:
    """Start the job's query (not waiting for it); returns it with the sinks it writes.

    Before the query starts (and writes its checkpoint), each log's key columns, ``value``
    and sequence column are checked against the input's columns (`check_input_columns`).
    ``wrap`` wraps the query's hook (``run`` uses `InFlightHook` to stop between batches).
    """
    hook, sinks = build_hook(job, out=out)
    if wrap is not None:
        hook = wrap(hook)
    source = build_source(spark, job)
    if job.avro is None:  # Avro decoding makes the columns the sinks see: known per batch
        check_input_columns(job, sinks, source.columns)
    writer = (
        source.writeStream.foreachBatch(hook)
        .queryName(job.file.stem)
        .option("checkpointLocation", checkpoint_location(job))
    )
    trigger = job.trigger
    if trigger.get("available_now") or trigger.get("once"):
        writer = writer.trigger(availableNow=True)
    elif "processing_time" in trigger:
        writer = writer.trigger(processingTime=str(trigger["processing_time"]))
    return writer.start(), sinks


def check_input_columns(
    job: JobConfig, sinks: list[CompactedStateSink], columns: list[str]
) -> None:
    """Raise `JobConfigError` when the input's ``columns`` lack a column a log of ``job``
    needs: its key columns (the job's, or the log's recorded ones), ``value``, its sequence
    column; with a ``value_format``, Kafka's ``key``, ``value`` and ``offset``. The message
    names the job file, the key to change, the missing column and the input's columns. A
    routed job's ``topic`` column is not the logs' (the router drops it). Pure; run before
    the query starts, so a wrong name leaves no query checkpoint behind."""
    for log, sink in zip(job.logs, sinks, strict=True):
        available = [c for c in columns if not (job.routed and c == TOPIC)]
        section = f"topics.{log.topic}" if log.topic is not None else "sink"
        needed = [(k, "key_columns") for k in sink.key_columns] + [("value", "key_columns")]
        if sink.sequence_column:
            needed.append((sink.sequence_column, "sequence_column"))
        if sink.value_format is not None:  # the key columns and the sequence come from them
            needed = [(c, "value_format") for c in ("key", "value", "offset")]
        for name, key in needed:
            if name in available:
                continue
            if key == "value_format":
                what = f"value_format = {sink.value_format!r} reads Kafka's key, value and offset"
            elif name == "value":
                what = "a compacted log's records need a 'value' column (null: a tombstone)"
            elif key == "key_columns":
                what = f"key_columns = {list(sink.key_columns)}"
            else:
                what = f"sequence_column = {name!r}"
            raise JobConfigError(
                f"{job.file}: {section}.{key}: the input has no column {name!r} ({what}); "
                f"its columns are {', '.join(available)}; the query was not started and "
                "nothing was written"
            )
