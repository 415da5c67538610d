"""`sinks.lookup` (no Spark) against the model and `read_state`, and its key filter.

Pure tests check the key filter on its own: the hash against XXH64's published values,
no false negative on filters pyarrow writes, the writers' files carrying it, a file
without it read whole. The sink builds the other logs (real Delta; its batches through
`testkit.arrow_append`, the Python segment writer a small Spark batch takes too, except where
Spark's input is the subject: Spark's writer, composite keys with struct values, the CLI;
passes on Spark); every lookup is then compared with the replay model of the workload and
with `read_state`, in pure Python: random workloads with tombstones, passes and a dirty region, time
travel, another engine's OPTIMIZE, Spark's writer, composite keys with a sequence
column, ``delete_records``, unknown and deleted keys, and the CLI.
"""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from testkit import arrow_append

from sinks import BadInputError, CleanerConfig, CompactedStateSink, lookup, read_state
from sinks.log.key_filter import (
    block_indexes,
    blocks_contain,
    filtered_columns,
    key_filter_options,
    key_hashes,
    parse_filter_header,
    spark_key_filter_options,
    xxhash64,
    xxhash64_many,
)
from sinks.log.location import LogLocation
from sinks.log.segment_writer import SegmentWriterTask
from sinks.reading.lookup import candidate_row_groups, wanted_keys
from sinks.reading.parquet_pages import PageReader, leaf_index
from streaming.cli import main

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
KVP = "key string, value string, partition int"


# -- pure: the key filter --------------------------------------------------------------------


def test_xxhash64_many_equals_xxhash64_at_every_length():
    rng = random.Random(11)
    values = [bytes(rng.randrange(256) for _ in range(n)) for n in range(0, 100) for _ in range(3)]
    rng.shuffle(values)
    assert xxhash64_many(values).tolist() == [xxhash64(v) for v in values]
    assert xxhash64_many([]).tolist() == []


def test_xxhash64_gives_the_published_values():
    assert xxhash64(b"") == 0xEF46DB3751D8E999
    assert xxhash64(b"a") == 0xD24EC4F1A98C6E5B
    assert xxhash64(b"abc") == 0x44BC2CF5AD770999
    assert xxhash64(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1


def _written(table: pa.Table, columns, rows_per_group: int) -> bytes:
    sink = io.BytesIO()
    options = key_filter_options(table.schema, columns, rows_per_group)
    pq.write_table(table, sink, bloom_filter_options=options, row_group_size=rows_per_group)
    return sink.getvalue()


def _probe_all(data: bytes, column: str, values: pa.Array) -> list[np.ndarray]:
    """Per row group: which of ``values`` its filter on ``column`` may hold."""
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    index = metadata.schema.names.index(column)
    answers = []
    for g in range(metadata.num_row_groups):
        chunk = metadata.row_group(g).column(index)
        offset = chunk.bloom_filter_offset
        header, size = parse_filter_header(data[offset : offset + 64])
        assert header + size == chunk.bloom_filter_length
        words = np.frombuffer(data[offset + header : offset + header + size], "<u4").reshape(-1, 8)
        hashes = key_hashes(values, chunk.physical_type)
        answers.append(blocks_contain(words[block_indexes(hashes, size)], hashes))
    return answers


@pytest.mark.parametrize(
    "values",
    [
        pa.array([f"key-{i}-" + "x" * (i % 40) for i in range(6000)]),
        pa.array([random.Random(i).getrandbits(62) - 2**61 for i in range(6000)], pa.int64()),
        pa.array([i * 7919 - 2**30 for i in range(6000)], pa.int32()),
        pa.array([f"b{i}".encode() for i in range(6000)], pa.binary()),
    ],
    ids=["string", "int64", "int32", "binary"],
)
def test_filters_pyarrow_writes_have_no_false_negative_and_few_false_positives(values):
    data = _written(pa.table({"k": values}), ["k"], 2000)
    for g, maybe in enumerate(_probe_all(data, "k", values)):
        inside = np.zeros(len(values), bool)
        inside[g * 2000 : (g + 1) * 2000] = True
        assert maybe[inside].all()  # never a false "no"
        assert maybe[~inside].mean() < 0.03  # the filter's rate is 1 %


def test_only_split_block_xxhash_uncompressed_filters_are_understood():
    block = b"\x15\x80\x01\x1c\x1c\x00\x00\x1c\x1c\x00\x00\x1c\x1c\x00\x00\x00"
    assert parse_filter_header(block) == (len(block), 64)
    other = b"\x15\x80\x01\x1c\x2c\x00\x00\x1c\x1c\x00\x00\x1c\x1c\x00\x00\x00"
    assert parse_filter_header(other) is None  # an algorithm this reader does not know
    assert parse_filter_header(b"\x15\x80\x01\x1c\x2c\x00\x00\x1c\x1c\x00") is None
    assert parse_filter_header(b"\x00") is None


def test_only_key_columns_a_lookup_hashes_get_a_filter():
    schema = pa.schema(
        [("s", pa.string()), ("i", pa.int16()), ("flag", pa.bool_()), ("day", pa.date32()),
         ("nested", pa.struct([("x", pa.int64())]))]
    )  # fmt: skip
    columns = ["s", "i", "flag", "day", "nested", "absent"]
    assert filtered_columns(schema, columns) == ["s", "i"]
    assert set(key_filter_options(schema, columns, 10)) == {"s", "i"}
    spark = spark_key_filter_options(schema, ["flag", "day"])
    assert spark == {}  # Arrow and parquet-mr refuse a filter on a boolean


def test_spark_writers_filter_is_sized_for_a_file_when_its_rows_are_known():
    schema = pa.schema([("s", pa.string())])
    adaptive = spark_key_filter_options(schema, ["s"])
    assert adaptive["parquet.bloom.filter.adaptive.enabled"] == "true"
    assert "parquet.bloom.filter.expected.ndv#s" not in adaptive
    sized = spark_key_filter_options(schema, ["s"], rows_per_file=500_000)
    assert sized["parquet.bloom.filter.expected.ndv#s"] == "500000"
    assert sized["parquet.bloom.filter.enabled#s"] == "true"
    assert not any("adaptive" in k or "candidates" in k for k in sized)


def test_unsupported_key_types_are_never_skipped():
    dates = pa.array([1, 2], pa.date32())
    assert key_hashes(dates, "INT32") is None
    assert key_hashes(pa.array(["a"]), "INT64") is None


def test_the_segment_writer_puts_a_filter_on_the_key_columns(tmp_path):
    schema = pa.schema(
        [("tenant", pa.string()), ("id", pa.int64()), ("value", pa.string()),
         ("partition", pa.int32()), ("offset", pa.int64())]
    )  # fmt: skip
    task = SegmentWriterTask(
        table_uri=str(tmp_path),
        schema=schema,
        stats_columns=("tenant", "id", "partition", "offset"),
        max_file_bytes=1 << 30,
        group_column=None,
        storage_options={},
        key_columns=("tenant", "id"),
    )
    rows = pa.table(
        {"tenant": ["t"] * 5, "id": list(range(5)), "value": list("abcde"),
         "partition": [0] * 5, "offset": list(range(5))},
        schema=schema,
    )  # fmt: skip
    (written,) = pa.Table.from_batches(list(task(iter(rows.to_batches())))).to_pylist()
    metadata = pq.read_metadata(tmp_path / written["path"])
    chunks = {
        metadata.schema.column(i).name: metadata.row_group(0).column(i)
        for i in range(metadata.num_columns)
    }
    assert chunks["tenant"].bloom_filter_offset is not None
    assert chunks["id"].bloom_filter_offset is not None
    assert chunks["value"].bloom_filter_offset is None
    assert chunks["id"].bloom_filter_length < 1024  # sized for 5 keys, not for a row group
    wanted = wanted_keys([("t", 3), ("t", 99), ("u", 3)], schema, ["tenant", "id"])
    location = LogLocation(str(tmp_path), {})
    fs, root = location.filesystem()
    with fs.open_input_file(f"{root}/{written['path']}") as source:
        assert candidate_row_groups(source, metadata, wanted, ["tenant", "id"]) == [0]
        absent = wanted_keys([("t", 99), ("u", 3)], schema, ["tenant", "id"])
        assert candidate_row_groups(source, metadata, absent, ["tenant", "id"]) == []


def test_a_file_without_filters_is_read_whole(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"key": ["a", "b"]}), path, row_group_size=1)
    metadata = pq.read_metadata(path)
    wanted = wanted_keys(["zzz"], pa.schema([("key", pa.string())]), ["key"])
    with open(path, "rb") as f:
        source = pa.PythonFile(f)
        assert candidate_row_groups(source, metadata, wanted, ["key"]) == [0, 1]


def test_wanted_keys_cast_to_the_key_types_and_refuse_what_does_not_fit():
    schema = pa.schema([("tenant", pa.string()), ("id", pa.int64())])
    table = wanted_keys(
        [("t", "42"), ("t", 42), {"tenant": "u", "id": 1}], schema, ["tenant", "id"]
    )
    assert table.select(["tenant", "id"]).to_pylist() == [
        {"tenant": "t", "id": 42},
        {"tenant": "u", "id": 1},
    ]
    with pytest.raises(BadInputError, match="2 columns"):
        wanted_keys(["t"], schema, ["tenant", "id"])
    with pytest.raises(BadInputError, match="key column 'id'"):
        wanted_keys([("t", "x")], schema, ["tenant", "id"])
    with pytest.raises(BadInputError, match="null"):
        wanted_keys([("t", None)], schema, ["tenant", "id"])


# -- against the model and read_state -----------------------------------------------------------


def model_at(history: list[list[tuple]]) -> dict[str, tuple[str, int]]:
    """key -> (value, partition) after the batches of ``history``; tombstones remove."""
    state: dict[str, tuple[str, int]] = {}
    for rows in history:
        for key, value, partition in rows:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = (value, partition)
    return state


def found(table: pa.Table) -> dict[str, tuple[str, int]]:
    rows = table.to_pylist()
    result = {r["key"]: (r["value"], r["partition"]) for r in rows}
    assert len(result) == len(rows), "a key came back twice"
    return result


def assert_lookups_match(path: str, keys: list[str], expected: dict, as_of=None) -> None:
    """lookup of every key (one by one and all at once) equals the model and read_state."""
    together = lookup(path, keys, as_of=as_of)
    assert found(together) == {k: v for k, v in expected.items() if k in keys}
    asked = [k for k in keys if k in expected]
    assert together.column("key").to_pylist() == asked  # in the order asked
    state = {r["key"]: r["value"] for r in read_state(path, as_of=as_of).to_pylist()}
    assert {k: v for k, (v, _) in found(together).items()} == {
        k: v for k, v in state.items() if k in keys
    }
    for key in random.Random(len(keys)).sample(keys, min(8, len(keys))):
        alone = found(lookup(path, key, as_of=as_of))
        assert alone == ({key: expected[key]} if key in expected else {})


def random_batch(rng: random.Random, batch_id: int, keys: int) -> list[tuple]:
    rows = []
    for j in range(rng.randint(5, 40)):
        n = rng.randrange(keys)
        value = None if rng.random() < 0.2 else f"v{batch_id}.{j}"
        rows.append((f"k{n}", value, n % 3))  # a key stays in its partition
    return rows


@pytest.mark.parametrize("seed", [1, 2])
def test_random_workloads_with_passes_a_dirty_region_and_time_travel(spark, lake, clock, seed):
    rng = random.Random(seed)
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    history: list[list[tuple]] = []
    versions: list[tuple[int, int]] = []  # (Delta version, batches applied)
    for batch_id in range(8):
        rows = random_batch(rng, batch_id, 40)
        arrow_append(sink, rows, KVP, batch_id, spark=spark)
        history.append(rows)
        if rng.random() < 0.4:
            sink.clean(force=True)
        versions.append((sink.log_table.snapshot().version, len(history)))
    keys = [f"k{n}" for n in range(45)]  # 5 never written
    assert_lookups_match(path, keys, model_at(history))
    for version, applied in rng.sample(versions, 3):
        assert_lookups_match(path, keys, model_at(history[:applied]), as_of=version)


def test_another_engines_optimize_leaves_files_without_filters_that_are_read(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    rng = random.Random(7)
    history = []
    for batch_id in range(5):
        history.append(random_batch(rng, batch_id, 30))
        arrow_append(sink, history[-1], KVP, batch_id, spark=spark)
        if batch_id == 2:
            sink.clean(force=True)
    DeltaTable(path).optimize.compact()
    keys = [f"k{n}" for n in range(32)]
    assert_lookups_match(path, keys, model_at(history))
    snapshot = sink.log_table.snapshot()
    assert snapshot.foreign_files
    for data_file in snapshot.foreign_files:  # delta-rs writes no key filter: read whole
        metadata = pq.read_metadata(f"{path}/{data_file.path}")
        index = metadata.schema.names.index("key")
        assert metadata.row_group(0).column(index).bloom_filter_offset is None
    history.append(random_batch(rng, 5, 30))
    arrow_append(sink, history[-1], KVP, 5, spark=spark)
    sink.clean(force=True)
    assert_lookups_match(path, keys, model_at(history))


def test_spark_writers_files_carry_the_filter(spark, lake, clock, monkeypatch):
    monkeypatch.setenv("COMPACTED_SINK_APPEND_WRITER", "spark")
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    rows = [(f"k{n}", f"v{n}", n % 2) for n in range(200)]
    batch = spark.range(0, 200, numPartitions=2).selectExpr(
        "format_string('k%d', id) AS key",
        "format_string('v%d', id) AS value",
        "CAST(id % 2 AS INT) AS partition",
    )
    sink(batch, 0)
    snapshot = sink.log_table.snapshot()
    for segment in snapshot.all_segments():
        metadata = pq.read_metadata(f"{path}/{segment.path}")
        assert "parquet-mr" in metadata.created_by  # Spark's writer wrote it
        index = metadata.schema.names.index("key")
        chunk = metadata.row_group(0).column(index)
        assert chunk.bloom_filter_offset is not None
        assert chunk.bloom_filter_length < 1_000  # sized for a file's 50 rows (adaptive: 8 KiB)
        source = pa.OSFile(
            f"{path}/{segment.path}"
        )  # parquet-mr writes the page index: read by pages
        pages = PageReader.of(source)
        leaf = leaf_index(metadata, "value")
        assert pages is not None and pages.pages_of(source, 0, leaf) is not None
        at = {0: np.array([0, metadata.row_group(0).num_rows - 1])}
        whole = pq.ParquetFile(source).read_row_group(0, columns=["value"]).column(0)
        by_pages = pages.take(source, leaf, at)
        assert by_pages.combine_chunks().equals(whole.take(at[0]).combine_chunks())
    assert_lookups_match(path, ["k3", "k150", "nope"], model_at([rows]))


def test_composite_keys_with_a_sequence_column_and_struct_values(spark, lake, clock):
    schema = "tenant string, id long, value struct<name: string, n: long>, seq long, topic string"
    path = str(lake / "log")
    sink = CompactedStateSink(
        path, key_columns=("tenant", "id"), sequence_column="seq", config=NO_CLEAN, clock=clock
    )
    first = [("t1", 1, ("a", 1), 10, "x"), ("t1", 2, ("b", 2), 5, "x"), ("t2", 1, ("c", 3), 1, "y")]
    sink(spark.createDataFrame(first, schema).coalesce(1), 0)
    sink.clean(force=True)
    tail = [("t1", 1, ("a-old", 9), 3, "z"), ("t1", 2, ("b2", 4), 6, "z"), ("t2", 1, None, 2, "z")]
    sink(spark.createDataFrame(tail, schema).coalesce(1), 1)
    got = lookup(path, [("t1", 1), ("t1", 2), ("t2", 1), ("t9", 1)])
    assert got.schema.names == [
        "tenant", "id", "value", "seq", "topic", "partition", "offset", "timestamp"
    ]  # fmt: skip
    rows = {(r["tenant"], r["id"]): (r["value"], r["seq"], r["topic"]) for r in got.to_pylist()}
    assert rows == {
        ("t1", 1): ({"name": "a", "n": 1}, 10, "x"),  # the clean record's sequence is higher
        ("t1", 2): ({"name": "b2", "n": 4}, 6, "z"),
    }
    state = read_state(path).select(["tenant", "id", "value", "seq", "topic"]).to_pylist()
    assert sorted(got.select(["tenant", "id", "value", "seq", "topic"]).to_pylist(), key=str) == (
        sorted(state, key=str)
    )
    assert lookup(path, {"tenant": "t1", "id": "2"}).column("seq").to_pylist() == [6]


def test_delete_records_hides_what_lies_below_the_log_start(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    first = [("a", "a1", 0), ("b", "b1", 0), ("c", "c1", 0), ("d", "d1", 0)]
    arrow_append(sink, first, KVP, 0, spark=spark)
    arrow_append(sink, [("b", "b2", 0), ("e", "e1", 0)], KVP, 1, spark=spark)
    sink.clean(force=True)  # clean: c1 d1 b2 e1 at offsets 2..5
    arrow_append(sink, [("c", None, 0), ("f", "f1", 0)], KVP, 2, spark=spark)
    sink.delete_records(0, 3)  # c1 goes
    keys = list("abcdef")
    assert found(lookup(path, keys)) == {
        "d": ("d1", 0), "b": ("b2", 0), "e": ("e1", 0), "f": ("f1", 0)
    }  # fmt: skip
    assert found(lookup(path, keys, as_of=3))["c"] == ("c1", 0)  # before the delete


def test_a_missing_log_and_the_cli(spark, lake, clock, capsys):
    with pytest.raises(FileNotFoundError, match="no compacted log"):
        lookup(str(lake / "nothing"), "a")
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    rows = [("a", "a1", 0), ("b", "b1", 1), ("b", None, 1), ("c", '{"n": 1}', 0)]
    sink(spark.createDataFrame(rows, KVP).coalesce(1), 0)
    assert main(["lookup", path, "c", "b", "a", "zz"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[:2] for line in lines] == [
        ["c", '{"n": 1}'], ["b", "(no live record)"], ["a", "a1"], ["zz", "(no live record)"]
    ]  # fmt: skip
    assert "[partition 0, offset 0, " in lines[2]
    assert main(["lookup", "--json", path, "a"]) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["key"] == "a" and record["value"] == "a1" and record["offset"] == 0
    assert main(["lookup", "--as-of", "0", path, "a"]) == 0
    assert main(["lookup", str(lake / "nothing"), "a"]) == 1
    assert "no compacted log" in capsys.readouterr().err
