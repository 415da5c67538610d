"""Schema evolution through the sink: a ten-step history, every reader, refusals, ``none``.

Direct calls on a classic and a Connect session. After every step ``state()`` (Spark) and
DuckDB's Delta reader equal a dict replay of the batches, with the fields a record lacks
read as null; passes run in between. Each refused change names its field and writes
nothing. See ``evolution_history`` for the steps.
"""

from __future__ import annotations

import json

import pytest
from evolution_history import REFUSED, STEPS, Replay, as_dicts, fill, struct
from pyspark.sql import types as T

from sinks import CleanerConfig, CompactedStateSink, SchemaMismatchError
from sinks.crash_points import SCHEMA_BEFORE_APPEND, armed
from sinks.log.log_format import COMMIT_INFO_KEY
from sinks.reading.export import (
    export_state,
    verify_export,
)
from sinks.reading.export_format import (
    read_manifest,
)
from streaming.status.gauges import log_status
from streaming.status.status_render import render_table

# Passes run only when a step asks for one; tombstones stay (no horizon passes).
CONFIG = CleanerConfig(min_cleanable_dirty_ratio=1.0)


def duckdb_state(duckdb_delta, path: str) -> dict:
    """The state as DuckDB's Delta reader (delta-kernel) sees the log: latest offset per key."""
    rows = duckdb_delta.execute(
        f"""SELECT key, value FROM delta_scan('{path}')
            QUALIFY row_number() OVER (PARTITION BY key ORDER BY "offset" DESC) = 1"""
    ).fetchall()
    return {k: value for k, value in sorted(rows) if value is not None}


def schema_commits(delta_commits, path: str) -> list[tuple[int, list[str], list[dict]]]:
    """(version, changes, the commit's other actions) of each schema commit the sink made."""
    found = []
    for version, actions in enumerate(delta_commits(path)):
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        if info.get(COMMIT_INFO_KEY, {}).get("operation") == "schema":
            found.append((version, info[COMMIT_INFO_KEY]["changes"], actions))
    return found


@pytest.mark.both_sessions
def test_a_ten_step_history_evolves_the_log_and_every_reader_follows(
    spark, lake, clock, duckdb_delta, delta_commits
):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock)
    replay, expected, versions = Replay(), {}, {}
    between = []  # what DuckDB read between a schema commit and its batch

    def read_between_commits() -> None:
        value = sink.log_table.snapshot().spark_schema["value"].dataType
        between.append(duckdb_state(duckdb_delta, path) == replay.state(value))

    for batch_id, step in enumerate(STEPS):
        refused = [r for r in REFUSED if r[0] == batch_id]
        for _, value, field_path in refused:
            before = sink.log_table.snapshot().version
            batch = spark.createDataFrame(
                [], struct(T.StructField("key", T.StringType()), T.StructField("value", value))
            )
            with pytest.raises(SchemaMismatchError) as error:
                sink(batch, batch_id)
            assert error.value.field_path == field_path
            assert sink.log_table.snapshot().version == before
        with armed(SCHEMA_BEFORE_APPEND, read_between_commits):
            sink(spark.createDataFrame(step.records(), step.schema()), batch_id)
        replay.apply(step)
        if step.clean_after:
            assert sink.clean(force=True) is not None, step.name
        snapshot = sink.log_table.snapshot()
        value = snapshot.spark_schema["value"].dataType
        assert as_dicts(sink.state().collect()) == replay.state(value), step.name
        assert duckdb_state(duckdb_delta, path) == replay.state(value), step.name
        assert sink.log().schema.simpleString() == snapshot.spark_schema.simpleString()
        expected[batch_id], versions[batch_id] = replay.state(value), snapshot.version

    final = sink.log_table.snapshot().spark_schema
    assert final["value"].dataType == STEPS[-1].value
    assert final.names[-1] == "source"
    # state() has key columns and value; the payload column is in log() and other engines.
    latest = duckdb_delta.execute(
        f"""SELECT key, source, value IS NULL FROM delta_scan('{path}')
            QUALIFY row_number() OVER (PARTITION BY key ORDER BY "offset" DESC) = 1"""
    ).fetchall()
    assert {k: x for k, x, tombstone in latest if not tombstone} == {
        k: replay.sources[k] for k in expected[len(STEPS) - 1]
    }
    assert "source" in sink.log().columns

    # The schema changed in commits of its own, each right before its batch's commit.
    commits = schema_commits(delta_commits, path)
    assert [changes for _, changes, _ in commits] == [s.changes for s in STEPS if s.changes]
    assert between == [True] * sum(1 for s in STEPS if s.changes)
    # status names each change with its version, the newest first.
    status = log_status(sink)
    assert [c.version for c in status.schema_changes] == [v for v, _, _ in reversed(commits)]
    assert [list(c.changes) for c in status.schema_changes] == [c for _, c, _ in reversed(commits)]
    assert f"schema changed at v{commits[-1][0]} " in render_table([status])
    for version, _, actions in commits:
        assert {k for a in actions for k in a} == {"commitInfo", "metaData"}
        following = delta_commits(path)[version + 1]
        assert any("add" in a for a in following) and any("txn" in a for a in following)

    # Time travel reads each version with the schema it had.
    for batch_id in (0, 4, 6):
        old = sink.state(as_of=versions[batch_id])
        assert old.schema["value"].dataType.simpleString() == STEPS[batch_id].value.simpleString()
        assert as_dicts(old.collect()) == expected[batch_id]


def test_export_of_an_evolved_log_has_null_union_defaults(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock)
    for batch_id, step in enumerate(STEPS[:3]):
        sink(spark.createDataFrame(step.records(), step.schema()), batch_id)
    report = export_state(sink, str(lake / "export"))
    assert report.keys == 3
    fields = {x["name"]: x for x in read_manifest(str(lake / "export"))["avro_schema"]["fields"]}
    value_fields = {x["name"]: x for x in fields["value"]["type"][1]["fields"]}
    assert value_fields["email"]["default"] is None and value_fields["email"]["type"][0] == "null"
    assert verify_export(sink, str(lake / "export")).ok


def test_map_values_and_a_pass_over_files_of_several_schemas(spark, lake, clock, duckdb_delta):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock)
    sink(
        spark.createDataFrame(
            [("a", {"k": {"q": 1}})], "key string, value map<string,struct<q:int>>"
        ),
        0,
    )
    sink(
        spark.createDataFrame(
            [("b", {"k": {"r": "s", "q": 2**40}})],
            "key string, value map<string,struct<r:string,q:bigint>>",
        ),
        1,
    )
    sink(  # the log's types now: bigint (an int would be a narrowing) and r (null)
        spark.createDataFrame(
            [("a", {"k": {"q": 3}})], "key string, value map<string,struct<q:bigint,r:string>>"
        ),
        2,
    )
    stats = sink.clean(force=True)
    assert stats is not None
    want = {"a": {"k": {"q": 3, "r": None}}, "b": {"k": {"q": 2**40, "r": "s"}}}
    assert {
        r["key"]: {k: x.asDict() for k, x in r["value"].items()} for r in sink.state().collect()
    } == want
    rows = dict(
        duckdb_delta.execute(
            f"""SELECT key, value FROM delta_scan('{path}')
                QUALIFY row_number() OVER (PARTITION BY key ORDER BY "offset" DESC) = 1"""
        ).fetchall()
    )
    assert {k: {m["key"]: m["value"] for m in _entries(x)} for k, x in rows.items()} == want


def _entries(duck_map) -> list[dict]:
    """A DuckDB MAP as fetched by Python: ``{"key": [...], "value": [...]}`` or a dict."""
    if isinstance(duck_map, dict) and set(duck_map) == {"key", "value"}:
        return [
            {"key": k, "value": x} for k, x in zip(duck_map["key"], duck_map["value"], strict=True)
        ]
    return [{"key": k, "value": x} for k, x in duck_map.items()]


def test_none_refuses_a_new_field_and_writes_nothing(spark, lake, clock, delta_commits):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, schema_evolution="none")
    sink(spark.createDataFrame([("a", {"x": 1})], "key string, value struct<x:int>"), 0)
    commits = len(delta_commits(path))
    with pytest.raises(SchemaMismatchError) as error:
        sink(
            spark.createDataFrame(
                [("a", {"x": 1, "y": 2})], "key string, value struct<x:int,y:int>"
            ),
            1,
        )
    assert str(error.value) == (
        "field 'value.y' (int) is new in the batch; schema_evolution='none' refuses every "
        "schema change; set schema_evolution='additive' to evolve the log, or select the log's "
        "columns only; nothing was written"
    )
    assert len(delta_commits(path)) == commits
    # fields in another order are not a change
    sink(spark.createDataFrame([({"x": 2}, "b")], "value struct<x:int>, key string"), 1)
    assert sorted((r.key, r.value.x) for r in sink.state().collect()) == [("a", 1), ("b", 2)]


def test_a_refused_change_with_a_dead_letter_table_diverts_nothing(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(
        path, config=CONFIG, clock=clock, dead_letter_table=str(lake / "dead")
    )
    sink(spark.createDataFrame([("a", {"x": 1})], "key string, value struct<x:bigint>"), 0)
    with pytest.raises(
        SchemaMismatchError, match=r"'value.x' has type int in the batch, the log has bigint"
    ):
        sink(spark.createDataFrame([("a", {"x": 1})], "key string, value struct<x:int>"), 1)
    assert not (lake / "dead").exists()
    # an additive change with a dead-letter table evolves the log as without one
    sink(
        spark.createDataFrame(
            [("b", {"x": 1, "y": "n"})], "key string, value struct<x:bigint,y:string>"
        ),
        1,
    )
    assert sorted(r.key for r in sink.state().collect()) == ["a", "b"]


def test_the_append_summary_names_the_changes(spark, lake, clock, caplog):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock)
    sink(spark.createDataFrame([("a", {"x": 1})], "key string, value struct<x:int>"), 0)
    with caplog.at_level("INFO", logger="compacted_sink"):
        sink(
            spark.createDataFrame(
                [("a", {"x": 1, "y": 2})], "key string, value struct<x:bigint,y:int>"
            ),
            1,
        )
    assert "batch 1 evolved the schema of" in caplog.text
    assert "widened value.x int -> bigint; added value.y int" in caplog.text
    info = json.loads(
        (lake / "log" / "_delta_log" / "00000000000000000002.json").read_text().splitlines()[0]
    )["commitInfo"][COMMIT_INFO_KEY]
    assert info["operation"] == "schema" and info["batchId"] == 1
    assert fill(
        {"x": 1},
        T.StructType([T.StructField("x", T.LongType()), T.StructField("y", T.IntegerType())]),
    ) == {"x": 1, "y": None}
