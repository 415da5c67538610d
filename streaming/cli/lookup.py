"""``lookup``: a key's state now, as ``kafka-console-consumer`` users check a key, no Spark.

Prints one line per key asked (``sinks.lookup``): the key, its value, then where the record
sits (partition, offset, timestamp) and the payload columns; ``(no live record)`` for a
key deleted or never written. ``--json`` prints one JSON object per record found instead.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from streaming.cli.common import as_of, out

_NOT_FOUND = "(no live record)"


def add_lookup(commands: argparse._SubParsersAction) -> None:
    lookup = commands.add_parser(
        "lookup", help="the latest live record of one or more keys (no Spark)"
    )
    lookup.add_argument("log", metavar="LOG", help="the log's path or URI")
    lookup.add_argument("keys", metavar="KEY", nargs="+", help="a key (text, cast to its type)")
    lookup.add_argument("--as-of", help="a Delta version or a timestamp inside the history window")
    lookup.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    lookup.add_argument(
        "--json-keys",
        action="store_true",
        help="each KEY is JSON: an array for a key of several columns, e.g. '[\"t1\", 42]'",
    )
    lookup.set_defaults(handler=_lookup)


def _lookup(args: argparse.Namespace) -> int:
    from sinks import lookup

    keys = [_key(k) for k in args.keys] if args.json_keys else list(args.keys)
    table = lookup(args.log, keys, as_of=as_of(args.as_of))
    rows = table.to_pylist()
    if args.json:
        for row in rows:
            out(json.dumps(row, default=str, ensure_ascii=False))
        return 0
    key_columns = table.schema.names[: table.schema.names.index("value")]
    for line in render(keys, rows, key_columns):
        out(line)
    return 0


def render(keys: list[Any], rows: list[dict[str, Any]], key_columns: list[str]) -> list[str]:
    """One line per key asked, in the order asked (a key in several partitions: one line
    each), for `lookup`'s ``rows``. Pure."""
    found: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        found.setdefault(_text(tuple(str(row[c]) for c in key_columns)), []).append(row)
    hidden = {*key_columns, "value", "partition", "offset", "timestamp"}
    lines = []
    for key in dict.fromkeys(_text(_as_tuple(k)) for k in keys):
        records = found.get(key)
        if not records:
            lines.append(f"{key}\t{_NOT_FOUND}")
            continue
        for row in records:
            where = f"partition {row.get('partition')}, offset {row.get('offset')}"
            if row.get("timestamp") is not None:
                where += f", {row['timestamp']}"
            payload = "".join(f"  {c}={_value(v)}" for c, v in row.items() if c not in hidden)
            lines.append(f"{key}\t{_value(row['value'])}\t[{where}]{payload}")
    return lines


def _key(text: str) -> Any:
    value = json.loads(text)
    return tuple(value) if isinstance(value, list) else value


def _as_tuple(key: Any) -> tuple[str, ...]:
    return tuple(str(k) for k in key) if isinstance(key, tuple | list) else (str(key),)


def _text(key: tuple[str, ...]) -> str:
    return key[0] if len(key) == 1 else "(" + ", ".join(key) + ")"


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str, ensure_ascii=False)
