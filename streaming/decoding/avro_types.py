"""Avro schemas as Spark types: the subset of spark-avro's ``SchemaConverters.toSqlType`` used here.

Primitives, records, enums (as strings), fixed (as binary), arrays, maps, the
logical types date, timestamps, decimal and uuid (as a string), and a union of
null with one type. Every record field is nullable, unlike spark-avro: a tombstone
or an undecodable row is a null struct, and Arrow refuses a null parent over
non-nullable children. Anything else raises `SchemaNotFoundError` naming where in
the schema it is. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import types as T

from sinks.errors import SchemaNotFoundError

_PRIMITIVES: dict[str, T.DataType] = {
    "boolean": T.BooleanType(),
    "int": T.IntegerType(),
    "long": T.LongType(),
    "float": T.FloatType(),
    "double": T.DoubleType(),
    "bytes": T.BinaryType(),
    "string": T.StringType(),
}
_LOGICAL: dict[str, Callable[[dict], T.DataType]] = {
    "date": lambda s: T.DateType(),
    "timestamp-millis": lambda s: T.TimestampType(),
    "timestamp-micros": lambda s: T.TimestampType(),
    "local-timestamp-millis": lambda s: T.TimestampNTZType(),
    "local-timestamp-micros": lambda s: T.TimestampNTZType(),
    "decimal": lambda s: T.DecimalType(s["precision"], s.get("scale", 0)),
    "uuid": lambda s: T.StringType(),
}


def avro_to_spark(schema: Any) -> T.DataType:
    """The Spark type of an Avro schema. Raises `SchemaNotFoundError` for what it cannot map."""
    return _to_spark(schema, {}, "value")


def _to_spark(schema: Any, named: dict[str, T.DataType], where: str) -> T.DataType:
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in named:
            return named[schema]
        raise SchemaNotFoundError(f"{where}: Avro type {schema!r} is not supported or not defined")
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise SchemaNotFoundError(f"{where}: a union other than [null, T] is not supported")
        return _to_spark(branches[0], named, where)
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical in _LOGICAL:
        return _LOGICAL[logical](schema)
    if kind == "record":
        # Every field nullable: a tombstone or undecodable row is a null struct, and Arrow
        # refuses a null parent over non-nullable children.
        struct = T.StructType(
            [
                T.StructField(f["name"], _to_spark(f["type"], named, f"{where}.{f['name']}"), True)
                for f in schema["fields"]
            ]
        )
        named[schema["name"]] = struct
        if schema.get("namespace"):
            named[f"{schema['namespace']}.{schema['name']}"] = struct
        return struct
    if kind == "enum":
        named[schema["name"]] = T.StringType()
        return T.StringType()
    if kind == "fixed":
        named[schema["name"]] = T.BinaryType()
        return T.BinaryType()
    if kind == "array":
        return T.ArrayType(_to_spark(schema["items"], named, f"{where}[]"), True)
    if kind == "map":
        return T.MapType(T.StringType(), _to_spark(schema["values"], named, f"{where}{{}}"), True)
    return _to_spark(kind, named, where)
