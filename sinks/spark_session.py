"""What the sink needs from a SparkSession, on a classic session and on Spark Connect.

A `foreachBatch` function under Spark Connect runs in a Python process beside the
server with a Connect session: no `SparkContext`, no JVM gateway. Everything the
sink asks of a session goes through here, so the rest of the code never touches
``sparkContext``.
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession


def is_connect(spark: SparkSession) -> bool:
    """True when ``spark`` is a Spark Connect session (no SparkContext behind it)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """How many tasks the cluster runs at once (Spark's ``defaultParallelism``)."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    return os.cpu_count() or 1
