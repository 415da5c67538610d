"""The benchmark's one SparkSession: local[2], zstd Parquet, Delta's timestamp type."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from streaming.session import local_session


def bench_session(driver_memory: str = "3g") -> SparkSession:
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.parquet.compression.codec": "zstd",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.driver.memory": driver_memory,
    }
    return local_session("compacted-sink-bench", "local[2]", conf=conf)
