"""A producer's schema evolves: each record read with its writer schema, resolved to the reader's.

Real Spark, real Delta: values in Confluent's wire format written by fastavro
(`encode_confluent`), decoded by `ConfluentAvroDecoder` on the executors, appended
by `CompactedStateSink` with its additive schema evolution (SPEC "Schema evolution").
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from pyspark.sql import types as T

from sinks import BadInputError, CompactedStateSink
from streaming.avro import (
    DECODE_ERROR,
    ConfluentAvroDecoder,
    DecodingHook,
    SchemaStore,
    encode_confluent,
)

SUBJECT = "users-value"
USER_V1 = {
    "type": "record",
    "name": "User",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
USER_V2 = {
    **USER_V1,
    "fields": [*USER_V1["fields"], {"name": "email", "type": ["null", "string"], "default": None}],
}
USER_NAME_AS_INT = {  # a type change: not backward compatible with either version
    **USER_V1,
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "int"}],
}
INPUT = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])


def _rows(store: SchemaStore, schema: dict, *records: dict) -> list[tuple[str, bytes]]:
    schema_id = next(i for i in store.ids if store.get(i) == schema)
    return [(str(r["id"]), encode_confluent(schema_id, schema, r)) for r in records]


def _state(sink: CompactedStateSink) -> dict[str, dict]:
    return {r["key"]: r["value"].asDict() for r in sink.state().collect()}


def _delta_value_fields(path: str) -> list[str]:
    value = next(f for f in DeltaTable(path).schema().fields if f.name == "value")
    return [f.name for f in value.type.fields]


def test_a_v2_producers_new_field_reaches_the_log_and_v1_records_read_null(spark, lake) -> None:
    store = SchemaStore()
    assert store.register(SUBJECT, USER_V1) == 1
    path = str(lake / "users")
    sink = CompactedStateSink(path, key_columns=("key",))
    hook = DecodingHook(sink, ConfluentAvroDecoder(store, subject=SUBJECT))

    v1 = _rows(store, USER_V1, {"id": 1, "name": "Ann"}, {"id": 2, "name": "Bob"})
    hook(spark.createDataFrame(v1, INPUT), 0)
    assert _delta_value_fields(path) == ["id", "name"]

    # the producer registers v2 while the query runs; an old producer still writes v1
    assert store.register(SUBJECT, USER_V2) == 2
    assert store.register(SUBJECT, USER_V2) == 2  # idempotent: not a new version
    mixed = _rows(store, USER_V2, {"id": 3, "name": "Cat", "email": "cat@x"}) + _rows(
        store, USER_V1, {"id": 4, "name": "Dee"}
    )
    hook(spark.createDataFrame(mixed, INPUT), 1)

    assert _delta_value_fields(path) == ["id", "name", "email"]  # the log's schema evolved
    assert _state(sink) == {
        "1": {"id": 1, "name": "Ann", "email": None},
        "2": {"id": 2, "name": "Bob", "email": None},
        "3": {"id": 3, "name": "Cat", "email": "cat@x"},
        "4": {"id": 4, "name": "Dee", "email": None},
    }


def test_without_a_subject_a_batchs_new_writer_id_becomes_the_reader_schema(spark, lake) -> None:
    store = SchemaStore({1: USER_V1})
    decoder = ConfluentAvroDecoder(store)
    sink = CompactedStateSink(str(lake / "users"), key_columns=("key",))
    sink(
        decoder.decode(
            spark.createDataFrame(_rows(store, USER_V1, {"id": 1, "name": "A"}), INPUT)
        ).drop(DECODE_ERROR),
        0,
    )
    store.register(SUBJECT, USER_V2)  # as a registry lookup of the batch's id 2 would
    v2 = _rows(store, USER_V2, {"id": 2, "name": "B", "email": "b@x"})
    sink(decoder.decode(spark.createDataFrame(v2, INPUT)).drop(DECODE_ERROR), 1)
    assert decoder.reader_label == "schema id 2, the newest"
    assert _state(sink)["2"] == {"id": 2, "name": "B", "email": "b@x"}
    assert _state(sink)["1"] == {"id": 1, "name": "A", "email": None}


def test_a_pinned_reader_schema_keeps_the_output_type(spark, lake) -> None:
    store = SchemaStore({1: USER_V1, 2: USER_V2}, subjects={SUBJECT: [1, 2]})
    path = str(lake / "users")
    sink = CompactedStateSink(path, key_columns=("key",))
    decoder = ConfluentAvroDecoder(store, subject=SUBJECT, reader_schema=USER_V1)
    rows = _rows(store, USER_V1, {"id": 1, "name": "Ann"}) + _rows(
        store, USER_V2, {"id": 2, "name": "Bob", "email": "bob@x"}
    )
    decoded = decoder.decode(spark.createDataFrame(rows, INPUT))
    assert decoded.schema["value"].dataType.fieldNames() == ["id", "name"]
    sink(decoded.drop(DECODE_ERROR), 0)  # the sink called directly, as foreachBatch would

    assert _delta_value_fields(path) == ["id", "name"]  # v2's email is dropped by the pin
    assert _state(sink) == {"1": {"id": 1, "name": "Ann"}, "2": {"id": 2, "name": "Bob"}}


def test_an_unresolvable_writer_schema_makes_bad_rows_with_the_reason(spark, lake) -> None:
    store = SchemaStore({1: USER_V1, 2: USER_V2, 9: USER_NAME_AS_INT}, subjects={SUBJECT: [1, 2]})
    decoder = ConfluentAvroDecoder(store, subject=SUBJECT)
    rows = [
        *_rows(store, USER_V1, {"id": 1, "name": "Ann"}),
        *_rows(store, USER_NAME_AS_INT, {"id": 2, "name": 7}, {"id": 3, "name": 8}),
    ]
    path = str(lake / "users")
    sink = CompactedStateSink(path, key_columns=("key",))
    with pytest.raises(BadInputError) as caught:
        DecodingHook(sink, decoder)(spark.createDataFrame(rows, INPUT), 0)
    message = str(caught.value)
    assert "2 of 3 rows" in message and "nothing was written" in message
    assert (
        "writer schema id 9 does not resolve to the reader schema "
        "(schema id 2, the newest of subject 'users-value'): Schema mismatch: int is not string"
    ) in message
    assert "make the producer's schema backward compatible" in message
    assert sink.log_table.snapshot() is None

    dead = str(lake / "dead")
    quarantining = CompactedStateSink(path, key_columns=("key",), dead_letter_table=dead)
    DecodingHook(quarantining, decoder, quarantine=True)(spark.createDataFrame(rows, INPUT), 0)
    assert _state(quarantining) == {"1": {"id": 1, "name": "Ann", "email": None}}
    reasons = DeltaTable(dead).to_pyarrow_table().column("reason").to_pylist()
    assert len(reasons) == 2
    assert all("writer schema id 9 does not resolve" in r for r in reasons)
