"""The ``compacted-sink`` console entry point (its ``main``) on a real lake directory.

One test walks an operator's day in order, every command in this process on the test
session (a process of its own would start a JVM for ``run``, ``clean`` and ``replay``;
``tests/cli/test_first_hour.py`` starts the console script itself): a bad job file is
refused, the job runs, ``status`` shows the gauges (table, JSON, PNG), ``clean`` empties
the dirty section, ``export`` writes and verifies an Avro snapshot, ``replay`` restores it
into a new log at the same offsets (compared column for column in
``tests/streaming/test_replay.py``; here by its counts and offsets).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from streaming.inputs.kafka import write_kafka_files

FILES, ROWS_PER_FILE, KEYS = 3, 200, 50


def write_input(directory: Path) -> dict[bytes, bytes]:
    """Kafka-shaped Parquet files (2 partitions, 1 in 13 a tombstone); returns the final state."""
    batches = []
    next_offset = {0: 0, 1: 0}
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    state: dict[bytes, bytes] = {}
    n = 0
    for _ in range(FILES):
        rows = []
        for _ in range(ROWS_PER_FILE):
            key = f"k{n * 7 % KEYS}".encode()
            partition = n * 7 % KEYS % 2
            value = None if n % 13 == 12 else f"v{n}".encode()
            rows.append(
                {
                    "key": key,
                    "value": value,
                    "topic": "users",
                    "partition": partition,
                    "offset": next_offset[partition],
                    "timestamp": start + dt.timedelta(seconds=n),
                    "timestampType": 0,
                }
            )
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
            next_offset[partition] += 1
            n += 1
        batches.append(rows)
    write_kafka_files(directory, batches)
    return state


JOB = """
[source]
format = "files"
path = "input"
max_files_per_trigger = 1

[sink]
path = "lake/users"
key_columns = ["key"]

[cleaner]
"min.cleanable.dirty.ratio" = 0.9

[trigger]
available_now = true
"""


def status_json(cli, cwd: Path) -> dict:
    done = cli("status", "--config", "job.toml", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["logs"][0]


@pytest.mark.slow
def test_run_status_clean_export_replay(spark, cli, tmp_path: Path) -> None:
    expected = write_input(tmp_path / "input")
    (tmp_path / "job.toml").write_text(JOB)
    (tmp_path / "bad.toml").write_text(JOB.replace("0.9", '"lots"'))

    bad = cli("run", "bad.toml", cwd=tmp_path)
    assert bad.returncode == 2
    assert "bad.toml" in bad.stderr and "min.cleanable.dirty.ratio" in bad.stderr

    run = cli("run", "job.toml", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    appended = [line for line in run.stderr.splitlines() if "appended 200 records" in line]
    assert [line.split(":")[0] for line in appended] == ["batch 0", "batch 1", "batch 2"]

    # Batch 0 alone was 100 % dirty and got cleaned; batches 1 and 2 stay below 0.9.
    before = status_json(cli, tmp_path)
    assert 0.5 < before["dirty_ratio"] < 0.9
    assert [p["first_dirty_offset"] for p in before["partitions"]] == [100, 100]
    assert [p["log_end_offset"] for p in before["partitions"]] == [300, 300]

    table = cli("status", "--config", "job.toml", "--plot", "status.png", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "first dirty" in table.stdout and "recopy %" in table.stdout
    assert (tmp_path / "status.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    clean = cli("clean", "--config", "job.toml", "--once", "--force", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    assert "cleaned " in clean.stdout and "p0 [100, 300)" in clean.stdout
    after = status_json(cli, tmp_path)
    assert after["dirty_ratio"] == 0.0
    assert [p["first_dirty_offset"] for p in after["partitions"]] == [300, 300]

    export = cli("export", "lake/users", "--to", "export", "--verify", cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    assert f"exported {len(expected)} keys" in export.stdout
    assert " matches log " in export.stdout and "0 missing, 0 unexpected" in export.stdout
    manifest = json.loads((tmp_path / "export" / "_manifest.json").read_text())
    assert manifest["keys"] == len(expected)
    assert manifest["records"] == len(expected) + manifest["tombstones"]

    replay = cli("replay", "export", "--to", "lake/restored", cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert f"restored {manifest['records']} records" in replay.stdout
    restored = cli("status", "lake/restored", "--json", cwd=tmp_path)
    (log,) = json.loads(restored.stdout)["logs"]
    # One record per key (tombstones within delete.retention.ms too), offsets kept.
    assert sum(p["records"] for p in log["partitions"]) == manifest["records"]
    assert [p["log_end_offset"] for p in log["partitions"]] == [300, 300]
