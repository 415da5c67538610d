"""The sink on a real Spark cluster gives what it gives locally, with executors writing the files.

The driver runs in a subprocess (this process already holds the local
SparkContext), in a working directory of its own, and names the table by a
*relative* path. Executors run in the worker's JVMs, in the worker's work
directory: a sink that resolved paths against the executor's working
directory, or relied on state only the driver holds, would write files the
commit does not reference, or fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DRIVER_TIMEOUT_S = 360
WORKLOAD = Path(__file__).with_name("workload.py")


def _load_workload():
    spec = importlib.util.spec_from_file_location("cluster_workload", WORKLOAD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_driver(cluster, cwd: Path, out: Path) -> subprocess.CompletedProcess:
    """Run the workload's driver against ``cluster``; its whole process group ends with it."""
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_CONF_DIR=str(cluster.base / "conf"),
    )
    cmd = [sys.executable, str(WORKLOAD), "--master", cluster.url, "--table", "lake/users"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        output = b"(driver timed out)"
        proc.kill()
        proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's JVM, if it outlived the driver
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, output.decode(errors="replace"))


def test_cluster_run_matches_local_run(spark, standalone_cluster, tmp_path, capsys):
    driver_cwd = tmp_path / "driver-cwd"
    driver_cwd.mkdir()
    out = tmp_path / "cluster.json"

    started = time.monotonic()
    result = run_driver(standalone_cluster, driver_cwd, out)
    cluster_wall_s = time.monotonic() - started
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{standalone_cluster.logs()}"
    on_cluster = json.loads(out.read_text())
    with capsys.disabled():
        print(f"\ncluster run: {cluster_wall_s:.1f} s wall, {_rounded(on_cluster)}")

    started = time.monotonic()
    local = json.loads(json.dumps(_load_workload().run_workload(spark, str(tmp_path / "local"))))
    local_wall_s = time.monotonic() - started

    # Same outcome: live keys and values, every stored offset, the recorded log end offsets.
    assert on_cluster["state"] == local["state"]
    assert on_cluster["log"] == local["log"]
    assert on_cluster["log_end_offsets"] == local["log_end_offsets"]
    assert on_cluster["passes"] == local["passes"]
    assert local["passes"] == [True, True]  # a pass, then one that dropped the tombstones
    assert on_cluster["replay_skipped"] and local["replay_skipped"]
    assert len(local["log"]) < local["records_appended"]  # the passes compacted
    assert not any(tombstone for *_, tombstone in local["log"])  # expired ones dropped

    # Executors were separate processes, in the worker's work directory, not the driver's.
    executors = on_cluster["executors"]
    assert on_cluster["master"] == standalone_cluster.url
    assert executors["executor_ids"], "no executor registered with the driver"
    worker_dir = standalone_cluster.worker_dir.resolve()
    for pid, cwd in executors["python_workers"]:
        assert pid != executors["driver_pid"]
        assert Path(cwd).resolve().is_relative_to(worker_dir), cwd
    assert any(worker_dir.glob("app-*/*/stderr")), "the worker launched no executor"

    # The relative table path resolved against the driver's cwd, and the files the
    # executors wrote are there, all of them, and nowhere else.
    table = (driver_cwd / "lake" / "users").resolve()
    assert Path(on_cluster["table"]) == table
    assert on_cluster["files"]
    for path in on_cluster["files"]:
        assert (table / path).is_file(), path
    live = {str(table / p) for p in on_cluster["files"]}
    on_disk = {str(p) for p in table.rglob("*.parquet")}
    assert live <= on_disk
    strays = [
        p
        for root in (standalone_cluster.worker_dir, standalone_cluster.worker_cwd)
        for p in root.rglob("*.parquet")
    ]
    assert not strays, strays

    with capsys.disabled():
        print(
            "\ncluster vs local figures: "
            + json.dumps(
                {
                    "cluster": {"wall_s": round(cluster_wall_s, 1), **_rounded(on_cluster)},
                    "local": {"wall_s": round(local_wall_s, 1), **_rounded(local)},
                }
            )
        )


def _rounded(outcome: dict) -> dict:
    figures = {k: round(v, 1) for k, v in outcome["timings"].items()}
    figures.update(
        records_appended=outcome["records_appended"],
        records_in_log=len(outcome["log"]),
        live_keys=len(outcome["state"]),
        files=len(outcome["files"]),
        delta_version=outcome["delta_version"],
    )
    return figures
