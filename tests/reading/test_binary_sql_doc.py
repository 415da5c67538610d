"""The SQL docs/api.md gives for binary keys and values ("Binary keys and values in SQL")
reads a log fed as Kafka feeds it (``key`` and ``value`` BINARY) as text.

The block between the ``binary-sql`` marker and the end of its code runs in Spark SQL on
``sink.state()`` of such a log; DuckDB's ``decode`` on `read_state`'s table too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from testkit import arrow_append

from sinks import CleanerConfig, CompactedStateSink, read_state

ROOT = Path(__file__).resolve().parents[2]
NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
PROFILE = json.dumps({"name": "Ada", "visits": 3}).encode()


def _documented_sql() -> str:
    block = re.search(
        r"<!-- binary-sql -->\n```sql\n(.*?)```", (ROOT / "docs/api.md").read_text(), re.S
    )
    assert block, "docs/api.md lost its binary-sql block"
    return block.group(1)


@pytest.fixture
def users(lake, clock) -> CompactedStateSink:
    sink = CompactedStateSink(str(lake / "users"), config=NO_CLEAN, clock=clock)
    rows = [(b"user-24", PROFILE, 0), (b"user-7", b'{"name": "Bob"}', 1)]
    arrow_append(sink, rows, "key binary, value binary, partition int", 0)
    return sink


def test_the_documented_spark_sql_reads_binary_as_text(spark, users):
    users.state().createOrReplaceTempView("users")
    (row,) = spark.sql(_documented_sql()).collect()
    assert (row["key"], row["value"]) == ("user-24", PROFILE.decode())
    assert (row["profile"]["name"], row["profile"]["visits"]) == ("Ada", 3)
    readme = (ROOT / "README.md").read_text()
    assert "CAST(key AS STRING)" in readme and "decode(value, 'UTF-8')" in readme


def test_duckdb_decodes_read_states_bytes(users):
    duckdb = pytest.importorskip("duckdb")
    state = read_state(users.path)  # noqa: F841 - DuckDB finds the Arrow table by its name
    got = duckdb.sql("SELECT decode(key) AS key FROM state ORDER BY key").fetchall()
    assert got == [("user-24",), ("user-7",)]
