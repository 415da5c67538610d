"""What a sink says, and when: a close over another engine's change or over an exception in
flight, the log-store race said once, and a replayed log's stale checkpoint rows said once."""

from __future__ import annotations

import logging
import shutil

import pytest
from deltalake import DeltaTable

from sinks import CleanerConfig, CompactedStateSink, ForeignChangeError
from sinks import warn_once as warn_once_module
from sinks.reading.replay import RestoreSource, replay
from sinks.spark_session import warn_unsafe_beside_delta_spark

SCHEMA = "key string, value string, partition int"


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


class _Conf(dict):
    def get(self, key, default=None):  # SparkSession.conf.get's signature
        return super().get(key, default)


class _SessionSettings:
    """Only what `warn_unsafe_beside_delta_spark` reads of a session: its settings.
    A session with delta-spark's jars is not on this test's classpath."""

    def __init__(self, **settings: str) -> None:
        self.conf = _Conf(settings)


DELTA_SPARK = _SessionSettings(
    **{
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
)


def test_the_log_store_race_is_said_once_per_process(monkeypatch, caplog):
    monkeypatch.setattr(warn_once_module, "_SAID", set())  # as a new process would
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        first = warn_unsafe_beside_delta_spark(DELTA_SPARK, "s3://bucket/users")
        again = warn_unsafe_beside_delta_spark(DELTA_SPARK, "s3://bucket/users")
        other = warn_unsafe_beside_delta_spark(DELTA_SPARK, "/lake/orders")
        plain = warn_unsafe_beside_delta_spark(_SessionSettings(), "/lake/plain")
    assert first is not None and "S3SingleDriverLogStore" in first and "lost" in first
    assert again is None and plain is None
    assert other is not None and "HDFSLogStore" in other and "/lake/orders" in other
    assert "lost" not in other and "the same race as the warning above" in other
    assert warnings(caplog) == [first, other]


def test_close_never_raises_over_a_foreign_delete_and_says_once_what_to_do(spark, lake, caplog):
    path = str(lake / "users")
    sink = CompactedStateSink(path, cleaning="inline")
    rows = [(f"k{i}", "v", i % 2) for i in range(10)]
    sink(spark.createDataFrame(rows, SCHEMA), 0)
    DeltaTable(path).delete("key = 'k1'")  # another engine's DELETE
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        sink.close()
        sink.close()  # idempotent, and said once
        with pytest.raises(ValueError, match="the caller's own"):
            with CompactedStateSink(path):
                raise ValueError("the caller's own")
    (said,) = [w for w in warnings(caplog) if "without a clean-shutdown marker" in w]
    assert "DELETE" in said and "accept" in said, said
    with pytest.raises(ForeignChangeError):  # the next write still stops at it
        sink(spark.createDataFrame(rows, SCHEMA), 1)


def test_a_replayed_logs_stale_checkpoint_is_replaced_and_said_once(spark, lake, caplog):
    path = str(lake / "users")
    sink = CompactedStateSink(
        path, config=CleanerConfig(min_cleanable_dirty_ratio=0.01), cleaning="inline"
    )
    for batch in range(2):
        rows = [(f"k{i}", f"v{batch}", i % 4) for i in range(20)]
        sink(spark.createDataFrame(rows, SCHEMA), batch)
    sink.close()
    replay(RestoreSource.of_log(spark, path), str(lake / "backup"))
    shutil.rmtree(path)  # the disaster
    replay(RestoreSource.of_log(spark, str(lake / "backup")), path)
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        for batch in range(3):
            opened = CompactedStateSink(path, cleaning="inline")
            rows = [(f"k{i}", f"w{batch}", i % 4) for i in range(4)]
            opened(spark.createDataFrame(rows, SCHEMA), 100 + batch)
            opened.close()
    said = [w for w in warnings(caplog) if "checkpoint" in w]
    assert len(said) == 1, said
    assert "partitions 0, 1, 2, 3 describes another table" in said[0]
    assert "replaced by the log's own record" in said[0]
