"""A Spark standalone cluster on loopback, started from the pyspark install, no Docker.

One master and ``workers`` workers (each ``worker_cores`` cores and ``worker_memory``),
each daemon a JVM in its own process group, with its own working directory, log and
work directory under ``base``. Shared by the cluster tests (`tests/cluster/conftest.py`:
one worker) and `bench.cluster_pass` (two workers).

`stop` ends every process started here: the daemons' process groups (the executors a
worker launches join its group), then any descendant that left its group (pyspark's
``daemon`` makes a process group of its own for the Python workers). It returns the
pids still alive after SIGKILL, so a caller can fail when one survives.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

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


def get_json(url: str, timeout_s: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.load(r)


@dataclass(frozen=True)
class StandaloneWorker:
    """One worker daemon: its RPC port, web UI, working directory and work directory
    (where it puts each executor's directory, ``<work_dir>/<app id>/<executor id>``)."""

    index: int
    port: int
    webui: str
    cwd: Path
    work_dir: Path

    def state(self) -> dict[str, Any]:
        """The worker's own JSON: ``id``, ``cores``, ``executors`` (``id``, ``appid``), …"""
        return get_json(f"{self.webui}/json/")


@dataclass
class StandaloneCluster:
    """A running master and workers; ``url`` is what a driver passes as its master."""

    base: Path
    workers: int = 1
    worker_cores: int = 1
    worker_memory: str = "1g"
    url: str = ""
    webui: str = ""
    started: list[StandaloneWorker] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.base / "master-cwd").mkdir(parents=True, exist_ok=True)

    @property
    def worker_cwd(self) -> Path:
        """The first worker's working directory."""
        return self._worker_path(0, "cwd")

    @property
    def worker_dir(self) -> Path:
        """The first worker's work directory (its executors' directories)."""
        return self._worker_path(0, "work")

    def _worker_path(self, index: int, kind: str) -> Path:
        # The first worker keeps the one-worker harness's directory names.
        return self.base / (f"worker-{kind}" if index == 0 else f"worker{index}-{kind}")

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
        for index in range(self.workers):
            worker = StandaloneWorker(
                index=index,
                port=free_port(),
                webui=f"http://127.0.0.1:{free_port()}",
                cwd=self._worker_path(index, "cwd"),
                work_dir=self._worker_path(index, "work"),
            )
            for d in (worker.cwd, worker.work_dir):
                d.mkdir(parents=True, exist_ok=True)
            self._launch(
                "worker" if index == 0 else f"worker{index}",
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(worker.port),
                    "--webui-port",
                    worker.webui.rsplit(":", 1)[1],
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--work-dir",
                    str(worker.work_dir),
                ],
                env,
                worker.cwd,
            )
            self.started.append(worker)
        self._wait(
            lambda s: sum(w["state"] == "ALIVE" for w in s.get("workers", [])) >= self.workers,
            f"{self.workers} worker(s)",
        )

    def _launch(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        log = open(self.base / f"{name}.out", "wb")  # kept open for the process
        # A new session makes the process a group leader: the worker's executors join its
        # group, so one killpg ends them.
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
                if ready(self.state()):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{what} not ready after {READY_TIMEOUT_S} s:\n{self.logs()}")

    def state(self) -> dict[str, Any]:
        """The master's JSON: ``status``, ``workers`` (``id``, ``webuiaddress``, ``state``), …"""
        return get_json(f"{self.webui}/json/", timeout_s=2)

    def logs(self, tail: int = 4000) -> str:
        out = []
        for f in sorted(self.base.glob("*.out")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    def stop(self) -> list[int]:
        """End every process started here; returns the pids still alive after SIGKILL."""
        # Taken before the groups end: once a parent dies its children are re-parented.
        strays = self._strays()
        for proc in reversed(self.processes):
            _signal_group(proc.pid, signal.SIGTERM)
        _signal_pids(strays, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and self._alive(strays):
            time.sleep(0.2)
        for proc in self.processes:
            if _group_alive(proc):
                _signal_group(proc.pid, signal.SIGKILL)
        _signal_pids(strays, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and self._alive(strays):
            time.sleep(0.2)
        return [p.pid for p in self.processes if _group_alive(p)] + _living(strays)

    def _strays(self) -> dict[int, str]:
        """Descendants of the daemons outside the daemons' groups, with their start times."""
        found = {}
        for proc in self.processes:
            for pid in descendants(proc.pid):
                try:
                    group = os.getpgid(pid)
                except ProcessLookupError:
                    continue
                if group != proc.pid:
                    found[pid] = _start_time(pid)
        return found

    def _alive(self, strays: dict[int, str]) -> bool:
        return any(_group_alive(p) for p in self.processes) or bool(_living(strays))


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


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _start_time(pid: int) -> str:
    fields = _stat_fields(pid)
    return fields[19] if fields else ""


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (children, their children, …), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _living(pids: dict[int, str]) -> list[int]:
    """The pids of ``pids`` still running as the same process (same start time, no zombie)."""
    alive = []
    for pid, started in pids.items():
        fields = _stat_fields(pid)
        if fields is not None and fields[19] == started and fields[0] != "Z":
            alive.append(pid)
    return alive


def _signal_pids(pids: dict[int, str], sig: int) -> None:
    for pid in _living(pids):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
