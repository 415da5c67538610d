"""Disaster recovery: export a state snapshot to Avro, verify it, restore it into a new log."""

from __future__ import annotations

import json

import fastavro
import pytest
from chispa import assert_df_equality
from pyspark.sql import types as T

from sinks import CompactedStateSink
from sinks.reading.replay import ReplayError, export_state, read_export, restore, verify_export

SCHEMA = T.StructType(
    [
        T.StructField("id", T.StringType()),
        T.StructField(
            "value",
            T.StructType(
                [
                    T.StructField("name", T.StringType()),
                    T.StructField("tags", T.ArrayType(T.StringType())),
                    T.StructField("score", T.DoubleType()),
                ]
            ),
        ),
    ]
)


@pytest.mark.both_sessions
def test_export_verify_and_restore_give_the_same_state(spark, lake, clock) -> None:
    sink = CompactedStateSink(str(lake / "users"), key_columns=("id",), clock=clock)
    first = [("a", ("Ann", ["x"], 1.0)), ("b", ("Bob", [], 2.0)), ("c", ("Cat", None, 3.0))]
    sink(spark.createDataFrame(first, SCHEMA), 0)
    after_first = sink.log_table.snapshot().version
    sink(spark.createDataFrame([("a", ("Ann", ["y"], 9.0)), ("c", None)], SCHEMA), 1)
    lines: list[str] = []

    report = export_state(sink, str(lake / "export"), codec="deflate", progress=lines.append)

    assert report.keys == 2 and report.log_version == sink.log_table.snapshot().version
    assert any(line.startswith("exported 2 keys") for line in lines)
    records = []
    for name in report.files:  # one container file per Spark partition of state()
        with open(lake / "export" / name, "rb") as f:
            reader = fastavro.reader(f)
            assert reader.codec == "deflate"
            assert reader.writer_schema["name"] == "compacted_sink.CompactedState"
            records += reader
    records.sort(key=lambda r: r["id"])
    assert records[0] == {"id": "a", "value": {"name": "Ann", "tags": ["y"], "score": 9.0}}
    assert verify_export(sink, str(lake / "export")).ok

    restored = CompactedStateSink(str(lake / "restored"), key_columns=("id",))
    done = restore(read_export(spark, str(lake / "export")), restored, source_name="export")
    again = restore(read_export(spark, str(lake / "export")), restored, source_name="export")
    assert done.records == 2 and again.skipped  # exactly once per batch id
    assert_df_equality(restored.state(), sink.state(), ignore_row_order=True, ignore_nullable=True)

    # Time travel: the state before batch 1, replayed into another log.
    before = CompactedStateSink(str(lake / "before"), key_columns=("id",))
    restore(sink.state(as_of=after_first), before, source_name=f"v{after_first}")
    assert sorted(r["id"] for r in before.state().collect()) == ["a", "b", "c"]

    with pytest.raises(ReplayError, match="already holds an export"):
        export_state(sink, str(lake / "export"))
    manifest = json.loads((lake / "export" / "_manifest.json").read_text())
    assert manifest["key_columns"] == ["id"] and manifest["keys"] == 2


def test_an_unusable_codec_is_refused_before_any_work(lake) -> None:
    sink = CompactedStateSink(str(lake / "users"), key_columns=("id",))
    with pytest.raises(ReplayError, match="codec 'brotli'"):
        export_state(sink, str(lake / "export"), codec="brotli")  # type: ignore[arg-type]
