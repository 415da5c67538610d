"""A Spark standalone cluster on loopback for the cluster tests (`bench.standalone_cluster`).

One master and one worker (1 core, 1 GiB). Every process the fixture started — daemons,
the executors the worker launched and their Python workers — is ended at teardown, also
when a test fails; teardown fails the test run when one survives.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The harness is shared with `bench.cluster_pass`; the repository root is not on the path
# under pytest's importlib mode unless pytest runs as `python -m pytest` from there.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.standalone_cluster import StandaloneCluster  # noqa: E402


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory) -> Iterator[StandaloneCluster]:
    """A master and one worker on 127.0.0.1, stopped (every process) after the module's tests."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        survivors = cluster.stop()
    assert not survivors, f"cluster processes still alive: {survivors}"
