"""The classic session with Spark's own Delta (delta-spark) on it.

`make jars` fetches delta-spark for the pyspark of `.venv-spark4.2` (delta-spark 4.4 is built
for Spark 4.0-4.2, none for 4.3); the root conftest puts the jars and Delta's extension and
catalog on the classic session. On a pyspark without them the tests skip, unless
``COMPACTED_SINK_DELTA_TESTS=required`` (`make test-delta-spark`) makes that a failure.
"""

from __future__ import annotations

import os

import pytest
from pyspark.sql import SparkSession

from sinks.log.delta_spark_policy import DELTA_SPARK_CONF, has_delta_spark


@pytest.fixture
def delta_spark(classic_spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> SparkSession:
    """The classic session, with delta-spark on it."""
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    if not has_delta_spark({k: classic_spark.conf.get(k, None) for k in DELTA_SPARK_CONF}):
        reason = "delta-spark is not on this session: run `make jars` and use .venv-spark4.2"
        if os.environ.get("COMPACTED_SINK_DELTA_TESTS") == "required":
            pytest.fail(reason)
        pytest.skip(reason)
    return classic_spark
