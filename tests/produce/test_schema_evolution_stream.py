"""The ten-step schema history through a streaming query, on a classic and a Connect session.

Each step is a JSON file read by a file-source query restarted with the step's schema on
the same checkpoint (as a producer's new schema reaches a job), the sink in
``foreachBatch``; passes run in between. After every step ``state()`` equals the dict
replay. A refused change stops the query with the field named, and writes nothing.
"""

from __future__ import annotations

import json

import pytest
from evolution_history import STEPS, Replay, as_dicts
from pyspark.sql import functions as F

from sinks import CleanerConfig, CompactedStateSink

CONFIG = CleanerConfig(min_cleanable_dirty_ratio=1.0)


def run_step(spark, source, checkpoint, sink, step, name: str):
    source.mkdir(exist_ok=True)
    (source / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in step.records()))
    stream = (
        spark.readStream.schema(step.schema()).option("maxFilesPerTrigger", 1).json(str(source))
    )
    if not step.value["id"].nullable:
        # File sources read every field nullable; the producer's schema says value.id is
        # required until the step that relaxes it.
        stream = stream.withColumn(
            "value", F.col("value").withField("id", F.coalesce(F.col("value.id"), F.lit(0)))
        )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    return query


@pytest.mark.both_sessions
def test_a_streaming_query_follows_a_ten_step_history(spark, lake, clock):
    source, checkpoint, path = lake / "in", lake / "_chk", str(lake / "log")
    sink = CompactedStateSink(
        path, config=CONFIG, clock=clock, checkpoint_location=str(checkpoint), cleaning="inline"
    )
    replay = Replay()
    for i, step in enumerate(STEPS):
        query = run_step(spark, source, checkpoint, sink, step, f"{i:02d}")
        query.awaitTermination()
        assert query.exception() is None, step.name
        replay.apply(step)
        if step.clean_after:
            assert sink.clean(force=True) is not None, step.name
        value = sink.log_table.snapshot().spark_schema["value"].dataType
        assert as_dicts(sink.state().collect()) == replay.state(value), step.name
    assert value == STEPS[-1].value

    # A producer that drops a field: the query stops, naming it; nothing is written.
    version = sink.log_table.snapshot().version
    dropped = STEPS[-1].value
    step = type(STEPS[-1])(
        "drop value.email",
        type(dropped)([x for x in dropped.fields if x.name != "email"]),
        [("z", None)],
    )
    query = run_step(spark, source, checkpoint, sink, step, "99")
    with pytest.raises(Exception, match=r"field 'value.email' \(string\) of the log is missing"):
        query.awaitTermination()
    assert sink.log_table.snapshot().version == version


def test_the_data_source_sink_evolves_the_log_and_honours_none(spark, lake):
    from streaming.consumers.datasource import register

    register(spark)
    source, path = lake / "in", str(lake / "log")
    source.mkdir()

    def run(name, ddl, rows, evolution="additive"):
        (source / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        query = (
            spark.readStream.schema(ddl)
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.format("compacted-state")
            .option("path", path)
            .option("schema_evolution", evolution)
            .option("checkpointLocation", str(lake / "_chk"))
            .trigger(availableNow=True)
            .start()
        )
        return query

    run(
        "0", "key string, value struct<a:string>", [{"key": "a", "value": {"a": "1"}}]
    ).awaitTermination()
    run(
        "1",
        "key string, value struct<b:int, a:string>, note string",
        [{"key": "b", "value": {"a": "2", "b": 3}, "note": "n"}],
    ).awaitTermination()
    sink = CompactedStateSink(path)
    assert {r["key"]: r["value"].asDict() for r in sink.state().collect()} == {
        "a": {"a": "1", "b": None},
        "b": {"a": "2", "b": 3},
    }
    assert sink.log_table.snapshot().spark_schema.names[-1] == "note"
    version = sink.log_table.snapshot().version
    query = run(
        "2",
        "key string, value struct<a:string, b:int, c:double>, note string",
        [{"key": "c", "value": {"a": "3", "b": 1, "c": 0.5}}],
        evolution="none",
    )
    with pytest.raises(Exception, match=r"field 'value.c' \(double\) is new in the batch"):
        query.awaitTermination()
    assert sink.log_table.snapshot().version == version
