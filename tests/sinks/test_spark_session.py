"""`sinks.spark_session`: what the sink asks of a session, classic and Spark Connect alike."""

from __future__ import annotations

import json
import pickle

import pytest

from sinks import CompactedStateSink
from sinks.spark_session import (
    QueryIdentityError,
    active_session,
    checkpoint_query_id,
    default_parallelism,
    in_foreach_batch_worker,
    streaming_query_id,
)


@pytest.mark.both_sessions
def test_the_active_session_and_parallelism_are_found_on_either_kind(spark) -> None:
    assert active_session() is spark
    assert default_parallelism(spark) == 2  # local[2]; a probe job under Connect
    assert default_parallelism(spark) == 2  # cached per session


@pytest.mark.both_sessions
def test_a_direct_call_has_no_query_id(spark, lake) -> None:
    assert streaming_query_id(spark, 0) is None
    assert streaming_query_id(spark, 0, checkpoint_location=str(lake / "none")) is None


def test_connect_s_foreach_batch_worker_needs_a_checkpoint_or_a_sink_id(
    connect_spark, lake, monkeypatch
) -> None:
    monkeypatch.setenv("SPARK_CONNECT_LOCAL_URL", "sc://localhost:1")  # as the server sets it
    assert in_foreach_batch_worker()
    with pytest.raises(QueryIdentityError, match="checkpoint_location=.*sink_id="):
        streaming_query_id(connect_spark, 0)
    assert streaming_query_id(connect_spark, 0, explicit_sink_id=True) is None
    with pytest.raises(QueryIdentityError, match="no readable streaming query metadata"):
        streaming_query_id(connect_spark, 0, checkpoint_location=str(lake / "none"))


def test_the_query_id_is_read_from_a_checkpoint_that_planned_the_batch(tmp_path) -> None:
    chk = tmp_path / "chk"
    with pytest.raises(QueryIdentityError, match="no readable streaming query metadata"):
        checkpoint_query_id(str(chk), 0)
    (chk / "offsets").mkdir(parents=True)
    (chk / "metadata").write_text(json.dumps({"id": "q-1"}))
    with pytest.raises(QueryIdentityError, match="has not planned batch 3"):
        checkpoint_query_id(str(chk), 3)
    (chk / "offsets" / "3").write_text("v1\n{}\n")
    assert checkpoint_query_id(str(chk), 3) == "q-1"


def test_the_sink_pickles_without_sessions_threads_or_locks(spark, lake) -> None:
    sink = CompactedStateSink(str(lake / "log"), checkpoint_location=str(lake / "chk"))
    sink(spark.createDataFrame([("a", "1")], "key string, value string"), 0)
    assert sink._log_cleaner is not None  # the cleaner (thread, locks) was made in this process
    copy = pickle.loads(pickle.dumps(sink))
    assert copy._log_cleaner is None
    assert copy.checkpoint_location == sink.checkpoint_location
    assert copy.state().count() == 1
