"""The benchmark's one SparkSession: local[2], zstd Parquet, Delta's timestamp type.

When `make jars` has fetched delta-spark for the running pyspark (``.jars/delta-<pyspark
version>/``: delta-spark 4.4 is built for Spark 4.0-4.2, so `make bench` runs on
``.venv-spark4.2``), its jars go on the session as local paths (nothing is downloaded when
the session starts) with Delta's extension and catalog, and the delta-spark baselines can run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from sinks.log.delta_spark_policy import DELTA_SPARK_CONF, has_delta_spark
from streaming.inputs.local_kafka import fetched_jars
from streaming.jobs.session import local_session

JARS = Path(__file__).resolve().parent.parent / ".jars"


def delta_spark_on(spark: SparkSession) -> bool:
    """Whether Spark's own Delta (delta-spark) is on ``spark``."""
    return has_delta_spark({key: spark.conf.get(key, None) for key in DELTA_SPARK_CONF})


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
    jars = fetched_jars(JARS, "delta")
    if any(Path(j).name.startswith("delta-spark_") for j in jars):
        conf["spark.jars"] = ",".join(jars)
        conf.update(DELTA_SPARK_CONF)
    return local_session("compacted-sink-bench", "local[2]", conf=conf)
