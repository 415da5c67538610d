"""Debezium's change events taken as they come: ``value_format="debezium-json"``.

A batch with Spark's Kafka source's columns (``key`` and ``value`` holding Debezium's JSON,
binary or text, with or without the JSON converter's ``schema``/``payload`` wrapping, and
``partition``, ``offset``, ``timestamp``) becomes the sink's records (design.md §52):

- the key columns are the message key's fields (the primary key's columns);
- ``value`` is a struct of ``after``'s fields, so ``state().select("value.*")`` is the
  table's row; ``op`` ``c``, ``u`` and ``r`` are upserts, ``d`` and the tombstone after it
  deletes;
- `SOURCE_POSITION` (the sink's sequence column, design.md §13) is the event's place in
  the source's log: PostgreSQL's ``source.lsn``, MySQL's ``source.file``, ``pos`` and
  ``row``, else ``ts_ms``, as fixed-width text so that text order is log order;
- a tombstone carries no position: it takes the one of the key's record just before it
  in the batch, else the key's live record in the log, followed by ``~`` so it sorts just
  after that record and before any later event (design.md §53); a tombstone with neither
  deletes nothing and is dropped;
- PostgreSQL's unchanged TOAST values (`UNAVAILABLE_VALUE`) take the column's previous
  value: the key's nearest earlier event in the batch, else its live record in the log;
- a primary-key change's unchanged TOAST values are the old key's (design.md §60).

What cannot be done right is a row refused by name in ``_decode_error`` (dead letters
when the sink has a dead-letter table, else `BadInputError` naming the reasons): ``op=t``
(TRUNCATE), any other ``op``, a change event without ``after``, a TOAST value with no
previous value, text that is not a change event. The log's records are looked up through
a callable the sink gives (`PreviousState`), so this module needs no reader.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window, WindowSpec

from sinks.errors import BadInputError, ConfigError
from sinks.log.records import DECODE_ERROR, OFFSET, PARTITION, TIMESTAMP, VALUE

DEBEZIUM_JSON = "debezium-json"
VALUE_FORMATS = (DEBEZIUM_JSON,)
"""The ``value_format`` names the sink, the job file and ``run`` take (Flink's and Paimon's)."""

SOURCE_POSITION = "source_position"
"""The sequence column the unwrap writes: the event's position in the source's log, as text."""

UNAVAILABLE_VALUE = "__debezium_unavailable_value"
"""Debezium's placeholder (``unavailable.value.placeholder``) for an unchanged TOAST value."""

TOMBSTONE_MARK = "~"
"""Appended to the position a tombstone takes: it sorts after it and before every later one."""

REKEY_LEVELS = 3
"""Primary-key changes of one row within one batch whose unchanged TOAST values are resolved
(A to B to C to D); a longer chain is refused by name (design.md §60)."""

_WIDTH = 20  # digits of a long: fixed width makes text order numeric order
_ROW_WIDTH = 10
_UPSERTS = ("c", "u", "r")

PreviousState = Callable[[list[dict[str, Any]]], pa.Table]
"""Keys (dicts by key column) -> the log's live rows of them: key columns, ``value``,
`SOURCE_POSITION` and ``partition`` (`sinks.lookup`'s answer); an empty table when none."""


def check_value_format(value_format: str | None) -> str | None:
    """``value_format`` when it is None or one of `VALUE_FORMATS`; else `ConfigError`."""
    if value_format is not None and value_format not in VALUE_FORMATS:
        raise ConfigError(
            f"value_format={value_format!r} is not known; use one of {list(VALUE_FORMATS)} "
            "or None (the batch's columns as they are)"
        )
    return value_format


# -- Kafka Connect schemas as Spark types -------------------------------------------------

_CONNECT_TYPES: dict[str, T.DataType] = {
    "int8": T.ByteType(),
    "int16": T.ShortType(),
    "int32": T.IntegerType(),
    "int64": T.LongType(),
    "float32": T.FloatType(),
    "float64": T.DoubleType(),
    "boolean": T.BooleanType(),
    "string": T.StringType(),
    "bytes": T.BinaryType(),
}

_DAYS = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_MILLIS = ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp")
_MICROS = ("io.debezium.time.MicroTimestamp",)


def connect_type(schema: dict[str, Any]) -> T.DataType:
    """The Spark type Kafka Connect's JSON schema ``schema`` is parsed as (physical types)."""
    kind = schema.get("type")
    if kind == "struct":
        return T.StructType(
            [
                T.StructField(f["field"], connect_type(f), nullable=True)
                for f in schema.get("fields", [])
            ]
        )
    if kind == "array":
        return T.ArrayType(connect_type(schema["items"]))
    if kind == "map":
        return T.MapType(connect_type(schema["keys"]), connect_type(schema["values"]))
    if kind in _CONNECT_TYPES:
        return _CONNECT_TYPES[kind]
    raise BadInputError(f"value_format={DEBEZIUM_JSON!r}: Kafka Connect type {kind!r} not known")


def _logical(schema: dict[str, Any], column: Column) -> Column:
    """A top-level field's column converted from Debezium's encoding to the database's type."""
    name = schema.get("name")
    if name in _DAYS:
        return F.date_from_unix_date(column)
    if name in _MILLIS:
        return F.to_timestamp_ntz(F.timestamp_millis(column))
    if name in _MICROS:
        return F.to_timestamp_ntz(F.timestamp_micros(column))
    return column


def _field_schemas(schema_text: str, field_name: str | None) -> list[dict[str, Any]]:
    """The fields of an envelope's ``field_name`` struct (the key's own with None)."""
    schema = json.loads(schema_text)
    if field_name is not None:
        schema = next((f for f in schema.get("fields", []) if f.get("field") == field_name), {})
    return list(schema.get("fields", []))


def merged_fields(schema_texts: Sequence[str], field_name: str | None) -> list[dict[str, Any]]:
    """The fields of every schema version a batch holds, fewest fields first, so a column
    the source added comes after the ones it had (the log's schema evolves additively).
    One field with two types is `BadInputError` naming it."""
    versions = sorted((_field_schemas(t, field_name) for t in schema_texts), key=len)
    fields: dict[str, dict[str, Any]] = {}
    for version in versions:
        for f in version:
            seen = fields.setdefault(f["field"], f)
            if connect_type(seen) != connect_type(f):
                raise BadInputError(
                    f"value_format={DEBEZIUM_JSON!r}: column {f['field']!r} changes type in "
                    f"one batch ({seen.get('type')} and {f.get('type')}); a source column's "
                    "type change is not an additive schema change"
                )
    return list(fields.values())


# -- the unwrap ---------------------------------------------------------------------------


@dataclass
class DebeziumBatch:
    """A batch of change events unwrapped: `records` for the append, `release` after it."""

    records: DataFrame
    cached: list[DataFrame] = field(default_factory=list)
    empty: bool = False
    """True for a batch of no records (Spark's first micro-batch of an empty topic): the
    sink appends nothing, and creates no log (design.md §61)."""

    def release(self) -> None:
        """Drop what the unwrap cached (the parsed batch); idempotent."""
        for df in self.cached:
            df.unpersist()
        self.cached.clear()


def unwrap(
    batch: DataFrame,
    *,
    key_columns: Sequence[str],
    previous_state: PreviousState,
    log_value: T.DataType | None = None,
    refuse: bool = True,
) -> DebeziumBatch:
    """The sink's records of ``batch``'s Debezium change events (the module's contract).

    Runs two small Spark jobs of its own: the batch's schemas (or, without them, JSON's
    types inferred over the batch), then one aggregate giving the keys whose previous state
    the log must give and the refused rows; with ``refuse`` it raises `BadInputError` with
    their reasons before anything is written (without ``refuse`` they stay in
    ``_decode_error`` for the dead letters).
    ``log_value`` is the log's ``value`` type: a field it has that the batch's events lack
    (events from before a column was added, redelivered) is kept, null, as the log keeps
    every field it has had.
    """
    missing = [c for c in ("key", "value", OFFSET) if c not in batch.columns]
    if missing:
        raise BadInputError(
            f"value_format={DEBEZIUM_JSON!r} needs Kafka's columns key, value and offset; "
            f"the batch has no {', '.join(missing)}"
        )
    texts = _texts(batch)
    out = DebeziumBatch(records=texts)
    try:
        types = _types(texts)
        if not types.key_type.fields:
            if texts.isEmpty():
                out.empty = True
                return out
            raise BadInputError(
                f"value_format={DEBEZIUM_JSON!r}: the message keys hold no fields; Debezium's "
                "key is a struct of the table's primary key (a table without one has null keys)"
            )
        _check_key_columns(types.key_type, key_columns)
        out.records = _records(
            _parsed(texts, types, key_columns),
            key_columns=key_columns,
            types=types,
            previous_state=previous_state,
            log_value=log_value,
            cache=out.cached,
            refuse=refuse,
        )
    except BaseException:
        out.release()
        raise
    return out


_WRAP = "schema string, payload string"
_SOURCE = T.StructType(
    [
        T.StructField("lsn", T.LongType()),
        T.StructField("file", T.StringType()),
        T.StructField("pos", T.LongType()),
        T.StructField("row", T.IntegerType()),
        T.StructField("ts_ms", T.LongType()),
    ]
)


def _texts(batch: DataFrame) -> DataFrame:
    """Key and value as text, with Kafka's partition (0 without one), offset and timestamp."""
    has_timestamp = TIMESTAMP in batch.columns
    return batch.select(
        F.col("key").cast("string").alias("_key_text"),
        F.col("value").cast("string").alias("_value_text"),
        (F.col(PARTITION) if PARTITION in batch.columns else F.lit(0)).alias(PARTITION),
        F.col(OFFSET),
        *([F.col(TIMESTAMP)] if has_timestamp else []),
    )


def _unwrapped_text(column: str) -> Column:
    """The JSON text of ``column`` without the converter's ``schema``/``payload`` wrapping
    (the schemaless inference's input; one parse, its struct read once)."""
    wrap = F.from_json(column, _WRAP)
    return F.when(wrap.schema.isNotNull() & wrap.payload.isNotNull(), wrap.payload).otherwise(
        F.col(column)
    )


@dataclass(frozen=True)
class _BatchTypes:
    """What one small job over a batch finds: the key's and ``after``'s types and fields,
    whether every key and every change event is wrapped in ``schema``/``payload``, and
    whether a primary-key change left TOAST values unchanged (``rekeyed``)."""

    key_type: T.StructType
    key_fields: list[dict[str, Any]]
    after_type: T.StructType
    after_fields: list[dict[str, Any]]
    rekeyed: bool
    keys_wrapped: bool = False
    values_wrapped: bool = False
    placeholders: bool = True
    """False when no value's text holds `UNAVAILABLE_VALUE` (nor its base64): no field can
    be an unchanged TOAST value, and the windows that resolve them are left out."""


def _types(texts: DataFrame) -> _BatchTypes:
    """The key's and ``after``'s Spark types: from the batch's Connect schemas (every
    version it holds, merged), else inferred by Spark's JSON reader over the batch.

    One pass over the text reads only the wrapping's ``schema`` (and ``op``): the typed
    parse of each value comes after, once (`_parsed`)."""
    key = F.from_json("_key_text", _WRAP)
    value = F.from_json("_value_text", "schema string, payload struct<op: string>, op string")
    encoded = base64.b64encode(UNAVAILABLE_VALUE.encode()).decode()
    raw = F.coalesce(F.col("_value_text"), F.lit(""))
    placeholder = raw.contains(UNAVAILABLE_VALUE) | raw.contains(encoded)
    heads = texts.select(
        key.alias("_k"),
        value.alias("_v"),
        F.col("_value_text").isNull().alias("_tombstone"),
        placeholder.alias("_placeholder"),
    ).select(
        F.when(F.col("_k.payload").isNotNull(), F.col("_k.schema")).alias("_key_schema"),
        F.when(F.col("_v.payload").isNotNull(), F.col("_v.schema")).alias("_value_schema"),
        "_tombstone",
        "_placeholder",
        ((F.coalesce(F.col("_v.payload.op"), F.col("_v.op")) == "c") & F.col("_placeholder")).alias(
            "_rekey"
        ),
    )
    rows = (
        heads.where(~F.col("_tombstone") | F.col("_key_schema").isNotNull())
        .groupBy("_key_schema", "_value_schema")
        .agg(
            F.min(F.col("_tombstone").cast("int")).alias("only_tombstones"),
            F.max(F.coalesce(F.col("_rekey"), F.lit(False)).cast("int")).alias("rekeyed"),
            F.max(F.col("_placeholder").cast("int")).alias("placeholders"),
        )
        .collect()
    )
    key_schemas = sorted({r["_key_schema"] for r in rows if r["_key_schema"] is not None})
    value_schemas = sorted({r["_value_schema"] for r in rows if r["_value_schema"] is not None})
    schemaless = any(r["_value_schema"] is None and not r["only_tombstones"] for r in rows)
    keys_wrapped = bool(key_schemas) and not any(r["_key_schema"] is None for r in rows)
    spark = texts.sparkSession
    if keys_wrapped:
        key_fields = merged_fields(key_schemas, None)
        key_type = T.StructType([T.StructField(f["field"], connect_type(f)) for f in key_fields])
    else:
        key_type = _inferred(spark, texts.select(_unwrapped_text("_key_text").alias("j")))
        key_fields = [{"field": f.name} for f in key_type.fields]
    if value_schemas and not schemaless:
        after_fields = merged_fields(value_schemas, "after")
        after_type = T.StructType(
            [T.StructField(f["field"], connect_type(f)) for f in after_fields]
        )
    else:
        envelope = F.from_json(_unwrapped_text("_value_text"), "after string, op string")
        upserts = texts.select(envelope.alias("e")).where(
            F.col("e.op").isin(*_UPSERTS) & F.col("e.after").isNotNull()
        )
        after_type = _inferred(spark, upserts.select(F.col("e.after").alias("j")))
        after_fields = [{"field": f.name} for f in after_type.fields]
    rekeyed = any(r["rekeyed"] for r in rows)
    return _BatchTypes(
        key_type,
        key_fields,
        after_type,
        after_fields,
        rekeyed,
        keys_wrapped=keys_wrapped,
        values_wrapped=bool(value_schemas) and not schemaless,
        placeholders=any(r["placeholders"] for r in rows),
    )


def _check_key_columns(key_type: T.StructType, key_columns: Sequence[str]) -> None:
    """`BadInputError` unless the message key's fields are the sink's key columns."""
    names = [f.name for f in key_type.fields]
    if sorted(names) != sorted(key_columns):
        raise BadInputError(
            f"value_format={DEBEZIUM_JSON!r}: the message key's fields are {names} (the "
            f"table's primary key) but the sink's key columns are {list(key_columns)}; open "
            f"the sink with key_columns={tuple(names)!r}"
        )


def _parsed(texts: DataFrame, types: _BatchTypes, key_columns: Sequence[str]) -> DataFrame:
    """Each key and value parsed once with its typed schema (the batch's types, `_types`):
    the key columns, ``after``'s fields as ``_a_<field>``, ``op``, the source's position.
    A batch whose every event is wrapped parses ``payload`` alone (the ``schema`` text is
    skipped, never copied); a batch that mixes or lacks the wrapping parses both shapes."""
    after_type, key_type = types.after_type, types.key_type
    envelope = T.StructType(
        [
            T.StructField("after", after_type),
            T.StructField("op", T.StringType()),
            T.StructField("ts_ms", T.LongType()),
            T.StructField("source", _SOURCE),
        ]
    )
    if types.values_wrapped:
        value = F.from_json("_value_text", T.StructType([T.StructField("payload", envelope)]))
        df = texts.select("*", value.payload.alias("_e"))
    else:
        both = T.StructType(
            [
                T.StructField("schema", T.StringType()),
                T.StructField("payload", envelope),
                *envelope.fields,
            ]
        )
        df = texts.select("*", F.from_json("_value_text", both).alias("_w")).select(
            "*",
            F.when(
                F.col("_w.schema").isNotNull() & F.col("_w.payload").isNotNull(),
                F.col("_w.payload"),
            )
            .otherwise(F.struct(*[F.col(f"_w.{f.name}") for f in envelope.fields]))
            .alias("_e"),
        )
        df = df.withColumn("_e", F.when(F.col("_w").isNotNull(), F.col("_e")))
    if types.keys_wrapped:
        key = F.from_json("_key_text", T.StructType([T.StructField("payload", key_type)]))
        df = df.select("*", key.payload.alias("_k"))
    else:
        df = df.select("*", F.from_json(_unwrapped_text("_key_text"), key_type).alias("_k"))
    source = F.col("_e.source")
    ts_ms = F.coalesce(source.ts_ms, F.col("_e.ts_ms"))
    position = (
        F.when(source.lsn.isNotNull(), F.lpad(source.lsn.cast("string"), _WIDTH, "0"))
        .when(
            source.file.isNotNull(),
            F.concat_ws(
                "/",
                source.file,
                F.lpad(source.pos.cast("string"), _WIDTH, "0"),
                F.lpad(F.coalesce(source.row, F.lit(0)).cast("string"), _ROW_WIDTH, "0"),
            ),
        )
        .when(ts_ms.isNotNull(), F.lpad(ts_ms.cast("string"), _WIDTH, "0"))
    )
    return df.select(
        PARTITION,
        OFFSET,
        *([TIMESTAMP] if TIMESTAMP in texts.columns else []),
        *[F.col("_k")[k].alias(k) for k in key_columns],
        F.col("_value_text").isNull().alias("_tombstone"),
        F.col("_e").isNull().alias("_not_event"),
        F.col("_e.op").alias("_op"),
        F.col("_e.after").isNull().alias("_no_after"),
        *[F.col("_e.after")[f.name].alias(f"_a_{f.name}") for f in after_type.fields],
        position.alias(SOURCE_POSITION),
        (source.lsn.isNotNull() | source.file.isNotNull()).alias("_log_position_kind"),
    )


def _inferred(spark: Any, texts: DataFrame) -> T.StructType:
    """JSON's own types over ``texts`` (one column of JSON objects), as Spark infers them."""
    inferred = spark.read.json(texts.where(F.col("j").isNotNull()).select("j")).schema
    return T.StructType([f for f in inferred.fields if f.name != "_corrupt_record"])


def _placeholder(data_type: T.DataType, column: Column) -> Column | None:
    """True where ``column`` holds Debezium's unchanged-TOAST placeholder (None: its type
    cannot)."""
    if isinstance(data_type, T.StringType):
        return column == F.lit(UNAVAILABLE_VALUE)
    if isinstance(data_type, T.BinaryType):
        return column == F.lit(UNAVAILABLE_VALUE.encode())
    if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, T.StringType):
        return (F.size(column) == 1) & (column[0] == F.lit(UNAVAILABLE_VALUE))
    return None


def _records(
    parsed: DataFrame,
    *,
    key_columns: Sequence[str],
    types: _BatchTypes,
    previous_state: PreviousState,
    log_value: T.DataType | None,
    cache: list[DataFrame],
    refuse: bool,
) -> DataFrame:
    after_type, after_fields = types.after_type, types.after_fields
    df = parsed
    by_key = Window.partitionBy(PARTITION, *key_columns)
    before = by_key.orderBy(OFFSET)
    earlier = by_key.orderBy(F.col(SOURCE_POSITION).asc_nulls_first(), OFFSET).rowsBetween(
        Window.unboundedPreceding, -1
    )
    tombstone = F.col("_tombstone")
    upsert = ~tombstone & F.col("_op").isin(*_UPSERTS)
    df = df.withColumn("_prior_position", F.lag(SOURCE_POSITION).over(before))
    delete = ~tombstone & (F.col("_op") == "d")
    own_key = F.struct(F.col(PARTITION).alias(PARTITION), *[F.col(k) for k in key_columns])
    toast: dict[str, T.DataType] = {}
    for f in after_type.fields:
        is_placeholder = _placeholder(f.dataType, F.col(f"_a_{f.name}"))
        if is_placeholder is None or not types.placeholders:
            continue
        toast[f.name] = f.dataType
        # The key's last value before the event; a delete in between leaves none ("live" false).
        df = df.withColumns(
            {
                f"_p_{f.name}": upsert & F.coalesce(is_placeholder, F.lit(False)),
                f"_e_{f.name}": F.last(
                    _anchor(upsert, delete, is_placeholder, f.name, f.dataType, own_key),
                    ignorenulls=True,
                ).over(earlier),
            }
        )
    if toast and types.rekeyed:
        df = _with_old_key(df, toast, upsert, delete, own_key, earlier)
    elif toast:  # (Spark Connect refuses withColumns of no column)
        df = df.withColumns({f"_s_{name}": F.col(f"_e_{name}") for name in toast})
    look = F.coalesce(*[F.when(F.col(f"_p_{n}"), F.col(f"_s_{n}").old) for n in toast], own_key)
    df = df.withColumn("_look", look).withColumns(
        {f"_look_{c}": F.col("_look")[c] for c in [PARTITION, *key_columns]}
    )
    needs_log = tombstone & F.col("_prior_position").isNull()
    for name in toast:
        needs_log = needs_log | (F.col(f"_p_{name}") & F.col(f"_s_{name}").live.isNull())
    # Cached: the keys the log must give are collected from it, and the records read it again
    # (refused rows, the append) without computing the windows a second time.
    df = df.withColumns(
        {
            "_needs_log": needs_log,
            "_early_reason": _early_reason(tombstone, upsert),
            # Unchanged TOAST values with no value whatever the log holds (a delete before),
            # and those the log's record gives, by field name.
            "_toast_dead": _names(toast, lambda n: F.col(f"_p_{n}") & ~F.col(f"_s_{n}").live),
            "_toast_log": _names(
                toast, lambda n: F.col(f"_p_{n}") & F.col(f"_s_{n}").live.isNull()
            ),
        }
    ).persist(StorageLevel.MEMORY_AND_DISK)
    cache.append(df)
    df = _with_log_state(df, key_columns, previous_state, refuse=refuse)

    position = F.when(
        tombstone,
        F.concat(
            F.coalesce(F.col("_prior_position"), F.col("_log_position")), F.lit(TOMBSTONE_MARK)
        ),
    ).otherwise(F.col(SOURCE_POSITION))
    fields: list[Column] = []
    unresolved: list[Column] = []
    for f in after_type.fields:
        column = F.col(f"_a_{f.name}")
        if f.name in toast:
            from_log = F.col("_log_value")[f.name] if f.name in _log_fields(df) else F.lit(None)
            earlier_value = F.col(f"_s_{f.name}")
            resolved = F.when(earlier_value.live, earlier_value.v).when(
                earlier_value.live.isNull() & F.col("_log_live"), from_log.cast(f.dataType)
            )
            missing = F.col(f"_p_{f.name}") & ~F.coalesce(earlier_value.live, F.col("_log_live"))
            unresolved.append(F.when(missing, F.lit(f.name)))
            column = F.when(F.col(f"_p_{f.name}"), resolved).otherwise(column)
        schema = next((s for s in after_fields if s["field"] == f.name), {})
        fields.append(_logical(schema, column).alias(f.name))
    if isinstance(log_value, T.StructType):
        ours = {f.name for f in after_type.fields}
        kept = [
            F.lit(None).cast(f.dataType).alias(f.name)
            for f in log_value.fields
            if f.name not in ours
        ]
        by_name = dict(zip([f.name for f in after_type.fields], fields, strict=True))
        by_name.update(
            zip([f.name for f in log_value.fields if f.name not in ours], kept, strict=True)
        )
        order = [f.name for f in log_value.fields] + [
            f.name for f in after_type.fields if f.name not in {g.name for g in log_value.fields}
        ]
        fields = [by_name[name] for name in order]
    value = F.when(upsert, F.struct(*fields))
    unresolved_names = F.concat_ws(", ", *unresolved) if unresolved else F.lit("")
    reason = F.coalesce(
        F.col("_early_reason"),
        F.when(
            upsert & (unresolved_names != ""),
            F.concat(F.lit(_TOAST_REASON[0]), unresolved_names, F.lit(_TOAST_REASON[1])),
        ),
    )
    has_timestamp = TIMESTAMP in parsed.columns
    records = df.where(~tombstone | position.isNotNull()).select(
        *key_columns,
        value.alias(VALUE),
        position.alias(SOURCE_POSITION),
        PARTITION,
        OFFSET,
        *([TIMESTAMP] if has_timestamp else []),
        reason.alias(DECODE_ERROR),
    )
    return records


_TOAST_REASON = (
    f"unchanged TOAST value ({UNAVAILABLE_VALUE}) of ",
    " and no earlier value of the key in the batch or the log: the sink must see the row's "
    "value first (start the connector with a snapshot)",
)


def _early_reason(tombstone: Column, upsert: Column) -> Column:
    """Why an event is refused, for the reasons the log cannot change (null: none)."""
    return (
        F.when(tombstone, F.lit(None).cast("string"))
        .when(F.col("_not_event"), F.lit(f"not a Debezium change event ({DEBEZIUM_JSON})"))
        .when(
            F.col("_op") == "t",
            F.lit(
                "op=t (TRUNCATE): the sink cannot clear a table's state from one event; "
                "leave truncates out (Debezium's default skipped.operations=t) and rebuild "
                "the log from a new snapshot"
            ),
        )
        .when(
            ~F.coalesce(F.col("_op").isin(*_UPSERTS, "d"), F.lit(False)),
            F.concat(
                F.lit("op="),
                F.coalesce(F.col("_op"), F.lit("null")),
                F.lit(" is not a row change (c, u, r, d)"),
            ),
        )
        .when(upsert & F.col("_no_after"), F.lit("a change event without after"))
        .when(
            F.col(SOURCE_POSITION).isNull(),
            F.lit(
                "a change event without a source position (source.lsn, source.file/pos or ts_ms)"
            ),
        )
    )


def _names(fields: Sequence[str], where: Callable[[str], Column]) -> Column:
    """The names of ``fields`` (in order, comma-separated) for which ``where`` holds."""
    return F.concat_ws(", ", *[F.when(where(n), F.lit(n)) for n in fields]) if fields else F.lit("")


def _anchor(
    upsert: Column,
    delete: Column,
    is_placeholder: Column,
    name: str,
    data_type: T.DataType,
    own_key: Column,
) -> Column:
    """What an event says of field ``name`` to the key's later events: its value (``live``),
    that the key was deleted (``live`` false), or nothing (null: a placeholder, a tombstone).
    ``old`` (null here) is the key whose log record holds the value (`_with_old_key`)."""
    no_key = F.when(F.lit(False), own_key)
    return F.when(
        upsert & ~F.coalesce(is_placeholder, F.lit(False)),
        F.struct(F.lit(True).alias("live"), F.col(f"_a_{name}").alias("v"), no_key.alias("old")),
    ).when(
        delete,
        F.struct(
            F.lit(False).alias("live"), F.lit(None).cast(data_type).alias("v"), no_key.alias("old")
        ),
    )


def _with_old_key(
    df: DataFrame,
    toast: dict[str, T.DataType],
    upsert: Column,
    delete: Column,
    own_key: Column,
    earlier: WindowSpec,
) -> DataFrame:
    """``df`` with where each unchanged TOAST value comes from (``_s_<field>``), when a
    primary-key change left some unchanged (design.md §60).

    A primary-key change is a ``d`` of the old key and a ``c`` of the new one at the same
    source position (one row change in the source's log). The ``c``'s unchanged values are
    the old key's: its last value before its ``d`` in the batch, else (``old``: the old key)
    its live record in the log. The new key's later events then take them from the ``c``.
    Only a position of the source's log (``lsn``, binlog file and position) pairs two
    events, never a time. Each of `REKEY_LEVELS` rounds (two windows) resolves one more
    change of a chain in the batch (A to B, then B to C); a longer chain finds no value
    and is refused by name.
    """
    by_position = Window.partitionBy(SOURCE_POSITION)
    deleted = delete & F.col("_log_position_kind")
    old_key = F.first(F.when(deleted, own_key), ignorenulls=True).over(by_position)
    df = df.withColumn("_old_key", F.when(upsert & F.col("_log_position_kind"), old_key))
    known = {name: f"_e_{name}" for name in toast}  # each event's anchor, so far
    for level in range(REKEY_LEVELS):
        rekeyed: dict[str, Column] = {}
        for name, data_type in toast.items():
            before_delete = F.first(F.when(deleted, F.col(known[name])), ignorenulls=True)
            from_log = F.struct(
                F.lit(None).cast("boolean").alias("live"),
                F.lit(None).cast(data_type).alias("v"),
                F.col("_old_key").alias("old"),
            )
            rekeyed[f"_r{level}_{name}"] = F.when(
                F.col("_old_key").isNotNull() & F.col(f"_p_{name}"),
                F.coalesce(before_delete.over(by_position), from_log),
            )
        df = df.withColumns(rekeyed)
        resolved: dict[str, Column] = {}
        for name, data_type in toast.items():
            own = F.col(f"_r{level}_{name}")
            anchor = F.when(own.isNotNull(), own).otherwise(
                _anchor(upsert, delete, F.col(f"_p_{name}"), name, data_type, own_key)
            )
            later = F.last(anchor, ignorenulls=True).over(earlier)
            resolved[f"_s{level}_{name}"] = F.coalesce(own, later)
        df = df.withColumns(resolved)
        known = {name: f"_s{level}_{name}" for name in toast}
    return df.withColumns({f"_s_{name}": F.col(known[name]) for name in toast})


def _log_fields(df: DataFrame) -> set[str]:
    data_type = df.schema["_log_value"].dataType
    return {f.name for f in data_type.fields} if isinstance(data_type, T.StructType) else set()


def _with_log_state(
    df: DataFrame,
    key_columns: Sequence[str],
    previous_state: PreviousState,
    *,
    refuse: bool,
) -> DataFrame:
    """``df`` with the log's live record of the look-up key (``_look_partition`` and
    ``_look_<key>``: the row's own, or a primary-key change's old key) of each row that
    needs it (``_needs_log``): ``_log_live``, ``_log_value``, ``_log_position``.

    One Spark job (an aggregate, small) gives both the keys to look up and, with
    ``refuse``, the refused rows: the reasons the log cannot change, and the unchanged TOAST
    values that only a live record of the look-up key would give. The log is read by
    ``previous_state`` on the driver; then `BadInputError` names the refused rows, before
    anything is written (design.md §62)."""
    look = F.struct(*[F.col(f"_look_{c}").alias(c) for c in [PARTITION, *key_columns]])
    wanted = (
        df.where(
            F.col("_needs_log") | F.col("_early_reason").isNotNull() | (F.col("_toast_dead") != "")
        )
        .select(
            F.when(F.col("_needs_log"), look).alias("look"),
            F.col("_early_reason").alias("reason"),
            F.col("_toast_dead").alias("dead"),
            F.col("_toast_log").alias("log"),
        )
        .groupBy("look", "reason", "dead", "log")
        .count()
        .collect()
    )
    keys = [
        {k: look[k] for k in key_columns}
        for look in {r["look"] for r in wanted if r["look"] is not None}
        if None not in [look[k] for k in key_columns]
    ]
    table = previous_state(keys) if keys else None
    if table is None or table.num_rows == 0:
        if refuse:
            _refuse(wanted, set())
        return df.select(
            "*",
            F.lit(False).alias("_log_live"),
            F.lit(None).alias("_log_value"),
            F.lit(None).cast("string").alias("_log_position"),
        )
    if refuse:
        live = zip(*[table.column(c).to_pylist() for c in [PARTITION, *key_columns]], strict=True)
        _refuse(wanted, set(live))
    spark = df.sparkSession
    columns = [*key_columns, PARTITION, VALUE]
    log_rows = table.select(columns)
    position = (
        table.column(SOURCE_POSITION)
        if SOURCE_POSITION in table.column_names
        else pa.nulls(table.num_rows, pa.string())
    )
    log_rows = log_rows.append_column("_log_position", position.cast(pa.string()))
    log_df = spark.createDataFrame(log_rows).select(
        *[F.col(k).alias(f"_lk_{k}") for k in key_columns],
        F.col(PARTITION).cast("int").alias("_lk_partition"),
        F.col(VALUE).alias("_log_value"),
        "_log_position",
        F.lit(True).alias("_log_live"),
    )
    condition = [F.col(f"_look_{PARTITION}") == F.col("_lk_partition")] + [
        F.col(f"_look_{k}") == F.col(f"_lk_{k}") for k in key_columns
    ]
    joined = df.join(F.broadcast(log_df), on=condition, how="left")
    joined = joined.drop(*[f"_lk_{k}" for k in key_columns], "_lk_partition")
    return joined.withColumn("_log_live", F.coalesce(F.col("_log_live"), F.lit(False)))


def _refuse(wanted: list[Any], live: set[tuple[Any, ...]]) -> None:
    """`BadInputError` naming why rows are refused (``wanted``: `_with_log_state`'s
    aggregate; ``live``: the look-up keys the log holds, as (partition, *key) tuples)."""
    counts: dict[str, int] = {}
    for row in wanted:
        reason = row["reason"]
        if reason is None:
            found = row["look"] is not None and tuple(row["look"]) in live
            names = [n for n in (row["dead"], "" if found else row["log"]) if n]
            if not names:
                continue
            ordered = ", ".join(names)
            reason = f"{_TOAST_REASON[0]}{ordered}{_TOAST_REASON[1]}"
        counts[reason] = counts.get(reason, 0) + row["count"]
    if counts:
        said = "; ".join(f"{n} rows: {reason}" for reason, n in list(counts.items())[:5])
        raise BadInputError(f"value_format={DEBEZIUM_JSON!r} refused change events: {said}")
