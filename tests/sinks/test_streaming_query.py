"""A streaming query into the sink through foreachBatch, stopped and restarted."""

from __future__ import annotations

import json

from sinks import CompactedStateSink


def write_json(directory, name, rows):
    directory.mkdir(exist_ok=True)
    (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_available_now(spark, source, sink, checkpoint):
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
    return query


def test_streaming_query_end_to_end_and_restart_does_not_duplicate(spark, lake, clock):
    source, checkpoint = lake / "in", lake / "_chk"
    write_json(source, "1.json", [{"key": "a", "value": "a1"}, {"key": "b", "value": "b1"}])
    write_json(source, "2.json", [{"key": "a", "value": "a2"}, {"key": "c", "value": None}])
    sink = CompactedStateSink(str(lake / "log"), clock=clock)
    query = run_available_now(spark, source, sink, checkpoint)
    assert sink.log_table.snapshot().txn_version(f"{sink.sink_id}/query={query.id}") == 1
    records = sorted((r.offset, r.key) for r in sink.log().collect())
    assert [o for o, _ in records] == sorted({o for o, _ in records})

    # A crash after the sink committed batch 1 but before Spark recorded it: the
    # restarted query runs batch 1 again, and the sink must not write it twice.
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    write_json(source, "3.json", [{"key": "d", "value": "d1"}])
    restarted = CompactedStateSink(str(lake / "log"), clock=clock)
    run_available_now(spark, source, restarted, checkpoint)
    log = restarted.log().collect()
    assert max(r.offset for r in log) == 4  # five records appended in all, none twice
    assert sorted((r.key, r.value) for r in restarted.state().collect()) == [
        ("a", "a2"),
        ("b", "b1"),
        ("d", "d1"),
    ]
