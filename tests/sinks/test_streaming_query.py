"""A streaming query into the sink through foreachBatch, stopped and restarted.

Also on Spark Connect, where the sink runs in the server's foreachBatch worker and
knows its query only through ``checkpoint_location``.
"""

from __future__ import annotations

import json

import pytest

from sinks import CompactedStateSink


def write_json(directory, name, rows):
    directory.mkdir(exist_ok=True)
    (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_available_now(spark, source, sink, checkpoint, *, fails=False):
    query = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    if fails:
        with pytest.raises(Exception) as failed:
            query.awaitTermination()
        return failed.value
    query.awaitTermination()
    assert query.exception() is None
    return query


@pytest.mark.both_sessions
def test_streaming_query_end_to_end_and_restart_does_not_duplicate(spark, lake, clock):
    source, checkpoint = lake / "in", lake / "_chk"
    write_json(source, "1.json", [{"key": "a", "value": "a1"}, {"key": "b", "value": "b1"}])
    write_json(source, "2.json", [{"key": "a", "value": "a2"}, {"key": "c", "value": None}])
    sink = CompactedStateSink(str(lake / "log"), clock=clock, checkpoint_location=str(checkpoint))
    query = run_available_now(spark, source, sink, checkpoint)
    assert sink.log_table.snapshot().txn_version(f"{sink.sink_id}/query={query.id}") == 1
    records = sorted((r.offset, r.key) for r in sink.log().collect())
    assert [o for o, _ in records] == sorted({o for o, _ in records})

    # A crash after the sink committed batch 1 but before Spark recorded it: the
    # restarted query runs batch 1 again, and the sink must not write it twice.
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    write_json(source, "3.json", [{"key": "d", "value": "d1"}])
    restarted = CompactedStateSink(
        str(lake / "log"), clock=clock, checkpoint_location=str(checkpoint)
    )
    run_available_now(spark, source, restarted, checkpoint)
    log = restarted.log().collect()
    assert max(r.offset for r in log) == 4  # five records appended in all, none twice
    assert sorted((r.key, r.value) for r in restarted.state().collect()) == [
        ("a", "a2"),
        ("b", "b1"),
        ("d", "d1"),
    ]


@pytest.mark.both_sessions
def test_a_query_on_a_fresh_checkpoint_is_not_mistaken_for_the_old_one(spark, lake, clock):
    source, log = lake / "in", str(lake / "log")
    write_json(source, "1.json", [{"key": "a", "value": "a1"}])
    first = lake / "_chk1"
    run_available_now(spark, source, CompactedStateSink(log, checkpoint_location=str(first)), first)
    # The same source again from a fresh checkpoint: its batch 0 is a new batch.
    fresh = lake / "_chk2"
    query = run_available_now(
        spark, source, CompactedStateSink(log, checkpoint_location=str(fresh)), fresh
    )
    sink = CompactedStateSink(log)
    assert sink.log_table.snapshot().txn_version(f"{sink.sink_id}/query={query.id}") == 0
    # Two records appended (offsets 0 and 1), whichever of them a background pass has
    # since compacted away: both carry key "a", and the second supersedes the first.
    assert [(r.offset, r.value) for r in sink.log().orderBy("offset").collect()][-1] == (1, "a1")


def test_under_connect_a_query_without_checkpoint_location_or_sink_id_fails_saying_so(
    connect_spark, lake
):
    source = lake / "in"
    write_json(source, "1.json", [{"key": "a", "value": "a1"}])
    sink = CompactedStateSink(str(lake / "log"))
    error = run_available_now(connect_spark, source, sink, lake / "_chk", fails=True)
    assert "QueryIdentityError" in str(error) and "checkpoint_location=" in str(error)
    assert not (lake / "log").exists()  # nothing was written
