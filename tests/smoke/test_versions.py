"""What the sink must do on every pyspark it supports (3.5 to the newest): `make smoke` runs
this module on one venv per Spark line (`.venv-spark3.5`, `.venv-spark4.0`, `.venv-spark4.1`,
`.venv-spark4.2`) and the main suite runs it on the project's own (4.3).

Append, a pass, ``state()`` and ``read_state`` (on a classic and a Spark Connect session), bad
rows into the dead-letter table (on both), a streaming query through ``foreachBatch`` (on
both), the CLI running a job file and ``status``, and the ``compacted-state`` data source: on
a Spark that has what it needs it works, on an older one it is refused with the version it
needs (`sinks.spark_compat`).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest
from chispa import assert_df_equality

from sinks import CleanerConfig, CompactedStateSink, SparkVersionError, read_state
from sinks.log.location import LogLocation
from sinks.produce.dead_letter import DeadLetterTable
from sinks.spark_compat import DATA_SOURCE, STREAM_READER, STREAM_WRITER, supports
from streaming.consumers.datasource import register
from streaming.inputs.kafka import write_kafka_files

pytestmark = pytest.mark.smoke

SCHEMA = "key string, value string, partition int"


@pytest.mark.both_sessions
def test_append_a_pass_and_the_state(spark, lake, clock) -> None:
    sink = CompactedStateSink(
        str(lake / "log"), config=CleanerConfig(min_cleanable_dirty_ratio=1.0), clock=clock
    )
    first = [(f"k{i}", f"a{i}", i % 2) for i in range(20)]
    second = [(f"k{i}", f"b{i}", i % 2) for i in range(10)] + [("k11", None, 1)]
    sink(spark.createDataFrame(first, SCHEMA), 0)
    sink(spark.createDataFrame(second, SCHEMA), 1)
    sink(spark.createDataFrame(second, SCHEMA), 1)  # redelivered: written once
    expected = {f"k{i}": (f"b{i}" if i < 10 else f"a{i}") for i in range(20) if i != 11}

    assert sink.log().count() == 31
    stats = sink.clean(force=True)
    assert stats is not None
    assert sink.log().count() == 19 + 1  # the tombstone stays until its delete horizon
    state = {r.key: r.value for r in sink.state().collect()}
    assert state == expected
    arrow = read_state(str(lake / "log"))
    assert dict(zip(arrow["key"].to_pylist(), arrow["value"].to_pylist(), strict=True)) == (
        expected
    )
    assert_df_equality(
        sink.state().select("key", "value"),
        spark.createDataFrame(sorted(expected.items()), "key string, value string"),
        ignore_row_order=True,
        ignore_nullable=True,
    )


@pytest.mark.both_sessions
def test_bad_rows_go_to_the_dead_letter_table(spark, lake, clock) -> None:
    """The dead-letter path collects the bad rows to the driver as Arrow (pyspark 3.5's
    DataFrame has no ``toArrow``)."""
    dead = str(lake / "dead")
    sink = CompactedStateSink(str(lake / "log"), clock=clock, dead_letter_table=dead)
    rows = [("a", "1", 0), (None, "no key", 1), ("b", "2", 1)]
    sink(spark.createDataFrame(rows, SCHEMA), 0)
    assert {r.key: r.value for r in sink.state().collect()} == {"a": "1", "b": "2"}
    letters = DeadLetterTable(LogLocation(dead)).read().to_pylist()
    assert [r["reason"] for r in letters] == ["null key (key)"], letters
    assert '"value":"no key"' in letters[0]["record"]


def _write_json(directory: Path, name: str, rows: list[dict]) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.both_sessions
def test_a_streaming_query_through_foreach_batch(spark, lake, clock) -> None:
    source, checkpoint = lake / "in", lake / "_chk"
    _write_json(source, "1.json", [{"key": "a", "value": "a1"}, {"key": "b", "value": "b1"}])
    _write_json(source, "2.json", [{"key": "a", "value": "a2"}, {"key": "b", "value": None}])
    sink = CompactedStateSink(str(lake / "log"), clock=clock, checkpoint_location=str(checkpoint))
    query = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    assert {r.key: r.value for r in sink.state().collect()} == {"a": "a2"}
    assert sorted(r.offset for r in sink.log().collect()) == [0, 1, 2, 3]


def test_the_data_source_works_or_names_the_spark_it_needs(spark, lake, clock) -> None:
    path = str(lake / "log")
    sink = CompactedStateSink(path, clock=clock)
    sink(spark.createDataFrame([("a", "1", 0), ("b", "2", 0)], SCHEMA), 0)
    if not supports(DATA_SOURCE):
        with pytest.raises(
            SparkVersionError, match=r"needs pyspark 4\.0 or newer; this is pyspark 3\.5"
        ):
            register(spark)
        return
    register(spark)

    batch = spark.read.format("compacted-state").load(path)
    assert sorted((r.key, r.value) for r in batch.collect()) == [("a", "1"), ("b", "2")]

    source, checkpoint = lake / "in", lake / "_chk"
    _write_json(source, "1.json", [{"key": "c", "value": "3"}])
    write = (
        spark.readStream.schema("key string, value string")
        .json(str(source))
        .writeStream.format("compacted-state")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    if supports(STREAM_WRITER):
        query = write.start(path)
        query.awaitTermination()
        assert {r.key for r in sink.state().collect()} == {"a", "b", "c"}
    else:
        with pytest.raises(Exception, match=r"needs pyspark 4\.1 or newer; this is pyspark 4\.0"):
            write.start(path).awaitTermination()

    read = spark.readStream.format("compacted-state").load(path)
    seen = lake / "seen"
    tail = (
        read.writeStream.format("parquet")
        .option("checkpointLocation", str(lake / "_chk_read"))
        .trigger(availableNow=True)
    )
    if supports(STREAM_READER):
        tail.start(str(seen)).awaitTermination()
        assert spark.read.parquet(str(seen)).count() >= 2
    else:
        with pytest.raises(Exception, match=r"needs pyspark 4\.2 or newer; this is pyspark 4\."):
            tail.start(str(seen)).awaitTermination()


def test_the_version_error_names_both_versions_and_the_way_on() -> None:
    error = SparkVersionError(STREAM_READER, (9, 9), "Use sink.log().")
    assert str(error) == (
        f"readStream.format('compacted-state') needs pyspark 9.9 or newer; "
        f"this is pyspark {pyspark.__version__}. Use sink.log()."
    )


def test_the_cli_imports_and_runs_a_job(spark, cli, tmp_path) -> None:
    """The console script's module imports and ``status`` runs in fresh processes; ``run`` runs
    the job on this Spark in this process, on the active session (as in a notebook or a
    job's driver): the CLI's own local session is `local_session`, which the tests' session
    is built by, and a ``run`` that starts its own Spark is tested on the newest
    (tests/cli/test_first_hour.py)."""
    command = [sys.executable, "-m", "streaming.cli"]
    assert subprocess.run([*command, "--help"], capture_output=True).returncode == 0
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [
        {
            "key": f"k{i % 3}".encode(),
            "value": f"v{i}".encode(),
            "topic": "users",
            "partition": 0,
            "offset": i,
            "timestamp": start,
            "timestampType": 0,
        }
        for i in range(10)
    ]
    write_kafka_files(tmp_path / "input", [rows])
    (tmp_path / "job.toml").write_text(
        '[source]\nformat = "files"\npath = "input"\n\n'
        '[sink]\npath = "lake/users"\n\n[trigger]\navailable_now = true\n'
    )
    run = cli("run", "job.toml", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    status = subprocess.run(
        [*command, "status", "lake/users", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert status.returncode == 0, status.stderr[-3000:]
    table = read_state(str(tmp_path / "lake" / "users"))
    assert sorted(table["key"].to_pylist()) == [b"k0", b"k1", b"k2"]
