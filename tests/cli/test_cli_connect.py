"""``compacted-sink`` against a Spark Connect server: ``run --remote``, ``SPARK_REMOTE``, demo.

The Connect client runs in a process of its own (it needs no JVM, so it starts fast; this
process keeps its classic session): the query's hook runs in the server's foreachBatch
worker. ``status`` (Delta metadata only) and ``demo``'s refusals run in this process
(`cli`).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streaming.inputs.kafka import write_kafka_files

CLI = [sys.executable, "-m", "streaming.cli"]
JOB = """
[source]
format = "files"
path = "input"
max_files_per_trigger = 1

[sink]
path = "lake/users"
key_columns = ["key"]

[trigger]
available_now = true
"""


def client(*args: str, cwd: Path, remote: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    env.pop("SPARK_REMOTE", None)
    if remote is not None:
        env["SPARK_REMOTE"] = remote
    return subprocess.run(
        [*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def write_input(directory: Path) -> int:
    """Two Kafka-shaped files of 20 records over 10 keys; returns the number of live keys."""
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    batches = [
        [
            {
                "key": f"k{n % 10}".encode(),
                "value": f"v{n}".encode(),
                "topic": "users",
                "partition": 0,
                "offset": n,
                "timestamp": start + dt.timedelta(seconds=n),
                "timestampType": 0,
            }
            for n in range(f * 20, f * 20 + 20)
        ]
        for f in range(2)
    ]
    write_kafka_files(directory, batches)
    return 10


@pytest.mark.connect
def test_run_and_export_through_a_connect_server(connect_server, cli, tmp_path: Path) -> None:
    keys = write_input(tmp_path / "input")
    (tmp_path / "job.toml").write_text(JOB)

    run = client("run", "job.toml", "--remote", connect_server.url, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "batch 1: 20 input rows" in run.stderr  # Spark's progress, printed by the client

    export = client("export", "lake/users", "--to", "export", "--verify", cwd=tmp_path,
                    remote=connect_server.url)  # fmt: skip
    assert export.returncode == 0, export.stderr[-3000:]
    assert f"exported {keys} keys" in export.stdout and " matches log " in export.stdout

    again = client("run", "job.toml", "--remote", connect_server.url, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]  # the checkpoint has it all: nothing twice
    status = cli("status", "lake/users", "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert '"log_end_offset": 40' in status.stdout, status.stdout


def test_demo_refuses_a_remote_session(cli, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    flag = cli("demo", "--remote", "sc://127.0.0.1:1", cwd=tmp_path)
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:1")
    for done in (flag, cli("demo", cwd=tmp_path)):
        assert done.returncode == 2
        assert "run JOB.toml --remote" in done.stderr
