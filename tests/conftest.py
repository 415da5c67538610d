"""One SparkSession for the whole run (local[2], two shuffle partitions) and a fake clock."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def build_session() -> SparkSession:
    return (
        SparkSession.builder.master("local[2]")
        .appName("compacted-sink-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


class FakeClock:
    """A clock the test moves by hand (epoch milliseconds)."""

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
def lake(tmp_path):
    """A fresh lake directory for one test."""
    path = tmp_path / "lake"
    path.mkdir()
    return path


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
