"""`Segment`: one Parquet data file of a log, Kafka's log segment, as plain numbers.

Every file this sink writes holds records of exactly one partition, sorted by
offset, so a partition's segments never overlap and sort by base offset. A
segment covers the half-open offset range ``[base_offset, last_offset + 1)``.
The numbers come from the file's add action in the Delta log (its statistics);
nothing here does I/O.

Other engines maintain Delta tables too (OPTIMIZE, Z-order, liquid clustering,
auto compaction) and write files of their own: one file may then hold records of
several partitions, in any row order. Such a file is a `ForeignFile`, recognised
by its path and its statistics (`classify`): it is read like any other file, but
it is never taken for a segment, so never for a clean one, until a pass rewrites
it into segments (`sinks.log.foreign.rearrangement`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

SEGMENT_PATH = re.compile(r"partition-(\d+)/(\d{20})-[0-9a-f]{32}\.parquet")
"""How this sink names a segment: ``partition-<p>/<base offset, 20 digits>-<uuid>.parquet``."""


def is_segment_path(path: str) -> bool:
    """Whether ``path`` is named as this sink names its segments (sorted by offset)."""
    return SEGMENT_PATH.fullmatch(unquote(path)) is not None


def segment_path(partition: int, base_offset: int, unique: str) -> str:
    """The path (relative to the table) of a segment this sink writes."""
    return f"partition-{partition}/{base_offset:020d}-{unique}.parquet"


@dataclass(frozen=True, order=True)
class Segment:
    """One data file of the log: Kafka's log segment. Ordered by (partition, base offset)."""

    partition: int
    base_offset: int
    last_offset: int
    path: str = field(compare=False)
    size_bytes: int = field(compare=False)
    num_records: int = field(compare=False)
    min_timestamp_ms: int | None = field(default=None, compare=False)
    max_timestamp_ms: int | None = field(default=None, compare=False)
    min_delete_horizon_ms: int | None = field(default=None, compare=False)

    @property
    def next_offset(self) -> int:
        """The offset just past this segment's last record."""
        return self.last_offset + 1


def split_clean(
    segments: Iterable[Segment], end: int | None
) -> tuple[list[Segment], list[Segment]]:
    """One partition's segments split at ``end``: (clean, dirty), each by base offset. Pure.

    The one rule for which segments are clean (design.md §6): a segment is clean
    when it lies wholly below ``end`` (its last offset < ``end``), and dirty when
    it straddles ``end`` or lies above it; with no ``end`` (a partition never
    cleaned) every segment is dirty. Who asks chooses ``end``: the reader the
    cleaner offset the log records, planning the checkpoint's first dirty offset,
    the offset map the lower of the two.
    """
    clean: list[Segment] = []
    dirty: list[Segment] = []
    for segment in sorted(segments):
        (clean if end is not None and segment.last_offset < end else dirty).append(segment)
    return clean, dirty


@dataclass(frozen=True)
class ForeignFile:
    """A live data file another engine wrote, that is not one partition's offset-ordered run.

    ``partitions`` is the ``[min, max]`` partition range its statistics give (None when
    it has none); ``why`` says what gave it away.
    """

    path: str
    size_bytes: int
    num_records: int
    partitions: tuple[int, int] | None
    why: str

    def may_hold(self, partition: int) -> bool:
        """Whether records of ``partition`` may be in this file (always, without statistics)."""
        return self.partitions is None or self.partitions[0] <= partition <= self.partitions[1]


DataFile = Segment | ForeignFile
"""Any live data file of a log: what a reader reads and what storage keeps."""


def classify(
    *,
    path: str,
    size_bytes: int,
    num_records: int,
    min_partition: int | None,
    max_partition: int | None,
    min_offset: int | None,
    max_offset: int | None,
    min_timestamp_ms: int | None = None,
    max_timestamp_ms: int | None = None,
    min_delete_horizon_ms: int | None = None,
) -> DataFile:
    """A `Segment` when the file is one this sink wrote, as its statistics confirm; else a
    `ForeignFile`. Pure.

    A segment's path names its partition and base offset (`SEGMENT_PATH`), and its
    statistics agree: one partition, the named base offset. Anything else, such as an
    OPTIMIZE's ``part-…`` file, is foreign, whatever its statistics say: only this
    sink's writer guarantees one partition sorted by offset.
    """
    named = SEGMENT_PATH.fullmatch(unquote(path))
    known = None not in (min_partition, max_partition, min_offset, max_offset)
    why = None
    if not known:
        why = "has no partition or offset statistics"
    elif min_partition != max_partition:
        why = f"holds partitions {min_partition} to {max_partition}"
    elif named is None:
        why = "was not written by this sink"
    elif (int(named.group(1)), int(named.group(2))) != (min_partition, min_offset):
        why = "does not hold what its name says"
    if why is not None:
        partitions = (min_partition, max_partition) if known else None
        return ForeignFile(path, size_bytes, num_records, partitions, why)  # type: ignore[arg-type]
    assert min_partition is not None and min_offset is not None and max_offset is not None
    return Segment(
        partition=min_partition,
        base_offset=min_offset,
        last_offset=max_offset,
        path=path,
        size_bytes=size_bytes,
        num_records=num_records,
        min_timestamp_ms=min_timestamp_ms,
        max_timestamp_ms=max_timestamp_ms,
        min_delete_horizon_ms=min_delete_horizon_ms,
    )


def add_action_table(actions: Any) -> pa.Table:
    """delta-rs's add actions (``get_add_actions``, an Arrow stream) as a pyarrow Table.

    Read as a stream, not with ``pa.table(...)``: that asks whether its argument is a
    pandas DataFrame and imports pandas to know, a cost a consumer's query start pays.
    """
    return pa.RecordBatchReader.from_stream(actions).read_all()


def add_action_paths(actions: Any) -> set[str]:
    """The paths (unquoted) of delta-rs's add actions."""
    return {unquote(p) for p in add_action_table(actions).column("path").to_pylist()}


def add_action_rows(actions: Any) -> list[dict[str, Any]]:
    """The rows of delta-rs's ``get_add_actions(flatten=True)``, with every timestamp
    statistic as epoch milliseconds (Delta's statistics are UTC).

    Integers, not datetimes: pyarrow makes a Python datetime through pandas.
    """
    table = add_action_table(actions)
    columns = [
        column.cast(pa.timestamp("ms", tz=field.type.tz), safe=False).cast(pa.int64())
        if pa.types.is_timestamp(field.type)
        else column
        for field, column in zip(table.schema, table.columns, strict=True)
    ]
    return pa.Table.from_arrays(columns, names=table.column_names).to_pylist()


def data_file(row: Mapping[str, Any]) -> DataFile:
    """`classify` over one row of `add_action_rows`. Pure."""
    return classify(
        path=row["path"],
        size_bytes=int(row["size_bytes"]),
        num_records=_int(row.get("num_records")) or 0,
        min_partition=_int(row.get("min.partition")),
        max_partition=_int(row.get("max.partition")),
        min_offset=_int(row.get("min.offset")),
        max_offset=_int(row.get("max.offset")),
        min_timestamp_ms=_int(row.get("min.timestamp")),
        max_timestamp_ms=_int(row.get("max.timestamp")),
        min_delete_horizon_ms=_int(row.get("min.delete_horizon_ms")),
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
