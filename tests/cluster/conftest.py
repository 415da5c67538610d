"""A Spark standalone cluster on loopback, started from the pyspark install for the tests.

One master and one worker (1 core, 1 GiB), each a JVM in its own process group,
with its own working directory, log and work directories under a temporary
directory. Every process the fixture started — daemons, the executors the worker
launched and their Python workers — is ended at teardown, also when a test fails;
teardown fails the test run when one survives.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
import pytest

READY_TIMEOUT_S = 90
STOP_TIMEOUT_S = 15


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_env(base: Path) -> dict[str, str]:
    """The environment of every cluster process: loopback only, the venv's Python, no user conf."""
    conf_dir = base / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(Path(pyspark.__file__).parent),
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(base / "logs"),
        SPARK_DAEMON_MEMORY="384m",
        # The master's REST submission server would take the fixed port 6066.
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    return env


@dataclass
class StandaloneCluster:
    """A running master and worker; ``url`` is what a driver passes as its master."""

    base: Path
    url: str = ""
    webui: str = ""
    worker_cwd: Path = field(init=False)
    worker_dir: Path = field(init=False)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.worker_cwd = self.base / "worker-cwd"
        self.worker_dir = self.base / "worker-work"
        for d in (self.worker_cwd, self.worker_dir, self.base / "master-cwd"):
            d.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        env = spark_env(self.base)
        spark_class = str(Path(env["SPARK_HOME"]) / "bin" / "spark-class")
        port, ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{port}"
        self.webui = f"http://127.0.0.1:{ui_port}"
        self._launch(
            "master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            env,
            self.base / "master-cwd",
        )
        self._wait(lambda s: s.get("status") == "ALIVE", "master")
        self._launch(
            "worker",
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(self.worker_dir),
            ],
            env,
            self.worker_cwd,
        )
        self._wait(lambda s: any(w["state"] == "ALIVE" for w in s.get("workers", [])), "worker")

    def _launch(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        log = open(self.base / f"{name}.out", "wb")  # noqa: SIM115 (kept open for the process)
        # A new session makes the process a group leader: the worker's executors and
        # their Python workers join its group, so one killpg ends them all.
        proc = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.processes.append(proc)

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    raise RuntimeError(f"{what} exited with {proc.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.webui}/json/", timeout=2) as r:
                    if ready(json.load(r)):
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{what} not ready after {READY_TIMEOUT_S} s:\n{self.logs()}")

    def logs(self, tail: int = 4000) -> str:
        out = []
        for f in sorted(self.base.glob("*.out")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    def stop(self) -> list[int]:
        """End every process group started here; returns the groups still alive after SIGKILL."""
        for proc in reversed(self.processes):
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and any(_group_alive(p) for p in self.processes):
            time.sleep(0.2)
        for proc in self.processes:
            if _group_alive(proc):
                _signal_group(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and any(_group_alive(p) for p in self.processes):
            time.sleep(0.2)
        return [p.pid for p in self.processes if _group_alive(p)]


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(leader: subprocess.Popen) -> bool:
    """True while any process of the group ``leader`` heads is alive."""
    leader.poll()  # reap the leader: a zombie would still count as a member
    try:
        os.killpg(leader.pid, 0)
    except ProcessLookupError:
        return False
    return True


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
