"""`read_files`: log files read on executors through pyarrow give what Spark's reader gives."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from chispa import assert_df_equality
from pyspark.sql.types import LongType, StringType, StructField, StructType

from sinks.log.file_reader import read_files
from sinks.log.location import LogLocation

SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("value", StringType()),
        StructField("offset", LongType()),
    ]
)


def write(path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def test_rows_equal_sparks_own_parquet_reader(spark, tmp_path):
    for part in range(3):
        offsets = list(range(part * 100, part * 100 + 100))
        write(
            tmp_path / f"partition-{part}" / f"{part:020d}.parquet",
            pa.table(
                {
                    "key": [f"k{o % 17}" for o in offsets],
                    "value": [None if o % 9 == 0 else f"v{o}" for o in offsets],
                    "offset": pa.array(offsets, pa.int64()),
                }
            ),
        )
    paths = [f"partition-{p}/{p:020d}.parquet" for p in range(3)]
    ours = read_files(spark, LogLocation(str(tmp_path)), paths, SCHEMA)
    sparks = spark.read.schema(SCHEMA).parquet(*[str(tmp_path / p) for p in paths])
    assert ours.schema == SCHEMA
    assert_df_equality(ours, sparks, ignore_row_order=True)


def test_missing_columns_are_null_and_extra_columns_dropped(spark, tmp_path):
    write(
        tmp_path / "old.parquet",
        pa.table({"offset": pa.array([0, 1], pa.int32()), "key": ["a", "b"], "extra": [1, 2]}),
    )
    rows = read_files(spark, LogLocation(str(tmp_path)), ["old.parquet"], SCHEMA).collect()
    assert sorted(tuple(r) for r in rows) == [("a", None, 0), ("b", None, 1)]


def test_no_paths_gives_an_empty_frame_of_the_schema(spark, tmp_path):
    df = read_files(spark, LogLocation(str(tmp_path)), [], SCHEMA)
    assert df.schema == SCHEMA and df.count() == 0


def test_relative_table_path_is_resolved_on_the_driver(spark, tmp_path, monkeypatch):
    write(tmp_path / "lake" / "f.parquet", pa.table({"key": ["a"], "value": ["1"], "offset": [7]}))
    monkeypatch.chdir(tmp_path)
    rows = read_files(spark, LogLocation("lake"), ["f.parquet"], SCHEMA).collect()
    assert [tuple(r) for r in rows] == [("a", "1", 7)]
