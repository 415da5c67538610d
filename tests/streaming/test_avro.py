"""Confluent Avro values decoded on executors; tombstones stay tombstones; design.md §12."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from pyspark.sql import types as T
from testkit import encode_confluent

from sinks import BadInputError, CompactedStateSink
from streaming.decoding.avro import DECODE_ERROR, ConfluentAvroDecoder, DecodingHook
from streaming.decoding.avro_types import avro_to_spark
from streaming.decoding.schema_registry import SchemaStore
from streaming.jobs.job import load_job
from streaming.jobs.runner import build_hook

USER_V1 = {
    "type": "record",
    "name": "User",
    "namespace": "shop",
    "fields": [{"name": "name", "type": "string"}, {"name": "visits", "type": "long"}],
}
USER_V2 = {
    **USER_V1,
    "fields": [
        *USER_V1["fields"],
        {"name": "email", "type": ["null", "string"], "default": None},
        {
            "name": "tier",
            "type": {"type": "enum", "name": "Tier", "symbols": ["FREE", "PRO"]},
            "default": "FREE",
        },
    ],
}
INPUT = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])


@pytest.fixture
def schema_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "schemas"
    directory.mkdir()
    (directory / "1.avsc").write_text(json.dumps(USER_V1))
    (directory / "2.avsc").write_text(json.dumps(USER_V2))
    return directory


def test_avro_records_become_spark_structs() -> None:
    assert avro_to_spark(USER_V2) == T.StructType(
        [
            T.StructField("name", T.StringType()),
            T.StructField("visits", T.LongType()),
            T.StructField("email", T.StringType()),
            T.StructField("tier", T.StringType()),
        ]
    )


def test_old_and_new_writer_schemas_decode_into_the_reader_schema(spark, schema_dir, lake) -> None:
    rows = [
        ("ann", encode_confluent(1, USER_V1, {"name": "Ann", "visits": 3})),
        (
            "bob",
            encode_confluent(
                2, USER_V2, {"name": "Bob", "visits": 1, "email": "b@x", "tier": "PRO"}
            ),
        ),
        ("cat", encode_confluent(1, USER_V1, {"name": "Cat", "visits": 9})),
        ("cat", None),  # a tombstone stays a tombstone
    ]
    sink = CompactedStateSink(str(lake / "users"), key_columns=("key",))
    decoder = ConfluentAvroDecoder(SchemaStore.from_path(schema_dir), keep_raw=True)
    DecodingHook(sink, decoder)(spark.createDataFrame(rows, INPUT), 0)

    state = {r["key"]: r["value"].asDict() for r in sink.state().collect()}
    assert state == {
        "ann": {"name": "Ann", "visits": 3, "email": None, "tier": "FREE"},
        "bob": {"name": "Bob", "visits": 1, "email": "b@x", "tier": "PRO"},
    }
    log = {r["key"]: r for r in sink.log().collect()}  # cleaned: one record per key
    assert log["cat"]["value"] is None and log["cat"]["value_raw"] is None
    assert bytes(log["ann"]["value_raw"]) == rows[0][1]


def test_undecodable_values_fail_the_batch_saying_how_many_and_why(spark, schema_dir, lake) -> None:
    good = encode_confluent(1, USER_V1, {"name": "Ann", "visits": 3})
    rows = [
        ("ann", good),
        ("bad-magic", b"\x01" + good[1:]),
        ("unknown-id", b"\x00\x00\x00\x00\x09" + good[5:]),
        ("short", b"\x00\x01"),
        ("gone", None),
    ]
    sink = CompactedStateSink(str(lake / "users"), key_columns=("key",))
    decoder = ConfluentAvroDecoder(SchemaStore.from_path(schema_dir))
    with pytest.raises(BadInputError) as caught:
        DecodingHook(sink, decoder)(spark.createDataFrame(rows, INPUT), 0)
    message = str(caught.value)
    assert "3 of 5 rows" in message
    assert "unknown schema id 9" in message and "magic byte 1" in message
    assert sink.log_table.snapshot() is None  # nothing was written

    handed: list = []
    quarantining = DecodingHook(
        lambda df, _b: handed.append(df.collect()), decoder, quarantine=True
    )
    quarantining(spark.createDataFrame(rows, INPUT), 0)
    errors = {r["key"]: r[DECODE_ERROR] for r in handed[0]}
    assert errors["ann"] is None and errors["gone"] is None
    assert errors["short"].startswith("value of 2 bytes")


class _Registry(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        answers = {
            "/schemas/ids/7": {"schema": json.dumps(USER_V1)},
            "/subjects/users-value/versions/latest": {"id": 8, "schema": json.dumps(USER_V2)},
        }
        body = answers.get(self.path)
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(json.dumps(body or {"error_code": 40403}).encode())

    def log_message(self, *args) -> None:
        pass


def test_schemas_come_from_a_registry_when_configured() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store = SchemaStore(registry_url=f"http://127.0.0.1:{server.server_port}")
        assert store.get(7) == USER_V1
        assert store.get(99) is None
        assert store.latest("users-value") == USER_V2
        assert store.ids == [7, 8]
    finally:
        server.shutdown()


def test_a_job_file_with_an_avro_section_decodes_before_the_sink(
    spark, schema_dir, tmp_path
) -> None:
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        f"""
[source]
format = "files"
path = "input"

[sink]
path = "lake/users"

[avro]
schemas = "{schema_dir}"
"""
    )
    hook, (sink,) = build_hook(load_job(job_file), out=lambda _line: None)
    value = encode_confluent(2, USER_V2, {"name": "Dee", "visits": 2, "email": None, "tier": "PRO"})
    hook(spark.createDataFrame([("dee", value)], INPUT), 0)
    assert [r["value"]["tier"] for r in sink.state().collect()] == ["PRO"]
