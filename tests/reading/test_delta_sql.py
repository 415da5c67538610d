"""The documented SQL over the raw Delta table (DuckDB's delta extension) gives `read_state`'s rows.

DuckDB reads the log with delta-kernel-rs, a reader independent of the sink: the
query in docs/api.md (between the ``state-sql`` marker and the end of its block)
runs against a log that is partially cleaned, has tombstones in both sections and
several partitions; `state_query` is checked against the same log with composite
keys and a sequence column. DuckDB also queries `read_state`'s Arrow table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sinks import CleanerConfig, CompactedStateSink, read_state
from sinks.log.log_keys import LogKeys
from sinks.reading.delta_sql import state_query

duckdb = pytest.importorskip("duckdb")

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def readme_query(path: str) -> str:
    text = DOC.read_text()
    block = re.search(r"<!-- state-sql -->\n```sql\n(.*?)```", text, re.S)
    assert block, "docs/api.md lost its state-sql block"
    return block.group(1).replace("lake/users", path)


def rows(result, columns) -> list[str]:
    names = [d[0] for d in result.description]
    records = [dict(zip(names, r, strict=True)) for r in result.fetchall()]
    return sorted(json.dumps({c: r[c] for c in columns}, default=str) for r in records)


def arrow_rows(table, columns) -> list[str]:
    return sorted(json.dumps({c: r[c] for c in columns}, default=str) for r in table.to_pylist())


def test_readme_query_in_duckdb_equals_read_state(spark, lake, clock, duckdb_delta):
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    schema = "key string, value string, partition int, topic string"
    first = [(f"k{i}", f"v{i}", i % 3, "t") for i in range(12)] + [("k1", None, 1, "t")]
    sink(spark.createDataFrame(first, schema), 0)
    sink.clean(force=True)  # the tombstone of k1 stays, stamped, in the clean section
    tail = [("k0", "w0", 0, "u"), ("k3", None, 0, "u"), ("k4", "w4", 1, "u"), ("k0", "x0", 0, "u")]
    sink(spark.createDataFrame(tail, schema), 1)

    columns = ["key", "value", "topic"]
    expected = read_state(path)
    assert expected.schema.names == columns
    got = duckdb_delta.execute(readme_query(path))
    assert [d[0] for d in got.description] == columns
    assert rows(got, columns) == arrow_rows(expected, columns)
    assert {r["key"]: r["value"] for r in expected.to_pylist()}["k0"] == "x0"

    state = expected  # noqa: F841 - DuckDB scans a pyarrow Table by its Python name
    counted = duckdb.sql("SELECT count(*) FROM state").fetchone()
    assert counted == (len(sink.state().collect()),)


def test_state_query_with_composite_keys_and_a_sequence_column(spark, lake, clock, duckdb_delta):
    path = str(lake / "orders")
    sink = CompactedStateSink(
        path, key_columns=("tenant", "id"), sequence_column="seq", config=NO_CLEAN, clock=clock
    )
    schema = "tenant string, id int, value string, seq long"
    sink(
        spark.createDataFrame([("t", 1, "a9", 9), ("t", 2, "b1", 1), ("u", 1, "c1", 1)], schema), 0
    )
    sink.clean(force=True)
    late = [("t", 1, "a3", 3), ("t", 2, None, 2), ("u", 1, "c5", 5)]  # a3 arrives late: a9 stays
    sink(spark.createDataFrame(late, schema), 1)
    keys = LogKeys(key_columns=("tenant", "id"), sequence_column="seq")
    query = state_query(f"delta_scan('{path}')", keys)
    columns = ["tenant", "id", "value", "seq"]
    got = rows(duckdb_delta.execute(query), columns)
    assert got == arrow_rows(read_state(path), columns)
    assert len(got) == 2
