"""``compacted-sink run JOB --value-format debezium-json``: the job's topic read as Debezium's
change events, though its job file names no ``value_format`` (design.md §52).

Files with Kafka's columns hold the JSON converter's output without schemas: inserts, an
update, a delete and its tombstone, and an older event sent again after them (it loses).
A format the sink does not know is refused in one line naming the option, before Spark.
"""

from __future__ import annotations

import datetime as dt
import json

from sinks import read_state
from streaming.inputs.kafka import write_kafka_files

JOB = """
[source]
format = "files"
path = "input"

[sink]
path = "lake/users"
key_columns = ["id"]

[trigger]
available_now = true
"""


def _event(op: str, id_: int, lsn: int, name: str | None) -> tuple[bytes, bytes]:
    after = None if op == "d" else {"id": id_, "name": name}
    envelope = {"before": None, "after": after, "op": op, "source": {"lsn": lsn}, "ts_ms": lsn}
    return json.dumps({"id": id_}).encode(), json.dumps(envelope).encode()


def test_run_takes_the_value_format_from_the_command_line(spark, cli, tmp_path):
    events = [
        _event("r", 1, 10, "ann"),
        _event("r", 2, 10, "bob"),
        _event("c", 3, 20, "cy"),
        _event("u", 1, 30, "ann-2"),
        _event("d", 2, 40, None),
        (json.dumps({"id": 2}).encode(), None),  # the delete's tombstone
        _event("u", 3, 15, "older, sent again"),  # Kafka Connect's at-least-once
    ]
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [
        {
            "key": key,
            "value": value,
            "topic": "dbz.public.users",
            "partition": 0,
            "offset": offset,
            "timestamp": start,
            "timestampType": 0,
        }
        for offset, (key, value) in enumerate(events)
    ]
    write_kafka_files(tmp_path / "input", [rows])
    (tmp_path / "job.toml").write_text(JOB)

    refused = cli("run", "job.toml", "--value-format", "avro", cwd=tmp_path)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert "--value-format" in line and "'avro' is not known" in line
    assert "debezium-json" in line

    done = cli("run", "job.toml", "--value-format", "debezium-json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    state = read_state(str(tmp_path / "lake" / "users"))
    assert sorted(state.column("value").to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "name": "ann-2"},
        {"id": 3, "name": "cy"},
    ]
    assert set(state.column_names) >= {"id", "value", "source_position"}
