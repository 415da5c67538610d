"""``lookup``: a key's state now, as ``kafka-console-consumer`` users check a key, no Spark.

Prints one line per key asked (``sinks.lookup``): the key, its value, then where the record
sits (partition, offset, timestamp) and the payload columns; ``(no live record)`` for a
key deleted or never written. ``--json`` prints one JSON object per record found instead.

A KEY is text, taken as the log's key column needs it (`streaming.cli.binary_text`): for a
binary key column (every log fed by Kafka or the ``files`` source) its UTF-8 bytes, or
its ``--key-encoding hex``/``base64`` bytes; for any other type it is cast as `sinks.lookup`
casts (``"42"`` finds the integer key 42). A log of several key columns takes each KEY as a
JSON array in key-column order with ``--json-keys`` (``'["tenant-1", 42]'``; a JSON object
by column name works too). Binary values are printed as text when valid UTF-8, else as
base64 (``base64:`` in text lines; named in ``--json``'s ``_encoding`` object).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pyarrow as pa

from sinks.errors import ConfigError
from streaming.cli.binary_text import KEY_ENCODINGS, as_text, json_record, key_bytes
from streaming.cli.common import as_of, out

_NOT_FOUND = "(no live record)"


def add_lookup(commands: argparse._SubParsersAction) -> None:
    lookup = commands.add_parser(
        "lookup", help="the latest live record of one or more keys (no Spark)"
    )
    lookup.add_argument("log", metavar="LOG", help="the log's path or URI")
    lookup.add_argument(
        "keys",
        metavar="KEY",
        nargs="+",
        help="a key: text, cast to the key column's type (binary: see --key-encoding)",
    )
    lookup.add_argument("--as-of", help="a Delta version or a timestamp inside the history window")
    lookup.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    lookup.add_argument(
        "--json-keys",
        action="store_true",
        help="each KEY is JSON: an array for a key of several columns, e.g. '[\"t1\", 42]'",
    )
    lookup.add_argument(
        "--key-encoding",
        choices=KEY_ENCODINGS,
        default="utf8",
        help="how a KEY for a binary key column gives its bytes: its UTF-8 text (default), "
        "hex or base64",
    )
    lookup.set_defaults(handler=_lookup)


def _lookup(args: argparse.Namespace) -> int:
    from sinks import lookup
    from sinks.reading import wanted_keys

    version = as_of(args.as_of)
    schema = lookup(args.log, [], as_of=version).schema  # no key asked: the answer's columns
    key_columns = schema.names[: schema.names.index("value")]
    keys = [asked_key(text, schema, key_columns, args) for text in args.keys]
    table = lookup(args.log, keys, as_of=version)
    rows = table.to_pylist()
    if args.json:
        for row in rows:
            out(json_record(row))
        return 0
    typed = [_typed(wanted_keys([key], schema, key_columns), key_columns) for key in keys]
    for line in render(list(zip(args.keys, typed, strict=True)), rows, key_columns):
        out(line)
    return 0


def asked_key(
    text: str, schema: pa.Schema, key_columns: list[str], args: argparse.Namespace
) -> Any:
    """A KEY argument as `sinks.lookup` takes it for a log of ``key_columns`` (of
    ``schema``): JSON with ``--json-keys``, else the text itself; a value for a binary key
    column as the bytes ``--key-encoding`` says. Raises `ConfigError` naming what to give."""
    binary = [c for c in key_columns if _is_binary(schema.field(c).type)]
    if args.key_encoding != "utf8" and not binary:
        raise ConfigError(
            f"--key-encoding {args.key_encoding}: {args.log} has no binary key column "
            f"({', '.join(f'{c} {schema.field(c).type}' for c in key_columns)}); "
            "give the keys as text"
        )
    if args.json_keys:
        try:
            key = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"--json-keys: KEY {text!r} is not JSON: {e}") from None
    elif len(key_columns) > 1:
        example = json.dumps(["..."] * len(key_columns))
        raise ConfigError(
            f"{args.log} is keyed by {len(key_columns)} columns {key_columns}: give each KEY "
            f"as a JSON array in that order with --json-keys, e.g. --json-keys '{example}'"
        )
    else:
        key = text
    try:
        if isinstance(key, dict):
            return {c: _encoded(v, c in binary, args.key_encoding) for c, v in key.items()}
        if isinstance(key, list):
            if len(key) != len(key_columns):
                return tuple(key)  # `sinks.lookup` says how many columns the key has
            return tuple(
                _encoded(v, c in binary, args.key_encoding)
                for c, v in zip(key_columns, key, strict=True)
            )
        return _encoded(key, key_columns[0] in binary, args.key_encoding)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def render(
    asked: list[tuple[str, tuple[Any, ...]]], rows: list[dict[str, Any]], key_columns: list[str]
) -> list[str]:
    """One line per key asked, in the order asked (a key in several partitions: one line
    each), for `lookup`'s ``rows``. ``asked`` holds each key as typed and as the key
    columns' values (`sinks.reading.wanted_keys`), which a row's key is compared
    with; a key asked twice (``42`` and ``042`` of an integer key) gets one line. Pure."""
    found: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        found.setdefault(tuple(row[c] for c in key_columns), []).append(row)
    hidden = {*key_columns, "value", "partition", "offset", "timestamp"}
    lines = []
    shown: set[tuple[Any, ...]] = set()
    for text, key in asked:
        if key in shown:
            continue
        shown.add(key)
        records = found.get(key)
        if not records:
            lines.append(f"{text}\t{_NOT_FOUND}")
            continue
        for row in records:
            where = f"partition {row.get('partition')}, offset {row.get('offset')}"
            if row.get("timestamp") is not None:
                where += f", {row['timestamp']}"
            payload = "".join(f"  {c}={as_text(v)}" for c, v in row.items() if c not in hidden)
            lines.append(f"{text}\t{as_text(row['value'])}\t[{where}]{payload}")
    return lines


def _typed(wanted: pa.Table, key_columns: list[str]) -> tuple[Any, ...]:
    (row,) = wanted.select(key_columns).to_pylist()
    return tuple(row[c] for c in key_columns)


def _encoded(value: Any, binary: bool, encoding: str) -> Any:
    return key_bytes(value, encoding) if binary and isinstance(value, str) else value  # type: ignore[arg-type]


def _is_binary(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_fixed_size_binary(arrow_type)
        or pa.types.is_binary_view(arrow_type)
    )
