"""The schema-evolution rule, without Spark: every accepted and refused change, and its message."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from sinks.errors import ConfigError, SchemaMismatchError
from sinks.produce.schema_evolution import check_mode, evolve_schema, schema_changes

_ATOMS = {
    "string": T.StringType(),
    "binary": T.BinaryType(),
    "tinyint": T.ByteType(),
    "smallint": T.ShortType(),
    "int": T.IntegerType(),
    "bigint": T.LongType(),
    "float": T.FloatType(),
    "double": T.DoubleType(),
    "timestamp": T.TimestampType(),
    "timestamp_ntz": T.TimestampNTZType(),
}


def schema(ddl: str) -> T.StructType:
    """A DDL string as a StructType, without a Spark session (``fromDDL`` needs one)."""
    parts, depth, current = [], 0, ""
    for ch in ddl:
        depth += ch in "<(" and 1 or (ch in ">)" and -1 or 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    text = ",".join(p.strip().replace(" ", ":", 1).replace(" ", "") for p in parts) + ">"
    parsed, end = _fields(text, 0)
    assert end == len(text) - 1, text
    return parsed


def _fields(text: str, i: int) -> tuple[T.StructType, int]:
    fields = []
    while text[i] != ">":
        colon = text.index(":", i)
        name = text[i:colon]
        data_type, i = _type(text, colon + 1)
        fields.append(T.StructField(name, data_type, True))
        if text[i] == ",":
            i += 1
    return T.StructType(fields), i


def _type(text: str, i: int) -> tuple[T.DataType, int]:
    for word, opener in (("struct<", "s"), ("array<", "a"), ("map<", "m"), ("decimal(", "d")):
        if text.startswith(word, i):
            i += len(word)
            if opener == "s":
                struct, i = _fields(text, i)
                return struct, i + 1
            if opener == "a":
                element, i = _type(text, i)
                return T.ArrayType(element, True), i + 1
            if opener == "m":
                key, i = _type(text, i)
                value, i = _type(text, i + 1)
                return T.MapType(key, value, True), i + 1
            end = text.index(")", i)
            precision, scale = text[i:end].split(",")
            return T.DecimalType(int(precision), int(scale)), end + 1
    for word in sorted(_ATOMS, key=len, reverse=True):
        if text.startswith(word, i):
            return _ATOMS[word], i + len(word)
    raise AssertionError(f"cannot parse {text[i:]!r}")


def field(name: str, data_type: T.DataType, nullable: bool = True) -> T.StructField:
    return T.StructField(name, data_type, nullable)


LOG = schema("key string, value struct<a:string, c:struct<x:int>>, n int")


def test_an_unchanged_batch_returns_the_log_schema_itself():
    assert evolve_schema(LOG, LOG) is LOG


def test_columns_and_struct_fields_in_another_order_are_matched_by_name():
    batch = schema("n int, value struct<c:struct<x:int>, a:string>, key string")
    assert evolve_schema(LOG, batch) is LOG


def test_new_fields_at_every_depth_are_appended_nullable_in_the_batch_order():
    batch = schema(
        "key string, value struct<a:string, c:struct<x:int, y:string>, b:double>, n int, "
        "note string"
    )
    evolved = evolve_schema(LOG, batch)
    assert evolved == schema(
        "key string, value struct<a:string, c:struct<x:int, y:string>, b:double>, n int, "
        "note string"
    )
    assert schema_changes(LOG, evolved) == [
        "added value.c.y string",
        "added value.b double",
        "added note string",
    ]


def test_a_new_field_that_the_batch_says_is_required_is_added_nullable():
    log = T.StructType([field("key", T.StringType()), field("value", T.StructType([]))])
    batch = T.StructType(
        [
            field("key", T.StringType()),
            field("value", T.StructType([field("x", T.IntegerType(), nullable=False)])),
        ]
    )
    evolved = evolve_schema(log, batch)
    assert evolved["value"].dataType["x"].nullable


def test_new_fields_inside_arrays_and_map_values():
    log = schema(
        "key string, value struct<tags:array<struct<t:string>>, m:map<string,struct<q:int>>>"
    )
    batch = schema(
        "key string, value struct<tags:array<struct<t:string, w:int>>, "
        "m:map<string,struct<q:int, r:string>>>"
    )
    evolved = evolve_schema(log, batch)
    assert evolved == batch
    assert schema_changes(log, evolved) == ["added value.tags[].w int", "added value.m{}.r string"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("tinyint", "smallint"),
        ("tinyint", "bigint"),
        ("smallint", "int"),
        ("int", "bigint"),
        ("float", "double"),
    ],
)
def test_widening(old, new):
    log = schema(f"key string, value struct<c:struct<x:{old}>>")
    evolved = evolve_schema(log, schema(f"key string, value struct<c:struct<x:{new}>>"))
    assert evolved == schema(f"key string, value struct<c:struct<x:{new}>>")
    assert schema_changes(log, evolved) == [f"widened value.c.x {old} -> {new}"]


def test_nullability_is_relaxed_at_any_depth_and_never_tightened():
    required = T.StructType(
        [
            field("key", T.StringType()),
            field(
                "value",
                T.StructType(
                    [
                        field("a", T.IntegerType(), nullable=False),
                        field("l", T.ArrayType(T.IntegerType(), containsNull=False)),
                        field("m", T.MapType(T.StringType(), T.LongType(), False)),
                    ]
                ),
            ),
        ]
    )
    nullable = schema("key string, value struct<a:int, l:array<int>, m:map<string,bigint>>")
    relaxed = evolve_schema(required, nullable)
    assert relaxed == nullable
    assert schema_changes(required, relaxed) == [
        "made value.a nullable",
        "made value.l[] nullable",
        "made value.m{} nullable",
    ]
    assert evolve_schema(nullable, required) is nullable


def test_transient_columns_are_not_compared():
    batch = schema("key string, value struct<a:string, c:struct<x:int>>, n int, _input_order int")
    assert evolve_schema(LOG, batch, ignored_columns=("_input_order",)) is LOG


def refused(log: T.StructType, batch: T.StructType, **kwargs) -> SchemaMismatchError:
    with pytest.raises(SchemaMismatchError) as error:
        evolve_schema(log, batch, **kwargs)
    assert str(error.value).endswith("nothing was written")
    return error.value


def test_a_dropped_field_is_refused_naming_its_path_and_what_to_do():
    error = refused(LOG, schema("key string, value struct<a:string, c:struct<z:int>>, n int"))
    assert error.field_path == "value.c.x"
    assert str(error).startswith(
        "field 'value.c.x' (int) of the log is missing from the batch (dropped or renamed); "
        "a log keeps every field it has had"
    )
    assert "send the field (null where there is no value" in str(error)


def test_a_dropped_top_level_column_is_refused():
    assert (
        refused(LOG, schema("key string, value struct<a:string, c:struct<x:int>>")).field_path
        == "n"
    )


def test_a_narrowing_is_refused():
    log = schema("key string, value struct<c:struct<x:bigint>>")
    error = refused(log, schema("key string, value struct<c:struct<x:int>>"))
    assert str(error) == (
        "field 'value.c.x' has type int in the batch, the log has bigint (the batch's type is "
        "narrower; only widening evolves a log (byte → short → int → long, float → double)); "
        "cast it to bigint in the batch, or write to a new log; nothing was written"
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("int", "string"),
        ("int", "double"),
        ("string", "binary"),
        ("struct<x:int>", "string"),
        ("array<int>", "array<string>"),
        ("decimal(10,2)", "decimal(12,2)"),
        ("timestamp", "timestamp_ntz"),
    ],
)
def test_other_type_changes_are_refused(old, new):
    log = schema(f"key string, value struct<c:{old}>")
    error = refused(log, schema(f"key string, value struct<c:{new}>"))
    assert error.field_path.startswith("value.c")
    assert "only widening evolves a log" in str(error)


def test_a_map_key_type_change_is_refused():
    log = schema("key string, value map<int,string>")
    error = refused(log, schema("key string, value map<bigint,string>"))
    assert error.field_path == "value{key}"


def test_key_and_sequence_columns_keep_their_type():
    log = schema("key int, value string, seq int")
    error = refused(log, schema("key bigint, value string, seq int"), fixed_columns=("key", "seq"))
    assert error.field_path == "key"
    assert "a key or sequence column keeps its type" in str(error)
    error = refused(log, schema("key int, value string, seq bigint"), fixed_columns=("key", "seq"))
    assert error.field_path == "seq"


def test_none_refuses_every_change_in_the_same_style():
    new_field = refused(
        LOG,
        schema("key string, value struct<a:string, c:struct<x:int, y:int>>, n int"),
        mode="none",
    )
    assert str(new_field) == (
        "field 'value.c.y' (int) is new in the batch; schema_evolution='none' refuses every "
        "schema change; set schema_evolution='additive' to evolve the log, or select the log's "
        "columns only; nothing was written"
    )
    widened = refused(
        LOG, schema("key string, value struct<a:string, c:struct<x:bigint>>, n int"), mode="none"
    )
    assert str(widened).startswith(
        "field 'value.c.x' has type bigint in the batch, the log has int (a type change); "
        "schema_evolution='none' refuses every schema change"
    )
    dropped = refused(LOG, schema("key string, value struct<a:string>, n int"), mode="none")
    assert dropped.field_path == "value.c"


def test_none_still_matches_by_name_and_ignores_nullability():
    batch = schema("n int, value struct<c:struct<x:int>, a:string>, key string")
    assert evolve_schema(LOG, batch, mode="none") is LOG
    required = T.StructType(
        [
            field("key", T.StringType()),
            field("value", T.StructType([field("a", T.IntegerType(), False)])),
        ]
    )
    assert (
        evolve_schema(required, schema("key string, value struct<a:int>"), mode="none") is required
    )


def test_an_unknown_mode_names_the_option():
    with pytest.raises(
        ConfigError, match="schema_evolution must be one of 'additive', 'none', not 'merge'"
    ):
        check_mode("merge")
