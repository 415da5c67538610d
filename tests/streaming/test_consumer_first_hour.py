"""A newcomer's consumer and reads: Python workers, lag after availableNow, missing logs, as_of.

- ``register(spark)`` makes the sink's check of Spark's Python workers: with
  ``PYSPARK_PYTHON`` unset (the workers start ``python3``, which cannot import the
  project), the consumers' source reads on a local session instead of failing with
  ``No module named 'streaming'``.
- A registered consumer that read everything with ``Trigger.AvailableNow`` has lag 0
  (lag is what is left to read: log end offset minus the next offset to read).
- ``state()`` and ``dirty_ratio()`` agree on a path with no log: both raise
  ``FileNotFoundError`` naming it.
- ``as_of`` before the log's first commit says the log did not exist yet.
"""

from __future__ import annotations

import logging
import sys

import pytest

from sinks import CleanerConfig, CompactedStateSink, python_workers, read_state
from sinks.log.history_window import HistoryExpiredError, TimeTravelError
from streaming.consumers.consumer_groups import consumer_report
from streaming.consumers.datasource import register

NEVER = CleanerConfig(min_cleanable_dirty_ratio=1.0)

UNSET_WORKERS_PYTHON = "python3"
"""The interpreter a SparkContext names for its workers when ``PYSPARK_PYTHON`` is unset
(pyspark's default): the first ``python3`` on the PATH, which cannot import the project."""


def test_the_consumers_source_fixes_the_workers_python_as_the_sink_does(
    spark, tmp_path, monkeypatch, caplog
):
    """On the test session, its workers named as a session with ``PYSPARK_PYTHON`` unset
    names them, and nothing checked yet: ``register`` runs the check (a probe job on that
    ``python3``), points the context at this interpreter, and the read then works. What
    is checked is Python's side of the context; no fresh JVM is needed for it."""
    path = str(tmp_path / "users")
    sink = CompactedStateSink(path, config=NEVER)
    sink(spark.createDataFrame([(f"k{i}", "v") for i in range(5)], "key string, value string"), 0)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", UNSET_WORKERS_PYTHON)
    monkeypatch.setattr(python_workers, "_checked", set())
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        register(spark)
        rows = spark.read.format("compacted-state").load(path).count()
    assert rows == 5
    assert spark.sparkContext.pythonExec == sys.executable
    assert f"ran {UNSET_WORKERS_PYTHON}, which cannot import" in caplog.text
    assert f"now runs them with {sys.executable}" in caplog.text
    assert "No module named" not in caplog.text


def test_a_consumer_that_read_everything_has_no_lag(spark, tmp_path):
    path = str(tmp_path / "lake" / "users")
    sink = CompactedStateSink(path, config=NEVER)
    rows = [(f"k{i}", "v", i % 2) for i in range(1000)]
    sink(spark.createDataFrame(rows, "key string, value string, partition int"), 0)
    register(spark)
    query = (
        spark.readStream.format("compacted-state")
        .option("consumer.id", "billing")
        .option("maxOffsetsPerTrigger", 400)
        .load(path)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    read = sum(p["numInputRows"] for p in query.recentProgress)
    assert read == 1000
    (billing,) = consumer_report(path)
    assert billing.lag == {0: 0, 1: 0}
    assert billing.line().startswith("billing: live, lag 0 (p0 0, p1 0)")


def test_state_and_dirty_ratio_agree_on_a_missing_log(tmp_path):
    sink = CompactedStateSink(str(tmp_path / "nothing"))
    for read in (sink.state, sink.dirty_ratio, sink.log):
        with pytest.raises(FileNotFoundError, match="no compacted log at .*nothing"):
            read()
    with pytest.raises(FileNotFoundError, match="no compacted log"):
        read_state(str(tmp_path / "nothing"))
    assert sink.clean() is None
    assert not (tmp_path / "nothing").exists()


def test_as_of_before_the_log_existed_says_so(spark, tmp_path):
    path = str(tmp_path / "users")
    sink = CompactedStateSink(path, config=NEVER)
    sink(spark.createDataFrame([("a", "1")], "key string, value string"), 0)
    for read in (lambda: read_state(path, as_of="2020-01-01"), lambda: sink.state("2020-01-01")):
        with pytest.raises(TimeTravelError) as e:
            read()
        assert not isinstance(e.value, HistoryExpiredError)
        message = str(e.value)
        assert "the log did not exist yet (its first commit was at 20" in message, message
        assert "history window" not in message
