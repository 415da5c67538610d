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
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

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
    build their sessions here too, with their own sizes). A JVM started here logs errors
    only, while it starts too, unless the user configures log4j (`_quiet_start`).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {**LOCAL_CONF, **(conf or {})}
    builder = SparkSession.builder.master(master or os.environ.get("SPARK_MASTER", "local[*]"))
    builder = builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _quiet_start(settings):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# What the JVM logs while it starts, before `setLogLevel` can be called (Spark's "default
# log4j profile" and "default log level" lines, a hostname that resolves to a loopback
# address, Hadoop's native library): errors only, as after the start. pyspark's gateway is
# the logger Spark takes a shell's level from: at the root's level, or Spark prints the level
# it sets. Log4j reads its configuration file from this variable (the environment's name for
# log4j2.configurationFile).
LOG4J_ENV = "LOG4J_CONFIGURATION_FILE"
# The files log4j2 takes from Spark's configuration directory (not the shipped `.template`).
LOG4J2_FILES = ("log4j2.properties", "log4j2.xml", "log4j2.json", "log4j2.yaml", "log4j2.yml")
START_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


@contextmanager
def _quiet_start(settings: Mapping[str, str]) -> Iterator[None]:
    """A JVM started inside this block logs errors only while it starts, unless the user's
    own log4j configuration applies (`_own_log4j`). Only the JVM pyspark launches here sees
    the variable: processes started later (a broker, a Connect server) do not."""
    if _own_log4j(settings):
        yield
        return
    path = Path(tempfile.gettempdir()) / f"compacted-sink-start-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != START_LOG4J2:
        staged = path.with_name(f"{path.name}.{os.getpid()}")
        staged.write_text(START_LOG4J2)
        staged.replace(path)
    os.environ[LOG4J_ENV] = str(path)
    try:
        yield
    finally:
        os.environ.pop(LOG4J_ENV, None)


def _own_log4j(settings: Mapping[str, str]) -> bool:
    """Whether the user configures log4j for this JVM: the variable itself, a log4j option
    among the driver's Java options or spark-submit's, or a log4j2 file (or a
    spark-defaults.conf naming log4j) in SPARK_CONF_DIR or SPARK_HOME/conf."""
    if LOG4J_ENV in os.environ:
        return True
    options = [
        settings.get("spark.driver.extraJavaOptions", ""),
        settings.get("spark.driver.defaultJavaOptions", ""),
        os.environ.get("PYSPARK_SUBMIT_ARGS", ""),
        os.environ.get("SPARK_SUBMIT_OPTS", ""),
        os.environ.get("JAVA_TOOL_OPTIONS", ""),
    ]
    if any("log4j" in option for option in options):
        return True
    conf_dirs = [os.environ.get("SPARK_CONF_DIR")]
    if os.environ.get("SPARK_HOME"):
        conf_dirs.append(os.path.join(os.environ["SPARK_HOME"], "conf"))
    for directory in filter(None, conf_dirs):
        conf = Path(directory)
        if any((conf / name).is_file() for name in LOG4J2_FILES):
            return True
        defaults = conf / "spark-defaults.conf"
        if defaults.is_file() and "log4j" in defaults.read_text(errors="replace"):
            return True
    return False


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
