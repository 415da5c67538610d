"""``erase`` and ``erasure-status``: forgetting keys, and proving what is left of them.

``erase LOG KEY... [--keys-file F]`` appends tombstones for the keys once and marks their
partitions for cleaning (`CompactedStateSink.erase`, design.md §54); with ``--clean`` it
runs the cleaning round at once (a Spark session), else the next ``clean`` round or the
running query's cleaner takes it. ``erasure-status LOG KEY...`` prints, per key, every file
under the log's path (and ``--dead-letter-table``'s) still holding it, with when each goes
and the key's deadline, or ``none`` (`CompactedStateSink.erasure_status`, design.md §55).
Keys are text, cast to the key column's type; ``--json-keys`` reads each as JSON (an array
for a key of several columns).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from streaming.cli.common import check_is_log, out, session


def add_erase(commands: argparse._SubParsersAction) -> None:
    erase = commands.add_parser(
        "erase", help="forget keys: tombstones once, their partitions cleaned by the deadline"
    )
    _key_arguments(erase)
    erase.add_argument(
        "--clean", action="store_true", help="run the cleaning round now (starts Spark)"
    )
    erase.set_defaults(handler=_erase)


def add_erasure_status(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser(
        "erasure-status", help="every file still holding a key, when each goes (no Spark)"
    )
    _key_arguments(status)
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(handler=_erasure_status)


def _key_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG", help="the log's path or URI")
    parser.add_argument("keys", metavar="KEY", nargs="*", help="a key (text, cast to its type)")
    parser.add_argument("--keys-file", help="a file of keys, one a line (added to KEY...)")
    parser.add_argument(
        "--json-keys", action="store_true", help="each key is JSON (an array: several columns)"
    )
    parser.add_argument("--dead-letter-table", help="the log's dead-letter table, if it has one")


def _keys(args: argparse.Namespace) -> list[Any]:
    texts = list(args.keys)
    if args.keys_file:
        lines = Path(args.keys_file).read_text(encoding="utf-8").splitlines()
        texts += [line for line in lines if line.strip()]
    if not texts:
        raise SystemExit("give at least one KEY or --keys-file")
    if not args.json_keys:
        return texts
    return [tuple(v) if isinstance(v, list) else v for v in map(json.loads, texts)]


def _sink(args: argparse.Namespace):
    from sinks import CompactedStateSink

    check_is_log(args.log)
    return CompactedStateSink(args.log, dead_letter_table=args.dead_letter_table)


def _erase(args: argparse.Namespace) -> int:
    keys = _keys(args)
    if args.clean:
        session("compacted-sink erase", args)
    report = _sink(args).erase(keys)
    out(report.summary())
    if not args.clean and report.marked:
        out("the next cleaning round (compacted-sink clean, or the query's cleaner) cleans them")
    return 0


def _erasure_status(args: argparse.Namespace) -> int:
    status = _sink(args).erasure_status(_keys(args))
    if args.json:
        out(json.dumps(status.as_dict(), default=str, ensure_ascii=False))
        return 0
    for line in render_status(status):
        out(line)
    return 0


def render_status(status: Any) -> list[str]:
    """Lines for an `ErasureStatus`: per key ``KEY: none`` or its places and deadline. Pure."""
    lines = []
    for key in status.keys:
        if key.gone:
            lines.append(f"{key.key}: none")
            continue
        lines.append(f"{key.key}: {len(key.places)} place(s), deadline {_utc(key.deadline_ms)}")
        for place in key.places:
            held = f" ({place.records} record(s))" if place.records else ""
            late = place.goes_at_ms is not None and place.goes_at_ms < status.now_ms
            lines.append(
                f"  {place.kind}: {place.table}/{place.path}{held}, goes "
                f"{_utc(place.goes_at_ms)}{' (overdue)' if late else ''}: {place.why}"
            )
    read = (
        f"read: {status.files_listed} file(s) listed, {status.files_decoded} data file(s) "
        f"decoded, {status.delta_log_files_read} Delta log file(s) read"
    )
    lines.append(read)
    if overdue := status.overdue():
        lines.append(
            f"overdue: {len(overdue)} place(s) past their time: the cleaner or the segment "
            "deleter has not run there, or failed (its log says why)"
        )
    return lines


def _utc(ms: int | None) -> str:
    if ms is None:
        return "unbounded"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
