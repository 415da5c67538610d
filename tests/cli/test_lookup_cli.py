"""``compacted-sink lookup`` on logs keyed by binary, string, integer and several columns.

The logs are real Delta tables the sink writes (`testkit.arrow_append`, no Spark); the
command runs in the test's process (``streaming.cli.main``). Binary keys are what every
log fed by Kafka or the ``files`` source has: a KEY is their UTF-8 text by default, or
hex or base64 with ``--key-encoding``; binary values print as text when valid UTF-8,
else as base64, never as a Python repr.
"""

from __future__ import annotations

import base64
import json

from testkit import arrow_append

from sinks import CleanerConfig, CompactedStateSink
from streaming.cli import main
from streaming.cli.binary_text import as_text, json_record, key_bytes

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
NOT_UTF8 = b"\xff\xfe\x00"


def _run(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def _binary_log(lake, clock) -> str:
    path = str(lake / "binary")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    rows = [
        (b"user-24", b"user-152", 0),
        (b"user-7", NOT_UTF8, 1),
        (b"gone", b"x", 0),
        (b"gone", None, 0),
        (NOT_UTF8, b"odd key", 1),
    ]
    arrow_append(sink, rows, "key binary, value binary, partition int", 0)
    return path


def test_binary_keys_are_found_by_their_text_and_printed_as_text(lake, clock, capsys):
    path = _binary_log(lake, clock)
    code, lines, _ = _run(capsys, "lookup", path, "user-24", "user-7", "gone", "nobody")
    assert code == 0
    assert [line.split("\t")[:2] for line in lines] == [
        ["user-24", "user-152"],
        ["user-7", "base64:" + base64.b64encode(NOT_UTF8).decode()],
        ["gone", "(no live record)"],
        ["nobody", "(no live record)"],
    ]
    assert "[partition 0, offset 0, " in lines[0]
    assert not any("b'" in line for line in lines)


def test_binary_keys_by_hex_and_base64(lake, clock, capsys):
    path = _binary_log(lake, clock)
    code, lines, _ = _run(capsys, "lookup", "--key-encoding", "hex", path, NOT_UTF8.hex())
    assert code == 0 and lines[0].split("\t")[:2] == [NOT_UTF8.hex(), "odd key"]
    b64 = base64.b64encode(b"user-24").decode()
    code, lines, _ = _run(capsys, "lookup", "--key-encoding", "base64", path, b64)
    assert code == 0 and lines[0].split("\t")[:2] == [b64, "user-152"]
    code, _, err = _run(capsys, "lookup", "--key-encoding", "hex", path, "not hex")
    assert code == 2 and "is not valid hex (--key-encoding)" in err


def test_json_writes_binary_as_text_or_base64_and_says_which(lake, clock, capsys):
    path = _binary_log(lake, clock)
    code, lines, _ = _run(capsys, "lookup", "--json", path, "user-24", "user-7")
    assert code == 0
    first, second = (json.loads(line) for line in lines)
    assert (first["key"], first["value"], first["offset"]) == ("user-24", "user-152", 0)
    assert first["_encoding"] == {"key": "utf8", "value": "utf8"}
    assert base64.b64decode(second["value"]) == NOT_UTF8
    assert second["_encoding"] == {"key": "utf8", "value": "base64"}
    assert not any("b'" in line for line in lines)


def test_string_integer_and_multi_column_keys(lake, clock, capsys):
    strings = str(lake / "strings")
    sink = CompactedStateSink(strings, config=NO_CLEAN, clock=clock)
    arrow_append(
        sink, [("a", "a1", 0), ("b", "b1", 1)], "key string, value string, partition int", 0
    )
    integers = str(lake / "integers")
    sink = CompactedStateSink(integers, key_columns=("id",), config=NO_CLEAN, clock=clock)
    arrow_append(
        sink, [(42, b"forty-two", 0), (7, b"seven", 0)], "id long, value binary, partition int", 0
    )
    composite = str(lake / "composite")
    sink = CompactedStateSink(composite, key_columns=("tenant", "id"), config=NO_CLEAN, clock=clock)
    rows = [(b"t1", 42, "t1/42", 0), (b"t2", 42, "t2/42", 0)]
    arrow_append(sink, rows, "tenant binary, id long, value string, partition int", 0)

    code, lines, _ = _run(capsys, "lookup", strings, "b", "zz")
    assert code == 0 and [line.split("\t")[:2] for line in lines] == [
        ["b", "b1"], ["zz", "(no live record)"]
    ]  # fmt: skip
    code, lines, _ = _run(capsys, "lookup", integers, "42", "042", "8")
    assert code == 0 and [line.split("\t")[:2] for line in lines] == [
        ["42", "forty-two"], ["8", "(no live record)"]
    ]  # fmt: skip
    code, _, err = _run(capsys, "lookup", "--key-encoding", "hex", integers, "2a")
    assert code == 2 and "has no binary key column (id int64)" in err
    code, lines, _ = _run(capsys, "lookup", "--json-keys", composite, '["t2", 42]', '["t1", 7]')
    assert code == 0 and [line.split("\t")[:2] for line in lines] == [
        ['["t2", 42]', "t2/42"], ['["t1", 7]', "(no live record)"]
    ]  # fmt: skip
    code, lines, _ = _run(
        capsys, "lookup", "--json", "--json-keys", composite, '{"id": 42, "tenant": "t1"}'
    )
    assert code == 0 and json.loads(lines[0])["tenant"] == "t1"
    code, _, err = _run(capsys, "lookup", composite, "t1")
    assert code == 2 and "keyed by 2 columns ['tenant', 'id']" in err and "--json-keys" in err


def test_the_text_rules():
    assert key_bytes("user-24", "utf8") == b"user-24"
    assert key_bytes("ff00", "hex") == b"\xff\x00"
    assert key_bytes("/wA=", "base64") == b"\xff\x00"
    assert as_text(b"caf\xc3\xa9") == "café"
    assert as_text(b"\xff") == "base64:/w=="
    assert as_text({"name": b"Ada", "n": 1}) == '{"name": "Ada", "n": 1}'
    record = json.loads(json_record({"key": "k", "value": {"raw": b"\xff", "text": b"t"}}))
    assert record == {
        "key": "k",
        "value": {"raw": "/w==", "text": "t"},
        "_encoding": {"value.raw": "base64", "value.text": "utf8"},
    }
    assert "_encoding" not in json.loads(json_record({"key": "k", "value": "v"}))
