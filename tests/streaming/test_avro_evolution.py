"""A producer's schema evolves: each record read with its writer schema, resolved to the reader's.

Real Spark, real Delta: values in Confluent's wire format written by fastavro
(`encode_confluent`), decoded by `ConfluentAvroDecoder` on the executors, appended
by `CompactedStateSink` with its additive schema evolution (design.md §17).
The last test uses confluent-kafka's `AvroSerializer` and its in-process mock registry
(served over HTTP to `SchemaStore`) when confluent-kafka is installed, and skips otherwise.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from deltalake import DeltaTable
from pyspark.sql import types as T
from testkit import encode_confluent

from sinks import BadInputError, CompactedStateSink
from streaming.decoding.avro import DECODE_ERROR, ConfluentAvroDecoder, DecodingHook
from streaming.decoding.schema_registry import SchemaNotFoundError, SchemaStore

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


def test_a_store_answers_a_subjects_newest_version_as_a_registry_does() -> None:
    store = SchemaStore({7: USER_V1}, subjects={SUBJECT: [7]})
    assert store.latest_id(SUBJECT) == 7
    assert store.register(SUBJECT, json.dumps(USER_V2)) == 8  # a schema as text, as registries give
    assert store.register("users-v2-copy", USER_V2) == 8  # the same schema keeps its id
    assert (store.latest_id(SUBJECT), store.latest(SUBJECT)) == (8, USER_V2)
    assert store.latest_id() == 8
    with pytest.raises(SchemaNotFoundError, match="subject 'orders-value' is not in the store"):
        store.latest_id("orders-value")
    with pytest.raises(SchemaNotFoundError, match=r"lists schema ids \[2\]"):
        SchemaStore({1: USER_V1}, subjects={SUBJECT: [1, 2]})
    with pytest.raises(SchemaNotFoundError, match="the store holds none yet"):
        ConfluentAvroDecoder(SchemaStore()).choose_reader_schema()


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


class _RegistryOver:
    """A Confluent registry client (here confluent-kafka's mock) served over HTTP, as
    `SchemaStore` reads one: ``/schemas/ids/<id>`` and ``/subjects/<s>/versions/latest``."""

    def __init__(self, client) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.answer(self.path)
                self.send_response(200 if body else 404)
                self.end_headers()
                self.wfile.write(json.dumps(body or {"error_code": 40403}).encode())

            def log_message(self, *args) -> None:
                pass

        self.client = client
        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str) -> dict | None:
        parts = path.strip("/").split("/")
        try:
            if parts[:2] == ["schemas", "ids"]:
                return {"schema": self.client.get_schema(int(parts[2])).schema_str}
            if parts[0] == "subjects" and parts[2:] == ["versions", "latest"]:
                found = self.client.get_latest_version(parts[1])
                return {"id": found.schema_id, "schema": found.schema.schema_str}
        except Exception:  # the mock raises its own not-found errors
            return None
        return None


def test_confluent_kafkas_avro_serializer_and_registry_evolve_the_log(spark, lake) -> None:
    """Values from confluent-kafka's `AvroSerializer` (v1, then v2 registered meanwhile)."""
    avro = pytest.importorskip("confluent_kafka.schema_registry.avro")
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient.new_client({"url": "mock://evolution"})  # no broker, no server
    context = SerializationContext("users", MessageField.VALUE)
    v1 = avro.AvroSerializer(client, json.dumps(USER_V1))
    registry = _RegistryOver(client)
    try:
        path = str(lake / "users")
        sink = CompactedStateSink(path, key_columns=("key",))
        store = SchemaStore(registry_url=registry.url)
        hook = DecodingHook(sink, ConfluentAvroDecoder(store, subject=SUBJECT))
        hook(spark.createDataFrame([("1", v1({"id": 1, "name": "Ann"}, context))], INPUT), 0)
        assert _delta_value_fields(path) == ["id", "name"]

        v2 = avro.AvroSerializer(client, json.dumps(USER_V2))
        rows = [
            ("2", v2({"id": 2, "name": "Bob", "email": "bob@x"}, context)),
            ("3", v1({"id": 3, "name": "Cat"}, context)),
        ]
        hook(spark.createDataFrame(rows, INPUT), 1)
    finally:
        registry.server.shutdown()

    assert _delta_value_fields(path) == ["id", "name", "email"]
    assert _state(sink) == {
        "1": {"id": 1, "name": "Ann", "email": None},
        "2": {"id": 2, "name": "Bob", "email": "bob@x"},
        "3": {"id": 3, "name": "Cat", "email": None},
    }
