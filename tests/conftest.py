"""Sessions for the whole run and a fake clock.

Two Spark sessions: a classic one (local[2], two shuffle partitions), and a Spark
Connect session on the Connect server the classic session's JVM runs on loopback
(`ConnectServer`). ``spark`` is the classic session unless a test is marked
``both_sessions``: it then runs once on each (the Connect run also carries the
``connect`` marker, so ``-m "not connect"`` leaves it out).

A process can hold both kinds at once, but pyspark picks classic or Connect
functions (``F.col``, ``SparkSession.active()``) by the environment variable
``SPARK_CONNECT_MODE_ENABLED``: the Connect fixtures set it for the test, and
unset it otherwise.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from sinks.log.delta_spark_policy import DELTA_SPARK_CONF
from streaming.cli import main
from streaming.cli.query import _FAILURE_LOGGERS
from streaming.inputs.local_kafka import fetched_jars
from streaming.jobs.session import local_session

# testkit sits beside this file. pytest puts it on the path (pyproject's pythonpath), but a
# Spark Connect server's Python worker that unpickles a test's function imports this module
# by itself, without that setting.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_per_test import ENV as CPU_PER_TEST
from cpu_per_test import CpuPerTest
from jvm_archive import BASE_OPTIONS, jvm_options
from testkit import Oracle

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Every JVM the tests start (this session, which is their Connect server too, each process a
# test starts that starts Spark) runs seconds to minutes on small data: HotSpot's client
# compiler alone and the serial collector spend about a third less CPU there, and the
# class-data archive that `make test-setup` dumps into the venv (tests/jvm_archive.py) saves
# most of each start's class loading (docs/development.md has the figures). What the JVM
# computes is the same. A value set outside pytest is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", jvm_options())
# The standalone cluster's master and worker (started by `spark-class`, which reads this
# variable, not the one above) and the executors the tests' drivers ask for run likewise.
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", BASE_OPTIONS)
# Every process the tests start, and every Python process their Sparks start, imports this
# checkout (where the venv's editable install points elsewhere too; a Connect worker that
# unpickles a test's object imports `tests.conftest`) and loads pyspark from its installed
# package, not from the copy in a zip that Spark puts first on its Python processes' path and
# that Python compiles from source at every start (tests/worker_site/sitecustomize.py).
WORKER_SITE = str(Path(__file__).resolve().parent / "worker_site")
ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(
    dict.fromkeys(
        filter(None, [WORKER_SITE, str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])
    )
)

CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"
SESSIONS = ["classic", pytest.param("connect", marks=pytest.mark.connect)]
SESSION_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    # Spark's parallel file listing (delta-spark's VACUUM, a read of many paths) runs jobs of
    # this many tasks, 10,000 by default: one VACUUM of a three-file table ran 170,483 tasks on
    # local[2]. Two, as the shuffle partitions; the files listed are the same.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    # Spark keeps the classes it generates for 100 query plans; a session that runs the
    # whole suite's thousands of small, differently shaped queries compiled many again.
    # Four files: 575 compilations with 100, 403 with 2,000. The plans run are the same.
    "spark.sql.codegen.cache.maxEntries": "2000",
}


JARS = ROOT / ".jars"  # `make jars` fills it from Maven Central (git-ignored)
SESSION_JAR_SETS = ("spark-kafka", "delta")
# Hadoop's S3A connector (hadoop-aws and the AWS SDK bundle, about 690 MB): on the driver's
# class path, which local mode's executors share, since spark.jars copies every jar into
# each session's temporary directory.
CLASS_PATH_JAR_SETS = ("hadoop-aws",)


# delta-spark rebuilds a table's snapshot in jobs of 50 tasks by default: INSERT, DELETE,
# OPTIMIZE, RESTORE, a read and DESCRIBE HISTORY of a small table ran 2,080 tasks on local[2],
# 208 with 2 (delta-spark's own test suites set 2). With 1, a log's snapshot is one task per
# stage: delta-spark reads every table the tests change afresh (a log after the sink's commit,
# each test's copy after `DeltaLog.clearCache`), and its operation and acceptance tests took
# 314 and 329 CPU-seconds against 336 and 358 with 2. The snapshot is the same.
DELTA_SPARK_TEST_CONF = {"spark.databricks.delta.snapshotPartitions": "1"}


def session_jars(cache: Path = JARS, sets: Sequence[str] = SESSION_JAR_SETS) -> list[str]:
    """Local jars for the classic session: each set's ``<cache>/<set>-<pyspark version>/``
    that `make jars` fetched (none for a pyspark nothing was fetched for), less the
    artifacts pyspark ships itself (its own versions stay)."""
    return [j for name in sets for j in fetched_jars(cache, name)]


def build_session() -> SparkSession:
    """The tests' classic session, a Spark Connect server too (`connect_server_conf`): the
    Connect tests cost no second JVM, its start and its warm-up (a separate server's first
    Connect test took 71 CPU-seconds against 9 for its classic run)."""
    conf = {**SESSION_CONF, "spark.default.parallelism": "2", "spark.driver.memory": "2g"}
    jars = session_jars()
    server = connect_server_conf(Path(pyspark.__file__).parent)
    if server is not None:
        jars += server[0]
        conf.update(server[1])
    if jars:  # local paths: nothing is downloaded when the session starts
        conf["spark.jars"] = ",".join(jars)
    class_path = session_jars(sets=CLASS_PATH_JAR_SETS)
    if class_path:
        conf["spark.driver.extraClassPath"] = os.pathsep.join(class_path)
    if any(Path(j).name.startswith("delta-spark_") for j in jars):
        conf.update(DELTA_SPARK_CONF)  # Spark's own Delta, when its jars are there
        conf.update(DELTA_SPARK_TEST_CONF)
    return local_session("compacted-sink-tests", "local[2]", conf=conf)


# The files that take longest (wall seconds on a 2-core machine), run first: with
# `pytest -n 2 --dist loadfile` (`make test`) each worker takes the next file when it is
# done, so the long ones start early and the run does not end waiting on one of them.
# The smoke file runs among them, not last: collected in order it ran in the suite's last
# minutes, as `make test`'s other lane starts the smoke run's JVMs on pyspark 3.5, and its
# streaming read's Python process missed Spark's 10 s twice in each of two fresh clones of three.
SLOW_FIRST = (
    "tests/storage/test_object_store_faults.py",
    "tests/reliability/test_crash.py",
    "tests/streaming/test_consumer_source.py",
    "tests/produce/test_schema_evolution_stream.py",
    "tests/maintenance/test_ownership.py",
    "tests/reading/test_state_reader.py",
    "tests/smoke/test_versions.py",
    "tests/cluster/test_standalone_cluster.py",
    "tests/reliability/test_foreign_engines.py",
    "tests/log/test_accept_foreign_changes.py",
    "tests/cleaner/test_cleaner.py",
    "tests/sinks/test_shutdown.py",
    "tests/streaming/test_consumer_first_hour.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """With `CPU_PER_TEST` naming a directory, each test's CPU is written there
    (tests/cpu_per_test.py); an xdist controller writes nothing (its tree holds the workers)."""
    directory = os.environ.get(CPU_PER_TEST)
    controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if directory and not controller:
        config.pluginmanager.register(CpuPerTest(Path(directory)), "cpu_per_test")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`SLOW_FIRST`'s files first, in its order; every other test as collected."""
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}

    def file_rank(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0], len(rank))

    items.sort(key=file_rank)  # stable: a file's tests keep their order


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run a test marked ``both_sessions`` on the classic and on the Connect session."""
    if metafunc.definition.get_closest_marker("both_sessions") and "spark" in (
        metafunc.fixturenames
    ):
        metafunc.parametrize("spark", SESSIONS, indirect=True)


@pytest.fixture(scope="session")
def classic_spark() -> Iterator[SparkSession]:
    """The classic session (also for fixtures wider than a test)."""
    os.environ.pop(CONNECT_MODE, None)
    session = build_session()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def spark(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> SparkSession:
    """The classic session; the Connect one in the ``connect`` run of a ``both_sessions`` test."""
    if getattr(request, "param", "classic") == "connect":
        return request.getfixturevalue("connect_spark")
    monkeypatch.delenv(CONNECT_MODE, raising=False)
    return request.getfixturevalue("classic_spark")


# pyspark 3.5 ships no Connect server (4.0 added it to the wheel): `make smoke` puts Spark's
# plugin (one shaded jar, the newest 3.5 on Maven Central) into the local Maven repository.
MAVEN_REPOSITORY = Path.home() / ".m2" / "repository"
CONNECT_PLUGIN = "org/apache/spark/spark-connect_2.12"
CONNECT_PORT = "spark.connect.grpc.binding.port"


def connect_plugin_jars(repository: Path = MAVEN_REPOSITORY) -> list[str]:
    """Spark's Connect plugin jar in ``repository`` for a pyspark that ships no server: this
    pyspark's version, else the newest of its line; none when there is neither."""
    line = ".".join(pyspark.__version__.split(".")[:2])
    found = sorted(
        (repository / CONNECT_PLUGIN).glob(f"{line}.*/spark-connect_2.12-{line}.*.jar"),
        key=lambda jar: [int(p) for p in jar.parent.name.split(".") if p.isdigit()],
    )
    exact = [j for j in found if j.parent.name == pyspark.__version__]
    return [str((exact or found)[-1])] if found else []


def connect_server_conf(spark_home: Path) -> tuple[list[str], dict[str, str]] | None:
    """The jars and settings that make the tests' classic session a Spark Connect server too,
    on a free loopback port (Spark's ``SparkConnectPlugin``, as ``start-connect-server.sh``
    starts it); None when this pyspark has no server and no plugin jar is there."""
    shipped = any((spark_home / "jars").glob("spark-connect_*.jar"))
    jars = [] if shipped else connect_plugin_jars()
    if not shipped and not jars:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return jars, {
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        CONNECT_PORT: str(port),
    }


@dataclass(frozen=True)
class ConnectServer:
    """The Spark Connect server the tests' classic session runs (its own JVM serves both):
    a Connect session sees the same SparkContext (local[2]), its own SQL settings, and its
    Python workers (``foreachBatch`` functions, listeners) run as the classic session's do."""

    url: str


@pytest.fixture(scope="session")
def connect_server(classic_spark: SparkSession) -> ConnectServer:
    port = classic_spark.sparkContext.getConf().get(CONNECT_PORT)
    if port is None:
        pytest.skip(
            f"pyspark {pyspark.__version__} ships no Connect server and no "
            f"{CONNECT_PLUGIN} jar is in {MAVEN_REPOSITORY} (`make smoke` fetches it)"
        )
    return ConnectServer(f"sc://127.0.0.1:{port}")


@pytest.fixture(scope="session")
def _connect_session(connect_server: ConnectServer) -> Iterator[SparkSession]:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(connect_server.url).getOrCreate()
    yield session
    session.stop()


# A Connect query's ``foreachBatch`` function runs in a Python process the server starts when
# the query starts, and Spark gives it a fixed 10 s to connect back (PythonWorkerFactory, 3.5 to
# 4.3, not a setting). It imports pyspark's Connect client, pandas and pyarrow first: 1.7
# CPU-seconds on an idle core, over 10 s on a loaded 2-core machine under `make test`. The
# server then refuses the start and no query exists; the tests' Connect sessions start it
# again, at most three times more, with a warning. Other
# such processes (a streaming read of the data source: the query fails before its first batch)
# fail the test, which then runs again (pyproject.toml's `reruns` and `only_rerun`).
WORKER_TIMED_OUT = "Python worker failed to connect back"
QUERY_START_ATTEMPTS = 4


def _start_again_when_the_worker_timed_out(start):
    @functools.wraps(start)
    def start_query(self, *args, **kwargs):
        for attempt in range(1, QUERY_START_ATTEMPTS):
            try:
                return start(self, *args, **kwargs)
            except Exception as error:
                if WORKER_TIMED_OUT not in str(error):
                    raise
                warnings.warn(
                    f"the Connect server's Python worker for a streaming query did not connect "
                    f"back within Spark's 10 s (attempt {attempt} of {QUERY_START_ATTEMPTS}): "
                    "starting the query again",
                    stacklevel=2,
                )
        return start(self, *args, **kwargs)

    return start_query


@pytest.fixture
def connect_spark(_connect_session: SparkSession, monkeypatch: pytest.MonkeyPatch) -> SparkSession:
    """A Spark Connect session (the process is in Connect mode for the test); its streaming
    queries' starts are tried again when the server's Python worker timed out connecting back
    (`WORKER_TIMED_OUT`)."""
    monkeypatch.setenv(CONNECT_MODE, "1")
    from pyspark.sql.connect.session import SparkSession as ConnectSession
    from pyspark.sql.connect.streaming.readwriter import DataStreamWriter

    for name in ("start", "toTable"):
        start = getattr(DataStreamWriter, name)
        monkeypatch.setattr(DataStreamWriter, name, _start_again_when_the_worker_timed_out(start))
    ConnectSession._active_session.session = _connect_session
    return _connect_session


CliRun = Callable[..., subprocess.CompletedProcess]


# ``streaming.cli.main`` is what the console script runs (``sys.exit(main())``). `cli` calls it
# in the test's own process: a command that needs Spark takes the active session (the test
# session, `streaming.cli.common.session`) instead of starting a JVM of its own, which costs
# ~10-14 CPU-seconds a process (the CLI starting its own Spark is tested where the process is
# the subject: tests/cli/test_first_hour.py).
@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRun]:
    """``cli(*args, cwd=path)``: ``compacted-sink ARGS`` run in this process from ``path``;
    its exit code, stdout and stderr as a `subprocess.CompletedProcess`.

    ``run`` quiets py4j's logger and three of Spark's (`streaming.cli.query`) for the rest
    of a process's life: their levels are put back when the test ends, so that the shared
    session logs as before.
    """
    levels = _LogLevels()

    def call(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        levels.remember()
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's own refusals
            code = e.code
        stdout, stderr = capsys.readouterr()
        return subprocess.CompletedProcess(["compacted-sink", *args], code, stdout, stderr)

    yield call
    levels.restore()


class _LogLevels:
    """The levels ``run`` changes, as they were before the test's first command."""

    def __init__(self) -> None:
        self.py4j: int | None = None
        self.spark: dict[str, object] = {}

    def remember(self) -> None:
        if self.py4j is None:
            self.py4j = logging.getLogger("py4j").level
        log4j = _log4j()
        if log4j is not None and not self.spark:
            self.spark = {n: log4j.LogManager.getLogger(n).getLevel() for n in _FAILURE_LOGGERS}

    def restore(self) -> None:
        if self.py4j is not None:
            logging.getLogger("py4j").setLevel(self.py4j)
        log4j = _log4j()
        if log4j is not None:
            for name, level in self.spark.items():
                log4j.core.config.Configurator.setLevel(name, level)


def _log4j():
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    return None if context is None else context._jvm.org.apache.logging.log4j


class FakeClock:
    """A clock the test moves by hand (epoch milliseconds). Defined here, not in testkit: a
    Connect server's Python workers unpickle it with a test's ``foreachBatch`` function and
    do not find testkit."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def clock_at() -> type[FakeClock]:
    """`FakeClock` itself, for a clock at a chosen time (``clock_at(ms)``): a test module
    cannot import conftest by name (a subfolder's conftest may be the one found)."""
    return FakeClock


@pytest.fixture
def lake(tmp_path):
    """A fresh lake directory for one test."""
    path = tmp_path / "lake"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def duckdb_delta():
    """A DuckDB connection with the ``delta`` extension loaded (``delta_scan(path)``): an
    engine independent of this project (delta-kernel-rs), from the duckdb-ext-delta wheel."""
    duckdb = pytest.importorskip("duckdb")
    import duckdb_ext

    root = list(duckdb_ext.__path__)[0]
    found = sorted(Path(root).glob("extensions/*/*/delta.duckdb_extension"))
    assert found, "duckdb-ext-delta is installed but its extension file is missing"
    connection = duckdb.connect()
    connection.execute(f"LOAD '{found[0]}'")
    yield connection
    connection.close()


def read_commits(table_path) -> list[list[dict]]:
    """Every commit of a Delta table as its list of actions, oldest first (from _delta_log)."""
    log_dir = os.path.join(str(table_path), "_delta_log")
    names = sorted(n for n in os.listdir(log_dir) if n.endswith(".json"))
    commits = []
    for name in names:
        with open(os.path.join(log_dir, name)) as f:
            commits.append([json.loads(line) for line in f if line.strip()])
    return commits


@pytest.fixture
def delta_commits():
    """``delta_commits(path)``: the actions of every commit of the Delta table at ``path``."""
    return read_commits


@pytest.fixture
def oracle() -> Oracle:
    """A dict replay of everything a test fed its log (`testkit.Oracle`)."""
    return Oracle()
