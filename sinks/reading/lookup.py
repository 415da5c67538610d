"""One key's state without Spark: a KTable's ``get(key)`` on a compacted log.

Kafka Streams answers "what is X now?" from a state store; here the state is the log, and
`lookup` answers it from the files with pyarrow alone, reading only the row groups whose
key filter (`sinks.log.key_filter`, design.md §38) does not rule the keys out, and of
their columns other than the key only the pages holding a matched row where the file has
a page index (`sinks.reading.parquet_pages`). A row group without a filter is read, never
skipped; a column without a page index is read whole. What a lookup reads of a file (its
footer, key filters, page reader) is kept in the process for the next
(`sinks.reading.lookup_files`: a Delta data file never changes once written).

The answer is the state's (`sinks.reading.arrow_state`, ``state()``): for each wanted key
and each partition it appears in, the visible record of highest offset, or with a
``sequence_column`` of highest (sequence, offset), over every live file, clean, dirty or
another engine's; nothing when that record is a tombstone or the key has none. Records
below a partition's log start offset are invisible. Over every live file the highest is
the latest whichever files are clean (design.md §6: a clean section holds at most one
record per key, a dirty one lies above it), so the lookup needs no split into sections;
a record two files both hold (another engine's rewrite) is one record. Reads only;
idempotent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sinks.cleaner.rules import arrow_latest_offsets
from sinks.errors import BadInputError
from sinks.log.file_reader import conform
from sinks.log.key_filter import (
    block_indexes,
    blocks_contain,
    key_hashes,
    parse_filter_header,
)
from sinks.log.location import LogLocation
from sinks.log.log_keys import LogKeys, log_keys
from sinks.log.log_table import AsOf, LogSnapshot, LogTable
from sinks.log.ownership import check_new_log_location
from sinks.log.records import OFFSET, PARTITION, TIMESTAMP, VALUE, at_or_above
from sinks.log.segment import DataFile
from sinks.reading.arrow_state import state_schema
from sinks.reading.lookup_files import LOOKUP_FILES, FileFacts, footer_weight
from sinks.reading.parquet_pages import PageReader, leaf_index

_WANTED = "_wanted"  # a wanted key's position in the caller's list
_ROW = "_row"
_HEADER_BYTES = 64  # covers a BloomFilterHeader (about 15 bytes)
# Below this many wanted keys a large filter's blocks are read one by one, 32 bytes each;
# above it, or when the filter is at most _SMALL_FILTER_BYTES, the whole bitset is read at
# once and kept (`LOOKUP_FILES`).
_BLOCK_READS_MAX_KEYS = 8
_SMALL_FILTER_BYTES = 64 * 1024
_READERS = 4  # files read at once: pyarrow decodes without the GIL
# A column is read by pages when they are at most this share of its chunks' bytes; above
# it a whole read costs about as much and needs no footer to be rewritten.
_PAGE_SHARE_MAX = 0.5
# A file's columns are read by pages only when the chunks to read hold at least this many
# bytes, or when a lookup read them before: below it a whole read costs less than parsing
# the file's footer to find pages, unless the footer is parsed once and kept.
_PAGE_PATH_MIN_BYTES = 1 << 20
# What the page path may raise on a footer or page it does not expect (a decoding error
# included): the column is then read whole.
_PAGE_PATH_ERRORS = (pa.ArrowException, ValueError, KeyError, IndexError, TypeError)
# A page reader's footer, parsed into Python, weighs this many times its serialized bytes.
_FOOTER_PARSED_WEIGHT = 32


def lookup(
    path: str,
    keys: Any,
    as_of: AsOf | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> pa.Table:
    """The latest live record of each of ``keys`` in the log at ``path``, as of its latest
    version or ``as_of`` (a Delta version or a timestamp inside the history window).

    ``keys`` is one key or a list of keys; a key is a value of the key column, or for a
    log with several key columns a tuple in the log's key-column order (a dict by column
    name works too). Values are cast to the key columns' types (``"42"`` finds the
    integer key 42). Returns one row per key found live, per partition it lives in, in
    the order of ``keys``: the state's columns (key columns, ``value``, payload), then
    ``partition``, ``offset`` and ``timestamp``. A deleted or unknown key has no row.
    Raises `FileNotFoundError` when no log exists at ``path``, the sink's time-travel
    error outside the history window, `BadInputError` when a key does not fit the log's
    key columns; a live data file that is gone raises `MissingDataFileError`. Reads only
    (what it read of the files is kept in the process's `LOOKUP_FILES`), no Spark;
    idempotent.
    """
    log = LogTable(LogLocation.at(path, storage_options))
    snapshot = log.snapshot(as_of)
    if snapshot is None:
        check_new_log_location(log.location, read_only=True)  # someone else's files
        raise FileNotFoundError(f"no compacted log at {path}")
    return KeyLookup.of(snapshot).find(keys)


@dataclass
class KeyLookup:
    """Lookups on one snapshot of a log: its live files and what a row of the answer holds.

    What is read of a file (footer, key filters, page reader) is kept in the process's
    `LOOKUP_FILES` for later lookups, on this snapshot or another (design.md §38).
    """

    snapshot: LogSnapshot
    keys: LogKeys
    files: tuple[DataFile, ...]
    floors: dict[int, int]
    cache: Any = field(default=LOOKUP_FILES, repr=False)
    _fs: tuple[Any, str] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, snapshot: LogSnapshot) -> KeyLookup:
        """A lookup on ``snapshot``; checks that its live files exist (metadata only)."""
        files = tuple(snapshot.data_files())
        snapshot.check_files(list(files))
        starts = {p: snapshot.log_start_offset(p) for p in snapshot.partitions}
        return cls(
            snapshot,
            log_keys(snapshot, read_only=True),
            files,
            {p: s for p, s in starts.items() if s > 0},
        )

    @cached_property
    def own_keys(self) -> list[str]:
        return [k for k in self.keys.key_columns if k != PARTITION]

    @cached_property
    def schema(self) -> pa.Schema:
        """The answer's columns: the state's, then ``partition``, ``offset``, ``timestamp``."""
        log_schema = self.snapshot.arrow_schema
        state = state_schema(log_schema, self.keys)
        extra = [
            log_schema.field(n) for n in (PARTITION, OFFSET, TIMESTAMP) if n in log_schema.names
        ]
        return pa.schema([*state, *(f for f in extra if f.name not in state.names)])

    @cached_property
    def read_schema(self) -> pa.Schema:
        """What is read of a matching row: the answer's columns and the sequence column."""
        schema = self.schema
        sequence = self.keys.sequence_column
        if sequence is not None and sequence not in schema.names:
            schema = schema.append(self.snapshot.arrow_schema.field(sequence))
        return schema

    def find(self, keys: Any) -> pa.Table:
        """`lookup`'s answer for ``keys`` on this snapshot."""
        wanted = wanted_keys(keys, self.snapshot.arrow_schema, self.own_keys)
        if wanted.num_rows == 0:
            return self.schema.empty_table()
        records = self._records_of(wanted)
        if records.num_rows == 0:
            return self.schema.empty_table()
        group = [PARTITION, *self.own_keys]
        narrow = records.select(
            list(dict.fromkeys([*group, *_order_columns(self.keys), OFFSET]))
        ).append_column(_ROW, pa.array(np.arange(records.num_rows, dtype=np.int64)))
        winners = arrow_latest_offsets(narrow, self.keys.partitioned())
        on = [*group, OFFSET]
        won = narrow.join(winners.select(on), on, join_type="left semi")
        won = _first_of_each(won, group)  # a record two files hold is one record
        won = won.join(wanted, self.own_keys, join_type="inner")
        won = won.sort_by([(_WANTED, "ascending"), (PARTITION, "ascending")])
        rows = records.take(won.column(_ROW)).select(self.schema.names)
        return rows.filter(pc.is_valid(rows.column(VALUE)))

    def records_of(self, wanted: pa.Table) -> pa.Table:
        """Every visible record (tombstones too, older ones too) of a key of ``wanted``
        (`wanted_keys`), with `read_schema`'s columns, in no order."""
        return self._records_of(wanted)

    def _records_of(self, wanted: pa.Table) -> pa.Table:
        """Every visible record of a wanted key, with `read_schema`'s columns."""
        hashes: dict[tuple[str, str], np.ndarray | None] = {}
        with ThreadPoolExecutor(max_workers=_READERS) as pool:
            found = [
                t
                for tables in pool.map(lambda f: list(self._matches(f, wanted, hashes)), self.files)
                for t in tables
            ]
        if not found:
            return self.read_schema.empty_table()
        return pa.concat_tables(found)

    def _matches(
        self,
        data_file: DataFile,
        wanted: pa.Table,
        hashes: dict[tuple[str, str], np.ndarray | None],
    ) -> Iterator[pa.Table]:
        """The records of a wanted key in ``data_file``: for each row group its key filter
        does not rule out, the key columns are read; the rest only where a key matched,
        by pages where the file allows (`_columns_at`). A file whose footer and filters
        are kept (`LOOKUP_FILES`) and rule every key out is not even opened."""
        fs, root = self._filesystem()
        schema = self.read_schema
        keys = pa.schema([schema.field(k) for k in self.own_keys])
        rest = pa.schema([f for f in schema if f.name not in self.own_keys])
        location = f"{self.snapshot.location.uri}/{data_file.path}"
        facts = self.cache.facts(location, data_file.size_bytes)
        with _OnDemand(fs, f"{root}/{data_file.path}") as source:
            metadata = facts.metadata
            if metadata is None:
                metadata = pq.ParquetFile(source.file()).metadata
                facts.metadata = metadata
                self.cache.charge(location, data_file.size_bytes, footer_weight(metadata))
            kept = _Kept(self.cache, location, data_file.size_bytes, facts)
            groups = candidate_row_groups(source, metadata, wanted, self.own_keys, hashes, kept)
            if not groups:
                return
            parquet = pq.ParquetFile(source.file(), metadata=metadata)
            present = set(parquet.schema_arrow.names)
            read = [k for k in keys.names if k in present]
            found: dict[int, tuple[pa.Table, np.ndarray]] = {}
            for group in groups:
                key_rows = conform(
                    parquet.read_row_group(group, columns=read, use_threads=False), keys
                )
                rows = _rows_of(key_rows, wanted, self.own_keys)
                if len(rows):
                    found[group] = (key_rows.take(rows), rows)
            if not found:
                return
            others = conform(self._columns_at(source, parquet, kept, rest, present, found), rest)
            key_columns = [
                pa.chunked_array([found[g][0].column(k) for g in sorted(found)], keys.field(k).type)
                for k in keys.names
            ]
            matched = pa.Table.from_arrays(
                [*key_columns, *others.columns], names=[*keys.names, *rest.names]
            ).select(schema.names)
            if self.floors:
                matched = at_or_above(matched, self.floors)
            yield matched.cast(schema)

    def _filesystem(self) -> tuple[Any, str]:
        """The log's pyarrow file system and root, built once per lookup object."""
        if self._fs is None:
            self._fs = self.snapshot.location.filesystem()
        return self._fs

    def _columns_at(
        self,
        source: _OnDemand,
        parquet: pq.ParquetFile,
        kept: _Kept,
        columns: pa.Schema,
        present: set[str],
        found: dict[int, tuple[pa.Table, np.ndarray]],
    ) -> pa.Table:
        """``columns`` (those the file has) at the matched rows of ``found`` (row group ->
        the matched rows' keys and indexes), in group then row order. A column is
        read by its pages where the file's page index allows (`PageReader`) and the chunks
        are large enough to gain by it or the file's page reader is kept, else by whole
        column chunks of the matched row groups (design.md §38)."""
        names = [n for n in columns.names if n in present]
        groups = sorted(found)
        rows = {g: found[g][1] for g in groups}
        read: dict[str, pa.ChunkedArray] = {}
        leaves = {n: leaf_index(parquet.metadata, n) for n in names}
        leaves = {n: i for n, i in leaves.items() if i is not None}
        chunk_bytes = sum(
            parquet.metadata.row_group(g).column(i).total_compressed_size
            for g in groups
            for i in leaves.values()
        )
        for name, leaf in list(leaves.items()):
            values = _constant_values(parquet, name, leaf, rows)
            if values is not None:
                read[name] = values
                del leaves[name]
        by_pages = chunk_bytes >= _PAGE_PATH_MIN_BYTES or kept.facts.column_reads > 0
        kept.facts.column_reads += 1
        pages = kept.page_reader(source) if by_pages and leaves else None
        if pages is not None:
            for name, leaf in leaves.items():
                try:
                    pages.prefetch(source, groups, list(leaves.values()))  # once: kept after
                    values = pages.take(source, leaf, rows, _PAGE_SHARE_MAX)
                    if values is not None:
                        read[name] = values.cast(parquet.schema_arrow.field(name).type)
                except _PAGE_PATH_ERRORS:
                    continue  # an odd file: the column is read whole below, never wrong
        whole = [n for n in names if n not in read]
        if whole:
            tables = [
                parquet.read_row_group(g, columns=whole, use_threads=False).take(rows[g])
                for g in groups
            ]
            table = pa.concat_tables(tables)
            read.update({n: table.column(n) for n in whole})
        if not names:  # the file has none of them: nulls, as `conform` fills
            count = sum(len(r) for r in rows.values())
            return pa.table({f.name: pa.nulls(count, f.type) for f in columns})
        return pa.table({n: read[n] for n in names})


def _constant_values(
    parquet: pq.ParquetFile, name: str, leaf: int, rows: dict[int, np.ndarray]
) -> pa.ChunkedArray | None:
    """Column ``name`` (leaf ``leaf``) at ``rows`` (row group -> row indexes) without
    reading it, when its statistics prove it one value in each of those row groups (a
    file's ``partition``, a batch's ``timestamp``): a signed integer or timestamp column,
    stored as INT32 or INT64, with min equal to max, no null and a value a row. Else None
    (the column is read). Pure."""
    arrow_type = parquet.schema_arrow.field(name).type
    signed = pa.types.is_signed_integer(arrow_type)
    if not (signed or pa.types.is_timestamp(arrow_type)):
        return None
    chunks = []
    for group in sorted(rows):
        row_group = parquet.metadata.row_group(group)
        chunk = row_group.column(leaf)
        stats = chunk.statistics
        if (
            chunk.physical_type not in ("INT32", "INT64")
            or stats is None
            or not stats.has_min_max
            or not stats.has_null_count
            or stats.null_count != 0
            or chunk.num_values != row_group.num_rows
            or stats.min_raw != stats.max_raw
        ):
            return None
        values = pa.array(np.full(len(rows[group]), int(stats.min_raw), dtype=np.int64))
        chunks.append(values.cast(arrow_type) if signed else values.view(arrow_type))
    return pa.chunked_array(chunks, arrow_type)


class _OnDemand:
    """A data file opened for random reads at its first read, closed on exit."""

    def __init__(self, fs: Any, path: str) -> None:
        self._fs, self._path, self._file = fs, path, None

    def file(self) -> Any:
        if self._file is None:
            self._file = self._fs.open_input_file(self._path)
        return self._file

    def read_at(self, nbytes: int, offset: int) -> bytes:
        return self.file().read_at(nbytes, offset)

    def size(self) -> int:
        return self.file().size()

    def __enter__(self) -> _OnDemand:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()


@dataclass
class _Kept:
    """One file's kept facts (`FileFacts`) and how to count what is added to them."""

    cache: Any
    location: str
    size: int
    facts: FileFacts

    def charge(self, nbytes: int) -> None:
        self.cache.charge(self.location, self.size, nbytes)

    def page_reader(self, source: Any) -> PageReader | None:
        """The file's page reader, its footer parsed once and kept."""
        if "reader" not in self.facts.pages:
            try:
                reader = PageReader.of(source)
            except (OSError, ValueError):
                reader = None
            self.facts.pages["reader"] = reader
            self.charge(_FOOTER_PARSED_WEIGHT * (self.facts.metadata.serialized_size or 0))
        return self.facts.pages["reader"]


def wanted_keys(keys: Any, log_schema: pa.Schema, key_columns: Sequence[str]) -> pa.Table:
    """``keys`` (see `lookup`) as a table of ``key_columns`` of the log's types, plus each
    key's position; a key given twice is kept once. Pure. Raises `BadInputError`."""
    if isinstance(keys, pa.Table):
        rows = keys.select(list(key_columns)).to_pylist()
        keys = [tuple(r[c] for c in key_columns) for r in rows]
    elif not isinstance(keys, list):
        keys = [keys]
    n = len(key_columns)
    columns: list[list[Any]] = [[] for _ in key_columns]
    for key in keys:
        if isinstance(key, Mapping):
            missing = [c for c in key_columns if c not in key]
            if missing:
                raise BadInputError(f"key {key!r} lacks the key column(s) {missing}")
            values = [key[c] for c in key_columns]
        elif n > 1:
            if not isinstance(key, tuple | list) or len(key) != n:
                raise BadInputError(
                    f"key {key!r}: the log's key has {n} columns {list(key_columns)}; "
                    f"give each key as a tuple of {n} values in that order"
                )
            values = list(key)
        else:
            values = [key[0] if isinstance(key, tuple) and len(key) == 1 else key]
        if any(v is None for v in values):
            raise BadInputError(f"key {key!r} holds a null: a log's keys are never null")
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    arrays = []
    for name, values in zip(key_columns, columns, strict=True):
        target = log_schema.field(name).type
        try:
            arrays.append(_as_array(values, target))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise BadInputError(
                f"a key does not fit key column {name!r} of type {target}: {e}"
            ) from e
    table = pa.table(dict(zip(key_columns, arrays, strict=True)))
    table = table.append_column(_WANTED, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return _first_of_each(table, list(key_columns))


def _as_array(values: list[Any], target: pa.DataType) -> pa.Array:
    """``values`` as an array of ``target``, each cast on its own when they mix types."""
    try:
        return pa.array(values).cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([pa.scalar(v).cast(target).as_py() for v in values], target)


def candidate_row_groups(
    source: Any,
    metadata: pq.FileMetaData,
    wanted: pa.Table,
    key_columns: Sequence[str],
    hashes: dict[tuple[str, str], np.ndarray | None] | None = None,
    kept: _Kept | None = None,
) -> list[int]:
    """The row groups of a file (``source``, open for random reads) that may hold a
    ``wanted`` key: every row group but those whose key filter rules out every wanted key.
    ``hashes`` keeps the wanted keys' hashes per (column, physical type) between files;
    ``kept``, the file's kept facts: filters read are kept there, and filters kept there
    are not read again (``source`` is then not read at all)."""
    hashes = {} if hashes is None else hashes
    chunks = _key_chunks(metadata, key_columns, kept)
    groups = []
    for group, filters in enumerate(chunks):
        maybe = np.ones(wanted.num_rows, dtype=bool)
        for name, physical_type, filter_offset in filters:
            cache = (name, physical_type)
            if cache not in hashes:
                hashes[cache] = key_hashes(wanted.column(name).combine_chunks(), physical_type)
            wanted_hashes = hashes[cache]
            if wanted_hashes is None:
                continue
            found = _probe(source, filter_offset, wanted_hashes[maybe], kept)
            if found is not None:
                maybe[np.flatnonzero(maybe)[~found]] = False
            if not maybe.any():
                break
        if maybe.any():
            groups.append(group)
    return groups


def _key_chunks(
    metadata: pq.FileMetaData, key_columns: Sequence[str], kept: _Kept | None
) -> list[list[tuple[str, str, int]]]:
    """Per row group, (column, physical type, filter offset) of each key column chunk
    with a filter (kept in ``kept``). A column the file lacks holds only nulls there, and a
    chunk without a filter (pyarrow < 24 does not even say where one is) says nothing:
    neither rules a row group out."""
    wanted = tuple(key_columns)
    if kept is not None and wanted in kept.facts.key_chunks:
        return kept.facts.key_chunks[wanted]
    chunk_of = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    chunks = []
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        filters = []
        for name in key_columns:
            if name not in chunk_of:
                continue
            chunk = row_group.column(chunk_of[name])
            filter_offset = getattr(chunk, "bloom_filter_offset", None)
            if filter_offset is not None:
                filters.append((name, chunk.physical_type, filter_offset))
        chunks.append(filters)
    if kept is not None:
        kept.facts.key_chunks[wanted] = chunks
    return chunks


def _probe(
    source: Any, offset: int, hashes: np.ndarray, kept: _Kept | None = None
) -> np.ndarray | None:
    """Per hash: whether the filter at ``offset`` may hold it; None when it is unreadable.
    A whole bitset read is kept in ``kept``, and so is the header of a filter read block
    by block."""
    if kept is not None and offset in kept.facts.filters:
        words = kept.facts.filters[offset]
        if words is None:
            return None
        return blocks_contain(words[block_indexes(hashes, words.nbytes)], hashes)
    if kept is not None and offset in kept.facts.headers:
        parsed = kept.facts.headers[offset]
    else:
        parsed = parse_filter_header(source.read_at(_HEADER_BYTES, offset))
        if kept is not None:
            kept.facts.headers[offset] = parsed
    if parsed is None:
        return None
    header, bitset = parsed
    start = offset + header
    if len(hashes) <= _BLOCK_READS_MAX_KEYS and bitset > _SMALL_FILTER_BYTES:
        blocks = block_indexes(hashes, bitset)
        words = np.stack(
            [np.frombuffer(source.read_at(32, start + 32 * int(b)), dtype="<u4") for b in blocks]
        )
        return blocks_contain(words, hashes)
    data = source.read_at(bitset, start)
    whole = np.frombuffer(data, dtype="<u4").reshape(-1, 8) if len(data) == bitset else None
    if kept is not None:
        kept.facts.filters[offset] = whole
        kept.charge(bitset)
    if whole is None:
        return None
    return blocks_contain(whole[block_indexes(hashes, bitset)], hashes)


def _rows_of(records: pa.Table, wanted: pa.Table, key_columns: Sequence[str]) -> np.ndarray:
    """Indices (ascending) of ``records``' rows whose key is one of ``wanted``'s."""
    if len(key_columns) == 1:
        (name,) = key_columns
        mask = pc.is_in(records.column(name), value_set=wanted.column(name).combine_chunks())
        return np.flatnonzero(mask.to_numpy(zero_copy_only=False))
    numbered = records.append_column(_ROW, pa.array(np.arange(records.num_rows, dtype=np.int64)))
    kept = numbered.join(wanted.select(list(key_columns)), list(key_columns), join_type="left semi")
    return np.sort(kept.column(_ROW).to_numpy())


def _order_columns(keys: LogKeys) -> list[str]:
    sequence = keys.sequence_column
    return [sequence] if sequence and sequence not in (*keys.key_columns, PARTITION) else []


def _first_of_each(table: pa.Table, columns: list[str]) -> pa.Table:
    """``table``'s first row of each distinct ``columns`` value."""
    if table.num_rows <= 1:
        return table
    numbered = table.append_column("_n", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    firsts = numbered.group_by(columns, use_threads=False).aggregate([("_n", "min")])
    keep = np.sort(firsts.column("_n_min").to_numpy())
    return table.take(keep)
