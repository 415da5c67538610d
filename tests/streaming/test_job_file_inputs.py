"""Job-file inputs as Kafka's tools write them: epoch-millisecond timestamps in JSON lines,
files without an ``offset`` column, and a failure's one line naming its Python cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from streaming.cli import failure_message
from streaming.cli.common import python_cause
from streaming.cli.query import root_cause
from streaming.inputs import file_columns
from streaming.jobs import load_job, start
from streaming.jobs.job import JobConfigError
from streaming.jobs.runner import source_columns

JOB = """
[source]
format = "files"
path = "{input}"

[sink]
path = "{lake}/users"

[trigger]
available_now = true
"""

# What `compacted-sink run` printed for a foreachBatch function that raised (cut here to the
# lines that matter): py4j's "Return Message: Traceback", a Python worker's traceback inside it.
PY4J_FAILURE = """\
[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch sink. Reason: An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 617, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/repo/sinks/sink.py", line 200, in __call__
    self._append(batch_df, batch_id)
pyspark.errors.exceptions.captured.PythonException:
  An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/repo/sinks/log/segment_writer.py", line 88, in write
    stats = segment_stats(table)
OverflowError: date value out of range

	at py4j.Protocol.getReturnValue(Protocol.java:476)
Caused by: py4j.Py4JException: An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
	at py4j.Protocol.getReturnValue(Protocol.java:476)
"""  # noqa: E501


def test_a_py4j_failure_is_named_by_its_python_cause():
    assert python_cause(PY4J_FAILURE) == "OverflowError: date value out of range"
    assert root_cause(PY4J_FAILURE) == "OverflowError: date value out of range"
    assert failure_message(RuntimeError(PY4J_FAILURE)) == "OverflowError: date value out of range"
    assert python_cause("no traceback here\nCaused by: x") is None


def test_the_columns_of_the_files_are_read_from_the_first(tmp_path):
    local = pafs.LocalFileSystem()
    pq.write_table(pa.table({"key": [b"a"], "value": [b"1"], "partition": [0]}), tmp_path / "a")
    assert file_columns("parquet", local, [str(tmp_path / "a")]) == {"key", "value", "partition"}
    (tmp_path / "b").write_text('\n{"key": "a", "value": "1", "timestamp": 1, "x": 2}\n')
    assert file_columns("json", local, [str(tmp_path / "b")]) == {"key", "value", "timestamp"}
    assert file_columns("json", local, []) is None
    assert file_columns("parquet", local, [str(tmp_path / "b")]) is None  # the reader says why


def test_a_routed_job_without_a_topic_column_fails_before_it_runs(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.json").write_text('{"key": "a", "value": "1"}\n')
    (tmp_path / "job.toml").write_text(
        f'[source]\nformat = "files"\npath = "{tmp_path}/in"\n'
        f'[topics.users]\npath = "{tmp_path}/lake/users"\n'
    )
    with pytest.raises(JobConfigError, match="'topic' column"):
        source_columns(f"{tmp_path}/in", "json", load_job(tmp_path / "job.toml"))


def test_kafka_tool_json_with_epoch_ms_and_no_offsets_runs(spark, tmp_path, capsys):
    """JSON lines as ``kafka-console-consumer --property print.timestamp=true`` gives their
    fields (epoch ms), without ``offset``: offsets are assigned, timestamps kept."""
    ms = 1_764_150_000_000  # 2025-11-26T09:40:00Z
    lines = [
        {"key": "a", "value": "1", "partition": 0, "timestamp": ms},
        {"key": "b", "value": "2", "partition": 1, "timestamp": ms + 1},
        {"key": "a", "value": "3", "partition": 0, "timestamp": ms + 2},
        {"key": "c", "value": "4", "partition": 0, "timestamp": 1_764_150_003},  # seconds
        {"key": "d", "value": "5", "partition": 0, "timestamp": "2025-11-26T09:40:04Z"},
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.json").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "job.toml").write_text(JOB.format(input=tmp_path / "in", lake=tmp_path / "lake"))
    job = load_job(tmp_path / "job.toml")
    query, sinks = start(spark, job, out=lambda line: None)
    query.awaitTermination(300)
    assert query.exception() is None
    (sink,) = sinks
    sink.close()
    assert "no 'offset' column: offsets are assigned" in capsys.readouterr().err
    rows = sorted(
        (r["partition"], r["offset"], bytes(r["key"]).decode(), r["timestamp"])
        for r in sink.log().collect()
    )
    base = datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)
    # a's first record (offset 0) may be cleaned away by the time the log is read
    assert [(p, o, k) for p, o, k, _ in rows if (p, o) != (0, 0)] == [
        (0, 1, "a"),
        (0, 2, "c"),
        (0, 3, "d"),
        (1, 0, "b"),
    ]
    seconds = {k: (t.replace(tzinfo=None) - base).total_seconds() for _, _, k, t in rows}
    assert seconds == pytest.approx({"a": 0.002, "b": 0.001, "c": 3, "d": 4})


def test_a_python_error_in_a_batch_ends_run_with_its_cause_in_one_line(tmp_path):
    """A timestamp Spark holds but Python's datetime cannot (the year 11476) fails the sink's
    segment writer in a Python worker: ``run``'s one line names the OverflowError."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.json").write_text(
        '{"key": "a", "value": "1", "timestamp": 300000000000000}\n'
    )
    (tmp_path / "job.toml").write_text(JOB.format(input="in", lake="lake"))
    done = subprocess.run(
        [sys.executable, "-m", "streaming.cli", "run", "job.toml"],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("compacted-sink run:")]
    assert line.endswith("OverflowError: date value out of range"), line
    assert "Traceback" not in done.stderr and "py4j" not in done.stderr, done.stderr
