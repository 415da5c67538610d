"""A ten-step schema history of one log's ``value``, with the dict replay the tests compare to.

Step 0 creates the log with a required ``value.id``; later steps add fields at three
depths (``value.email``, ``value.address.zip``, ``value.address.geo.alt``), in arrays
(``value.tags[].w``), widen ``score`` int → bigint and ``alt`` float → double, relax
``value.id`` to nullable, add a top-level ``source`` column and send fields in another
order. ``REFUSED`` are batches each step must refuse, with the field they name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import types as T


def f(name: str, data_type: T.DataType, nullable: bool = True) -> T.StructField:
    return T.StructField(name, data_type, nullable)


def struct(*fields: T.StructField) -> T.StructType:
    return T.StructType(list(fields))


def tags(*extra: T.StructField) -> T.ArrayType:
    return T.ArrayType(struct(f("t", T.StringType()), *extra))


def value_type(
    *, email=False, zip_=False, geo=False, alt=None, w=False, score=None, id_null=False
) -> T.StructType:
    score = score or T.IntegerType()
    address = [f("city", T.StringType())]
    if zip_:
        address.append(f("zip", T.StringType()))
    if geo:
        address.append(
            f("geo", struct(f("lat", T.DoubleType()), *([f("alt", alt)] if alt else [])))
        )
    fields = [
        f("id", T.IntegerType(), nullable=id_null),
        f("name", T.StringType()),
        f("address", struct(*address)),
        f("score", score),
        f("tags", tags(*([f("w", T.IntegerType())] if w else []))),
    ]
    if email:
        fields.append(f("email", T.StringType()))
    return struct(*fields)


@dataclass(frozen=True)
class Step:
    """One batch: its ``value`` type, rows ``(key, value dict or None[, source])``, a pass after."""

    name: str
    value: T.StructType
    rows: list[tuple[Any, ...]]
    clean_after: bool = False
    source: bool = False
    reorder: bool = False
    changes: list[str] = field(default_factory=list)

    def schema(self) -> T.StructType:
        value = _reordered(self.value) if self.reorder else self.value
        fields = [f("key", T.StringType()), f("value", value)]
        if self.source:
            fields.append(f("source", T.StringType()))
        return struct(*(reversed(fields) if self.reorder else fields))

    def records(self) -> list[dict[str, Any]]:
        out = []
        for row in self.rows:
            record = {"key": row[0], "value": row[1]}
            if self.source:
                record["source"] = row[2] if len(row) > 2 else None
            out.append(record)
        return out


def _reordered(data_type: T.DataType) -> T.DataType:
    if isinstance(data_type, T.StructType):
        return T.StructType(
            [
                T.StructField(x.name, _reordered(x.dataType), x.nullable)
                for x in data_type.fields[::-1]
            ]
        )
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(_reordered(data_type.elementType), data_type.containsNull)
    return data_type


def v(id_, name, city="x", score=1, tag_list=(), **extra) -> dict[str, Any]:
    value = {"id": id_, "name": name, "address": {"city": city}, "score": score}
    value["tags"] = [dict(t) for t in tag_list]
    for k, x in extra.items():
        if k in ("zip", "geo"):
            value["address"][k] = x
        else:
            value[k] = x
    return value


STEPS = [
    Step("create", value_type(), [("a", v(1, "ann")), ("b", v(2, "bob", tag_list=[{"t": "x"}]))]),
    Step("tombstone", value_type(), [("a", v(1, "ann2")), ("b", None), ("c", v(3, "cy"))], True),
    Step(
        "add value.email",
        value_type(email=True),
        [("d", v(4, "di", email="d@x")), ("c", v(3, "cy2"))],
        changes=["added value.email string"],
    ),
    Step(
        "add value.address.zip",
        value_type(email=True, zip_=True),
        [("a", v(1, "ann3", zip="1000", email=None))],
        changes=["added value.address.zip string"],
    ),
    Step(
        "add value.address.geo and value.tags[].w",
        value_type(email=True, zip_=True, geo=True, w=True),
        [("e", v(5, "ed", geo={"lat": 1.5}, tag_list=[{"t": "y", "w": 7}]))],
        clean_after=True,
        changes=["added value.address.geo struct<lat:double>", "added value.tags[].w int"],
    ),
    Step(
        "add value.address.geo.alt (depth 3)",
        value_type(email=True, zip_=True, geo=True, w=True, alt=T.FloatType()),
        [("e", v(5, "ed2", geo={"lat": 1.5, "alt": 2.5})), ("b", v(2, "bob2"))],
        changes=["added value.address.geo.alt float"],
    ),
    Step(
        "widen score int -> bigint, alt float -> double",
        value_type(email=True, zip_=True, geo=True, w=True, alt=T.DoubleType(), score=T.LongType()),
        [("f", v(6, "fi", score=2**40, geo={"lat": 0.5, "alt": 0.25}))],
        changes=[
            "widened value.address.geo.alt float -> double",
            "widened value.score int -> bigint",
        ],
    ),
    Step(
        "relax value.id to nullable",
        value_type(
            email=True,
            zip_=True,
            geo=True,
            w=True,
            alt=T.DoubleType(),
            score=T.LongType(),
            id_null=True,
        ),
        [("g", v(None, "gu")), ("a", None)],
        clean_after=True,
        changes=["made value.id nullable"],
    ),
    Step(
        "add top-level source",
        value_type(
            email=True,
            zip_=True,
            geo=True,
            w=True,
            alt=T.DoubleType(),
            score=T.LongType(),
            id_null=True,
        ),
        [("h", v(8, "hu"), "crm"), ("c", v(3, "cy3"), "web")],
        source=True,
        changes=["added source string"],
    ),
    Step(
        "fields in another order",
        value_type(
            email=True,
            zip_=True,
            geo=True,
            w=True,
            alt=T.DoubleType(),
            score=T.LongType(),
            id_null=True,
        ),
        [("i", v(9, "io", zip="9", tag_list=[{"t": "z", "w": 1}]), "web"), ("d", None, None)],
        clean_after=True,
        source=True,
        reorder=True,
    ),
]

FINAL = STEPS[-1]
REFUSED = [
    # (before step, the value type of a batch, the field path the error must name)
    (7, value_type(email=True, zip_=True, geo=True, w=True, alt=T.DoubleType()), "value.score"),
    (
        9,
        value_type(
            zip_=True, geo=True, w=True, alt=T.DoubleType(), score=T.LongType(), id_null=True
        ),
        "value.email",
    ),
]


class Replay:
    """The state as a dict: each key's latest record, unless a tombstone (design.md §3)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, Any] = {}

    def apply(self, step: Step) -> None:
        for record in step.records():
            self.values[record["key"]] = record["value"]
            self.sources[record["key"]] = record.get("source")

    def state(self, value: T.StructType) -> dict[str, Any]:
        """Every live key's value as the log's current schema reads it (new fields null)."""
        return {k: fill(x, value) for k, x in sorted(self.values.items()) if x is not None}


def fill(value: Any, data_type: T.DataType) -> Any:
    """``value`` as read with ``data_type``: fields it lacks are None, structs are dicts."""
    if value is None:
        return None
    if isinstance(data_type, T.StructType):
        return {x.name: fill(value.get(x.name), x.dataType) for x in data_type.fields}
    if isinstance(data_type, T.ArrayType):
        return [fill(x, data_type.elementType) for x in value]
    return value


def as_dicts(rows) -> dict[str, Any]:
    """``state()`` rows as ``{key: value dict}``."""
    return {r["key"]: r["value"].asDict(recursive=True) for r in rows}
