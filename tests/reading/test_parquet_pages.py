"""The page path of a lookup (`sinks.reading.parquet_pages`), without Spark.

Over random tables (strings, integers, timestamps, nulls, dictionary and plain encodings,
several pages and row groups, the codecs and page versions pyarrow writes) reading rows by
their pages gives exactly what reading the whole column chunk and taking them gives; what
the page path cannot read (no page index, a nested column, an offset index that does not
tile its chunk) it refuses, and a lookup then reads whole. A log written by the segment
writer answers lookups by pages as `read_state` does, with and without the page index.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sinks import CleanerConfig, lookup, read_state
from sinks.log.history_window import table_properties
from sinks.log.key_filter import PAGE_INDEX_OFF_ENV, page_index_options
from sinks.log.log_config import topic_table_properties
from sinks.log.log_format import CLEANER_OFFSET_TXN, LOG_END_OFFSET_TXN, PARTITIONS_TXN
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogTable
from sinks.log.segment_writer import SegmentWriterTask, WrittenSegment, stats_columns
from sinks.log.thrift_compact import read_struct, write_struct
from sinks.reading import lookup as lookup_module
from sinks.reading.lookup_files import LOOKUP_FILES, FileCache
from sinks.reading.parquet_pages import PageReader, leaf_index, page_locations

# -- pure: pages against whole chunks ---------------------------------------------------------


def random_table(rng: np.random.Generator, rows: int) -> pa.Table:
    distinct = [f"v{i:06d}-" + "x" * int(rng.integers(0, 40)) for i in range(rows)]
    few = ["alpha", "beta", "gamma", None]
    nulls = rng.random(rows) < 0.2
    return pa.table(
        {
            "s": pa.array([None if n else s for s, n in zip(distinct, nulls, strict=True)]),
            "low": pa.array([few[i] for i in rng.integers(0, 4, rows)]),
            "i": pa.array(rng.integers(-(2**40), 2**40, rows), pa.int64()),
            "small": pa.array(rng.integers(0, 3, rows).astype(np.int32)),
            "n": pa.array(
                [
                    None if n else int(v)
                    for v, n in zip(rng.integers(0, 99, rows), nulls, strict=True)
                ],
                pa.int64(),
            ),
            "ts": pa.array(np.arange(rows, dtype=np.int64) * 1000).cast(pa.timestamp("us", "UTC")),
            "b": pa.array([bytes([i % 256]) * (i % 7) for i in range(rows)], pa.binary()),
            "nested": pa.array([{"x": i} for i in range(rows)]),
            "listed": pa.array([[i, i] for i in range(rows)]),
        }
    )


WRITERS = [
    {"compression": "zstd", **page_index_options()},
    {"compression": "snappy", "write_page_index": True, "data_page_size": 2048},
    {"compression": "none", "write_page_index": True, "data_page_size": 4096,
     "use_dictionary": False},
    {"compression": "gzip", "write_page_index": True, "data_page_size": 1024,
     "data_page_version": "2.0", "write_page_checksum": True, "write_batch_size": 64},
    {"compression": "zstd", "write_page_index": True, "max_rows_per_page": 100,
     "use_dictionary": ["low", "small"]},
    {"compression": "lz4", "write_page_index": True, "data_page_size": 4096,
     "column_encoding": {"i": "DELTA_BINARY_PACKED", "s": "DELTA_BYTE_ARRAY"},
     "use_dictionary": False},
]  # fmt: skip


def written(table: pa.Table, row_group_size: int, **options) -> pa.BufferReader:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size, **options)
    return pa.BufferReader(sink.getvalue())


def whole_take(parquet: pq.ParquetFile, name: str, rows: dict[int, np.ndarray]) -> pa.Array:
    parts = [
        parquet.read_row_group(g, columns=[name]).column(0).take(pa.array(rows[g]))
        for g in sorted(rows)
    ]
    return pa.chunked_array(parts).combine_chunks()


@pytest.mark.parametrize("writer", range(len(WRITERS)))
@pytest.mark.parametrize("seed", [1, 2])
def test_pages_give_what_whole_chunks_give(writer, seed):
    rng = np.random.default_rng(seed * 100 + writer)
    table = random_table(rng, 6000)
    source = written(table, 1700, **WRITERS[writer])
    parquet = pq.ParquetFile(source)
    reader = PageReader.of(source)
    assert reader is not None
    groups = parquet.metadata.num_row_groups
    assert groups == 4
    read = 0
    for trial in range(6):
        rows = {}
        for g in range(groups):
            n = parquet.metadata.row_group(g).num_rows
            if trial == 0:
                rows[g] = np.arange(n)  # every row
            elif rng.random() < 0.75:
                rows[g] = np.sort(rng.choice(n, int(rng.integers(1, 6)), replace=False))
        rows = rows or {0: np.array([n - 1])}
        for name in ["s", "low", "i", "small", "n", "ts", "b"]:
            leaf = leaf_index(parquet.metadata, name)
            values = reader.take(source, leaf, rows)
            assert values is not None, name
            expected = whole_take(parquet, name, rows)
            got = values.cast(parquet.schema_arrow.field(name).type).combine_chunks()
            assert got.equals(expected), (name, writer, trial)
            read += 1
    assert read == 42


def test_pages_are_many_and_read_only_where_rows_are():
    rng = np.random.default_rng(7)
    source = written(random_table(rng, 20_000), 20_000, compression="zstd", **page_index_options())
    parquet = pq.ParquetFile(source)
    reader = PageReader.of(source)
    leaf = leaf_index(parquet.metadata, "s")
    chunk = reader.pages_of(source, 0, leaf)
    assert chunk is not None and len(chunk.pages) > 20  # small pages
    assert reader.take(source, leaf, {0: np.array([5, 19_999])}, max_share=0.2) is not None
    assert reader.take(source, leaf, {0: np.arange(0, 20_000, 50)}, max_share=0.5) is None


def test_what_the_page_path_cannot_read_is_refused():
    rng = np.random.default_rng(3)
    table = random_table(rng, 3000)
    plain = written(table, 1000, compression="zstd")  # no page index: another writer
    reader = PageReader.of(plain)
    parquet = pq.ParquetFile(plain)
    assert not parquet.metadata.row_group(0).column(0).has_offset_index
    for name in ["s", "i"]:
        leaf = leaf_index(parquet.metadata, name)
        assert reader.pages_of(plain, 0, leaf) is None
        assert reader.take(plain, leaf, {0: np.array([1])}) is None
    indexed = written(table, 1000, compression="zstd", write_page_index=True)
    parquet = pq.ParquetFile(indexed)
    reader = PageReader.of(indexed)
    assert leaf_index(parquet.metadata, "nested") is None  # a struct is not one leaf
    assert leaf_index(parquet.metadata, "missing") is None
    listed = next(
        i for i in range(parquet.metadata.num_columns)
        if parquet.metadata.schema.column(i).path.startswith("listed")
    )  # fmt: skip
    assert reader.pages_of(indexed, 0, listed) is None  # repeated: never by pages
    nested = next(
        i for i in range(parquet.metadata.num_columns)
        if parquet.metadata.schema.column(i).path.startswith("nested")
    )  # fmt: skip
    assert reader.pages_of(indexed, 0, nested) is None
    assert PageReader.of(pa.BufferReader(b"PAR1 not parquet at all PAR2")) is None


def test_an_offset_index_that_does_not_tile_its_chunk_is_refused():
    rng = np.random.default_rng(4)
    options = {**page_index_options(), "use_dictionary": False}
    source = written(random_table(rng, 3000), 3000, compression="zstd", **options)
    reader = PageReader.of(source)
    leaf = leaf_index(pq.ParquetFile(source).metadata, "s")
    good = reader.pages_of(source, 0, leaf)
    assert good is not None and len(good.pages) > 2
    bad = good.pages.copy()
    bad[1, 0] += 1  # a gap between two pages
    located = reader._column_chunk(0, leaf)
    index = source.read_at(located[5][1], located[4][1])
    assert np.array_equal(page_locations(index), good.pages)
    fields = read_struct(index)
    for row, page in zip(bad, fields[1][1][1], strict=True):
        page[1] = (page[1][0], int(row[0]))
    out = bytearray()
    write_struct(out, fields)
    assert np.array_equal(page_locations(bytes(out)), bad)
    assert reader._parse_chunk(0, leaf, memoryview(bytes(out))) is None
    assert page_locations(b"\x00garbage") is None or len(page_locations(b"\x00garbage")) == 0


def test_footers_survive_a_thrift_round_trip():
    rng = np.random.default_rng(5)
    for options in WRITERS:
        source = written(random_table(rng, 2000), 700, **options)
        size = source.size()
        length = int.from_bytes(source.read_at(4, size - 8), "little")
        raw = source.read_at(length, size - 8 - length)
        out = bytearray()
        write_struct(out, read_struct(raw))
        assert read_struct(bytes(out)) == read_struct(raw)


# -- a log the segment writer wrote ---------------------------------------------------------------

SCHEMA_DDL = "key string, value string, partition int, offset long"


def build_log(path: str, rng: np.random.Generator, keys: int, dirty_batches: int) -> None:
    """A log of ``keys`` keys in 2 partitions, cleaned, then dirty batches with tombstones."""
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("key", T.StringType()),
            T.StructField("value", T.StringType()),
            T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()),
        ]
    )
    config = CleanerConfig()
    log_keys = LogKeys(key_columns=("key",))
    snapshot = LogTable(path).create(
        schema,
        {
            **table_properties(config.file_delete_delay_ms),
            **log_keys.to_properties(),
            **topic_table_properties(config),
        },
    )
    task = SegmentWriterTask(
        table_uri=path,
        schema=snapshot.arrow_schema,
        stats_columns=tuple(stats_columns(schema, log_keys)),
        max_file_bytes=1 << 30,
        group_column=None,
        storage_options={},
        key_columns=("key",),
    )

    def write(tables):
        batches = (b for t in tables for b in t.cast(task.schema).to_batches(max_chunksize=9000))
        return [WrittenSegment(**r) for b in task(batches) for r in b.to_pylist()]

    def records(ids, partition, first, tag, dead):
        values = pc.binary_join_element_wise(
            pc.cast(pa.array(ids), pa.string()), pa.scalar(tag * 30), ""
        )
        return pa.table(
            {
                "key": pc.binary_join_element_wise("k", pc.cast(pa.array(ids), pa.string()), ""),
                "value": pc.if_else(pa.array(dead), pa.nulls(len(ids), pa.string()), values),
                "partition": pa.array(np.full(len(ids), partition, np.int32)),
                "offset": pa.array(np.arange(first, first + len(ids), dtype=np.int64)),
            }
        )

    ends = {}
    tables = []
    for p in range(2):
        ids = rng.permutation(keys // 2) * 2 + p
        tables.append(records(ids, p, 0, "c", np.zeros(len(ids), bool)))
        ends[p] = len(ids)
    transactions = {LOG_END_OFFSET_TXN.format(p): e for p, e in ends.items()}
    transactions |= {CLEANER_OFFSET_TXN.format(p): e for p, e in ends.items()}
    transactions[PARTITIONS_TXN] = 2
    snapshot.commit(
        adds=write(tables), data_change=True, transactions=transactions, info={"operation": "x"}
    )
    for batch in range(dirty_batches):
        snapshot = LogTable(path).snapshot()
        ids = rng.integers(0, keys, 3000)
        tables = []
        for p in range(2):
            mine = ids[ids % 2 == p]
            tables.append(records(mine, p, ends[p], f"d{batch}", rng.random(len(mine)) < 0.2))
            ends[p] += len(mine)
        snapshot.commit(
            adds=write(tables),
            data_change=True,
            transactions={LOG_END_OFFSET_TXN.format(p): e for p, e in ends.items()},
            info={"operation": "x"},
        )


def state_rows(path: str, keys: list[str]) -> set[tuple]:
    state = read_state(path)
    state = state.filter(pc.is_in(state.column("key"), pa.array(keys)))
    return set(zip(*(state.column(c).to_pylist() for c in ("key", "value")), strict=True))


def answer_rows(table: pa.Table) -> set[tuple]:
    return set(zip(*(table.column(c).to_pylist() for c in ("key", "value")), strict=True))


@pytest.mark.parametrize("page_index", [True, False])
def test_lookups_by_pages_answer_what_the_state_holds(tmp_path, monkeypatch, page_index):
    if not page_index:
        monkeypatch.setenv(PAGE_INDEX_OFF_ENV, "1")  # files as another writer leaves them
    rng = np.random.default_rng(11)
    path = str(tmp_path / "log")
    build_log(path, rng, 40_000, dirty_batches=3)
    monkeypatch.delenv(PAGE_INDEX_OFF_ENV, raising=False)
    metadata = pq.read_metadata(next(p for p in (tmp_path / "log").rglob("*.parquet")))
    assert metadata.row_group(0).column(1).has_offset_index == page_index
    taken = []
    take = PageReader.take

    def counted(self, *args, **kwargs):
        values = take(self, *args, **kwargs)
        taken.append(values is not None)
        return values

    monkeypatch.setattr(PageReader, "take", counted)
    monkeypatch.setattr(lookup_module, "_PAGE_PATH_MIN_BYTES", 0)  # this log's chunks are small
    for n in (1, 5, 300, 3000):
        keys = [f"k{int(i)}" for i in rng.integers(0, 41_000, n)]
        by_pages = lookup(path, keys)
        assert answer_rows(by_pages) == state_rows(path, keys)
        monkeypatch.setattr(lookup_module, "_PAGE_SHARE_MAX", 0.0)  # every column read whole
        whole = lookup(path, keys)
        monkeypatch.setattr(lookup_module, "_PAGE_SHARE_MAX", 0.5)
        assert by_pages.equals(whole)
        assert by_pages.num_rows > 0
    assert any(taken) == page_index  # pages read exactly where the files allow


def test_a_page_path_that_fails_reads_the_column_whole(tmp_path, monkeypatch):
    rng = np.random.default_rng(12)
    path = str(tmp_path / "log")
    build_log(path, rng, 20_000, dirty_batches=1)
    monkeypatch.setattr(lookup_module, "_PAGE_PATH_MIN_BYTES", 0)
    keys = [f"k{int(i)}" for i in rng.integers(0, 21_000, 200)]
    expected = lookup(path, keys)

    def broken(self, *args, **kwargs):
        raise ValueError("a footer this reader does not expect")

    monkeypatch.setattr(PageReader, "take", broken)
    assert lookup(path, keys).equals(expected)
    assert answer_rows(expected) == state_rows(path, keys)


# -- what lookups keep of each file between calls ---------------------------------------------


def test_constant_columns_are_taken_from_statistics_exactly_as_read():
    rows = 3000
    table = pa.table(
        {
            "p": pa.array(np.full(rows, 7, np.int32)),
            "ts": pa.array(np.full(rows, 1_764_000_000_123_456_789, np.int64)).cast(
                pa.timestamp("ns", "UTC")
            ),
            "neg": pa.array(np.full(rows, -(2**40), np.int64)),
            "tiny": pa.array(np.full(rows, -5, np.int8)),
            "varies": pa.array(np.arange(rows, dtype=np.int64)),
            "nulls": pa.array([None] + [5] * (rows - 1), pa.int64()),
            "u": pa.array(np.full(rows, 2**32 - 1, np.uint32)),
            "s": pa.array(["same"] * rows),
        }
    )
    rows_at = {0: np.array([0, 999]), 2: np.array([5])}
    for options in ({}, {"coerce_timestamps": "ms", "allow_truncated_timestamps": True}):
        parquet = pq.ParquetFile(written(table, 1000, compression="zstd", **options))
        for name in ("p", "ts", "neg", "tiny"):
            leaf = leaf_index(parquet.metadata, name)
            values = lookup_module._constant_values(parquet, name, leaf, rows_at)
            assert values is not None, name
            assert values.type == parquet.schema_arrow.field(name).type
            assert values.to_pylist() == whole_take(parquet, name, rows_at).to_pylist()
    for name in ("varies", "nulls", "u", "s"):  # not proven constant, or not a type it makes
        leaf = leaf_index(parquet.metadata, name)
        assert lookup_module._constant_values(parquet, name, leaf, rows_at) is None, name


def test_the_file_cache_keeps_a_file_by_location_and_size_and_drops_the_oldest():
    cache = FileCache(max_bytes=100)
    first = cache.facts("a/1.parquet", 10)
    assert cache.facts("a/1.parquet", 10) is first
    assert cache.facts("a/1.parquet", 11) is not first  # another file under the same name
    cache.charge("a/1.parquet", 10, 60)
    cache.facts("a/2.parquet", 10)
    cache.charge("a/2.parquet", 10, 30)
    cache.facts("a/1.parquet", 10)  # used last: the other one is older
    cache.facts("a/3.parquet", 10)
    cache.charge("a/3.parquet", 10, 50)  # 140 > 100: the least recently used go first
    assert cache.kept_bytes <= 100
    assert cache.facts("a/3.parquet", 10) is not None and len(cache) >= 1
    kept = cache.facts("a/1.parquet", 10)
    assert kept is not first  # dropped (its 60 bytes and the 2nd's 30 went for the 3rd's)
    cache.charge("a/4.parquet", 10, 10)  # never asked for: nothing to count
    cache.facts("big", 1)
    cache.charge("big", 1, 1000)  # alone over the bound: kept, the others dropped
    assert len(cache) == 1 and cache.kept_bytes == 1000
    cache.clear()
    assert len(cache) == 0 and cache.kept_bytes == 0


def test_kept_footers_and_filters_answer_what_fresh_reads_answer(tmp_path, monkeypatch):
    rng = np.random.default_rng(13)
    path = str(tmp_path / "log")
    build_log(path, rng, 20_000, dirty_batches=3)
    opened = []
    file = lookup_module._OnDemand.file

    def counted(self):
        if self._file is None:
            opened.append(self._path)
        return file(self)

    monkeypatch.setattr(lookup_module._OnDemand, "file", counted)
    key_sets = [[f"k{int(i)}" for i in rng.integers(0, 21_000, n)] for n in (1, 5, 300)]
    LOOKUP_FILES.clear()
    cold = [lookup(path, keys) for keys in key_sets]
    assert len(LOOKUP_FILES) == live_files(path)  # every live file, read once
    for keys, answer in zip(key_sets, cold, strict=True):
        assert lookup(path, keys).equals(answer)  # now from what was kept
        assert answer_rows(answer) == state_rows(path, keys)
    # a key no filter lets through opens no file once the footers and filters are kept
    absent = next(k for k in (f"absent-{i}" for i in range(100)) if not lookup(path, k).num_rows)
    opened.clear()
    lookup(path, absent)
    lookup_object = lookup_module.KeyLookup.of(LogTable(path).snapshot())
    wanted = lookup_module.wanted_keys([absent], lookup_object.snapshot.arrow_schema, ["key"])
    maybe = 0
    for data_file in lookup_object.files:
        metadata = pq.read_metadata(f"{path}/{data_file.path}")
        with open(f"{path}/{data_file.path}", "rb") as f:
            maybe += bool(
                lookup_module.candidate_row_groups(pa.PythonFile(f), metadata, wanted, ["key"])
            )
    assert len(opened) == maybe < 10
    # a new version: its new files are read, the kept ones stay right, time travel too
    build_more(path, rng, 20_000)
    for keys in key_sets:
        assert answer_rows(lookup(path, keys)) == state_rows(path, keys)
        assert lookup(path, keys, as_of=4).equals(cold[key_sets.index(keys)])
    assert len(LOOKUP_FILES) == live_files(path) == 8 + 2  # the new ones added


def live_files(path: str) -> int:
    return len(list(LogTable(path).snapshot().data_files()))


def build_more(path: str, rng: np.random.Generator, keys: int) -> None:
    """One more dirty batch on ``build_log``'s log, tombstones included (a new version)."""
    snapshot = LogTable(path).snapshot()
    ends = snapshot.log_end_offsets()
    ids = rng.integers(0, keys, 3000)
    adds = []
    for p in range(2):
        mine = ids[ids % 2 == p]
        key = pc.binary_join_element_wise("k", pc.cast(pa.array(mine), pa.string()), "")
        dead = pa.array(rng.random(len(mine)) < 0.3)
        table = pa.table(
            {
                "key": key,
                "value": pc.if_else(dead, pa.nulls(len(mine), pa.string()), key),
                "partition": pa.array(np.full(len(mine), p, np.int32)),
                "offset": pa.array(np.arange(ends[p], ends[p] + len(mine), dtype=np.int64)),
            }
        )
        ends[p] += len(mine)
        task = SegmentWriterTask(
            table_uri=path,
            schema=snapshot.arrow_schema,
            stats_columns=("key", "partition", "offset"),
            max_file_bytes=1 << 30,
            group_column=None,
            storage_options={},
            key_columns=("key",),
        )
        batches = table.cast(task.schema).to_batches()
        adds += [WrittenSegment(**r) for b in task(iter(batches)) for r in b.to_pylist()]
    snapshot.commit(
        adds=adds,
        data_change=True,
        transactions={LOG_END_OFFSET_TXN.format(p): e for p, e in ends.items()},
        info={"operation": "x"},
    )
