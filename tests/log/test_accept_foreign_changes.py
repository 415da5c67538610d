"""Accepting another engine's data changes: the log's offsets follow its records.

The other engine here is delta-rs itself (RESTORE, an INSERT through ``write_deltalake``,
DELETE, OPTIMIZE), committing without the sink's metadata, as delta-spark does; the
same operations by delta-spark are in tests/delta_spark/test_accept_spark_changes.py.
Every reader (``state()``, ``read_state``, ``log()``, a new sink) must equal a replay of
the records the table holds (`replayed`), after the accept and after later batches and
passes. Batches are fed without Spark (`append`, the sink's own append) but in the test
of the append after an accepted INSERT (`spark_append`); passes and ``state()`` run on Spark.
"""

from __future__ import annotations

import json
import shutil
import tempfile

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testkit import arrow_append, assert_offsets_unique, state_of

from sinks import (
    CleanerConfig,
    CompactedSinkError,
    CompactedStateSink,
    ForeignChangeError,
    MissingDataFileError,
    read_state,
)
from sinks.log.foreign.changes import ACCEPTED_VERSION_TXN, CHECKED_VERSION_TXN
from sinks.log.log_format import HISTORY_OPERATION_KEY, LOG_END_OFFSET_TXN
from sinks.log.log_table import LogTable
from sinks.maintenance.recovery import CLEAN_SHUTDOWN_MARKER

CONFIG = CleanerConfig(min_cleanable_dirty_ratio=0.99, delete_retention_ms=1_000)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def append(spark, sink, rows, batch_id: int, partitions: int = 1) -> None:
    """The sink's append of ``rows``, fed without Spark (`testkit.arrow_append`): the
    accept is under test here; `spark_append` feeds the same rows through Spark."""
    rows = [(k, v, _partition(k, partitions)) for k, v in rows]
    arrow_append(sink, rows, "key string, value string, partition int", batch_id, spark=spark)


def spark_append(spark, sink, rows, batch_id: int, partitions: int = 1) -> None:
    frame = spark.createDataFrame(
        [(k, v, _partition(k, partitions)) for k, v in rows],
        "key string, value string, partition int",
    )
    sink(frame.coalesce(1), batch_id)


def _partition(key: str, partitions: int) -> int:
    return sum(map(ord, key)) % partitions


def inserted(rows, *, now_ms: int) -> pa.Table:
    """Rows in the log's schema, as another engine's INSERT writes them:
    (key, value, partition, offset)."""
    n = len(rows)
    return pa.table(
        {
            "key": pa.array([r[0] for r in rows], pa.string()),
            "value": pa.array([r[1] for r in rows], pa.string()),
            "partition": pa.array([r[2] for r in rows], pa.int32()),
            "offset": pa.array([r[3] for r in rows], pa.int64()),
            "timestamp": pa.array([now_ms * 1000] * n, pa.timestamp("us", tz="UTC")),
            "delete_horizon_ms": pa.nulls(n, pa.int64()),
        }
    )


def replayed(path: str) -> dict[str, str]:
    """The state a replay of the records the table holds gives: per (partition, key) the
    record with the highest offset at or above its partition's log start offset, tombstones
    dropped (read with delta-rs, not with the sink)."""
    snapshot = LogTable(path).snapshot(verify=False)
    assert snapshot is not None
    starts = {p: snapshot.log_start_offset(p) for p in snapshot.partitions}
    rows = DeltaTable(path).to_pyarrow_table(columns=["key", "value", "partition", "offset"])
    latest: dict[tuple[int, str], tuple[int, str | None]] = {}
    for r in rows.to_pylist():
        if r["offset"] < starts.get(r["partition"], 0):
            continue
        at = (r["partition"], r["key"])
        if at not in latest or latest[at][0] < r["offset"]:
            latest[at] = (r["offset"], r["value"])
    return {k: v for (_, k), (_, v) in latest.items() if v is not None}


def assert_readers_replay(spark, path: str, sink, clock) -> dict[str, str]:
    """Every reader equals `replayed`: state() of this sink and of a new one, read_state,
    and log() holds exactly the table's records; no offset repeats."""
    expected = replayed(path)
    assert state_of(sink) == expected
    assert state_of(CompactedStateSink(path, config=CONFIG, clock=clock)) == expected
    arrow = read_state(path)
    assert dict(zip(arrow["key"].to_pylist(), arrow["value"].to_pylist(), strict=True)) == (
        expected
    )
    columns = ["partition", "offset", "key"]
    table = DeltaTable(path).to_pyarrow_table(columns=columns).to_pylist()
    logged = [r.asDict() for r in sink.log().select(*columns).collect()]
    snapshot = LogTable(path).snapshot()
    starts = {p: snapshot.log_start_offset(p) for p in snapshot.partitions}
    visible = [r for r in table if r["offset"] >= starts.get(r["partition"], 0)]
    assert sorted(map(str, logged)) == sorted(map(str, visible))
    assert_offsets_unique(path)
    return expected


# -- RESTORE after a pass, accepted --------------------------------------------------------


def test_a_restore_to_before_a_pass_then_accept_gives_each_key_once(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)
    clock.advance(2_000)
    append(spark, sink, [("a", "2")], 1)
    restored_to = DeltaTable(path).version()
    clock.advance(2_000)
    assert sink.clean(force=True) is not None
    append(spark, sink, [("c", "1")], 2)

    DeltaTable(path).restore(restored_to)  # another engine's RESTORE, to before the pass

    with pytest.raises(ForeignChangeError, match="RESTORE"):
        sink.state().collect()
    version = sink.accept_foreign_changes()

    assert assert_readers_replay(spark, path, sink, clock) == {"a": "2", "b": "1"}
    snapshot = LogTable(path).snapshot()
    assert snapshot.txn_version(ACCEPTED_VERSION_TXN) == version
    assert snapshot.cleaner_offset(0) == 0  # the restored segments are dirty again
    # ... and so is the cleaner's checkpoint, which follows the log.
    assert sink.checkpoints.read(sink.path)[(sink.path, 0)].first_dirty_offset == 0
    append(spark, sink, [("d", "1")], 3)  # its inline pass cleans the restored segments
    clock.advance(2_000)
    sink.clean(force=True)
    assert LogTable(path).snapshot().cleaner_offset(0) > 0
    assert assert_readers_replay(spark, path, sink, clock) == {"a": "2", "b": "1", "d": "1"}


def test_a_restore_that_keeps_the_clean_section_keeps_its_cleaner_offset(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)
    clock.advance(2_000)
    append(spark, sink, [("a", "2")], 1)
    clock.advance(2_000)
    assert sink.clean(force=True) is not None
    restored_to = DeltaTable(path).version()
    end = LogTable(path).snapshot().cleaner_offset(0)
    append(spark, sink, [("c", "1")], 2)

    DeltaTable(path).restore(restored_to)  # after the pass: the clean section is the pass's
    sink.accept_foreign_changes()

    assert LogTable(path).snapshot().cleaner_offset(0) == end  # nothing to clean again
    assert assert_readers_replay(spark, path, sink, clock) == {"a": "2", "b": "1"}


# -- INSERT, accepted, then the next append --------------------------------------------------


def test_an_insert_accepted_keeps_its_offsets_through_the_next_append(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    spark_append(spark, sink, [("a", "1"), ("b", "1")], 0)  # offsets 0 and 1
    rows = [("a", "inserted", 0, 2), ("x", "inserted", 0, 3)]
    write_deltalake(path, inserted(rows, now_ms=clock.now), mode="append")
    sink.accept_foreign_changes()
    assert LogTable(path).snapshot().txn_version(LOG_END_OFFSET_TXN.format(0)) == 4

    spark_append(spark, sink, [("b", "2"), ("c", "1")], 1)

    assert assert_readers_replay(spark, path, sink, clock) == {
        "a": "inserted",
        "b": "2",
        "c": "1",
        "x": "inserted",
    }
    offsets = sorted(r.offset for r in sink.log().collect())
    assert offsets[-2:] == [4, 5]  # the batch took the next offsets, not 2 and 3 again
    clock.advance(2_000)
    sink.clean(force=True)
    assert replayed(path)["x"] == "inserted"
    assert_readers_replay(spark, path, sink, clock)


def test_an_insert_in_a_new_partition_is_counted(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1")], 0)
    write_deltalake(path, inserted([("z", "new", 3, 7)], now_ms=clock.now), mode="append")
    sink.accept_foreign_changes()
    snapshot = LogTable(path).snapshot()
    assert snapshot.partitions == [0, 1, 2, 3]
    assert snapshot.log_end_offset(3) == 8
    assert assert_readers_replay(spark, path, sink, clock) == {"a": "1", "z": "new"}


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([("y", "dup", 0, 1)], "inside a segment the sink wrote"),
        ([("y", "one", 0, 5), ("z", "two", 0, 5)], "held by more than one live record"),
    ],
)
def test_an_insert_repeating_an_offset_is_refused_by_name(spark, lake, clock, rows, expected):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)
    write_deltalake(path, inserted(rows, now_ms=clock.now), mode="append")
    version = DeltaTable(path).version()

    with pytest.raises(ForeignChangeError, match=expected) as refused:
        sink.accept_foreign_changes()

    assert f"Delta version {version}" in str(refused.value)
    assert f"sink.restore({version - 1})" in str(refused.value)
    assert refused.value.version == version
    # Following the advice: the engine deletes its rows, and the log is accepted.
    DeltaTable(path).delete("value <> '1'")
    sink.accept_foreign_changes()
    assert assert_readers_replay(spark, path, sink, clock) == {"a": "1", "b": "1"}


# -- rows without partition, offset or key --------------------------------------------------


def test_rows_without_partition_or_offset_are_refused_by_name_by_accept_and_every_reader(
    spark, lake, clock
):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)
    write_deltalake(
        path, pa.table({"key": ["q", "r"], "value": ["v", "w"]}), mode="append", schema_mode="merge"
    )
    version = DeltaTable(path).version()

    with pytest.raises(ForeignChangeError) as refused:
        sink.accept_foreign_changes()
    message = str(refused.value)
    assert f"Delta version {version}" in message and "2 row(s)" in message, message

    # A log whose such rows were accepted anyway (before the accept checked them):
    LogTable(path).snapshot(verify=False).commit(
        data_change=False,
        transactions={ACCEPTED_VERSION_TXN: version, CHECKED_VERSION_TXN: version},
        info={"operation": "accept-foreign-changes"},
    )
    attempts = {
        "state()": lambda: sink.state().collect(),
        "log()": lambda: sink.log().collect(),
        "read_state": lambda: read_state(path),
        "clean()": lambda: sink.clean(force=True),
        "append": lambda: append(spark, sink, [("c", "1")], 1),
    }
    for what, attempt in attempts.items():
        with pytest.raises(ForeignChangeError) as failed:
            attempt()
        assert f"Delta version {version}" in str(failed.value), what
        assert "2 row(s)" in str(failed.value), what
    # The way on it names: the engine deletes them; the log is accepted and goes on.
    DeltaTable(path).delete("partition IS NULL OR offset IS NULL")
    sink.accept_foreign_changes()
    append(spark, sink, [("c", "1")], 1)
    assert assert_readers_replay(spark, path, sink, clock) == {"a": "1", "b": "1", "c": "1"}


def test_rows_without_a_key_are_refused_by_accept(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1")], 0)
    rows = inserted([(None, "no key", 0, 5)], now_ms=clock.now)
    write_deltalake(path, rows, mode="append")
    with pytest.raises(
        ForeignChangeError, match="1 row\\(s\\) with no 'partition', 'offset', 'key'"
    ):
        sink.accept_foreign_changes()


# -- repair advice -----------------------------------------------------------------------


def test_an_old_version_vacuumed_away_is_no_reason_to_restore(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)
    clock.advance(2_000)
    append(spark, sink, [("a", "2")], 1)
    clock.advance(2_000)
    sink.clean(force=True)
    expected = state_of(sink)
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    with pytest.raises(MissingDataFileError) as failed:
        sink.state(as_of=1).collect()

    message = str(failed.value)
    assert "--to-version" not in message and "restore version" not in message, message
    assert "nothing needs repair" in message, message
    assert state_of(sink) == expected  # following it: the log as it is now is whole


def test_a_lost_file_advice_names_what_a_restore_undoes_and_following_it_gives_that(
    spark, lake, clock
):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)
    append(spark, sink, [("a", "2")], 1)
    added = DeltaTable(path).version()
    append(spark, sink, [("c", "1")], 2)
    lost = [
        s.path
        for s in LogTable(path).snapshot().all_segments()
        if s.base_offset == 2  # the second batch's segment, added by version `added`
    ]
    then = state_of(sink) | {}
    (lake / "log" / lost[0]).unlink()

    with pytest.raises(MissingDataFileError) as failed:
        sink.state().collect()

    message = str(failed.value)
    before = added - 1
    assert f"--to-version {before}" in message, message
    assert f"versions {added} to {added + 1}, 2 of which changed records" in message, message
    sink.restore(before)  # following it gives the state it said: version `before`'s
    assert state_of(sink) == {"a": "1", "b": "1"} != then


def test_a_lost_file_of_the_first_batch_never_advises_the_empty_log(spark, lake, clock):
    path = str(lake / "log")
    no_passes = CleanerConfig(cleanup_policy="delete")
    sink = CompactedStateSink(path, config=no_passes, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1")], 0)
    (segment,) = LogTable(path).snapshot().all_segments()
    (lake / "log" / segment.path).unlink()
    with pytest.raises(MissingDataFileError) as failed:
        sink.state().collect()
    assert "--to-version" not in str(failed.value) and "would empty the log" in str(failed.value)


# -- a refused clone, the history ---------------------------------------------------------


def test_a_sink_refusing_a_shallow_clone_leaves_no_marker_in_it(spark, lake, clock):
    path, clone = lake / "log", lake / "clone"
    sink = CompactedStateSink(str(path), config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1")], 0)
    # A shallow clone: the clone's Delta log names the source's files by absolute path.
    (clone / "_delta_log").mkdir(parents=True)
    for commit in sorted((path / "_delta_log").glob("*.json")):
        lines = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        for action in lines:
            if "add" in action:
                action["add"]["path"] = f"file://{path}/{action['add']['path']}"
        (clone / "_delta_log" / commit.name).write_text("\n".join(map(json.dumps, lines)) + "\n")

    refusing = CompactedStateSink(str(clone), config=CONFIG, clock=clock)
    with pytest.raises(CompactedSinkError, match="SHALLOW CLONE"):
        refusing.state().collect()
    refusing.close()

    assert not (clone / CLEAN_SHUTDOWN_MARKER).exists()


def test_the_history_tells_an_append_from_a_pass_and_an_accept(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1")], 0)
    append(spark, sink, [("a", "2")], 1)
    clock.advance(2_000)
    sink.clean(force=True)
    write_deltalake(path, inserted([("x", "1", 0, 9)], now_ms=clock.now), mode="append")
    sink.accept_foreign_changes()

    history = DeltaTable(path).history()
    ours = [
        (h["operationParameters"].get(HISTORY_OPERATION_KEY), h.get("userMetadata", ""))
        for h in reversed(history)
        if HISTORY_OPERATION_KEY in (h.get("operationParameters") or {})
    ]
    operations = [o for o, _ in ours]
    assert operations == ["append", "clean", "append", "clean", "accept-foreign-changes"]
    assert all(line.startswith("compacted-sink ") for _, line in ours)


# -- random foreign operations ------------------------------------------------------------


def _foreign(path: str, operation: str, draw: int, now_ms: int) -> None:
    """One operation of another engine (delta-rs without the sink's metadata)."""
    table = DeltaTable(path)
    if operation == "insert":
        snapshot = LogTable(path).snapshot(verify=False)
        rows = []
        for i in range(1 + draw % 3):
            key = f"k{(draw * 7 + i) % 6}"
            p = _partition(key, 2)  # a key stays in its partition (design.md §15)
            end = max([snapshot.log_end_offset(p)] + [r[3] + 1 for r in rows if r[2] == p])
            value = None if (draw + i) % 5 == 0 else f"ins{draw}-{i}"
            rows.append((key, value, p, end + draw % 2))
        write_deltalake(path, inserted(rows, now_ms=now_ms), mode="append")
    elif operation == "delete":
        table.delete(f"key = 'k{draw % 6}'")
    elif operation == "restore":
        table.restore(max(1, table.version() - 1 - draw % 4))
    elif operation == "optimize":
        table.optimize.compact()


step = st.tuples(
    st.sampled_from(["append", "clean", "insert", "delete", "restore", "optimize"]),
    st.integers(0, 40),
)


@settings(
    max_examples=4,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=4, max_size=6))
def test_random_foreign_operations_then_accept_keep_every_reader_a_replay(spark, steps):
    lake = tempfile.mkdtemp(prefix="accept-")
    try:
        clock = Clock()
        path = f"{lake}/log"
        sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
        batch_id = 0
        for k in range(2):
            append(spark, sink, [(f"k{i}", f"v{k}-{i}") for i in range(k, 6, 1 + k)], batch_id, 2)
            batch_id += 1
        for operation, draw in steps:
            clock.now += 700
            if operation == "append":
                rows = [
                    (f"k{(draw + i) % 6}", None if i == 2 else f"b{batch_id}") for i in range(3)
                ]
                append(spark, sink, rows, batch_id, 2)
                batch_id += 1
            elif operation == "clean":
                clock.now += 2_000
                sink.clean(force=True)
            else:
                _foreign(path, operation, draw, clock.now)
                sink.accept_foreign_changes()
                assert_readers_replay(spark, path, sink, clock)
        append(spark, sink, [("k0", "last"), ("k9", "new")], batch_id, 2)
        clock.now += 2_000
        sink.clean(force=True)
        expected = assert_readers_replay(spark, path, sink, clock)
        assert expected["k0"] == "last" and expected["k9"] == "new"
    finally:
        shutil.rmtree(lake, ignore_errors=True)
