"""The embedded default SparkSession: local Spark, UTC, few shuffle partitions."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def local_session(app_name: str = "compacted-sink", master: str | None = None) -> SparkSession:
    """A SparkSession for jobs and notebooks: ``local[*]`` unless ``master`` or SPARK_MASTER say."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master or os.environ.get("SPARK_MASTER", "local[*]"))
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
