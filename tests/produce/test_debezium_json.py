"""``value_format="debezium-json"``: Debezium's change events into the state (design.md §52, §53).

Batches are made as Spark's Kafka source gives them (binary key and value holding the JSON
converter's output, with and without schemas) and as JSON lines with Kafka's columns; the
judge is the table the events describe, compared with chispa.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from sinks import CompactedStateSink, read_state
from sinks.errors import BadInputError
from sinks.log.location import LogLocation
from sinks.produce.dead_letter import DeadLetterTable
from sinks.produce.debezium_json import SOURCE_POSITION, UNAVAILABLE_VALUE

KAFKA = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
    ]
)
VALUE_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "born"},
]


class Topic:
    """A topic of one table's change events, as Debezium's PostgreSQL connector writes them."""

    def __init__(
        self,
        *,
        schemas: bool,
        fields: list[dict[str, Any]] | None = None,
        compact: bool = False,
    ) -> None:
        self.schemas = schemas
        self.fields = fields or VALUE_FIELDS
        # Kafka Connect's JSON converter writes compact JSON; json.dumps' default has spaces.
        self.separators = (",", ":") if compact else None
        self.offset = 0
        self.records: list[tuple[Any, ...]] = []

    def _wrap(self, payload: Any, schema: dict[str, Any]) -> bytes:
        body = {"schema": schema, "payload": payload} if self.schemas else payload
        return json.dumps(body, separators=self.separators).encode()

    def _key(self, id_: int) -> bytes:
        schema = {"type": "struct", "fields": [self.fields[0]], "name": "db.public.t.Key"}
        return self._wrap({"id": id_}, schema)

    def event(
        self, op: str, id_: int, lsn: int | None, after: dict[str, Any] | None = None
    ) -> Topic:
        row = {
            "type": "struct",
            "fields": self.fields,
            "optional": True,
            "name": "db.public.t.Value",
        }
        source = {
            "type": "struct",
            "fields": [{"type": "int64", "field": "lsn"}, {"type": "int64", "field": "ts_ms"}],
            "field": "source",
        }
        schema = {
            "type": "struct",
            "fields": [
                {**row, "field": "before"},
                {**row, "field": "after"},
                source,
                {"type": "string", "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
            ],
            "name": "db.public.t.Envelope",
        }
        payload = {
            "before": None,
            "after": after,
            "source": {"lsn": lsn, "ts_ms": 1_700_000_000_000, "connector": "postgresql"},
            "op": op,
            "ts_ms": 1_700_000_000_000,
        }
        return self._append(self._key(id_), self._wrap(payload, schema))

    def tombstone(self, id_: int) -> Topic:
        return self._append(self._key(id_), None)

    def _append(self, key: bytes, value: bytes | None) -> Topic:
        self.records.append((key, value, "db.public.t", 0, self.offset, None))
        self.offset += 1
        return self

    def batch(self, spark: SparkSession) -> DataFrame:
        """The records since the last batch, as Spark's Kafka source gives them."""
        records, self.records = self.records, []
        return spark.createDataFrame(records, KAFKA)


def _table(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    schema = T.StructType(
        [
            T.StructField("id", T.IntegerType()),
            T.StructField("name", T.StringType()),
            T.StructField("born", T.DateType()),
        ]
    )
    return spark.createDataFrame(rows, schema)


def _state(sink: CompactedStateSink) -> DataFrame:
    return sink.state().select("value.*")


def row(id_: int, name: str | None, born: int | None = None) -> dict[str, Any]:
    return {"id": id_, "name": name, "born": born}


@pytest.mark.parametrize("compact", [False, True], ids=["spaced", "compact"])
def test_snapshot_changes_deletes_and_redelivery_give_the_table(
    spark: SparkSession, tmp_path: Path, compact: bool
) -> None:
    import datetime

    topic = Topic(schemas=True, compact=compact)
    topic.event("r", 1, 100, row(1, "ann", 0)).event("r", 2, 100, row(2, "bob")).event(
        "r", 3, 100, row(3, "cy")
    )
    topic.event("c", 4, 200, row(4, "dee")).event("u", 1, 210, row(1, "ann2", 1))
    topic.event("d", 2, 220).tombstone(2)
    # A primary-key change: d (and its tombstone) of the old key, c of the new one.
    topic.event("d", 3, 230).tombstone(3).event("c", 30, 230, row(30, "cy"))
    # Kafka Connect redelivers older events (at least once): they must not win.
    topic.event("u", 1, 210, row(1, "ann2", 1)).event("c", 4, 200, row(4, "dee"))
    topic.event("d", 2, 220).tombstone(2).event("r", 1, 100, row(1, "ann", 0))
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(topic.batch(spark), 0)

    day = datetime.date(1970, 1, 1)
    expected = _table(
        spark,
        [(1, "ann2", day + datetime.timedelta(days=1)), (4, "dee", None), (30, "cy", None)],
    )
    assert_df_equality(_state(sink), expected, ignore_row_order=True, ignore_nullable=True)
    assert sink.sequence_column == SOURCE_POSITION
    arrow = read_state(str(tmp_path / "log"))
    assert sorted(arrow.column("value").to_pylist(), key=lambda r: r["id"]) == [
        r.asDict() for r in expected.orderBy("id").collect()
    ]
    sink.close()


@pytest.mark.parametrize("compact", [False, True], ids=["schemaless", "compact"])
def test_a_tombstone_without_its_delete_deletes_and_a_later_insert_wins(
    spark: SparkSession, tmp_path: Path, compact: bool
) -> None:
    """Kafka compaction of the source topic may leave a delete's tombstone alone."""
    topic = Topic(schemas=compact, compact=compact)
    topic.event("c", 1, 10, row(1, "a")).event("c", 2, 11, row(2, "b")).event(
        "c", 3, 12, row(3, "c")
    )
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(topic.batch(spark), 0)
    # The d events were compacted away; 9 was never seen (its tombstone deletes nothing).
    topic.tombstone(1).tombstone(9).tombstone(2).event("c", 2, 40, row(2, "b2"))
    # An older event of 1 redelivered after its tombstone loses to it.
    topic.event("u", 1, 10, row(1, "a"))
    sink(topic.batch(spark), 1)
    # A schema's int32 is an int; without schemas JSON's inference says long.
    id_type = "int" if compact else "long"
    expected = spark.createDataFrame([(2, "b2"), (3, "c")], f"id {id_type}, name string")
    assert_df_equality(
        _state(sink).select("id", "name"), expected, ignore_row_order=True, ignore_nullable=True
    )
    positions = sink.log().where("id = 1 AND value IS NULL").select(SOURCE_POSITION).collect()
    assert [r[0] for r in positions] == ["00000000000000000010~"]
    assert sink.log().where("id = 9").count() == 0
    sink.close()


@pytest.mark.parametrize("compact", [False, True], ids=["spaced", "compact"])
def test_unchanged_toast_values_keep_the_previous_value(
    spark: SparkSession, tmp_path: Path, compact: bool
) -> None:
    topic = Topic(schemas=True, compact=compact)
    topic.event("c", 1, 10, row(1, "long text")).event("c", 2, 11, row(2, "other"))
    topic.event("u", 1, 12, row(1, UNAVAILABLE_VALUE, 5))  # from the same batch
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(topic.batch(spark), 0)
    topic.event("u", 2, 20, row(2, UNAVAILABLE_VALUE, 7))  # from the log
    sink(topic.batch(spark), 1)
    state = {r["id"]: (r["name"], r["born"].day) for r in _state(sink).collect()}
    assert state == {1: ("long text", 6), 2: ("other", 8)}

    topic.event("u", 5, 30, row(5, UNAVAILABLE_VALUE))  # nothing earlier: refused by name
    version = sink.log_table.snapshot().version
    with pytest.raises(BadInputError, match=r"unchanged TOAST value .* of name"):
        sink(topic.batch(spark), 2)
    assert sink.log_table.snapshot().version == version  # nothing written
    sink.close()


@pytest.mark.parametrize("compact", [False, True], ids=["spaced", "compact"])
def test_a_primary_key_change_keeps_the_old_keys_unchanged_toast_values(
    spark: SparkSession, tmp_path: Path, compact: bool
) -> None:
    # UPDATE t SET id = new WHERE id = old on a row whose TOASTed text is unchanged: Debezium
    # sends a d of the old key and a c of the new one at one LSN, the c with the placeholder.
    topic = Topic(schemas=True, compact=compact)
    topic.event("c", 1, 10, row(1, "long one")).event("c", 2, 11, row(2, "long two"))
    topic.event("c", 7, 12, row(7, "gone")).event("d", 7, 13).tombstone(7)
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(topic.batch(spark), 0)
    # 1 -> 3 from the log; 2 -> 4 from the batch (after an update of it); 3 updated again.
    topic.event("d", 1, 20).tombstone(1).event("c", 3, 20, row(3, UNAVAILABLE_VALUE, 1))
    topic.event("u", 2, 21, row(2, "long two, changed"))
    topic.event("d", 2, 22).tombstone(2).event("c", 4, 22, row(4, UNAVAILABLE_VALUE, 2))
    topic.event("u", 3, 23, row(3, UNAVAILABLE_VALUE, 3))
    # A key deleted in the batch, then taken by a primary-key change: the old key's value.
    topic.event("c", 5, 24, row(5, "five")).event("c", 8, 25, row(8, "long eight"))
    topic.event("d", 5, 26).tombstone(5)
    topic.event("d", 8, 27).tombstone(8).event("c", 5, 27, row(5, UNAVAILABLE_VALUE, 4))
    sink(topic.batch(spark), 1)
    expected = [
        (3, "long one", dt.date(1970, 1, 4)),
        (4, "long two, changed", dt.date(1970, 1, 3)),
        (5, "long eight", dt.date(1970, 1, 5)),
    ]
    assert_df_equality(
        _state(sink), _table(spark, expected), ignore_row_order=True, ignore_nullable=True
    )

    # Chains within one batch: 10 -> 11 -> 12 from the batch, 3 -> 13 -> 14 -> 15 from the log.
    topic.event("c", 10, 30, row(10, "ten"))
    for old, new, lsn in ((10, 11, 31), (11, 12, 32), (3, 13, 33), (13, 14, 34), (14, 15, 35)):
        topic.event("d", old, lsn).tombstone(old)
        topic.event("c", new, lsn, row(new, UNAVAILABLE_VALUE, new))
    sink(topic.batch(spark), 2)
    expected = [
        (4, "long two, changed", dt.date(1970, 1, 3)),
        (5, "long eight", dt.date(1970, 1, 5)),
        (12, "ten", dt.date(1970, 1, 13)),
        (15, "long one", dt.date(1970, 1, 16)),
    ]
    assert_df_equality(
        _state(sink), _table(spark, expected), ignore_row_order=True, ignore_nullable=True
    )
    sink.close()


def test_an_empty_batch_is_one_and_keys_without_fields_are_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Spark's first micro-batch of a topic Debezium has not written to yet holds no record.
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(spark.createDataFrame([], KAFKA), 0)
    assert sink.log_table.snapshot() is None  # nothing to create the log with
    topic = Topic(schemas=False)
    sink(topic.event("c", 1, 10, row(1, "one")).batch(spark), 1)
    sink(spark.createDataFrame([], KAFKA), 2)
    assert [r["name"] for r in _state(sink).collect()] == ["one"]
    keyless = [(None, b'{"op": "c", "after": {"id": 2}, "source": {"lsn": 11}}', "t", 0, 9, None)]
    with pytest.raises(BadInputError, match="the message keys hold no fields"):
        sink(spark.createDataFrame(keyless, KAFKA), 3)
    sink.close()


def test_truncate_and_other_ops_are_refused_by_name(spark: SparkSession, tmp_path: Path) -> None:
    topic = Topic(schemas=False)
    topic.event("c", 1, 10, row(1, "a")).event("t", 1, 11)
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    with pytest.raises(BadInputError, match=r"op=t \(TRUNCATE\)"):
        sink(topic.batch(spark), 0)
    assert not (tmp_path / "log" / "_delta_log").exists()
    with pytest.raises(BadInputError, match=r"key_columns=\('id',\)"):
        CompactedStateSink(tmp_path / "other", ("key",), value_format="debezium-json")(
            Topic(schemas=True).event("c", 1, 1, row(1, "a")).batch(spark), 0
        )
    sink.close()
    # With a dead-letter table the refused event goes there and the others are appended.
    dead = str(tmp_path / "dead")
    topic.event("c", 1, 10, row(1, "a")).event("t", 1, 11).event("c", 2, 12, row(2, "b"))
    sink = CompactedStateSink(
        tmp_path / "log", ("id",), value_format="debezium-json", dead_letter_table=dead
    )
    sink(topic.batch(spark), 0)
    assert sorted(r["id"] for r in _state(sink).collect()) == [1, 2]
    (letter,) = DeadLetterTable(LogLocation(dead)).read().to_pylist()
    assert "op=t (TRUNCATE)" in letter["reason"]
    sink.close()


@pytest.mark.parametrize("compact", [False, True], ids=["spaced", "compact"])
def test_a_column_added_at_the_source_evolves_the_log(
    spark: SparkSession, tmp_path: Path, compact: bool
) -> None:
    old = Topic(schemas=True, compact=compact)
    old.event("c", 1, 10, row(1, "a")).event("c", 2, 11, row(2, "b"))
    wider = [*VALUE_FIELDS, {"type": "int64", "optional": True, "field": "score"}]
    new = Topic(schemas=True, fields=wider, compact=compact)
    new.offset = old.offset
    new.event("u", 2, 20, {**row(2, "b2"), "score": 7})
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(old.batch(spark), 0)
    sink(new.batch(spark), 1)
    state = {r["id"]: (r["name"], r["score"]) for r in _state(sink).collect()}
    assert state == {1: ("a", None), 2: ("b2", 7)}
    # Events from before the column, redelivered: the log keeps the field; they lose.
    old.offset = new.offset
    old.event("c", 2, 11, row(2, "b")).event("u", 1, 12, row(1, "a1"))
    sink(old.batch(spark), 2)
    state = {r["id"]: (r["name"], r["score"]) for r in _state(sink).collect()}
    assert state == {1: ("a1", None), 2: ("b2", 7)}
    sink.close()


def test_json_lines_with_kafka_columns(spark: SparkSession, tmp_path: Path) -> None:
    topic = Topic(schemas=False)
    topic.event("r", 1, 5, row(1, "a")).event("u", 1, 6, row(1, "b")).event("d", 1, 7)
    topic.tombstone(1).event("c", 2, 8, row(2, "z"))
    lines = [
        json.dumps(
            {
                "key": key.decode(),
                "value": value.decode() if value else None,
                "partition": p,
                "offset": o,
            }
        )
        for key, value, _, p, o, _ in topic.records
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.json").write_text("\n".join(lines) + "\n")
    batch = spark.read.schema("key string, value string, partition int, offset long").json(
        str(tmp_path / "in")
    )
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(batch, 0)
    expected = spark.createDataFrame([(2, "z")], "id long, name string")
    assert_df_equality(
        _state(sink).select("id", "name"), expected, ignore_row_order=True, ignore_nullable=True
    )
    sink.close()


def test_mysql_events_are_ordered_by_binlog_file_position_and_row(
    spark: SparkSession, tmp_path: Path
) -> None:
    def event(offset: int, id_: int, name: str, file: str, pos: int, row_: int) -> tuple:
        payload = {
            "before": None,
            "after": {"id": id_, "name": name},
            "source": {"connector": "mysql", "file": file, "pos": pos, "row": row_, "ts_ms": 1},
            "op": "u",
            "ts_ms": 1,
        }
        key = json.dumps({"id": id_}).encode()
        return (key, json.dumps(payload).encode(), "db.t", 0, offset, None)

    records = [
        event(0, 1, "a", "mysql-bin.000002", 900, 0),
        event(1, 1, "b", "mysql-bin.000003", 4, 0),  # a later file, a smaller position
        event(2, 2, "x", "mysql-bin.000003", 10, 1),
        event(3, 2, "y", "mysql-bin.000003", 10, 0),  # redelivered: the same event, row 0
        event(4, 1, "a", "mysql-bin.000002", 900, 0),  # redelivered: older
    ]
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(spark.createDataFrame(records, KAFKA), 0)
    assert {r["id"]: r["name"] for r in _state(sink).collect()} == {1: "b", 2: "x"}
    sink.close()


def _batch(spark: SparkSession, *topics: Topic) -> DataFrame:
    """The records of ``topics`` (one topic's partition written by several) in offset order."""
    records = sorted((r for t in topics for r in t.records), key=lambda r: r[4])
    for t in topics:
        t.records = []
    return spark.createDataFrame(records, KAFKA)


def test_one_batch_of_two_schema_versions_evolves_the_log(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A column added while the connector's events are in flight: both schema versions in
    one batch, each found by its text; a type changed in one batch is refused."""
    old = Topic(schemas=True, compact=True)
    wider = [*VALUE_FIELDS, {"type": "int64", "optional": True, "field": "score"}]
    new = Topic(schemas=True, fields=wider, compact=True)
    old.event("c", 1, 10, row(1, "a")).event("c", 2, 11, row(2, "b"))
    new.offset = old.offset
    new.event("u", 2, 20, {**row(2, "b2"), "score": 7})
    new.event("c", 3, 21, {**row(3, "c"), "score": 1}).event("d", 3, 22).tombstone(3)
    old.offset = new.offset
    old.event("u", 1, 23, row(1, "a1"))
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(_batch(spark, old, new), 0)
    state = {r["id"]: (r["name"], r["score"]) for r in _state(sink).collect()}
    assert state == {1: ("a1", None), 2: ("b2", 7)}
    assert _state(sink).columns == ["id", "name", "born", "score"]

    other = [VALUE_FIELDS[0], {"type": "int64", "optional": True, "field": "name"}]
    changed = Topic(schemas=True, fields=other, compact=True)
    changed.offset = old.offset
    changed.event("u", 1, 30, {"id": 1, "name": 5})
    old.offset = changed.offset
    old.event("u", 2, 31, row(2, "b3"))
    with pytest.raises(BadInputError, match="column 'name' changes type in one batch"):
        sink(_batch(spark, old, changed), 1)
    sink.close()


def test_tombstones_right_after_their_delete_and_apart_from_it_both_delete(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A tombstone just after its key's record, one after a gap (the source topic
    compacted) and one after another key's record each delete their key, once."""
    topic = Topic(schemas=True, compact=True)
    for i in range(1, 7):
        topic.event("c", i, 10 + i, row(i, f"n{i}"))
    topic.event("d", 6, 20)  # its tombstone opens the next batch
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(topic.batch(spark), 0)

    topic.tombstone(6).event("d", 5, 21).tombstone(5).tombstone(5)
    in_order = topic.batch(spark)
    sink(in_order, 1)
    assert sorted(r["id"] for r in _state(sink).collect()) == [1, 2, 3, 4]

    topic.event("u", 4, 29, row(4, "n4b"))
    topic.offset += 3  # 1's d and two other records compacted away
    topic.tombstone(1).event("d", 2, 30).event("u", 3, 31, row(3, "n3b")).tombstone(2)
    topic.tombstone(9)  # never seen: deletes nothing
    topic.event("u", 1, 11, row(1, "n1")).event("c", 7, 32, row(7, "n7"))  # 1 redelivered
    apart = topic.batch(spark)
    sink(apart, 2)
    state = {r["id"]: r["name"] for r in _state(sink).collect()}
    assert state == {3: "n3b", 4: "n4b", 7: "n7"}
    positions = {
        (r["id"], r[SOURCE_POSITION])
        for r in sink.log().where("value IS NULL").select("id", SOURCE_POSITION).collect()
    }
    assert {(1, "00000000000000000011~"), (2, "00000000000000000030~")} <= positions
    assert {(5, "00000000000000000021~")} <= positions
    assert not [p for i, p in positions if i == 9]
    sink.close()


def test_a_schema_with_no_change_event_after_it_is_refused_as_before(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A value whose schema is found by its text but whose payload is no change event:
    the batch's schemas are then parsed, and the batch is taken as one that mixes the
    wrapping (JSON's types, the value's top level read as the event)."""
    topic = Topic(schemas=True, compact=True)
    topic.event("c", 1, 10, row(1, "a")).event("c", 2, 11, row(2, "b"))
    key, value, *rest = topic.records[-1]
    topic.records[-1] = (key, value.replace(b'"payload":{', b'"payload":null,"x":{', 1), *rest)
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    with pytest.raises(BadInputError, match=r"1 rows: op=null is not a row change"):
        sink(_batch(spark, topic), 0)
    sink.close()
    dead = str(tmp_path / "dead")
    sink = CompactedStateSink(
        tmp_path / "log", ("id",), value_format="debezium-json", dead_letter_table=dead
    )
    topic.event("c", 1, 10, row(1, "a"))
    key, value, *rest = topic.records[-1]
    topic.records = [(key, value.replace(b'"payload":{', b'"payload":7,"x":{', 1), *rest)]
    topic.event("c", 2, 11, row(2, "b"))
    sink(_batch(spark, topic), 0)
    assert {r["id"]: r["name"] for r in _state(sink).collect()} == {2: "b"}
    (letter,) = DeadLetterTable(LogLocation(dead)).read().to_pylist()
    assert "op=null is not a row change" in letter["reason"]
    sink.close()


def test_a_schema_whose_text_holds_the_payloads_mark_is_parsed(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``},"payload":`` inside a schema (a member of that name after an object): the
    text found is not one JSON object, and the schemas are parsed."""
    named = {"type": "string", "optional": True, "field": "name", "parameters": {"x": "y"}}
    fields = [VALUE_FIELDS[0], {**named, "payload": "p"}, VALUE_FIELDS[2]]
    topic = Topic(schemas=True, fields=fields, compact=True)
    assert b'},"payload":"p"' in topic.event("c", 1, 10, row(1, "a")).records[-1][1]
    topic.event("u", 1, 11, row(1, "a1", 3)).event("c", 2, 12, row(2, "b"))
    topic.event("d", 2, 13).tombstone(2)
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    sink(topic.batch(spark), 0)
    expected = _table(spark, [(1, "a1", dt.date(1970, 1, 4))])
    assert_df_equality(_state(sink), expected, ignore_row_order=True, ignore_nullable=True)
    sink.close()
