"""Reading chosen rows of a Parquet column chunk by its pages, not the whole chunk (design.md §38).

pyarrow reads a column chunk whole. A file with a page index keeps, for each column chunk,
an offset index: where each data page is and the row it starts at. `PageReader.take` reads
only the data pages that hold the wanted rows (and the chunk's dictionary page), copies
them verbatim into a small Parquet file of its own whose footer is the original footer
with its row groups and column chunks rewritten to these pages (Thrift compact protocol,
`sinks.log.thrift_compact`), and lets pyarrow decode that file: every encoding and codec
pyarrow reads is read, and this module decodes nothing itself.

Invariant: the page path answers exactly what a whole-chunk read answers, or is not taken.
A column it cannot read by pages (`PageReader.pages_of` returns None) is read whole by the
caller: a file without the offset index (another engine, a writer without the page index),
an encrypted file, a column that is not a top-level flat column (nested or repeated), a
column chunk in another file, or an offset index that does not tile the chunk exactly.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sinks.log import thrift_compact as thrift
from sinks.log.parquet_thrift import (
    ColumnChunk,
    ColumnMetaData,
    FieldRepetitionType,
    FileMetaData,
    OffsetIndex,
    PageLocation,
    RowGroup,
    SchemaElement,
)

_MAGIC = b"PAR1"
# Ranges of pages closer than this are read at once.
_COALESCE_GAP = 64 * 1024
# A PageLocation's field headers (offset i64, size i32, first row i64: each field id one
# past the last) and its stop byte.
_HEADERS = np.array(
    [(1 << 4) | thrift.I64, (1 << 4) | thrift.I32, (1 << 4) | thrift.I64, 0x00], dtype=np.uint8
)
# What a column chunk's metadata says of the whole chunk beyond its size and pages: a
# chunk rewritten to some of its pages leaves it out.
_WHOLE_CHUNK_ONLY = (
    ColumnMetaData.KEY_VALUE_METADATA,
    ColumnMetaData.INDEX_PAGE_OFFSET,
    ColumnMetaData.STATISTICS,
    ColumnMetaData.ENCODING_STATS,
    ColumnMetaData.BLOOM_FILTER_OFFSET,
    ColumnMetaData.BLOOM_FILTER_LENGTH,
    ColumnMetaData.SIZE_STATISTICS,
    ColumnMetaData.GEOSPATIAL_STATISTICS,
)


@dataclass(frozen=True)
class _Chunk:
    """What the page path needs of one column chunk, from the footer and offset index."""

    meta: thrift.Struct  # ColumnMetaData
    start: int  # first byte of the chunk (its dictionary page, if any)
    pages: np.ndarray  # int64 [n, 3]: offset, compressed size, first row


class PageReader:
    """The page path over one Parquet file, open for random reads as ``source``.

    Built from the file's raw footer (`of`); holds no open file: each read takes the file,
    open for random reads, as ``source``. Keeps the offset indexes it has parsed.
    """

    def __init__(self, footer: thrift.Struct) -> None:
        self.footer = footer
        self._leaf = _top_level_leaves(footer)
        self._chunks: dict[tuple[int, int], _Chunk | None] = {}

    @classmethod
    def of(cls, source: Any, size: int | None = None) -> PageReader | None:
        """The page reader of the file ``source`` (a pyarrow random-access file), or None
        when its footer is not a plain (unencrypted) Parquet footer this module reads."""
        size = source.size() if size is None else size
        if size < 12:
            return None
        tail = source.read_at(8, size - 8)
        if len(tail) != 8 or tail[4:] != _MAGIC:
            return None  # an encrypted footer ("PARE") or not Parquet
        length = struct.unpack("<I", tail[:4])[0]
        if length + 12 > size:
            return None
        try:
            footer = thrift.read_struct(source.read_at(length, size - 8 - length))
        except ValueError:
            return None
        if (
            FileMetaData.ENCRYPTION_ALGORITHM in footer
            or FileMetaData.FOOTER_SIGNING_KEY_METADATA in footer
        ):
            return None  # encryption with a plaintext footer
        return cls(footer)

    def prefetch(self, source: Any, groups: Sequence[int], columns: Sequence[int]) -> None:
        """Read the offset indexes of ``columns`` (leaf indexes) in ``groups`` at once."""
        wanted = [(g, c) for g in groups for c in columns if (g, c) not in self._chunks]
        places: dict[tuple[int, int], tuple[int, int]] = {}
        for g, c in wanted:
            chunk = self._column_chunk(g, c)
            if chunk is None or self._leaf.get(c) is None:
                self._chunks[(g, c)] = None
                continue
            offset = thrift.optional(chunk, ColumnChunk.OFFSET_INDEX_OFFSET)
            length = thrift.optional(chunk, ColumnChunk.OFFSET_INDEX_LENGTH)
            elsewhere = (
                ColumnChunk.FILE_PATH in chunk
                or ColumnChunk.CRYPTO_METADATA in chunk
                or ColumnChunk.ENCRYPTED_COLUMN_METADATA in chunk
            )
            if offset is None or length is None or elsewhere:
                self._chunks[(g, c)] = None  # no offset index, another file, encrypted
                continue
            places[(g, c)] = (offset, length)
        if not places:
            return
        low = min(o for o, _ in places.values())
        high = max(o + n for o, n in places.values())
        data = memoryview(source.read_at(high - low, low))
        if len(data) != high - low:
            for key in places:
                self._chunks[key] = None
            return
        for (g, c), (offset, length) in places.items():
            self._chunks[(g, c)] = self._parse_chunk(
                g, c, data[offset - low : offset - low + length]
            )

    def _row_group(self, group: int) -> thrift.Struct:
        return thrift.elements(self.footer, FileMetaData.ROW_GROUPS)[group]

    def _column_chunk(self, group: int, column: int) -> thrift.Struct | None:
        try:
            return thrift.elements(self._row_group(group), RowGroup.COLUMNS)[column]
        except (KeyError, IndexError):
            return None

    def _parse_chunk(self, group: int, column: int, index: memoryview) -> _Chunk | None:
        """The chunk's pages, or None unless its offset index tiles it exactly: pages
        back to back from the first data page to the chunk's end, rows ascending from 0."""
        chunk = self._column_chunk(group, column)
        if chunk is None or ColumnChunk.META_DATA not in chunk:
            return None
        meta = thrift.field(chunk, ColumnChunk.META_DATA)
        pages = page_locations(index)
        if pages is None:
            return None
        rows = thrift.field(self._row_group(group), RowGroup.NUM_ROWS)
        data_start = thrift.optional(meta, ColumnMetaData.DATA_PAGE_OFFSET)
        dictionary = thrift.optional(meta, ColumnMetaData.DICTIONARY_PAGE_OFFSET)
        size = thrift.optional(meta, ColumnMetaData.TOTAL_COMPRESSED_SIZE)
        if len(pages) == 0 or data_start is None or size is None:
            return None
        start = data_start if dictionary is None else dictionary
        ends = pages[:, 0] + pages[:, 1]
        tiled = (
            pages[0, 0] == data_start
            and start <= data_start
            and (dictionary is not None or start == data_start)
            and bool(np.all(pages[1:, 0] == ends[:-1]))
            and ends[-1] == start + size
            and bool(np.all(pages[:, 1] > 0))
            and pages[0, 2] == 0
            and bool(np.all(np.diff(pages[:, 2]) > 0))
            and pages[-1, 2] < rows
            and thrift.optional(meta, ColumnMetaData.NUM_VALUES) == rows  # flat: a value a row
        )
        return _Chunk(meta, start, pages) if tiled else None

    def pages_of(self, source: Any, group: int, column: int) -> _Chunk | None:
        """The chunk of ``column`` in ``group`` if the page path reads it, else None."""
        if (group, column) not in self._chunks:
            self.prefetch(source, [group], [column])
        return self._chunks[(group, column)]

    def take(
        self, source: Any, column: int, rows: dict[int, np.ndarray], max_share: float = 1.0
    ) -> pa.ChunkedArray | None:
        """Column ``column``'s values at ``rows`` (row group -> ascending, distinct row
        indexes in it), in group then row order, decoded by pyarrow from the dictionary
        page and the data pages holding those rows. None, having read no page, when a
        group's chunk is not readable by pages (`pages_of`) or when those pages are more
        than ``max_share`` of the chunks' bytes (a whole read is then as cheap)."""
        groups = sorted(rows)
        chunks = {g: self.pages_of(source, g, column) for g in groups}
        if any(c is None for c in chunks.values()):
            return None
        wanted: dict[int, np.ndarray] = {}
        spans: list[tuple[int, int]] = []
        total = 0
        for g in groups:
            chunk = chunks[g]
            assert chunk is not None
            total += int(thrift.field(chunk.meta, ColumnMetaData.TOTAL_COMPRESSED_SIZE))
            first_rows = chunk.pages[:, 2]
            page_of_row = np.searchsorted(first_rows, rows[g], side="right") - 1
            chosen = np.unique(page_of_row)
            wanted[g] = chosen
            if chunk.pages[0, 0] > chunk.start:
                spans.append((chunk.start, int(chunk.pages[0, 0])))
            spans += [(int(o), int(o + n)) for o, n in chunk.pages[chosen, :2]]
        if sum(e - s for s, e in spans) > max_share * total:
            return None
        data = _read_spans(source, spans)
        body = bytearray(_MAGIC)
        row_groups = []
        positions = []
        base = 0
        for g in groups:
            chunk = chunks[g]
            assert chunk is not None
            chosen = wanted[g]
            rows_in_group = thrift.field(self._row_group(g), RowGroup.NUM_ROWS)
            first = chunk.pages[:, 2]
            lasts = np.append(first[1:], rows_in_group)
            counts = lasts[chosen] - first[chosen]
            starts = np.cumsum(counts) - counts  # where each chosen page begins in the output
            page_of_row = np.searchsorted(first, rows[g], side="right") - 1
            slot = np.searchsorted(chosen, page_of_row)
            positions.append(base + starts[slot] + rows[g] - first[page_of_row])
            num_rows = int(counts.sum())
            base += num_rows
            chunk_start = len(body)
            meta = {f: v for f, v in chunk.meta.items() if f not in _WHOLE_CHUNK_ONLY}
            if chunk.pages[0, 0] > chunk.start:
                body += data(chunk.start, int(chunk.pages[0, 0]))
                meta[ColumnMetaData.DICTIONARY_PAGE_OFFSET] = (thrift.I64, chunk_start)
            first_page = len(body)
            for o, n in chunk.pages[chosen, :2]:
                body += data(int(o), int(o + n))
            size = len(body) - chunk_start
            whole = int(thrift.field(chunk.meta, ColumnMetaData.TOTAL_COMPRESSED_SIZE)) or 1
            uncompressed = int(thrift.field(chunk.meta, ColumnMetaData.TOTAL_UNCOMPRESSED_SIZE))
            uncompressed = max(uncompressed * size // whole, size)
            meta[ColumnMetaData.DATA_PAGE_OFFSET] = (thrift.I64, first_page)
            meta[ColumnMetaData.NUM_VALUES] = (thrift.I64, num_rows)
            meta[ColumnMetaData.TOTAL_COMPRESSED_SIZE] = (thrift.I64, size)
            meta[ColumnMetaData.TOTAL_UNCOMPRESSED_SIZE] = (thrift.I64, uncompressed)
            column_chunk: thrift.Struct = {
                ColumnChunk.FILE_OFFSET: (thrift.I64, chunk_start),
                ColumnChunk.META_DATA: (thrift.STRUCT, meta),
            }
            row_groups.append(
                {
                    RowGroup.COLUMNS: (thrift.LIST, (thrift.STRUCT, [column_chunk])),
                    RowGroup.TOTAL_BYTE_SIZE: (thrift.I64, uncompressed),
                    RowGroup.NUM_ROWS: (thrift.I64, num_rows),
                }
            )
        schema = thrift.elements(self.footer, FileMetaData.SCHEMA)
        element = schema[self._leaf[column]]
        root = dict(schema[0])
        root[SchemaElement.NUM_CHILDREN] = (thrift.I32, 1)
        footer: thrift.Struct = {
            FileMetaData.VERSION: self.footer[FileMetaData.VERSION],
            FileMetaData.SCHEMA: (thrift.LIST, (thrift.STRUCT, [root, element])),
            FileMetaData.NUM_ROWS: (thrift.I64, base),
            FileMetaData.ROW_GROUPS: (thrift.LIST, (thrift.STRUCT, row_groups)),
        }
        if FileMetaData.CREATED_BY in self.footer:
            # pyarrow's workarounds for a writer's known bugs follow the writer's name
            footer[FileMetaData.CREATED_BY] = self.footer[FileMetaData.CREATED_BY]
        if FileMetaData.COLUMN_ORDERS in self.footer:
            orders = thrift.elements(self.footer, FileMetaData.COLUMN_ORDERS)
            footer[FileMetaData.COLUMN_ORDERS] = (thrift.LIST, (thrift.STRUCT, [orders[column]]))
        tail = bytearray()
        thrift.write_struct(tail, footer)
        body += tail
        body += struct.pack("<I", len(tail)) + _MAGIC
        table = pq.ParquetFile(pa.BufferReader(bytes(body))).read(use_threads=False)
        return table.column(0).take(pa.array(np.concatenate(positions)))


def _read_spans(source: Any, spans: list[tuple[int, int]]) -> Any:
    """Read ``spans`` (byte ranges of ``source``), nearby ones at once; returns a
    function giving the bytes of any range inside one of them."""
    ordered = sorted(set(spans))
    merged: list[list[int]] = []
    for start, end in ordered:
        if merged and start <= merged[-1][1] + _COALESCE_GAP:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    starts = np.array([m[0] for m in merged], dtype=np.int64)
    blocks = []
    for start, end in merged:
        block = source.read_at(end - start, start)
        if len(block) != end - start:
            raise OSError(f"short read of {end - start} bytes at {start}")
        blocks.append(memoryview(block))

    def data(start: int, end: int) -> memoryview:
        i = int(np.searchsorted(starts, start, side="right")) - 1
        return blocks[i][start - merged[i][0] : end - merged[i][0]]

    return data


def page_locations(index: bytes | memoryview) -> np.ndarray | None:
    """An OffsetIndex's page locations as int64 rows (offset, compressed size, first row),
    or None when ``index`` is not one. Pure."""
    fast = _page_locations_fast(index)
    if fast is not None:
        return fast
    try:
        locations = thrift.elements(thrift.read_struct(index), OffsetIndex.PAGE_LOCATIONS)
        rows = [
            [
                thrift.field(p, PageLocation.OFFSET),
                thrift.field(p, PageLocation.COMPRESSED_PAGE_SIZE),
                thrift.field(p, PageLocation.FIRST_ROW_INDEX),
            ]
            for p in locations
        ]
        return np.array(rows, dtype=np.int64).reshape(-1, 3)
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def _page_locations_fast(index: bytes | memoryview) -> np.ndarray | None:
    """`page_locations` vectorized for the usual layout (each PageLocation its three
    fields in order, short field headers), or None for any other layout."""
    reader = thrift.Reader(index)
    try:
        if reader.byte() != (OffsetIndex.PAGE_LOCATIONS << 4) | thrift.LIST:
            return None
        head = reader.byte()
        if head & 0x0F != thrift.STRUCT:
            return None
        count = head >> 4 if head >> 4 != 15 else reader.varint()
    except ValueError:
        return None
    data = np.frombuffer(index, dtype=np.uint8)[reader.pos :]
    ends = np.flatnonzero(data < 0x80)  # every token ends at a byte below 0x80
    tokens = 7 * count
    if len(ends) < tokens:
        return None
    ends = ends[:tokens]
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    ends, starts = ends.reshape(count, 7), starts.reshape(count, 7)
    fixed = [0, 2, 4, 6]
    if np.any(ends[:, fixed] != starts[:, fixed]) or np.any(data[ends[:, fixed]] != _HEADERS):
        return None
    first, last = starts[:, 1::2].ravel(), ends[:, 1::2].ravel()
    width = int((last - first).max()) + 1
    if width > 9:
        return None
    value = np.zeros(len(first), dtype=np.uint64)
    for k in range(width):
        at = np.minimum(first + k, last)  # past its end a varint repeats its last byte...
        byte = (data[at] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        value |= np.where(first + k <= last, byte, np.uint64(0))  # ...which is masked out
    signed = (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)
    return signed.reshape(count, 3)


def _top_level_leaves(footer: thrift.Struct) -> dict[int, int | None]:
    """Leaf column index -> its schema element's index when the leaf is a top-level,
    non-repeated primitive column (what the page path reads), else None."""
    try:
        elements = thrift.elements(footer, FileMetaData.SCHEMA)
    except (KeyError, IndexError):
        return {}
    leaves: dict[int, int | None] = {}
    leaf = 0
    stack: list[int] = []  # children still to come at each open level
    i = 1
    root_children = thrift.optional(elements[0], SchemaElement.NUM_CHILDREN, 0) if elements else 0
    stack.append(root_children)
    while i < len(elements) and stack:
        element = elements[i]
        children = thrift.optional(element, SchemaElement.NUM_CHILDREN, 0) or 0
        stack[-1] -= 1
        if children > 0:
            stack.append(children)
        else:
            top = len(stack) == 1
            repetition = thrift.optional(element, SchemaElement.REPETITION_TYPE)
            repeated = repetition == FieldRepetitionType.REPEATED
            leaves[leaf] = i if top and not repeated else None
            leaf += 1
        while stack and stack[-1] == 0:
            stack.pop()
        i += 1
    return leaves


def leaf_index(metadata: pq.FileMetaData, name: str) -> int | None:
    """The leaf column index of the top-level column ``name`` in a file, or None when it
    is not one leaf (absent, nested)."""
    found = [i for i in range(metadata.num_columns) if metadata.schema.column(i).path == name]
    return found[0] if len(found) == 1 else None
