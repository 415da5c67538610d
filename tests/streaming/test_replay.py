"""Disaster recovery: export a log to Avro, verify it, restore it into a new log as it was.

The round trip keeps what consumers depend on: each (partition, key)'s latest record at
its partition and offset, with its timestamp, headers, topic and payload columns, the
tombstones a lagging consumer still needs, the log's config, and each partition's log
start and end offsets, so the next append continues where the source's would have.
"""

from __future__ import annotations

import datetime as dt
import json

import fastavro
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sinks import CleanerConfig, CompactedStateSink
from sinks.cleaner.rules import latest_records
from sinks.errors import ConfigError, NotACompactedLogError
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogTable
from sinks.reading.arrow_export import (
    export_state_arrow,
    verify_export_arrow,
    verify_restore_arrow,
)
from sinks.reading.export import (
    export_state,
    read_export,
    verify_export,
)
from sinks.reading.export_format import (
    ReplayError,
)
from sinks.reading.replay import (
    RestoreSource,
    RestoreTargetError,
    replay,
)

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

HEADERS = T.ArrayType(
    T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])
)
KAFKA_SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType()),
        T.StructField(
            "value",
            T.StructType(
                [T.StructField("name", T.StringType()), T.StructField("score", T.DoubleType())]
            ),
        ),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestampType", T.IntegerType()),
        T.StructField("headers", HEADERS),
        T.StructField("region", T.StringType()),
    ]
)
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def kafka_rows(batch: int, entries: list[tuple[str, int, int, str | None]]) -> list[tuple]:
    """Rows as Spark's Kafka source gives them: (key, partition, offset, name or None)."""
    rows = []
    for key, partition, offset, name in entries:
        value = None if name is None else (name, float(offset))
        headers = [("trace", f"{batch}-{offset}".encode()), ("source", b"crm")]
        stamp = START + dt.timedelta(minutes=batch, seconds=offset)
        region = ["eu", "us", "ap"][partition]
        rows.append((key, value, "users", partition, offset, stamp, 0, headers, region))
    return rows


def live(log: DataFrame, keys: tuple[str, ...] = ("key",)) -> DataFrame:
    """The live records of a ``log()``: each (partition, key)'s latest, not a tombstone."""
    return latest_records(log, LogKeys(key_columns=("partition", *keys))).filter(
        F.col("value").isNotNull()
    )


def latest(log: DataFrame, keys: tuple[str, ...] = ("key",)) -> DataFrame:
    """Each (partition, key)'s latest record of a ``log()``, tombstones included."""
    return latest_records(log, LogKeys(key_columns=("partition", *keys))).select(*log.columns)


def kafka_log(spark, path: str, clock) -> CompactedStateSink:
    """Three partitions of Kafka input (offsets with gaps), two passes, then a dirty tail.

    Partition 2's last record is a tombstone that the second pass removes: its log end
    offset (13) lies beyond its last surviving record, and only the log records it.
    """
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, delete_retention_ms=1_000)
    sink = CompactedStateSink(path, config=config, clock=clock)
    df = lambda batch, entries: spark.createDataFrame(kafka_rows(batch, entries), KAFKA_SCHEMA)  # noqa: E731
    sink(
        df(
            0,
            [
                ("a", 0, 0, "Ann"),
                ("b", 0, 2, "Bob"),  # offset 1 is a gap: a transaction marker in Kafka
                ("c", 0, 3, "Cat"),
                ("d", 1, 0, "Dan"),
                ("e", 1, 1, "Eve"),
                ("f", 2, 5, "Fay"),
                ("g", 2, 7, "Gus"),
            ],
        ),
        0,
    )
    sink(
        df(
            1,
            [
                ("a", 0, 4, "Ann2"),
                ("c", 0, 6, None),  # a tombstone the first pass stamps, the second removes
                ("e", 1, 3, "Eve2"),
                ("g", 2, 9, "Gus2"),
                ("f", 2, 12, None),  # partition 2's last record, removed by the second pass
            ],
        ),
        1,
    )
    sink.clean(force=True)
    clock.advance(5_000)
    sink(df(2, [("b", 0, 8, None), ("h", 1, 6, "Hal")]), 2)  # stamped by the second pass
    sink.clean(force=True)
    sink(
        df(
            3,
            [
                ("a", 0, 10, "Ann3"),
                ("a", 0, 11, "Ann4"),  # the dirty tail holds a superseded record
                ("d", 1, 9, None),  # a tombstone no pass has stamped yet
                ("i", 1, 12, "Ivy"),
            ],
        ),
        3,
    )
    return sink


def test_round_trip_keeps_partitions_offsets_every_column_and_the_config(spark, lake, clock):
    source = kafka_log(spark, str(lake / "users"), clock)
    DeltaTable(source.path).alter.set_table_properties(
        {"delete.retention.ms": "1000"}, raise_if_not_exists=False
    )
    snapshot = source.log_table.snapshot()
    ends = snapshot.log_end_offsets()
    assert ends == {0: 12, 1: 13, 2: 13}
    last_p2 = source.log().filter("partition = 2").agg(F.max("offset")).first()[0]
    assert last_p2 == 9  # the log end offset is not derivable from the records
    lines: list[str] = []

    report = export_state(source, str(lake / "export"), codec="deflate", progress=lines.append)

    expected_latest = latest(source.log())
    # Live keys a, e, g, h, i; tombstones b (stamped) and d (not yet): c and f are gone.
    assert (report.keys, report.tombstones, report.records) == (5, 2, 7)
    assert any(
        line.startswith("exported 5 keys (7 records: 5 live, 2 tombstones") for line in lines
    )
    manifest = json.loads((lake / "export" / "_manifest.json").read_text())
    assert manifest["format"] == 2 and manifest["records"] == 7
    assert manifest["partitions"]["2"] == {
        "log_start_offset": 0,
        "log_end_offset": 13,
        "cleaner_offset": snapshot.cleaner_offset(2),
    }
    assert manifest["config"]["key_columns"] == ["key"]
    assert manifest["config"]["properties"]["delete.retention.ms"] == "1000"
    assert manifest["config"]["properties"]["compacted.sink.key.columns"] == '["key"]'
    records = []
    for name in report.files:
        with open(lake / "export" / name, "rb") as f:
            reader = fastavro.reader(f)
            assert reader.codec == "deflate"
            records += reader
    hal = next(r for r in records if r["key"] == "h")
    assert hal["partition"] == 1 and hal["offset"] == 6 and hal["topic"] == "users"
    assert hal["headers"] == [{"key": "trace", "value": b"2-6"}, {"key": "source", "value": b"crm"}]
    assert hal["timestamp"] == START + dt.timedelta(minutes=2, seconds=6)
    assert hal["region"] == "us" and hal["timestampType"] == 0
    verification = verify_export(source, str(lake / "export"))
    assert verification.ok, verification.lines()

    # The same export without Spark is the same records.
    arrow = export_state_arrow(source.log_table, str(lake / "export-arrow"))
    assert (arrow.keys, arrow.tombstones, arrow.records) == (5, 2, 7)
    assert verify_export_arrow(source.log_table, str(lake / "export-arrow")).ok
    assert_df_equality(
        read_export(spark, str(lake / "export-arrow")),
        read_export(spark, str(lake / "export")),
        ignore_row_order=True,
    )

    # Restore into a new path: the live records' log() is the source's, every column.
    restored_path = str(lake / "restored")
    done = replay(RestoreSource.of_export(spark, str(lake / "export")), restored_path)
    again = replay(RestoreSource.of_export(spark, str(lake / "export")), restored_path)
    assert done.records == 7 and not done.skipped and again.skipped  # exactly once
    restored = CompactedStateSink(restored_path, clock=clock)
    assert restored.key_columns == ("key",)
    assert_df_equality(live(restored.log()), live(source.log()), ignore_row_order=True)
    assert_df_equality(latest(restored.log()), expected_latest, ignore_row_order=True)
    assert_df_equality(restored.log(), expected_latest, ignore_row_order=True)
    assert_df_equality(restored.state(), source.state(), ignore_row_order=True)
    after = restored.log_table.snapshot()
    assert after.log_end_offsets() == ends
    assert {p: after.cleaner_offset(p) for p in after.partitions} == {
        p: snapshot.cleaner_offset(p) for p in snapshot.partitions
    }
    configuration = after.table.metadata().configuration
    assert configuration["delete.retention.ms"] == "1000"
    assert configuration["compacted.sink.key.columns"] == '["key"]'
    assert verify_restore_arrow(str(lake / "export"), LogTable(restored_path)).ok

    # A restore into a log that holds records is refused, whatever the batch id.
    with pytest.raises(RestoreTargetError, match="already holds a log"):
        replay(RestoreSource.of_export(spark, str(lake / "export")), restored_path, batch_id=1)

    # Offsets continue after the source's log end, where its last records were cleaned away.
    appended = spark.createDataFrame(kafka_rows(4, [("j", 2, 0, "Jo")]), KAFKA_SCHEMA)
    restored(appended.drop("offset"), 0)
    j = restored.log().filter("key = 'j'").select("partition", "offset").first()
    assert (j.partition, j.offset) == (2, 13)

    # The target tampered with (an append after the restore): the verification names it.
    check = verify_restore_arrow(str(lake / "export"), LogTable(restored_path))
    assert not check.ok
    assert check.unexpected == 1
    assert any("not in export" in e and '"j"' in e for e in check.examples)
    assert any("partition 2: log end offset 13" in e for e in check.offset_differences)

    # From a log directly: log -> new log at another path.
    copy = str(lake / "copy")
    replay(RestoreSource.of_log(spark, source.path), copy)
    assert_df_equality(CompactedStateSink(copy).log(), expected_latest, ignore_row_order=True)
    assert verify_restore_arrow(source.path, LogTable(copy)).ok


def test_a_tampered_export_is_named_by_the_verification(spark, lake, clock):
    source = kafka_log(spark, str(lake / "users"), clock)
    report = export_state_arrow(source.log_table, str(lake / "export"))
    (name,) = report.files
    path = lake / "export" / name
    with open(path, "rb") as f:
        reader = fastavro.reader(f)
        schema, records = reader.writer_schema, list(reader)
    for r in records:
        if r["key"] == "e":
            r["value"] = {"name": "Mallory", "score": 0.0}
        if r["key"] == "i":
            r["offset"] = 11
    with open(path, "wb") as f:
        fastavro.writer(f, schema, records, codec="deflate")

    check = verify_export_arrow(source.log_table, str(lake / "export"), max_examples=1)
    assert not check.ok
    assert check.differing == {"value": 1, "offset": 1}
    assert check.missing == check.unexpected == 0
    lines = check.lines()
    assert "DOES NOT match" in lines[0] and "differing columns: offset 1, value 1" in lines[0]
    assert len(lines) == 3 and "… and 1 more difference(s)" in lines[2]
    assert "offset differs" in lines[1] or "value differs" in lines[1]


def test_lossy_new_offsets_only_by_name(spark, lake, clock):
    source = kafka_log(spark, str(lake / "users"), clock)
    export_state_arrow(source.log_table, str(lake / "export"))
    with pytest.raises(ConfigError, match="'exact' or 'new-offsets'"):
        replay(RestoreSource.of_export(spark, str(lake / "export")), str(lake / "x"), mode="lossy")  # type: ignore[arg-type]

    lossy = str(lake / "lossy")
    done = replay(RestoreSource.of_export(spark, str(lake / "export")), lossy, mode="new-offsets")
    assert done.records == 5 and "NEW offsets in partition 0" in done.summary()
    target = CompactedStateSink(lossy)
    assert_df_equality(target.state(), source.state(), ignore_row_order=True)
    rows = target.log().select("partition", "offset").collect()
    assert sorted(r.offset for r in rows) == [0, 1, 2, 3, 4] and {r.partition for r in rows} == {0}
    kept = target.log().filter("key = 'h'").first()
    assert kept.topic == "users" and kept.region == "us" and len(kept.headers) == 2

    check = verify_restore_arrow(str(lake / "export"), LogTable(lossy), mode="new-offsets")
    assert check.ok, check.lines()
    assert (
        "not compared (new-offsets mode): partition, offset, delete_horizon_ms" in check.summary()
    )
    exact = verify_restore_arrow(str(lake / "export"), LogTable(lossy))
    assert not exact.ok and exact.offset_differences  # what the lossy mode does not keep

    # Someone else's files where the new log would go: refused, every byte left.
    theirs = lake / "theirs" / "data.parquet"
    theirs.parent.mkdir()
    theirs.write_bytes(b"someone else's")
    with pytest.raises(NotACompactedLogError):
        replay(RestoreSource.of_export(spark, str(lake / "export")), str(lake / "theirs"))
    assert sorted(p.name for p in (lake / "theirs").iterdir()) == ["data.parquet"]
    assert theirs.read_bytes() == b"someone else's"

    # An export from before exports carried offsets restores only with new offsets.
    manifest_path = lake / "export" / "_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["format"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ReplayError, match="older export"):
        replay(RestoreSource.of_export(spark, str(lake / "export")), str(lake / "old"))
    assert LogTable(str(lake / "old")).snapshot() is None  # refused before anything was written


@pytest.mark.both_sessions
def test_export_verify_and_restore_give_the_same_log(spark, lake, clock) -> None:
    sink = CompactedStateSink(str(lake / "users"), key_columns=("id",), clock=clock)
    first = [("a", ("Ann", ["x"], 1.0)), ("b", ("Bob", [], 2.0)), ("c", ("Cat", None, 3.0))]
    sink(spark.createDataFrame(first, SCHEMA), 0)
    after_first = sink.log_table.snapshot().version
    sink(spark.createDataFrame([("a", ("Ann", ["y"], 9.0)), ("c", None)], SCHEMA), 1)
    lines: list[str] = []

    report = export_state(sink, str(lake / "export"), codec="deflate", progress=lines.append)

    assert report.keys == 2 and report.tombstones == 1
    assert report.log_version == sink.log_table.snapshot().version
    assert any(line.startswith("exported 2 keys") for line in lines)
    records = []
    for name in report.files:  # one container file per Spark partition of the records
        with open(lake / "export" / name, "rb") as f:
            reader = fastavro.reader(f)
            assert reader.codec == "deflate"
            assert reader.writer_schema["name"] == "compacted_sink.CompactedState"
            records += reader
    records.sort(key=lambda r: r["id"])
    assert records[0]["value"] == {"name": "Ann", "tags": ["y"], "score": 9.0}
    assert (records[0]["partition"], records[0]["offset"]) == (0, 3)
    assert records[2]["id"] == "c" and records[2]["value"] is None  # the tombstone travels
    assert verify_export(sink, str(lake / "export")).ok

    restored_path = str(lake / "restored")
    done = replay(RestoreSource.of_export(spark, str(lake / "export")), restored_path)
    assert done.records == 3
    restored = CompactedStateSink(restored_path)
    assert_df_equality(restored.state(), sink.state(), ignore_row_order=True, ignore_nullable=True)
    assert_df_equality(
        restored.log(), latest(sink.log(), ("id",)), ignore_row_order=True, ignore_nullable=True
    )

    # Time travel: the log before batch 1, restored into another log.
    before = str(lake / "before")
    replay(RestoreSource.of_log(spark, sink.path, as_of=after_first), before)
    assert sorted(r["id"] for r in CompactedStateSink(before).state().collect()) == ["a", "b", "c"]

    with pytest.raises(ReplayError, match="already holds an export"):
        export_state(sink, str(lake / "export"))
    manifest = json.loads((lake / "export" / "_manifest.json").read_text())
    assert manifest["key_columns"] == ["id"] and manifest["keys"] == 2


def test_an_unusable_codec_is_refused_before_any_work(lake) -> None:
    sink = CompactedStateSink(str(lake / "users"), key_columns=("id",))
    with pytest.raises(ReplayError, match="codec 'brotli'"):
        export_state(sink, str(lake / "export"), codec="brotli")  # type: ignore[arg-type]
