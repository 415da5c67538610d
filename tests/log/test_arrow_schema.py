"""The log's Arrow schema from delta-rs's conversion of the Delta schema (`arrow_schema_of`,
what the Arrow readers use without pyspark: design.md §59) is pyspark's (`log_arrow_schema`)
for every Delta type a log can hold, nested nullability included. No Spark session: the
Spark schema is parsed from the same JSON Delta keeps."""

from __future__ import annotations

import json

from deltalake import DeltaTable
from deltalake.schema import Schema
from pyspark.sql.types import StructType

from sinks.log.log_table import arrow_schema_of, log_arrow_schema


def _field(name: str, kind: object, nullable: bool = True) -> dict:
    return {"name": name, "type": kind, "nullable": nullable, "metadata": {}}


FIELDS = [
    _field("key", "string"),
    _field("value", "string"),
    *(
        _field(t, t)
        for t in ("boolean", "byte", "short", "integer", "long", "float", "double")
        + ("binary", "date", "timestamp", "timestamp_ntz", "decimal(10,2)")
    ),
    _field("tags", {"type": "array", "elementType": "string", "containsNull": True}),
    _field("ids", {"type": "array", "elementType": "long", "containsNull": False}),
    _field(
        "counts",
        {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True},
    ),
    _field(
        "address",
        {
            "type": "struct",
            "fields": [
                _field("zip", "integer", nullable=False),
                _field(
                    "seen",
                    {"type": "array", "elementType": "timestamp", "containsNull": True},
                ),
            ],
        },
    ),
    _field("partition", "integer", nullable=False),
    _field("offset", "long", nullable=False),
]


def test_delta_rs_conversion_is_pysparks_for_every_delta_type(tmp_path):
    schema_json = json.dumps({"type": "struct", "fields": FIELDS})
    DeltaTable.create(str(tmp_path / "t"), Schema.from_json(schema_json))
    ours = arrow_schema_of(DeltaTable(str(tmp_path / "t")))
    pysparks = log_arrow_schema(StructType.fromJson(json.loads(schema_json)))
    assert ours.equals(pysparks, check_metadata=True), (ours, pysparks)
    assert all(f.nullable for f in ours)
