"""Spark's own Delta reads what the sink writes, and a table delta-spark created first.

``spark.read.format("delta")`` gives ``log()``'s records; ``VERSION AS OF`` and
``TIMESTAMP AS OF``, folded to the latest record per key, give ``state(as_of=...)``;
``DESCRIBE HISTORY`` tells appends, passes and schema changes apart (``userMetadata``).
A table delta-spark created (``CREATE TABLE ... USING delta``, also with deletion vectors
and column mapping by name, as Databricks creates them) is refused as not a compacted log;
a column delta-spark stores under another physical name is refused by every reader.
"""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from sinks import (
    CleanerConfig,
    CompactedStateSink,
    NotACompactedLogError,
    TableFeatureError,
    read_state,
)

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
    "column mapping by name": "TBLPROPERTIES ('delta.columnMapping.mode' = 'name')",
}


@pytest.mark.parametrize("features", list(CREATED_BY_SPARK))
def test_a_table_delta_spark_created_is_refused_saying_what_to_do(
    delta_spark, lake, features
) -> None:
    spark, path = delta_spark, str(lake / "log")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (key string, value string, partition int) USING delta "
        + CREATED_BY_SPARK[features]
    )
    # A table without the marks the sink leaves on its logs is someone else's: refused
    # before anything is written, saying what it is and what to do.
    with pytest.raises(NotACompactedLogError, match="is not a compacted log") as refused:
        CompactedStateSink(path)(spark.createDataFrame([("a", "1", 0)], SCHEMA), 0)
    assert "Nothing was written" in str(refused.value)
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count() == 1
    with pytest.raises(NotACompactedLogError):
        read_state(path)


def test_a_column_delta_spark_stores_under_another_name_is_refused_by_every_reader(
    delta_spark, lake
) -> None:
    """Column mapping by name turned on for a log, then a column added by delta-spark: it is
    stored as ``col-<uuid>``, which the sink's by-name Parquet reads would read as nulls."""
    spark, path = delta_spark, str(lake / "log")
    sink = CompactedStateSink(path)
    sink(spark.createDataFrame([("a", "1", 0), ("b", "2", 0), ("a", "3", 0)], SCHEMA), 0)
    alter = f"ALTER TABLE delta.`{path}`"
    spark.sql(f"{alter} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')")
    assert {r.key: r.value for r in sink.state().collect()} == {"a": "3", "b": "2"}
    spark.sql(f"{alter} ADD COLUMNS (note string)")
    for attempt in (
        lambda: sink.state().collect(),
        lambda: read_state(path),
        lambda: sink(spark.createDataFrame([("c", "4", 0, None)], f"{SCHEMA}, note string"), 1),
    ):
        with pytest.raises(TableFeatureError, match="columnMapping") as refused:
            attempt()
        assert "column 'note' is stored as 'col-" in str(refused.value)
