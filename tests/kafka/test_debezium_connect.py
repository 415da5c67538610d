"""Debezium's change events into the state on a Spark Connect session (design.md §52, §53).

The events, as Debezium's PostgreSQL connector writes them (the JSON converter, with and
without schemas), are read from JSON lines with Kafka's columns (no broker) into Connect
DataFrames, and the sink unwraps them on the Connect session (as it does inside a Connect
query's ``foreachBatch`` worker, whose batch is a Connect DataFrame too): snapshot reads,
an insert, an update that leaves a TOASTed text unchanged and a primary-key change with it
unchanged (both resolved from the log: its live records come back as a Connect DataFrame),
a delete and its tombstone, an older event sent again. The state is the table. Without
schemas (JSON's types inferred over a Connect DataFrame) in ``make test-cdc`` only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from sinks import CompactedStateSink, read_state
from sinks.produce.debezium_json import UNAVAILABLE_VALUE

pytestmark = pytest.mark.kafka

FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "string", "optional": True, "field": "big"},
]
COLUMNS = "key string, value string, partition int, offset long"


def _events(schemas: bool) -> list[str]:
    """JSON lines of Kafka's columns holding one table's change events."""
    lines: list[str] = []

    def wrap(payload: Any, schema: dict[str, Any]) -> str:
        return json.dumps({"schema": schema, "payload": payload} if schemas else payload)

    def key(id_: int) -> str:
        return wrap({"id": id_}, {"type": "struct", "fields": FIELDS[:1], "name": "t.Key"})

    def add(id_: int, value: str | None) -> None:
        line = {"key": key(id_), "value": value, "partition": 0, "offset": len(lines)}
        lines.append(json.dumps(line))

    def event(op: str, id_: int, lsn: int, after: dict[str, Any] | None = None) -> None:
        row = {"type": "struct", "fields": FIELDS, "optional": True, "name": "t.Value"}
        lsn_field = {"type": "int64", "field": "lsn"}
        schema = {
            "type": "struct",
            "fields": [
                {**row, "field": "before"},
                {**row, "field": "after"},
                {"type": "struct", "fields": [lsn_field], "field": "source"},
                {"type": "string", "field": "op"},
            ],
            "name": "t.Envelope",
        }
        payload = {"before": None, "after": after, "source": {"lsn": lsn}, "op": op}
        add(id_, wrap(payload, schema))

    event("r", 1, 10, {"id": 1, "name": "ann", "big": "long text of 1"})
    event("r", 2, 10, {"id": 2, "name": "bob", "big": "long text of 2"})
    event("c", 3, 20, {"id": 3, "name": "cy", "big": None})
    event("u", 1, 30, {"id": 1, "name": "ann-2", "big": UNAVAILABLE_VALUE})
    event("d", 2, 40)  # UPDATE users SET id = 5 WHERE id = 2, big unchanged
    add(2, None)
    event("c", 5, 40, {"id": 5, "name": "bob", "big": UNAVAILABLE_VALUE})
    event("d", 3, 50)
    add(3, None)
    event("r", 1, 10, {"id": 1, "name": "ann", "big": "long text of 1"})  # sent again
    return lines


TABLE = [(1, "ann-2", "long text of 1"), (5, "bob", "long text of 2")]


def test_change_events_from_files_on_a_connect_session(
    connect_spark: SparkSession, tmp_path: Path
) -> None:
    spark = connect_spark
    lines = _events(schemas=True)
    for name, part in (("a", lines[:3]), ("b", lines[3:])):  # the second needs the log
        (tmp_path / name).mkdir()
        (tmp_path / name / "events.json").write_text("\n".join(part) + "\n")
    sink = CompactedStateSink(tmp_path / "log", ("id",), value_format="debezium-json")
    for batch_id, name in enumerate("ab"):
        sink(spark.read.schema(COLUMNS).json(str(tmp_path / name)), batch_id)
    expected = spark.createDataFrame(TABLE, "id int, name string, big string")
    assert_df_equality(
        sink.state().select("value.*"), expected, ignore_row_order=True, ignore_nullable=True
    )
    values = read_state(str(tmp_path / "log")).column("value").to_pylist()
    assert sorted(values, key=lambda r: r["id"]) == [
        {"id": i, "name": n, "big": b} for i, n, b in TABLE
    ]

    sink.close()


def test_change_events_without_schemas_on_a_connect_session(
    connect_spark: SparkSession, tmp_path: Path
) -> None:
    # JSON's own types (and Spark's JSON reader's order of fields, by name), inferred over a
    # Connect DataFrame. In `make test-cdc` only: a Connect batch costs 10-20 s here.
    if os.environ.get("COMPACTED_SINK_CDC_TESTS") != "required":
        pytest.skip("`make test-cdc` runs it")
    spark = connect_spark
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "events.json").write_text("\n".join(_events(schemas=False)) + "\n")
    plain = CompactedStateSink(tmp_path / "plain-log", ("id",), value_format="debezium-json")
    plain(spark.read.schema(COLUMNS).json(str(tmp_path / "plain")), 0)
    assert_df_equality(
        plain.state().select("value.id", "value.name", "value.big"),
        spark.createDataFrame(TABLE, "id long, name string, big string"),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    plain.close()
