"""``compacted-sink`` in a newcomer's first hour: Ctrl-C, a source that fails, a path with no log.

- Ctrl-C on ``run`` (SIGINT to the process group, as a terminal sends it) stops the
  query between batches and exits 130 with one line: no py4j traceback, no JVM stack.
- A ``files`` source whose files are not what the job file says fails the query with
  one line naming the root cause ("is not a Parquet file"), and the terminal shows no
  JVM stack either; without ``file_format`` the format is read from the files.
- ``status`` on a path with no log exits 1 and says so.
- Neither ``run`` prints what Spark logs while its JVM starts (its default log4j profile,
  a loopback hostname, Hadoop's native library): the local session starts it quiet.

The first two run the console script in a process of its own (a signal, and what the
JVM itself prints, are what they test), which starts its own local session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streaming.cli.query import root_cause
from streaming.jobs.job import JobConfigError
from streaming.jobs.runner import infer_file_format

CLI = [sys.executable, "-m", "streaming.cli"]
ENV = dict(os.environ)

RATE_JOB = """
[source]
format = "rate"
rows_per_batch = 100
keys = 50
partitions = 2

[sink]
path = "lake/users"

[trigger]
processing_time = "1 second"
"""

FILES_JOB = """
[source]
format = "files"
path = "input"
{file_format}

[sink]
path = "lake/users"

[trigger]
available_now = true
"""


def java_or_traceback_lines(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.lstrip().startswith(("at ", "Traceback", "Caused by"))
        or "Exception in thread" in line
        or "py4j" in line
    ]


def spark_start_lines(text: str) -> list[str]:
    """What Spark logs while its JVM starts, before a session's level is set."""
    return [
        line
        for line in text.splitlines()
        if " WARN " in line or "log4j profile" in line or "default log level" in line
    ]


def test_ctrl_c_on_run_exits_130_with_one_line(tmp_path):
    (tmp_path / "job.toml").write_text(RATE_JOB)
    run = subprocess.Popen(
        [*CLI, "run", "job.toml"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, which the terminal's Ctrl-C reaches
    )
    before = []
    try:
        for line in run.stderr:
            before.append(line)
            if line.startswith("batch 1:"):
                break
        else:
            pytest.fail("run ended before its second batch:\n" + "".join(before))
        os.killpg(run.pid, signal.SIGINT)
        stdout, after = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, after
    assert java_or_traceback_lines(after) == [], after
    assert spark_start_lines("".join(before)) == [], "".join(before)
    ended = [line for line in after.splitlines() if line.startswith("run: ")]
    assert ended == ["run: interrupted (Ctrl-C); query job stopped between batches, sinks closed"]
    assert "lake/users: dirty ratio" in stdout


def test_a_source_that_fails_ends_in_one_line_with_the_root_cause(tmp_path):
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "part-0.json").write_text('{"key": "a", "value": "1"}\n')
    job = FILES_JOB.format(file_format='file_format = "parquet"')
    (tmp_path / "job.toml").write_text(job)
    done = subprocess.run(
        [*CLI, "run", "job.toml"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    assert java_or_traceback_lines(done.stderr) == [], done.stderr
    assert spark_start_lines(done.stderr) == [], done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("compacted-sink run:")]
    assert "part-0.json is not a Parquet file" in line, done.stderr


def test_the_files_format_is_read_from_the_files(tmp_path):
    assert infer_file_format(str(tmp_path / "missing")) == "parquet"
    json_dir = tmp_path / "json"
    json_dir.mkdir()
    (json_dir / "part-0.txt").write_text('\n{"key": "a", "value": "1"}\n')
    (json_dir / "_SUCCESS").write_text("")
    assert infer_file_format(str(json_dir)) == "json"
    parquet_dir = tmp_path / "parquet"
    parquet_dir.mkdir()
    pq.write_table(pa.table({"key": [b"a"]}), parquet_dir / "part-0.parquet")
    assert infer_file_format(str(parquet_dir)) == "parquet"
    (parquet_dir / "part-1.json").write_text('{"key": "a"}\n')
    with pytest.raises(JobConfigError, match="not all Parquet or all JSON lines"):
        infer_file_format(str(parquet_dir))
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    (csv_dir / "part-0.csv").write_text("key,value\na,1\n")
    with pytest.raises(JobConfigError, match="neither Parquet nor JSON lines"):
        infer_file_format(str(csv_dir))


def test_the_root_cause_is_the_innermost_caused_by():
    text = (
        "[STREAM_FAILED] Query terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR]\n"
        "Caused by: org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered\n"
        "\tat org.apache.spark.Foo.bar(Foo.scala:1)\n"
        "Caused by: java.lang.RuntimeException: file:/in/x.json is not a Parquet file. Expected\n"
    )
    assert root_cause(text) == "file:/in/x.json is not a Parquet file. Expected"
    assert root_cause("BadInputError: batch 0: 1 of 2 rows have a null key\nCaused by: x") is None
    assert root_cause("no cause here") is None


def test_status_on_a_path_with_no_log_exits_1(cli, tmp_path):
    done = cli("status", "lake/users", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "compacted-sink status: FileNotFoundError: no compacted log at lake/users"
    ]
    assert not (tmp_path / "lake").exists()
