"""The `foreachBatch` upsert Delta's docs write, shared by the benches' delta-spark systems.

Imports only pyspark, so the peers' venv (a pyspark without this package) uses it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def latest_per_key(df: DataFrame) -> DataFrame:
    """One row per key, its highest ``seq`` (Delta docs' ``max(struct(...))`` dedupe)."""
    latest = df.groupBy("key").agg(F.max_by(F.struct("value", "seq"), "seq").alias("l"))
    return latest.select("key", "l.value", "l.seq")


@contextmanager
def delta_txn(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """delta-spark's idempotent-DML session settings around one write, unset after it."""
    spark.conf.set(TXN_APP_ID, app_id)
    spark.conf.set(TXN_VERSION, str(version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID)
        spark.conf.unset(TXN_VERSION)


def merge_batch(
    spark: SparkSession, table_uri: str, source: DataFrame, *, view: str, app_id: str, batch_id: int
) -> dict[str, Any]:
    """``MERGE INTO`` the table from ``source`` (latest per key): a null value deletes its key.
    Idempotent per (``app_id``, ``batch_id``). Returns the MERGE's metrics row."""
    source.createOrReplaceTempView(view)
    with delta_txn(spark, app_id, batch_id):
        metrics = spark.sql(
            f"MERGE INTO delta.`{table_uri}` AS t USING {view} AS s "
            "ON t.key = s.key "
            "WHEN MATCHED AND s.value IS NULL THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET * "
            "WHEN NOT MATCHED AND s.value IS NOT NULL THEN INSERT *"
        ).collect()
    return metrics[0].asDict() if metrics else {}
