"""Schema evolution: the rule that decides what a batch may change in its log's schema.

Ports what a schema registry's BACKWARD compatibility allows a Kafka producer
(a new optional field, a promotion), for a log whose records are all kept: a
record written before a change must still read under the new schema, with the
new fields null. `evolve_schema` is pure, over Spark ``StructType`` values: it
takes the log's schema and a batch's, and returns the log's schema after the
batch, or raises `SchemaMismatchError` naming the field path (``value.c.x``;
``[]`` steps into an array's elements, ``{}`` into a map's values), the log's
type and the batch's, and what to do.

With ``"additive"`` (the default) a batch may bring

- a new top-level column or a new field in a struct at any depth (also inside
  arrays and map values); the field is added nullable, since older records lack it;
- a nullable field, array element or map value where the log had a required one;
- a wider type: byte → short → int → long, float → double.

Fields are matched by name, so a batch may order columns and struct fields as
it likes; the evolved schema keeps the log's order and appends new fields in
the batch's order. Everything else is refused: a field of the log missing from
the batch (dropped or renamed), a narrower type than the log's, any other type
change, a new map key type, and any type change of a key or sequence column
(they are compared by value across every file). With ``"none"`` every change of
names or types is refused the same way (nullability is not compared, as before
evolution existed). A refused batch has written nothing: the rule runs before.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal, get_args

from pyspark.sql import types as T

from sinks.errors import ConfigError, SchemaMismatchError

SchemaEvolution = Literal["additive", "none"]
SCHEMA_EVOLUTION_MODES: tuple[str, ...] = get_args(SchemaEvolution)
DEFAULT_SCHEMA_EVOLUTION: SchemaEvolution = "additive"

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_FRACTIONAL = (T.FloatType, T.DoubleType)
_WIDENING = "only widening evolves a log (byte → short → int → long, float → double)"
_NOTHING_WRITTEN = "nothing was written"


def check_mode(mode: str) -> SchemaEvolution:
    """``mode`` as a `SchemaEvolution`; raises `ConfigError` naming ``schema_evolution``."""
    if mode not in SCHEMA_EVOLUTION_MODES:
        raise ConfigError(
            f"schema_evolution must be one of {', '.join(map(repr, SCHEMA_EVOLUTION_MODES))}, "
            f"not {mode!r}"
        )
    return mode  # type: ignore[return-value]


def evolve_schema(
    log: T.StructType,
    batch: T.StructType,
    *,
    mode: SchemaEvolution = DEFAULT_SCHEMA_EVOLUTION,
    fixed_columns: Collection[str] = (),
    ignored_columns: Collection[str] = (),
) -> T.StructType:
    """The log's schema once ``batch`` is appended: ``log`` itself when nothing changes.

    ``fixed_columns`` (key and sequence columns) may not change type at all;
    ``ignored_columns`` (transient batch columns) are not compared. Pure; raises
    `SchemaMismatchError` for a refused change (see the module doc).
    """
    rule = _Rule(check_mode(mode), frozenset(fixed_columns))
    top = T.StructType([f for f in batch.fields if f.name not in ignored_columns])
    evolved = rule.struct("", log, top)
    return log if evolved == log else evolved


def schema_changes(old: T.StructType, new: T.StructType) -> list[str]:
    """What ``new`` (an evolution of ``old``) changed, one line per field, for logs and status.

    For example ``["added value.c.x int", "widened value.n int -> bigint",
    "made value.a nullable"]``. Empty when the schemas are equal.
    """
    changes: list[str] = []
    _diff("", old, new, changes)
    return changes


# -- the rule ----------------------------------------------------------------------------------


class _Rule:
    def __init__(self, mode: SchemaEvolution, fixed: frozenset[str]) -> None:
        self.mode = mode
        self.fixed = fixed

    def refuse(self, path: str, what: str, todo: str) -> SchemaMismatchError:
        if self.mode == "none":
            todo = (
                "schema_evolution='none' refuses every schema change; set "
                f"schema_evolution='additive' to evolve the log, or {todo}"
            )
        return SchemaMismatchError(f"{what}; {todo}; {_NOTHING_WRITTEN}", field_path=path)

    def struct(self, path: str, log: T.StructType, batch: T.StructType) -> T.StructType:
        got = {f.name: f for f in batch.fields}
        fields = []
        for old in log.fields:
            field_path = _join(path, old.name)
            new = got.get(old.name)
            if new is None:
                raise self.refuse(
                    field_path,
                    f"field {field_path!r} ({_type(old.dataType)}) of the log is missing from "
                    "the batch (dropped or renamed)",
                    "a log keeps every field it has had, since older records hold it: send the "
                    "field (null where there is no value; a rename keeps the old field and adds "
                    "the new one), or write to a new log",
                )
            data_type = self.type(field_path, old.dataType, new.dataType)
            nullable = old.nullable or (new.nullable and self.mode == "additive")
            fields.append(T.StructField(old.name, data_type, nullable, old.metadata))
        known = {f.name for f in log.fields}
        for new in batch.fields:
            if new.name in known:
                continue
            field_path = _join(path, new.name)
            if self.mode == "none":
                raise self.refuse(
                    field_path,
                    f"field {field_path!r} ({_type(new.dataType)}) is new in the batch",
                    "select the log's columns only",
                )
            fields.append(T.StructField(new.name, new.dataType, True, new.metadata))
        return T.StructType(fields)

    def type(self, path: str, log: T.DataType, batch: T.DataType) -> T.DataType:
        if isinstance(log, T.StructType) and isinstance(batch, T.StructType):
            return self.struct(path, log, batch)
        if isinstance(log, T.ArrayType) and isinstance(batch, T.ArrayType):
            element = self.type(path + "[]", log.elementType, batch.elementType)
            return T.ArrayType(element, self.relaxed(log.containsNull, batch.containsNull))
        if isinstance(log, T.MapType) and isinstance(batch, T.MapType):
            if _plain(log.keyType) != _plain(batch.keyType):
                raise self.changed(path + "{key}", log.keyType, batch.keyType, "a map's key type")
            value = self.type(path + "{}", log.valueType, batch.valueType)
            relaxed = self.relaxed(log.valueContainsNull, batch.valueContainsNull)
            return T.MapType(log.keyType, value, relaxed)
        if _plain(log) == _plain(batch):
            return log
        wider = _wider(log, batch)
        if path in self.fixed:
            why = "a key or sequence column keeps its type: it is compared by value"
        elif self.mode == "none":
            why = "a type change"
        elif wider is batch:
            return batch
        elif wider is log:
            why = f"the batch's type is narrower; {_WIDENING}"
        else:
            why = _WIDENING
        raise self.changed(path, log, batch, why)

    def relaxed(self, log_nullable: bool, batch_nullable: bool) -> bool:
        return log_nullable or (batch_nullable and self.mode == "additive")

    def changed(
        self, path: str, log: T.DataType, batch: T.DataType, why: str
    ) -> SchemaMismatchError:
        return self.refuse(
            path,
            f"field {path!r} has type {_type(batch)} in the batch, the log has {_type(log)} "
            f"({why})",
            f"cast it to {_type(log)} in the batch, or write to a new log",
        )


def _wider(log: T.DataType, batch: T.DataType) -> T.DataType | None:
    """The wider of two numeric types of one family (integral, fractional); None otherwise."""
    for family in (_INTEGRAL, _FRACTIONAL):
        ranks = [i for t in (log, batch) for i, kind in enumerate(family) if type(t) is kind]
        if len(ranks) == 2:
            return batch if ranks[1] > ranks[0] else log
    return None


def _plain(data_type: T.DataType) -> str:
    """A type without nullability: equal for two types that differ only in nullability."""
    return _type(data_type)


def _type(data_type: T.DataType) -> str:
    return data_type.simpleString()


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# -- describing a change -----------------------------------------------------------------------


def _diff(path: str, old: T.DataType, new: T.DataType, out: list[str]) -> None:
    if isinstance(old, T.StructType) and isinstance(new, T.StructType):
        before = {f.name: f for f in old.fields}
        for f in new.fields:
            field_path = _join(path, f.name)
            if f.name not in before:
                out.append(f"added {field_path} {_type(f.dataType)}")
                continue
            if f.nullable and not before[f.name].nullable:
                out.append(f"made {field_path} nullable")
            _diff(field_path, before[f.name].dataType, f.dataType, out)
    elif isinstance(old, T.ArrayType) and isinstance(new, T.ArrayType):
        if new.containsNull and not old.containsNull:
            out.append(f"made {path}[] nullable")
        _diff(path + "[]", old.elementType, new.elementType, out)
    elif isinstance(old, T.MapType) and isinstance(new, T.MapType):
        if new.valueContainsNull and not old.valueContainsNull:
            out.append(f"made {path}{{}} nullable")
        _diff(path + "{}", old.valueType, new.valueType, out)
    elif _plain(old) != _plain(new):
        out.append(f"widened {path} {_type(old)} -> {_type(new)}")
