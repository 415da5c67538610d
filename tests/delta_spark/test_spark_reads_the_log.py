"""Spark's own Delta reads what the sink writes, and a table delta-spark created first.

``spark.read.format("delta")`` gives ``log()``'s records; ``VERSION AS OF`` and
``TIMESTAMP AS OF``, folded to the latest record per key, give ``state(as_of=...)``;
``DESCRIBE HISTORY`` tells appends, passes and schema changes apart (``userMetadata``).
A table delta-spark created (``CREATE TABLE ... USING delta``, also with deletion vectors
and column mapping by name, as Databricks creates them) is adopted or refused by name.
"""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from sinks import CleanerConfig, CompactedSinkError, CompactedStateSink, read_state

pytestmark = pytest.mark.delta_spark

SCHEMA = "key string, value string, partition int"


def latest_per_key(records: DataFrame) -> DataFrame:
    """The state Delta's reader gives when folded as the sink folds: latest offset per key,
    tombstones dropped."""
    newest = Window.partitionBy("key").orderBy(F.col("offset").desc())
    return (
        records.withColumn("_rank", F.row_number().over(newest))
        .where("_rank = 1 and value is not null")
        .select("key", "value")
    )


def build_log(spark: SparkSession, path: str) -> CompactedStateSink:
    """Appends with tombstones, a pass, a schema change, and an append after it."""
    sink = CompactedStateSink(path, config=CleanerConfig(min_cleanable_dirty_ratio=1.0))
    sink(spark.createDataFrame([(f"k{i}", f"a{i}", i % 2) for i in range(12)], SCHEMA), 0)
    second = [(f"k{i}", f"b{i}", i % 2) for i in range(6)] + [("k7", None, 1)]
    sink(spark.createDataFrame(second, SCHEMA), 1)
    assert sink.clean(force=True) is not None
    third = [(f"k{i}", f"c{i}", i % 2, i) for i in range(3)]
    sink(spark.createDataFrame(third, f"{SCHEMA}, extra int"), 2)
    return sink


def test_spark_delta_reads_log_state_as_of_and_history(delta_spark, lake) -> None:
    spark, path = delta_spark, str(lake / "log")
    sink = build_log(spark, path)

    assert_df_equality(
        spark.read.format("delta").load(path),
        sink.log(),
        ignore_row_order=True,
        ignore_nullable=True,
    )

    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    for row in history:
        assert_df_equality(
            latest_per_key(spark.sql(f"SELECT * FROM delta.`{path}` VERSION AS OF {row.version}")),
            sink.state(as_of=row.version).select("key", "value"),
            ignore_row_order=True,
            ignore_nullable=True,
        )
    last = history[-1]
    at = last.timestamp.strftime("%Y-%m-%d %H:%M:%S.%f")
    assert_df_equality(
        latest_per_key(spark.sql(f"SELECT * FROM delta.`{path}` TIMESTAMP AS OF '{at}'")),
        sink.state(as_of=last.timestamp).select("key", "value"),
        ignore_row_order=True,
        ignore_nullable=True,
    )

    lines = [row.userMetadata for row in history[1:]]
    assert [line.split(":")[0] for line in lines] == [
        "compacted-sink append",
        "compacted-sink append",
        "compacted-sink clean",
        "compacted-sink schema change",
        "compacted-sink append",
    ]
    assert "batch 1 of " in lines[1] and "partition(s) 0 to offset" in lines[2]


CREATED_BY_SPARK = {
    "plain": "",
    "deletion vectors": "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
    "column mapping by name": (
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
        "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')"
    ),
}


@pytest.mark.parametrize("features", list(CREATED_BY_SPARK))
def test_a_table_delta_spark_created_is_adopted_or_refused_by_name(
    delta_spark, lake, features
) -> None:
    spark, path = delta_spark, str(lake / "log")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (key string, value string, partition int) USING delta "
        + CREATED_BY_SPARK[features]
    )
    try:
        sink = CompactedStateSink(path)
        sink(spark.createDataFrame([("a", "1", 0), ("b", "2", 0), ("a", "3", 0)], SCHEMA), 0)
    except CompactedSinkError as refused:
        # Columns stored as col-<uuid>: the sink reads and writes Parquet columns by name.
        assert features == "column mapping by name", str(refused)
        assert "columnMapping" in str(refused) and "stored as 'col-" in str(refused)
        return
    assert features != "column mapping by name", "a column-mapped table was not refused"
    expected = {"a": "3", "b": "2"}
    assert {r.key: r.value for r in sink.state().collect()} == expected
    arrow = read_state(path)
    assert dict(zip(arrow["key"].to_pylist(), arrow["value"].to_pylist(), strict=True)) == (
        expected
    )
    assert_df_equality(
        spark.read.format("delta").load(path).select("key", "value", "partition"),
        sink.log().select("key", "value", "partition"),
        ignore_row_order=True,
        ignore_nullable=True,
    )
