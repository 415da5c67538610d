"""The sessions a job starts: embedded local Spark, or a Spark Connect server.

``local_session`` is the embedded default (local Spark, UTC, few shuffle
partitions). ``remote_session`` connects to a Spark Connect server (open-source
Spark 4's ``start-connect-server.sh``, or Databricks through a
``sc://<workspace>:443/;token=…;x-databricks-cluster-id=…`` URL); the CLI takes
it from ``--remote`` or the ``SPARK_REMOTE`` environment variable, as pyspark does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

REMOTE_ENV = "SPARK_REMOTE"
LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
}


def local_session(
    app_name: str = "compacted-sink",
    master: str | None = None,
    *,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for jobs and notebooks: ``local[*]`` unless ``master`` or SPARK_MASTER say.

    ``conf`` adds or overrides settings (tests, benchmarks and the cluster harness
    build their sessions here too, with their own sizes).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {**LOCAL_CONF, **(conf or {})}
    builder = SparkSession.builder.master(master or os.environ.get("SPARK_MASTER", "local[*]"))
    builder = builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def remote_session(url: str, app_name: str = "compacted-sink") -> SparkSession:
    """A Spark Connect session to ``url`` (``sc://host:port``, with ``/;key=value`` parameters).

    Needs the Connect client's packages (``pip install 'compacted-sink[connect]'``).
    The server's Python workers run the sink's ``foreachBatch`` hook: they need this
    project and its dependencies installed beside the server.
    """
    if not url.startswith("sc://"):
        raise ValueError(f"a Spark Connect URL starts with sc:// (got {url!r})")
    try:
        import grpc  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "a Spark Connect session needs the Connect client packages: "
            "pip install 'compacted-sink[connect]'"
        ) from e
    return SparkSession.builder.remote(url).appName(app_name).getOrCreate()
