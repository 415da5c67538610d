"""Kafka's offset map: the latest offset of each key of the dirty section, built exactly.

Kafka's ``Cleaner.buildOffsetMap`` reads the dirty section only (from the first
dirty offset to the first uncleanable one) and records, per key, the offset of
its latest record there; the recopy then keeps a record when the map holds no
newer offset for its key. Here the map is exact (keys compared by value, never
through a digest: Kafka's ``SkimpyOffsetMap`` would lose a key to an MD5
collision) and held as an Arrow table of (partition, key columns, offset).

Why the dirty section suffices: the clean section (segments wholly below the
cleaner offset the log records, see `sinks.reading.state_reader`) holds at most
one record per (partition, key), and every dirty offset of a partition lies above
every clean one. So a clean record is obsolete exactly when the map holds its
key, and a dirty record exactly when the map holds a higher offset for its key.
With a ``sequence_column`` a clean record may beat a dirty one; passes with a
sequence column therefore build the map over the whole cleanable range (the
caller decides which segments to pass).

Built on the driver, as Kafka's cleaner thread builds its map: pyarrow reads the
narrow columns (partition, keys, offset) of the dirty files and reduces them with
one hash ``max``. Records below a partition's log start offset are invisible and
play no part.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from sinks.cleaner.cpu_priority import at_lower_priority, lower_thread_priority
from sinks.log.log_table import LogSnapshot
from sinks.log.records import OFFSET, PARTITION, at_or_above
from sinks.log.segment import Segment
from sinks.log.storage import arrow_filesystem, normalize_uri

# The largest offset map (in dirty records, a bound on its keys) a pass builds on the
# driver and ships to every recopy task. A key of ~10 bytes costs ~30 bytes in Arrow
# and ~100 bytes in a task's hash index (Python strings): 2 M records bound a task's
# index near 200 MB. Above it a pass takes the shuffled path (`Cleaner.retained`).
MAX_OFFSET_MAP_RECORDS = 2_000_000


def is_mappable(arrow_type: pa.DataType) -> bool:
    """Whether a key column of this type compares the same in pyarrow/pandas as in Spark.

    Strings and binaries compare by bytes, integers, booleans and dates by value, in
    both. Floats (NaN, -0.0), timestamps and nested types are left to Spark.
    """
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_integer(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_date32(arrow_type)
    )


def map_schema(log_schema: pa.Schema, key_columns: Sequence[str]) -> pa.Schema:
    """The offset map's columns: partition, the key columns, offset (types from the log)."""
    names = [PARTITION, *[k for k in key_columns if k != PARTITION], OFFSET]
    return pa.schema([log_schema.field(n) for n in names])


def dirty_segments(
    segments: Sequence[Segment], *, first_dirty_offset: int, cleaner_offset: int | None
) -> list[Segment]:
    """The segments of one partition that the map must cover. Pure.

    A segment is clean only when it lies wholly below both the first dirty offset
    and the cleaner offset the log itself records (what guarantees one record per
    key); every other segment, including one straddling either, is dirty.
    """
    end = min(first_dirty_offset, cleaner_offset) if cleaner_offset is not None else None
    return [s for s in segments if end is None or s.last_offset >= end]


def read_dirty_keys(
    paths: Sequence[str],
    schema: pa.Schema,
    *,
    table_uri: str,
    storage_options: Mapping[str, str],
    log_start_offsets: Mapping[int, int],
    threads: int,
    niceness: int = 0,
) -> pa.Table:
    """The map's columns of every visible record in ``paths``, ``threads`` files at a time
    (on pool threads niced by ``niceness``)."""
    fs, root = arrow_filesystem(table_uri, dict(storage_options))

    def read(path: str) -> pa.Table:
        with fs.open_input_file(f"{root}/{path}") as source:
            table = pq.read_table(source, columns=schema.names, use_threads=False)
        return visible(table, log_start_offsets).cast(schema)

    if threads <= 1 or len(paths) <= 1:
        tables = [read(p) for p in paths]
    else:
        with ThreadPoolExecutor(
            max_workers=threads,
            thread_name_prefix="offset-map",
            initializer=lower_thread_priority,
            initargs=(niceness,),
        ) as pool:
            tables = list(pool.map(read, paths))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def visible(table: pa.Table, log_start_offsets: Mapping[int, int]) -> pa.Table:
    """The rows at or above their partition's log start offset."""
    floors = {p: s for p, s in log_start_offsets.items() if s > 0}
    if not floors or table.num_rows == 0:
        return table
    return at_or_above(table, floors)


def latest_offsets(table: pa.Table, schema: pa.Schema, *, use_threads: bool = False) -> pa.Table:
    """``max(offset)`` per (partition, key columns): a hash aggregate, keys by value."""
    groups = [n for n in schema.names if n != OFFSET]
    latest = table.group_by(groups, use_threads=use_threads).aggregate([(OFFSET, "max")])
    return latest.rename_columns([*groups, OFFSET]).select(schema.names).cast(schema)


def build_offset_map(
    snapshot: LogSnapshot,
    dirty: Sequence[Segment],
    key_columns: Sequence[str],
    *,
    table_uri: str,
    storage_options: Mapping[str, str] | None = None,
    max_tasks: int | None = None,
    niceness: int = 0,
) -> pa.Table:
    """The offset map of ``dirty`` (partition, key columns, offset), on the driver.

    As Kafka's cleaner thread builds its map: the narrow columns of the dirty files
    are read and reduced right here, by at most ``max_tasks`` threads (None: one per
    core) running at ``niceness``. No Spark job: the map is needed on the driver
    anyway (it ships inside the recopy tasks), and a job would only carry its keys
    through the JVM to get here. Reads only.
    """
    schema = map_schema(snapshot.arrow_schema, key_columns)
    if not dirty:
        return schema.empty_table()
    threads = max(1, min(max_tasks or os.cpu_count() or 1, len(dirty)))

    def build() -> Iterator[pa.Table]:
        keys = read_dirty_keys(
            [s.path for s in dirty],
            schema,
            table_uri=normalize_uri(table_uri),
            storage_options=storage_options or {},
            log_start_offsets={
                p: snapshot.log_start_offset(p) for p in {s.partition for s in dirty}
            },
            threads=threads,
            niceness=niceness,
        )
        yield latest_offsets(keys, schema, use_threads=threads > 1)

    [offset_map] = at_lower_priority(niceness, build)
    return offset_map
