"""Kafka-shaped input: the columns of Spark's Kafka source, and a router from topics to logs.

Spark's Kafka source yields ``key, value, topic, partition, offset, timestamp,
timestampType`` (and ``headers`` with ``includeHeaders``). The sink takes those
columns as they come; a subscription to several topics is split by `TopicRouter`
so that each topic lands in its own compacted log, as each Kafka topic is its own log.

The Kafka connector's jar is not on every classpath (it is not on this project's
build machines), so `kafka_shaped_files` reads the same schema from Parquet or
JSON files: tests and local runs feed the exact shape without a broker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sinks.errors import BadInputError

TOPIC = "topic"

KAFKA_SCHEMA = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestampType", T.IntegerType()),
    ]
)
"""The schema of Spark's Kafka source without headers (``includeHeaders`` false)."""

KAFKA_ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)
"""`KAFKA_SCHEMA` in Arrow: the schema of the Parquet files `kafka_shaped_files` reads."""


def write_kafka_files(
    directory: str | Path, batches: Iterable[Sequence[Mapping[str, Any]]]
) -> list[Path]:
    """Write each batch of Kafka-shaped rows as one Parquet file, in the order given.

    Spark's file source reads new files in modification-time order, so each file gets a
    modification time one second after the previous one: the files are read as written,
    however fast they were written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, rows in enumerate(batches):
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(list(rows), schema=KAFKA_ARROW_SCHEMA), path)
        mtime = 1_700_000_000 + i
        os.utime(path, (mtime, mtime))
        paths.append(path)
    return paths


HEADERS_FIELD = T.StructField(
    "headers",
    T.ArrayType(
        T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])
    ),
)

# JSON cannot carry bytes: key and value arrive as text and are cast to binary. The
# timestamp arrives as text too, read by `json_timestamp`.
_JSON_TEXT = ("key", "value", "timestamp")
_JSON_SCHEMA = T.StructType(
    [
        T.StructField(f.name, T.StringType()) if f.name in _JSON_TEXT else f
        for f in KAFKA_SCHEMA.fields
    ]
)

MILLISECONDS_FROM = 100_000_000_000
"""A JSON timestamp number at or above this is epoch milliseconds (Kafka's unit, what its
tools print: 1e11 ms is March 1973), below it epoch seconds (1e11 s is the year 5138)."""

KAFKA_COLUMNS = tuple(f.name for f in KAFKA_SCHEMA.fields)


def kafka_stream(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """Spark's Kafka source (needs the spark-sql-kafka jar on the classpath).

    ``options`` are passed as they are (``kafka.bootstrap.servers``, ``subscribe``, …).
    """
    return spark.readStream.format("kafka").options(**dict(options)).load()


def kafka_shaped_files(
    spark: SparkSession,
    path: str,
    *,
    file_format: Literal["parquet", "json"] = "parquet",
    max_files_per_trigger: int | None = None,
    columns: Collection[str] | None = None,
) -> DataFrame:
    """A file stream with the Kafka source's columns, for runs without a broker.

    Parquet files carry `KAFKA_SCHEMA`'s columns; JSON lines carry ``key`` and ``value``
    as text (cast to binary, their UTF-8 bytes: the stream has the Kafka source's types
    whichever the format, so a log fed by files takes a broker's records later) and
    ``timestamp`` as an ISO string or a number, epoch milliseconds as Kafka's tools print
    them (seconds below `MILLISECONDS_FROM`).
    ``columns``: the Kafka columns the files hold (`file_columns`; None: all). A column
    they lack is left out of the stream, so the sink fills it as for any batch without
    it: offsets assigned per partition from the log end offset in input order,
    partition 0, the time of the append.
    """
    kept = [c for c in KAFKA_COLUMNS if columns is None or c in columns or c in ("key", "value")]
    reader = spark.readStream
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    if file_format == "parquet":
        return reader.schema(KAFKA_SCHEMA).parquet(path).select(*kept)
    if file_format == "json":
        raw = reader.schema(_JSON_SCHEMA).json(path)
        return raw.select(
            *[
                F.col(name).cast("binary").alias(name)
                if name in ("key", "value")
                else json_timestamp(F.col(name)).alias(name)
                if name == "timestamp"
                else name
                for name in kept
            ]
        )
    raise ValueError(f"file_format must be 'parquet' or 'json', got {file_format!r}")


_NUMBER = r"^\s*-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?\s*$"


def json_timestamp(text: Column) -> Column:
    """A JSON line's ``timestamp`` text as a timestamp: a number is epoch milliseconds
    (seconds below `MILLISECONDS_FROM`), anything else is read as Spark reads a timestamp
    string (ISO 8601); text that is neither gives null."""
    number = F.when(text.rlike(_NUMBER), text.cast("double"))
    micros = F.when(F.abs(number) >= MILLISECONDS_FROM, number * 1_000).otherwise(
        number * 1_000_000
    )
    return F.when(number.isNotNull(), F.timestamp_micros(micros.cast("long"))).otherwise(
        F.try_to_timestamp(text)
    )


def file_columns(
    file_format: Literal["parquet", "json"], filesystem: Any, files: Sequence[str]
) -> frozenset[str] | None:
    """The Kafka columns (`KAFKA_COLUMNS`) the first of ``files`` (paths on ``filesystem``,
    a pyarrow file system) holds: a Parquet file's schema, or a JSON line's keys (its first
    line). None when there is no file to look at or it cannot be read as ``file_format``
    (the stream's reader then fails naming it). Reads one footer or one line."""
    for file in files:
        if file_format == "parquet":
            try:
                with filesystem.open_input_file(file) as f:
                    names = pq.read_schema(f).names
            except (pa.ArrowInvalid, OSError):
                return None  # not Parquet: the stream's own reader says what is wrong with it
        else:
            with filesystem.open_input_stream(file) as f:
                head = f.read(1 << 20).decode("utf-8", errors="replace")
            first = next((line for line in head.splitlines() if line.strip()), None)
            if first is None:
                continue
            try:
                names = list(json.loads(first))
            except (ValueError, TypeError):
                return None  # the stream's own reader says what is wrong with it
        return frozenset(n for n in names if n in KAFKA_COLUMNS)
    return None


BatchHook = Callable[[DataFrame, int], None]


class TopicRouter:
    """A foreachBatch hook that sends each topic's records to that topic's own hook (a sink).

    Each routed hook gets the same ``batch_id``; because every sink records its
    batch ids in its own log, a batch replayed after a crash that had committed
    some topics and not others writes each topic exactly once. The ``topic``
    column is dropped (it is constant within a log). Records of a topic with no
    hook fail the batch (`BadInputError`, nothing written) unless
    ``unrouted="ignore"``.
    """

    def __init__(
        self,
        routes: Mapping[str, BatchHook],
        *,
        unrouted: Literal["fail", "ignore"] = "fail",
    ) -> None:
        if not routes:
            raise ValueError("a TopicRouter needs at least one topic")
        self.routes = dict(routes)
        self.unrouted = unrouted

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        batch = batch_df.persist()
        try:
            counts = {r[TOPIC]: r["count"] for r in batch.groupBy(TOPIC).count().collect()}
            unknown = {t: n for t, n in counts.items() if t not in self.routes}
            if unknown and self.unrouted == "fail":
                described = ", ".join(f"{n} of topic {t!r}" for t, n in sorted(unknown.items()))
                raise BadInputError(
                    f"batch {batch_id}: {described} have no log to go to "
                    f"(routed topics: {', '.join(sorted(self.routes))}); nothing was written"
                )
            for topic, hook in sorted(self.routes.items()):
                if topic in counts:
                    hook(batch.filter(F.col(TOPIC) == topic).drop(TOPIC), batch_id)
        finally:
            batch.unpersist()
