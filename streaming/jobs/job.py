"""A streaming job described by a TOML file: its source, its log(s), and the cleaner settings.

Sink settings use Kafka's dotted property names, as a topic's config would::

    [source]
    format = "files"              # "files", "rate" or "kafka"
    path = "input/"               # files: Parquet (or JSON lines) with the Kafka source's columns
    file_format = "parquet"       # or "json"; unset: read from the files already there

    [sink]
    path = "lake/users"
    key_columns = ["key"]
    checkpoint_location = "lake/_chk/users"
    schema_evolution = "additive"  # or "none": refuse every schema change
    value_format = "debezium-json"  # optional: the topic holds Debezium's change events

    [cleaner]
    "min.cleanable.dirty.ratio" = 0.5
    "delete.retention.ms" = 86400000

    [trigger]
    available_now = true          # or processing_time = "10 seconds"

Several topics go to several logs with ``[topics.<name>]`` tables instead of
``[sink]`` (each takes the keys of ``[sink]`` and an optional ``[topics.<name>.cleaner]``).
Every error raised while reading the file is a `JobConfigError` naming the file and the key.

The ``files`` source reads Parquet files with the Kafka source's schema (`KAFKA_SCHEMA`:
``key`` and ``value`` binary, ``topic``, ``partition``, ``offset``, ``timestamp``,
``timestampType``) or JSON lines with ``key`` and ``value`` as text, stored as binary (their
UTF-8 bytes) as the Kafka source gives them, so the log's types do not depend on the
source. ``file_format``
says which; without it the format is taken from the files in ``path`` when the job
starts (Parquet's magic bytes, or a JSON object), Parquet when there are none yet.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sinks import CleanerConfig, CompactedStateSink
from sinks.errors import ConfigError, JobConfigError
from sinks.produce import (
    DEFAULT_SCHEMA_EVOLUTION,
    SchemaEvolution,
    check_mode,
    check_value_format,
)

SOURCE_FORMATS = ("files", "rate", "kafka")
FILE_FORMATS = ("parquet", "json")
FileFormat = Literal["parquet", "json"]
_SOURCE_KEYS = {
    "format",
    "path",
    "file_format",
    "max_files_per_trigger",
    "rows_per_batch",
    "keys",
    "partitions",
    "topic",
    "options",
}
_SINK_KEYS = {
    "path",
    "key_columns",
    "checkpoint_location",
    "checkpoint_table",
    "dead_letter_table",
    "sequence_column",
    "sink_id",
    "schema_evolution",
    "cleaner",
    "value_format",
}
_TRIGGER_KEYS = {"available_now", "processing_time", "once"}
_TOP_KEYS = {"source", "sink", "topics", "cleaner", "trigger", "avro", "spark"}


@dataclass(frozen=True, kw_only=True)
class LogSpec:
    """One compacted log a job writes: where, keyed by what, cleaned how."""

    path: str
    key_columns: tuple[str, ...]
    config: CleanerConfig
    checkpoint_location: str | None = None
    checkpoint_table: str | None = None
    dead_letter_table: str | None = None
    sequence_column: str | None = None
    sink_id: str | None = None
    topic: str | None = None
    schema_evolution: SchemaEvolution = DEFAULT_SCHEMA_EVOLUTION
    value_format: str | None = None

    def sink(self, checkpoint_location: str | None = None) -> CompactedStateSink:
        """The sink over this log (reads only the log's key properties until used);
        ``checkpoint_location`` is the query's, which the sink needs under Spark Connect
        to know its query."""
        return CompactedStateSink(
            self.path,
            key_columns=self.key_columns,
            config=self.config,
            sequence_column=self.sequence_column,
            checkpoint_table=self.checkpoint_table,
            dead_letter_table=self.dead_letter_table,
            sink_id=self.sink_id,
            checkpoint_location=checkpoint_location,
            schema_evolution=self.schema_evolution,
            value_format=self.value_format,
        )


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """A parsed job file. Relative paths are resolved against the file's directory."""

    file: Path
    source: Mapping[str, Any]
    logs: tuple[LogSpec, ...]
    trigger: Mapping[str, Any] = field(default_factory=dict)
    avro: Mapping[str, Any] | None = None
    spark: Mapping[str, str] = field(default_factory=dict)

    @property
    def routed(self) -> bool:
        """True when the job sends each topic to its own log."""
        return any(log.topic is not None for log in self.logs)


def load_job(file: str | Path) -> JobConfig:
    """Read and check a job file. Raises `JobConfigError` naming the file and the key."""
    path = Path(file).resolve()
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise JobConfigError(f"{file}: no such job file") from None
    except tomllib.TOMLDecodeError as e:
        raise JobConfigError(f"{file}: not valid TOML: {e}") from None
    return parse_job(document, path)


def parse_job(document: Mapping[str, Any], file: Path) -> JobConfig:
    """Check a TOML document already read from ``file``."""
    where = _Where(file)
    where.unknown(document, _TOP_KEYS, "")
    source = dict(_table(document, "source", where, required=True))
    where.unknown(source, _SOURCE_KEYS, "source")
    fmt = source.get("format")
    if fmt not in SOURCE_FORMATS:
        where.fail("source.format", f"must be one of {', '.join(SOURCE_FORMATS)}, got {fmt!r}")
    if fmt == "files":
        source["path"] = where.path(source, "source.path", required=True)
        if source.get("file_format", "parquet") not in FILE_FORMATS:
            where.fail(
                "source.file_format", f"must be parquet or json, got {source['file_format']!r}"
            )
    if fmt == "kafka" and not isinstance(source.get("options"), dict):
        where.fail(
            "source.options", "a kafka source needs an options table (kafka.bootstrap.servers, …)"
        )

    shared_cleaner = _table(document, "cleaner", where)
    logs: list[LogSpec] = []
    if "sink" in document and "topics" in document:
        where.fail("topics", "give either [sink] or [topics.<name>] tables, not both")
    if "sink" in document:
        logs.append(_log_spec(_table(document, "sink", where), "sink", shared_cleaner, where))
    elif "topics" in document:
        for topic, table in _table(document, "topics", where).items():
            if not isinstance(table, dict):
                where.fail(f"topics.{topic}", "must be a table")
            logs.append(_log_spec(table, f"topics.{topic}", shared_cleaner, where, topic=topic))
    if not logs:
        where.fail("sink", "a job needs a [sink] table (or [topics.<name>] tables)")

    trigger = _table(document, "trigger", where)
    where.unknown(trigger, _TRIGGER_KEYS, "trigger")
    if len(trigger) > 1:
        where.fail(
            "trigger", f"give one of {', '.join(sorted(_TRIGGER_KEYS))}, got {sorted(trigger)}"
        )
    avro = _table(document, "avro", where) or None
    if avro is not None:
        for key in ("schemas", "reader_schema"):
            if key in avro:
                avro[key] = where.path(avro, f"avro.{key}")
    spark = {str(k): str(v) for k, v in _table(document, "spark", where).items()}
    return JobConfig(
        file=file, source=source, logs=tuple(logs), trigger=trigger, avro=avro, spark=spark
    )


def _log_spec(
    table: Mapping[str, Any],
    section: str,
    shared_cleaner: Mapping[str, Any],
    where: _Where,
    *,
    topic: str | None = None,
) -> LogSpec:
    where.unknown(table, _SINK_KEYS, section)
    keys = table.get("key_columns", ["key"])
    if isinstance(keys, str):
        keys = [keys]
    if not keys or not all(isinstance(k, str) and k for k in keys):
        where.fail(
            f"{section}.key_columns", f"must be a non-empty list of column names, got {keys!r}"
        )
    properties = {**shared_cleaner, **table.get("cleaner", {})}
    try:
        config = CleanerConfig.from_properties(properties)
    except ConfigError as e:
        cleaner_section = f"{section}.cleaner" if "cleaner" in table else "cleaner"
        raise JobConfigError(f"{where.file}: [{cleaner_section}] {e}") from None
    try:
        evolution = check_mode(table.get("schema_evolution", DEFAULT_SCHEMA_EVOLUTION))
    except ConfigError as e:
        where.fail(f"{section}.schema_evolution", str(e))
    try:
        value_format = check_value_format(table.get("value_format"))
    except ConfigError as e:
        where.fail(f"{section}.value_format", str(e))
    return LogSpec(
        path=where.path(table, f"{section}.path", required=True),
        key_columns=tuple(keys),
        config=config,
        checkpoint_location=where.path(table, f"{section}.checkpoint_location"),
        checkpoint_table=where.path(table, f"{section}.checkpoint_table"),
        dead_letter_table=where.path(table, f"{section}.dead_letter_table"),
        sequence_column=table.get("sequence_column"),
        sink_id=table.get("sink_id"),
        topic=topic,
        schema_evolution=evolution,
        value_format=value_format,
    )


def _table(document: Mapping[str, Any], key: str, where: _Where, *, required: bool = False) -> dict:
    value = document.get(key)
    if value is None:
        if required:
            where.fail(key, "is missing")
        return {}
    if not isinstance(value, dict):
        where.fail(key, f"must be a table, got {type(value).__name__}")
    return dict(value)


class _Where:
    """Error messages that name the file and the key."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def fail(self, key: str, message: str) -> None:
        raise JobConfigError(f"{self.file}: {key}: {message}")

    def unknown(self, table: Mapping[str, Any], known: set[str], section: str) -> None:
        for key in table:
            if key not in known:
                name = f"{section}.{key}" if section else key
                self.fail(name, f"unknown key; known: {', '.join(sorted(known))}")

    def path(self, table: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
        """A path value, resolved against the job file's directory unless it is a URI."""
        value = table.get(key.rsplit(".", 1)[-1])
        if value is None:
            if required:
                self.fail(key, "is missing")
            return None
        if not isinstance(value, str) or not value:
            self.fail(key, f"must be a path, got {value!r}")
        if "://" in value:
            return value
        return str((self.file.parent / value).resolve())
