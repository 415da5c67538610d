"""`spark_state` against today's rule: every record of the log grouped by key (design.md §3).

The reference is `latest_records` over the whole log, then `drop_tombstones`,
computed here; `spark_state` must give the same rows, types and nullability on
every shape of log: never cleaned, cleaned with a dirty tail, a partial pass,
several partitions, composite keys, a sequence column, ``delete_records`` and
time travel. A hypothesis test runs random append / clean histories. The reader is
under test, not the append: batches are fed without Spark (`fed`), but in the two tests
that run on both sessions.
"""

from __future__ import annotations

import re
import shutil
import tempfile

import pytest
from chispa import assert_df_equality
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T
from testkit import arrow_append, segment

from sinks import CleanerConfig, CompactedStateSink
from sinks.cleaner.rules import drop_tombstones, latest_records
from sinks.reading.state_reader import (
    LogSections,
    broadcast_bytes,
    spark_state,
    split_at_cleaner_offset,
)
from sinks.reading.superseded import superseded_by_spark

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
SPARK_WEIGHS = 200  # B: too few for the contenders in 8 buckets, enough for the losers
KV = "key string, value string"
KVP = "key string, value string, partition int"


def batch(spark, rows, schema=KV):
    return spark.createDataFrame(rows, schema).coalesce(1)


def fed(spark, sink, rows, batch_id, schema=KV):
    """``sink(batch(spark, rows, schema), batch_id)`` with the rows fed without Spark: the
    reader is under test here, not the append (the tests on both sessions append through
    Spark)."""
    arrow_append(sink, rows, schema, batch_id, spark=spark)


def reference(sink, as_of=None):
    """Today's state(): the whole log grouped by key, latest record, tombstones dropped."""
    keys = [*sink.key_columns]
    return (
        sink.log(as_of)
        .transform(lambda d: latest_records(d, sink.keys))
        .transform(drop_tombstones)
        .select(*keys, "value")
    )


def sections(sink, as_of=None) -> LogSections:
    snapshot = sink.log_table.snapshot(as_of)
    return split_at_cleaner_offset(
        snapshot.segments, {p: snapshot.cleaner_offset(p) for p in snapshot.segments}
    )


def read(spark, sink, as_of=None, **options):
    snapshot = sink.log_table.snapshot(as_of)
    return spark_state(spark, sink.log_table, snapshot, sink.keys, **options)


def assert_same_state(spark, sink, as_of=None, **options):
    """Every way of reading a dirty tail agrees with the reference: row groups read less the
    superseded records (the default), a pass's tasks per partition (`partition_state`,
    without ``superseded_first``) and joins against the tail's winners."""
    ways = [{}, {"superseded_first": False}]
    ways += [] if "dedupe_buffer_size" in options else [{"dedupe_buffer_size": None}]
    for way in ways:
        assert_df_equality(
            read(spark, sink, as_of, **options, **way),
            reference(sink, as_of),
            ignore_row_order=True,
        )


def state_dict(df):
    return {r["key"]: r["value"] for r in df.collect()}


# -- planning (pure) ------------------------------------------------------------------------


def test_split_at_cleaner_offset_classifies_doubtful_segments_as_dirty():
    segments = {
        0: [segment(0, 5, 9), segment(0, 0, 4), segment(0, 10, 12)],  # E=10: straddles nothing
        1: [segment(1, 0, 3), segment(1, 4, 8)],  # E=6: [4, 8] straddles it
        2: [segment(2, 0, 7)],  # no pass recorded
    }
    split = split_at_cleaner_offset(segments, {0: 10, 1: 6, 2: None})
    assert [(s.partition, s.base_offset) for s in split.clean] == [(0, 0), (0, 5), (1, 0)]
    assert [(s.partition, s.base_offset) for s in split.dirty] == [(0, 10), (1, 4), (2, 0)]
    assert split.dirty_records == 3 + 5 + 8
    assert split_at_cleaner_offset(segments, {}).clean == ()


def test_broadcast_estimate_grows_with_rows_and_key_width():
    narrow = [T.IntegerType(), T.LongType()]
    keyed = [T.IntegerType(), T.StringType(), T.LongType()]
    assert broadcast_bytes(0, keyed) == 0
    assert broadcast_bytes(1_000, narrow) < broadcast_bytes(1_000, keyed)
    assert broadcast_bytes(2_000, keyed) == 2 * broadcast_bytes(1_000, keyed)


# -- against the reference -----------------------------------------------------------------


def test_never_cleaned_log(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    fed(spark, sink, [("a", "a1"), ("b", "b1"), ("c", "c1")], 0)
    fed(spark, sink, [("a", "a2"), ("b", None), ("a", "a3")], 1)
    assert sections(sink).clean == ()
    assert_same_state(spark, sink)
    assert state_dict(read(spark, sink)) == {"a": "a3", "c": "c1"}


@pytest.mark.both_sessions
def test_cleaned_log_with_a_dirty_tail_and_tombstones_in_both_sections(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [("a", "a1"), ("b", "b1"), ("c", "c1"), ("d", "d1"), ("e", "e1")]), 0)
    sink(batch(spark, [("a", "a2"), ("c", None), ("e", None)]), 1)
    sink.clean(force=True)  # keeps the tombstones of c and e (within delete.retention.ms)
    sink(batch(spark, [("a", None), ("b", "b2"), ("e", "e2"), ("f", "f1"), ("b", "b3")]), 2)
    sink(batch(spark, [("f", None), ("g", "g1")]), 3)
    split = sections(sink)
    assert split.clean and split.dirty
    assert_same_state(spark, sink)
    assert state_dict(read(spark, sink)) == {"b": "b3", "d": "d1", "e": "e2", "g": "g1"}


def test_fully_cleaned_log_reads_the_clean_section_alone(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    fed(spark, sink, [("a", "a1"), ("b", "b1"), ("a", None), ("c", "c1")], 0)
    sink.clean(force=True)
    assert sections(sink).dirty == ()
    assert_same_state(spark, sink)


def test_partial_pass_leaves_an_uncleanable_section(spark, lake, clock):
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, min_compaction_lag_ms=60_000)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    fed(spark, sink, [("a", "a1"), ("b", "b1"), ("c", "c1")], 0)
    fed(spark, sink, [("a", "a2"), ("c", None)], 1)
    clock.advance(120_000)
    fed(spark, sink, [("a", "a3"), ("b", None)], 2)
    fed(spark, sink, [("c", "c2"), ("d", "d1")], 3)
    stats = sink.clean(force=True)
    assert stats.end_offsets == {0: 5}  # batches 2 and 3 are younger than the lag
    split = sections(sink)
    assert max(s.last_offset for s in split.clean) < 5 <= min(s.base_offset for s in split.dirty)
    assert_same_state(spark, sink)


def test_several_partitions_one_never_cleaned(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    rows = [(f"k{i}", f"v{i}", i % 3) for i in range(12)]
    fed(spark, sink, rows, 0, KVP)
    fed(spark, sink, [("k0", "w0", 0), ("k1", None, 1), ("k2", "w2", 2)], 1, KVP)
    sink.pause_cleaning([2])
    sink.clean(force=True)
    sink.resume_cleaning([2])
    fed(spark, sink, [("k3", None, 0), ("k4", "x4", 1), ("k0", "x0", 0), ("k5", "x5", 2)], 2, KVP)
    snapshot = sink.log_table.snapshot()
    assert snapshot.cleaner_offset(0) and snapshot.cleaner_offset(2) is None
    assert_same_state(spark, sink)


def test_composite_keys(spark, lake, clock):
    schema = "tenant string, id long, value string"
    sink = CompactedStateSink(
        str(lake / "log"), key_columns=("tenant", "id"), config=NO_CLEAN, clock=clock
    )
    fed(spark, sink, [("t1", 1, "a"), ("t1", 2, "b"), ("t2", 1, "c"), ("t2", 2, "d")], 0, schema)
    fed(spark, sink, [("t1", 1, "a2"), ("t2", 2, None)], 1, schema)
    sink.clean(force=True)
    fed(spark, sink, [("t1", 2, "b2"), ("t2", 1, None), ("t2", 2, "d3"), ("t3", 1, "e")], 2, schema)
    assert_same_state(spark, sink)
    got = {(r.tenant, r.id): r.value for r in read(spark, sink).collect()}
    assert got == {("t1", 1): "a2", ("t1", 2): "b2", ("t2", 2): "d3", ("t3", 1): "e"}


def test_sequence_column_out_of_order_across_the_clean_dirty_split(spark, lake, clock):
    schema = "key string, value string, seq long"
    sink = CompactedStateSink(
        str(lake / "log"), config=NO_CLEAN, sequence_column="seq", clock=clock
    )
    fed(
        spark,
        sink,
        [("a", "a10", 10), ("b", "b10", 10), ("c", None, 10), ("d", "d5", 5), ("e", "e5", 5)],
        0,
        schema,
    )
    fed(spark, sink, [("a", "a3", 3)], 1, schema)  # older event arriving late: a10 stays
    sink.clean(force=True)
    tail = [
        ("a", "a7", 7),  # older than the clean a10: the clean record wins
        ("b", "b12", 12),  # newer: the tail wins
        ("c", "c2", 2),  # older than the clean tombstone: c stays deleted
        ("d", None, 5),  # same sequence, higher offset: the tail's tombstone wins
        ("e", "e1", 1),
        ("e", "e9", 9),  # newest of the tail, and newer than the clean e5
        ("f", "f1", 1),
    ]
    fed(spark, sink, tail, 2, schema)
    assert sections(sink).clean
    assert_same_state(spark, sink)
    assert state_dict(read(spark, sink)) == {"a": "a10", "b": "b12", "e": "e9", "f": "f1"}
    assert_same_state(spark, sink, broadcast_max_bytes=0)  # the shuffled plan agrees
    assert_same_state(spark, sink, dedupe_buffer_size=SPARK_WEIGHS)  # Spark weighs the keys


def test_delete_records_moves_the_log_start_inside_clean_and_dirty_segments(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    fed(spark, sink, [("a", "a1"), ("b", "b1"), ("c", "c1"), ("d", "d1")], 0)
    fed(spark, sink, [("b", "b2"), ("e", "e1")], 1)
    sink.clean(force=True)  # clean: c1 d1 b2 e1 at offsets 2..5
    fed(spark, sink, [("c", None), ("f", "f1"), ("a", "a2")], 2)  # offsets 6..8
    sink.delete_records(0, 3)  # inside the clean file: c1 goes
    assert_same_state(spark, sink)
    sink.delete_records(0, 7)  # inside the dirty file: the tombstone of c goes, f stays
    assert_same_state(spark, sink)
    assert state_dict(read(spark, sink)) == {"f": "f1", "a": "a2"}


@pytest.mark.both_sessions
def test_as_of_an_older_version(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [("a", "a1"), ("b", "b1")]), 0)
    sink(batch(spark, [("a", "a2"), ("c", "c1")]), 1)
    before_pass = sink.log_table.snapshot().version
    sink.clean(force=True)
    sink(batch(spark, [("a", None), ("b", "b2")]), 2)
    cleaned = sink.log_table.snapshot().version
    sink.clean(force=True)
    sink(batch(spark, [("d", "d1")]), 3)
    for version in (before_pass, cleaned, None):
        assert_same_state(spark, sink, as_of=version)
    assert state_dict(read(spark, sink, as_of=before_pass)) == {"a": "a2", "b": "b1", "c": "c1"}


def test_empty_log(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    fed(spark, sink, [("a", None)], 0)
    sink.clean(force=True)  # the tombstone stays, stamped
    assert_same_state(spark, sink)
    assert read(spark, sink).count() == 0


# -- the plan ------------------------------------------------------------------------------


def ancestors(plan: str, line_no: int) -> list[str]:
    """The node lines above ``line_no`` in a plan's tree string, nearest first, without the
    whole-stage codegen marker (``*(3) ``) a plan Spark planned without AQE carries."""
    lines = plan.splitlines()

    def depth(line: str) -> int:
        return len(line) - len(re.sub(r"^[\s:+\-|]*", "", line))

    found, current = [], depth(lines[line_no])
    for line in reversed(lines[:line_no]):
        if line.strip() and depth(line) < current:
            found.append(re.sub(r"^\*\(\d+\) ", "", line.strip(" :+-|")))
            current = depth(line)
    return found


def test_clean_section_is_scanned_without_a_shuffle_when_the_tail_is_small(spark, lake, clock):
    """The joins' plan (``dedupe_buffer_size=None``): the clean section is never shuffled."""
    for sequence in (None, "seq"):
        schema = "key string, value string, seq long"
        sink = CompactedStateSink(
            str(lake / f"log-{sequence}"), config=NO_CLEAN, sequence_column=sequence, clock=clock
        )
        fed(spark, sink, [(f"k{i}", f"v{i}", i) for i in range(20)], 0, schema)
        sink.clean(force=True)
        fed(spark, sink, [("k1", "w", 50), ("k2", None, 50)], 1, schema)
        clean_files = {s.path.rsplit("/", 1)[-1] for s in sections(sink).clean}
        spark.conf.set("spark.sql.maxMetadataStringLength", "100000")  # whole file paths
        try:
            joins = read(spark, sink, dedupe_buffer_size=None)
            plan = joins._jdf.queryExecution().executedPlan().toString()
        finally:
            spark.conf.unset("spark.sql.maxMetadataStringLength")
        scans = [
            n
            for n, line in enumerate(plan.splitlines())
            if "FileScan" in line and any(f in line for f in clean_files)
        ]
        assert scans, plan
        for n in scans:
            above = ancestors(plan, n)
            shuffled = [i for i, a in enumerate(above) if a.startswith("Exchange")]
            if "value:" in plan.splitlines()[n]:  # the clean records themselves
                assert not shuffled, plan
            else:  # with a sequence, clean keys the tail holds compete, narrow
                joined = [i for i, a in enumerate(above) if a.startswith("BroadcastHashJoin")]
                assert sequence and joined and joined[0] < shuffled[0], plan


def test_a_dirty_tail_is_read_by_a_pass_s_tasks_without_a_shuffle(spark, lake, clock):
    """Without ``superseded_first``, partitions with a dirty section are read one task a
    partition, their maps built where they run (in key buckets when the buffer is small); a
    clean-only partition is scanned by Spark; a map too large for the buffer falls back to
    the joins."""
    schema = "key string, value string, partition int"
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    fed(spark, sink, [(f"k{i}", f"v{i}", i % 3) for i in range(30)], 0, schema)
    sink.clean(force=True)
    tail = [("k1", "w", 1), ("k4", None, 1), ("k2", "x", 2), ("new", "n", 2), ("k2", "y", 2)]
    fed(spark, sink, tail, 1, schema)  # partition 0 stays clean
    for buffer in (CleanerConfig().dedupe_buffer_size, 700):  # 700 B: two records at once
        state = read(spark, sink, dedupe_buffer_size=buffer, superseded_first=False)
        plan = state._jdf.queryExecution().executedPlan().toString()
        assert "LiveRecordsTask" in plan and "Exchange" not in plan, plan
        assert_same_state(spark, sink, dedupe_buffer_size=buffer)
    assert state_dict(read(spark, sink))["k2"] == "y" and "k4" not in state_dict(read(spark, sink))
    joins = read(spark, sink, dedupe_buffer_size=1)  # no map fits: the joins read it
    assert "MapInArrow" not in joins._jdf.queryExecution().executedPlan().toString()
    assert_same_state(spark, sink, dedupe_buffer_size=1)


def test_a_dirty_partition_is_read_a_row_group_a_task_less_its_superseded_records(
    spark, lake, clock
):
    """By default the superseded records are found from the narrow columns, then every row
    group of a partition with a dirty section is read by its own task (a one-partition log
    on every core), no shuffle, no join; a partition without one stays Spark's scan, which
    a key filter and a column pruning reach. A dirty record a later one overrides, and a
    clean record a tail record overrides, are dropped."""
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    rows = [(f"k{i}", f"v{i}", i % 2) for i in range(40)]
    for start in range(0, 40, 10):  # four segments a partition: row groups for two tasks
        fed(spark, sink, rows[start : start + 10], start // 10, KVP)
    sink.clean(force=True)
    tail = [("k1", "a", 1), ("k1", "b", 1), ("k3", None, 1), ("k5", "c", 1), ("new", "n", 1)]
    fed(spark, sink, tail, 4, KVP)
    state = read(spark, sink)
    plan = state._jdf.queryExecution().executedPlan().toString()
    nodes = [re.sub(r"^\*\(\d+\) ", "", line.strip(" :+-|")) for line in plan.splitlines()]
    assert any(n.startswith("MapInArrow KeptRecordsTask") for n in nodes), plan
    assert sum(n.startswith("FileScan") for n in nodes) == 1, plan  # partition 0's files
    assert not any(n.startswith(("Exchange", "BroadcastHashJoin", "SortMergeJoin")) for n in nodes)
    assert state.rdd.getNumPartitions() >= 2
    got = state_dict(state)
    assert got["k1"] == "b" and got["k5"] == "c" and got["new"] == "n" and "k3" not in got
    assert len(got) == 40 and got["k4"] == "v4"
    assert_same_state(spark, sink)
    one = read(spark, sink).filter("key = 'k2'").select("value")
    scan = [line for line in one._jdf.queryExecution().executedPlan().toString().splitlines()]
    scan = next(line for line in scan if "FileScan" in line)
    assert "EqualTo(key,k2)" in scan and "ReadSchema: struct<key:string,value:string" in scan
    assert [r["value"] for r in one.collect()] == ["v2"]
    # 10 contenders (5 tail records, 5 rivals at most) against 1,000 B: weighed in 3 buckets.
    bucketed = read(spark, sink, dedupe_buffer_size=1000)
    assert "KeptRecordsTask" in bucketed._jdf.queryExecution().executedPlan().toString()
    assert_same_state(spark, sink, dedupe_buffer_size=1000)
    # Against 200 B they would take 22 buckets: Spark weighs them, and the 4 losers' 64 B
    # of offsets come back (k1, k3, k5's clean records and the first k1 of the tail); the
    # row groups are read less them as before.
    split = sections(sink)
    snapshot = sink.log_table.snapshot()
    found = superseded_by_spark(
        spark, sink.log_table, snapshot, sink.keys, split.clean, split.dirty
    )
    assert {p: o.tolist() for p, o in found.offsets.items()} == {1: [0, 1, 2, 20]}
    weighed = read(spark, sink, dedupe_buffer_size=SPARK_WEIGHS)
    assert "KeptRecordsTask" in weighed._jdf.queryExecution().executedPlan().toString()
    assert_same_state(spark, sink, dedupe_buffer_size=SPARK_WEIGHS)


# -- random histories ----------------------------------------------------------------------

KEYS = [f"k{i}" for i in range(5)]
record = st.tuples(
    st.sampled_from(KEYS),
    st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
    st.integers(0, 3),  # sequence values repeat and go back
)
batches = st.lists(st.lists(record, min_size=1, max_size=5), min_size=1, max_size=2)
# A round appends, then (when ``aged``, and always in the first round) lets every file
# so far pass the compaction lag, then runs a forced pass: without the tick the round's
# own files stay uncleanable (a partial pass). The tail is appended after the last pass.
rounds = st.lists(st.tuples(batches, st.booleans()), min_size=1, max_size=2)
FIGURES = {"examples": 0, "split": 0}  # printed: how many histories had both sections


@settings(
    max_examples=4,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sequenced=st.booleans(),
    history=rounds,
    tail=st.lists(st.lists(record, min_size=1, max_size=5), min_size=1, max_size=2),
    back=st.integers(0, 6),
)
def test_random_histories_match_the_reference(spark, sequenced, history, tail, back):
    lake = tempfile.mkdtemp(prefix="state-reader-")
    now = [1_700_000_000_000]
    try:
        config = CleanerConfig(min_cleanable_dirty_ratio=1.0, min_compaction_lag_ms=1_000)
        sink = CompactedStateSink(
            f"{lake}/log",
            config=config,
            sequence_column="seq" if sequenced else None,
            clock=lambda: now[0],
        )
        schema = "key string, value string, seq long, partition int"
        appended = 0

        def append(rows):
            nonlocal appended
            rows = [(k, v, s, int(k[1:]) % 2) for k, v, s in rows]
            fed(spark, sink, rows, appended, schema)
            appended += 1

        for i, (round_batches, aged) in enumerate(history):
            for rows in round_batches:
                append(rows)
            now[0] += 2_000 if aged or i == 0 else 0
            sink.clean(force=True)
        for rows in tail:
            append(rows)
        assert_same_state(spark, sink)
        assert_df_equality(  # Spark weighing the contenders agrees too
            read(spark, sink, dedupe_buffer_size=SPARK_WEIGHS),
            reference(sink),
            ignore_row_order=True,
        )
        split = sections(sink)
        FIGURES["split"] += bool(split.clean and split.dirty)
        FIGURES["examples"] += 1
        assert_same_state(spark, sink, as_of=max(0, sink.log_table.snapshot().version - back))
    finally:
        shutil.rmtree(lake, ignore_errors=True)
    print("state reader histories:", FIGURES)
