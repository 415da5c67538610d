"""Other engines on the log (design.md §14): their rearrangements absorbed, their data changes
stopped.

delta-rs stands in for the other engine: its OPTIMIZE (bin-packing across partitions)
and Z-order are ``dataChange=false`` commits, as Databricks' auto compaction,
predictive optimization and liquid clustering are; its DELETE, UPDATE, append and
RESTORE change data as Spark's do. Every check compares ``state()`` with a replay
of what was fed in. The batches are fed without Spark (`testkit.arrow_append`, the sink's
own append) but in the restore test and the streaming query's; passes and ``state()`` run
on Spark.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake
from testkit import Oracle, arrow_append, assert_offsets_unique, state_of

from sinks import CleanerConfig, CompactedStateSink, ForeignChangeError, read_state
from sinks.crash_points import CLEAN_BEFORE_COMMIT, armed
from sinks.log.segment import SEGMENT_PATH
from streaming.cli import main as cli
from streaming.consumers.datasource import register
from streaming.status.gauges import log_status
from streaming.status.status_render import render_table

PARTITIONS = 3
CONFIG = CleanerConfig(min_cleanable_dirty_ratio=0.99, delete_retention_ms=1_000)
KVP = "key string, value string, partition int"


class Feed:
    """Random keyed updates and tombstones into a sink, remembered by an oracle."""

    def __init__(self, spark, sink, clock, seed: int = 7, *, through_spark: bool = False) -> None:
        self.spark, self.sink, self.clock = spark, sink, clock
        self.through_spark = through_spark
        self.rng = random.Random(seed)
        self.oracle = Oracle()
        self.batch_id = 0

    def rows(self, n: int = 40):
        rows = []
        for _ in range(n):
            key = f"k{self.rng.randrange(60)}"
            value = None if self.rng.random() < 0.15 else f"v{self.batch_id}-{self.rng.random()}"
            rows.append((key, value, int(key[1:]) % PARTITIONS))
        return rows

    def append(self, n: int = 40) -> None:
        rows = self.rows(n)
        if self.through_spark:
            self.sink(self.spark.createDataFrame(rows, KVP), self.batch_id)
        else:  # the same append, the rows fed without Spark (`testkit.arrow_append`)
            arrow_append(self.sink, rows, KVP, self.batch_id, spark=self.spark)
        self.oracle.apply((k, v) for k, v, _ in rows)
        self.batch_id += 1
        self.clock.advance(400)


def foreign_files(path: str) -> list[str]:
    paths = DeltaTable(path).file_uris()
    return [p for p in paths if not SEGMENT_PATH.search(p)]


def arrow_state(path: str) -> dict[str, str]:
    """`read_state` (no Spark) as a dict."""
    table = read_state(path)
    return dict(
        zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
    )


def optimize(path: str) -> None:
    DeltaTable(path).optimize.compact()


def z_order(path: str) -> None:
    DeltaTable(path).optimize.z_order(["key"])


def test_optimize_and_z_order_at_every_point_leave_state_log_and_offsets_exact(spark, lake, clock):
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    feed = Feed(spark, sink, clock)
    steps = [
        *(["append"] * 4),
        "optimize",  # merges every partition's files into one, across partitions
        *(["append"] * 3),
        "clean",  # rewrites the foreign file into segments, then cleans
        "z_order",  # reorders the compacted log's rows by key
        *(["append"] * 2),
        "delete_records",  # below a foreign file's offsets, before any pass absorbed it
        "optimize",
        "clean",
        *(["append"] * 2),
        "z_order",
    ]
    for step in steps:
        if step == "append":
            feed.append()
        elif step == "optimize":
            optimize(path)
            assert foreign_files(path)
        elif step == "z_order":
            z_order(path)
        elif step == "clean":
            clock.advance(2_000)  # tombstones stamped by earlier passes expire
            sink.clean(force=True)
            assert not foreign_files(path)
        elif step == "delete_records":
            end = sink.log_table.snapshot().log_end_offset(0)
            sink.delete_records(0, end - 5)
            records = [(r.key, r.offset) for r in sink.log().collect() if r.partition == 0]
            assert all(offset >= end - 5 for _, offset in records)
            # Kafka's DeleteRecords: what went below the log start is gone from the state.
            feed.oracle.state = {
                k: v
                for k, v in feed.oracle.state.items()
                if int(k[1:]) % PARTITIONS != 0 or any(k == key for key, _ in records)
            }
        assert state_of(sink) == feed.oracle.state, f"after {step}"
        assert arrow_state(path) == feed.oracle.state, f"read_state after {step}"

    # The next pass leaves nothing foreign, and every live file is one partition's run.
    clock.advance(2_000)
    sink.clean(force=True)
    assert not foreign_files(path)
    assert state_of(sink) == feed.oracle.state
    assert assert_offsets_unique(path) == sink.log().count()
    reopened = CompactedStateSink(path, config=CONFIG, clock=clock)
    assert reopened.recover().version is not None  # offsets verified, no corruption found
    assert state_of(reopened) == feed.oracle.state


def test_a_pass_that_an_optimize_beats_to_the_commit_conflicts_and_plans_again(
    spark, lake, clock, delta_commits
):
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    feed = Feed(spark, sink, clock)
    for _ in range(5):
        feed.append()
    with armed(CLEAN_BEFORE_COMMIT, lambda: optimize(path)):
        stats = sink.clean(force=True)
    assert stats is not None
    operations = [
        next(a["commitInfo"] for a in c if "commitInfo" in a) for c in delta_commits(path)[-3:]
    ]
    # OPTIMIZE went in between the pass's plan and its commit; the pass's commit failed,
    # it planned again, rewrote the OPTIMIZE's file into segments, then cleaned.
    assert operations[0]["operation"] == "OPTIMIZE"
    assert [o["compactedSink"]["operation"] for o in operations[1:]] == ["absorb", "clean"]
    assert not foreign_files(path)
    assert state_of(sink) == feed.oracle.state


def commit_info(commit: list[dict]) -> dict:
    return next(a["commitInfo"] for a in commit if "commitInfo" in a)


def paths(commit: list[dict], kind: str) -> list[str]:
    """The paths a commit's ``add`` or ``remove`` actions name, sorted."""
    return sorted(a[kind]["path"] for a in commit if kind in a)


def undo_commit(commits: list[list[dict]]) -> list[dict]:
    """The last of ``commits`` that undid stale rewrites (the sink's own)."""
    return next(
        c
        for c in reversed(commits)
        if commit_info(c).get("compactedSink", {}).get("operation") == "revert-stale-rewrite"
    )


def data_changes(commit: list[dict]) -> set[bool]:
    return {a[k]["dataChange"] for a in commit for k in ("add", "remove") if k in a}


def replayed_log(path: str) -> dict[str, str]:
    """Every record the Delta table holds (read by delta-rs, not by the sink) replayed in
    offset order: what any engine rebuilding the state from the log gets."""
    table = DeltaTable(path).to_pyarrow_table(columns=["key", "value", "partition", "offset"])
    latest: dict[str, str | None] = {}
    for row in sorted(table.to_pylist(), key=lambda r: (r["partition"], r["offset"])):
        latest[row["key"]] = row["value"]
    return {k: v for k, v in latest.items() if v is not None}


def test_an_optimize_planned_before_a_pass_and_committed_after_it_changes_nothing(
    spark, lake, clock, delta_commits
):
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    feed = Feed(spark, sink, clock)
    for _ in range(5):
        feed.append()
    # delta-rs lets an OPTIMIZE planned before a pass commit after it: a dataChange=false
    # remove does not conflict. The records the pass dropped come back in its file.
    stale = DeltaTable(path)  # the other engine reads the log here ...
    read_version = stale.version()
    assert sink.clean(force=True) is not None
    pass_removed = {p for c in delta_commits(path)[read_version + 1 :] for p in paths(c, "remove")}
    stale.optimize.compact()  # ... and commits over the pass: delta-rs lets it through
    optimize = delta_commits(path)[-1]
    stale_version = len(delta_commits(path)) - 1
    # What tells the rewrite is stale: the read version delta-rs records, and removes of
    # files a commit since then had removed already.
    assert commit_info(optimize)["operation"] == "OPTIMIZE"
    assert commit_info(optimize)["readVersion"] == read_version < stale_version - 1
    assert set(paths(optimize, "remove")) & pass_removed

    # Readers answer exactly without writing (design.md §66) ...
    assert arrow_state(path) == feed.oracle.state
    assert state_of(sink) == feed.oracle.state
    assert DeltaTable(path).version() == stale_version
    # ... and the sink's repair undoes the OPTIMIZE in one commit of its own.
    assert sink.repair() == stale_version + 1
    undo = delta_commits(path)[-1]
    assert commit_info(undo)["compactedSink"]["operation"] == "revert-stale-rewrite"
    assert commit_info(undo)["compactedSink"]["staleVersions"] == [stale_version]
    assert paths(undo, "remove") == paths(optimize, "add")
    assert set(paths(undo, "add")) == set(paths(optimize, "remove")) - pass_removed
    assert data_changes(undo) == {False}
    assert not foreign_files(path)
    assert replayed_log(path) == feed.oracle.state
    assert arrow_state(path) == feed.oracle.state
    sink.clean(force=True)
    assert_offsets_unique(path)
    assert state_of(sink) == feed.oracle.state


def test_a_stale_optimize_cannot_bring_back_a_key_whose_expired_tombstone_a_pass_dropped(
    spark, lake, clock, oracle, delta_commits
):
    """Gap (a) of the race: the pass dropped "gone"'s tombstone (its delete horizon had
    passed); the OPTIMIZE, planned before, brings back a file with "gone"'s older value
    and not the tombstone, so nothing in the log beats it any more."""
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")

    def append(rows, batch_id):
        arrow_append(sink, rows, KVP, batch_id, spark=spark)
        oracle.apply((k, v) for k, v, _ in rows)
        clock.advance(400)

    append([("gone", "old", 0), ("stay", "s", 0), ("kept", "a", 1), ("other", "x", 2)], 0)
    sink.clean(force=True)
    stale = DeltaTable(path)  # the other engine reads the log: "gone" still holds "old"
    read_version = stale.version()
    live_then = {f.rsplit("/users/", 1)[1] for f in stale.file_uris()}
    append([("gone", None, 0)], 1)
    sink.clean(force=True)  # keeps gone's tombstone and stamps its delete horizon
    clock.advance(2_000)
    sink.clean(force=True)  # the horizon passed: the tombstone goes, and "gone" with it
    assert "gone" not in {r.key for r in sink.log().collect()}
    stale.optimize.compact()  # commits over both passes: delta-rs lets it through
    stale_version = DeltaTable(path).version()
    optimize = delta_commits(path)[stale_version]
    assert commit_info(optimize)["readVersion"] == read_version
    assert set(paths(optimize, "remove")) == live_then
    # The OPTIMIZE's file holds "gone" = "old" again, beside partitions 1 and 2's files,
    # which no pass had touched since the read (they come back as they were).
    assert replayed_log(path)["gone"] == "old"

    assert arrow_state(path) == oracle.state  # seen through, nothing written
    assert DeltaTable(path).version() == stale_version
    assert read_state(path, as_of=stale_version).num_rows == len(oracle.state)

    expected = spark.createDataFrame(sorted(oracle.state.items()), "key string, value string")
    assert_df_equality(sink.state(), expected, ignore_row_order=True, ignore_nullable=True)
    assert DeltaTable(path).version() == stale_version  # state() read through, wrote nothing
    sink.recover()  # a writer's first step undoes it
    undo = delta_commits(path)[-1]
    assert commit_info(undo)["compactedSink"]["staleVersions"] == [stale_version]
    assert paths(undo, "remove") == paths(optimize, "add")
    restored = set(paths(undo, "add"))
    assert restored and restored < live_then  # partitions 1 and 2's files, untouched since
    assert all(SEGMENT_PATH.search(p) for p in restored)
    assert data_changes(undo) == {False}
    assert replayed_log(path) == oracle.state
    # The three readers agree, also at the OPTIMIZE's own version (time travel sees
    # through it) and from a sink opened afresh.
    assert arrow_state(path) == oracle.state
    assert state_of_as_of(sink, stale_version) == oracle.state
    assert state_of(CompactedStateSink(path, config=CONFIG, clock=clock)) == oracle.state
    assert DeltaTable(path).version() == stale_version + 1  # undone once

    append([("gone", "new", 0), ("kept", "b", 1)], 2)
    clock.advance(2_000)
    sink.clean(force=True)
    assert state_of(sink) == oracle.state == arrow_state(path) == replayed_log(path)
    assert assert_offsets_unique(path) == sink.log().count()


def test_a_stale_optimize_rewritten_again_by_the_next_optimize_is_undone_with_it(
    spark, lake, clock, delta_commits
):
    """Two OPTIMIZEs read the log at the same version: delta-rs lets both commit (the
    second brings every record back twice). A third, planned after them, merges their
    files before the sink looks; the sink undoes the second and the third together."""
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    feed = Feed(spark, sink, clock)
    for _ in range(3):
        feed.append()
    first, second = DeltaTable(path), DeltaTable(path)
    first.optimize.compact()
    second.optimize.compact()
    stale_version = DeltaTable(path).version()
    assert commit_info(delta_commits(path)[-1])["readVersion"] == stale_version - 2
    optimize(path)  # reads at the stale version, so not stale itself: it merges both files
    assert arrow_state(path) == feed.oracle.state  # seen through, nothing written
    assert state_of(sink) == feed.oracle.state
    assert DeltaTable(path).version() == stale_version + 1
    feed.append()  # an append undoes both before its own commit
    undo = undo_commit(delta_commits(path))
    assert commit_info(undo)["compactedSink"]["staleVersions"] == [stale_version]
    assert commit_info(undo)["compactedSink"]["followedBy"] == [[stale_version + 1]]
    assert paths(undo, "remove") == paths(delta_commits(path)[stale_version + 1], "add")
    assert paths(undo, "add") == paths(delta_commits(path)[stale_version - 1], "add")
    assert data_changes(undo) == {False}
    assert replayed_log(path) == feed.oracle.state
    assert assert_offsets_unique(path) == sink.log().count()
    feed.append()
    sink.clean(force=True)
    assert state_of(sink) == feed.oracle.state == arrow_state(path) == replayed_log(path)


def test_a_stale_optimize_that_cannot_be_undone_exactly_stops_the_sink(
    spark, lake, clock, delta_commits
):
    """The OPTIMIZE planned before a pass removed, beside the pass's inputs, files that were
    still live; one of them is gone from storage before the sink looks (another engine's
    VACUUM with a short retention, say), so no undo is exact: every reader stops."""
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")

    def append(rows, batch_id):
        arrow_append(sink, rows, KVP, batch_id, spark=spark)

    append([("a", "1", 0), ("b", "1", 1)], 0)
    sink.clean(force=True)
    stale = DeltaTable(path)
    append([("a", "2", 0)], 1)
    sink.clean(force=True)  # rewrites partition 0 only: partition 1's segment stays live
    stale.optimize.compact()
    stale_version = DeltaTable(path).version()
    [untouched] = [
        p for p in paths(delta_commits(path)[stale_version], "remove") if "partition-1" in p
    ]
    (lake / "users" / untouched).unlink()
    with pytest.raises(ForeignChangeError) as stopped:
        sink.state()
    message = str(stopped.value)
    assert f"Delta version {stale_version} " in message
    assert "OPTIMIZE" in message and "delta-rs" in message and "gone from storage" in message
    assert f"sink.restore({stale_version - 1})" in message and "accept_foreign_changes" in message
    assert stopped.value.version == stale_version
    with pytest.raises(ForeignChangeError):
        read_state(path)
    with pytest.raises(ForeignChangeError):
        append([("c", "1", 2)], 2)
    assert DeltaTable(path).version() == stale_version  # nothing was written
    # The way on here: accept the log as it is (the missing file is no longer live).
    assert sink.accept_foreign_changes() == stale_version
    append([("c", "1", 2)], 2)
    sink.clean(force=True)
    assert state_of(sink) == {"a": "2", "b": "1", "c": "1"} == arrow_state(path)
    assert assert_offsets_unique(path) == sink.log().count()


def test_a_streaming_query_beside_a_scheduled_optimize_loses_nothing(spark, lake, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    rng = random.Random(3)
    oracle = Oracle()
    for i in range(10):
        rows = [
            (f"k{rng.randrange(80)}", None if rng.random() < 0.1 else f"v{i}") for _ in range(60)
        ]
        oracle.apply(rows)
        file = source / f"{i:03d}.parquet"
        pq.write_table(
            pa.table(
                {
                    "key": [k for k, _ in rows],
                    "value": [v for _, v in rows],
                    "partition": pa.array([int(k[1:]) % PARTITIONS for k, _ in rows], pa.int32()),
                }
            ),
            str(file),
        )
        os.utime(file, (1_700_000_000 + i, 1_700_000_000 + i))  # the source reads in this order
    path = str(lake / "users")
    sink = CompactedStateSink(
        path,
        config=CleanerConfig(min_cleanable_dirty_ratio=0.3),
        cleaning="background",
        checkpoint_location=str(lake / "_chk"),
    )
    stop = threading.Event()
    optimized = []

    def scheduled_optimize() -> None:
        while not stop.is_set():
            try:
                DeltaTable(path).optimize.compact()
                optimized.append(time.monotonic())
            except Exception:  # no table yet, or a commit conflict: try again
                pass
            stop.wait(0.5)

    thread = threading.Thread(target=scheduled_optimize, daemon=True)
    thread.start()
    try:
        query = (
            spark.readStream.schema("key string, value string, partition int")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(source))
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(lake / "_chk"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None
        sink.await_cleaner(60)
    finally:
        stop.set()
        thread.join()
    assert optimized, "the OPTIMIZE ran beside the query"
    assert state_of(sink) == oracle.state
    sink.clean(force=True)
    assert not foreign_files(path)
    assert state_of(sink) == oracle.state
    assert sink.log().count() == assert_offsets_unique(path)
    sink.close()


def _a_key(path: str) -> str:
    return DeltaTable(path).to_pyarrow_table(columns=["key"]).column(0)[0].as_py()


def _delete(path: str) -> None:
    DeltaTable(path).delete(f"key = '{_a_key(path)}'")


def _update(path: str) -> None:
    DeltaTable(path).update(updates={"value": "'edited'"}, predicate=f"key = '{_a_key(path)}'")


def _append(path: str) -> None:
    table = DeltaTable(path).to_pyarrow_table()
    write_deltalake(path, table.slice(0, 1), mode="append")


def _restore(path: str) -> None:
    DeltaTable(path).restore(1)


@pytest.mark.parametrize(
    ("change", "operation"),
    [(_delete, "DELETE"), (_update, "UPDATE"), (_append, "WRITE"), (_restore, "RESTORE")],
)
def test_another_engines_data_change_stops_the_sink_naming_version_operation_and_engine(
    spark, lake, clock, change, operation
):
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    feed = Feed(spark, sink, clock)
    for _ in range(3):
        feed.append()
    change(path)
    foreign_version = DeltaTable(path).version()

    with pytest.raises(ForeignChangeError) as stopped:
        feed.append()
    message = str(stopped.value)
    assert f"Delta version {foreign_version}" in message
    assert operation in message and "delta-rs" in message
    assert "accept_foreign_changes" in message and f"--to-version {foreign_version - 1}" in message
    assert stopped.value.version == foreign_version
    assert DeltaTable(path).version() == foreign_version  # nothing was written
    for reader in (sink, CompactedStateSink(path, config=CONFIG, clock=clock)):
        with pytest.raises(ForeignChangeError):
            reader.state()
    # The state before the change is still there to read.
    assert state_of_as_of(sink, foreign_version - 1) == feed.oracle.state

    if change is _append:
        # An INSERT of a copied record repeats the offset a live record holds: the accept
        # refuses it by name; the way on it names, a restore, undoes it.
        with pytest.raises(ForeignChangeError, match="inside a segment the sink wrote"):
            sink.accept_foreign_changes()
        sink.restore(foreign_version - 1)
    else:
        assert sink.accept_foreign_changes() == foreign_version
    feed.batch_id += 1  # the refused batch is fed again under a new id
    feed.append()
    sink.clean(force=True)
    assert assert_offsets_unique(path) == sink.log().count()


def state_of_as_of(sink, version):
    return {r["key"]: r["value"] for r in sink.state(as_of=version).collect()}


def test_restore_undoes_another_engines_delete_and_offsets_keep_counting(spark, lake, clock):
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    feed = Feed(spark, sink, clock, through_spark=True)  # this file's appends through Spark
    for _ in range(4):
        feed.append()
    sink.clean(force=True)
    before = DeltaTable(path).version()
    expected = dict(feed.oracle.state)
    end_offsets = sink.log_table.snapshot().log_end_offsets()
    _delete(path)
    with pytest.raises(ForeignChangeError):
        sink.state()

    assert cli(["restore", path, "--to-version", str(before)]) == 0
    assert state_of(sink) == expected
    assert arrow_state(path) == expected
    feed.append()
    assert state_of(sink) == feed.oracle.state
    new = [r for r in sink.log().collect() if r.offset >= end_offsets.get(r.partition, 0)]
    assert len(new) == 40  # the batch after the restore numbered from the old log end
    assert assert_offsets_unique(path) == sink.log().count()


def test_the_log_and_the_checkpoint_table_ask_other_engines_not_to_rearrange_them(
    spark, lake, clock
):
    sink = CompactedStateSink(str(lake / "users"), config=CONFIG, clock=clock)
    Feed(spark, sink, clock).append()
    for table in (lake / "users", lake / "_cleaner-offset-checkpoint"):
        configuration = DeltaTable(str(table)).metadata().configuration
        assert configuration["delta.autoOptimize.autoCompact"] == "false"
        assert configuration["delta.autoOptimize.optimizeWrite"] == "false"


def test_commits_the_sink_makes_are_not_taken_for_foreign_ones(spark, lake, clock, delta_commits):
    """Appends, passes, retention and property changes never stop the sink."""
    path = str(lake / "users")
    sink = CompactedStateSink(
        path,
        config=CleanerConfig(cleanup_policy="compact,delete", retention_ms=10**12),
        clock=clock,
        cleaning="inline",
    )
    feed = Feed(spark, sink, clock)
    for _ in range(3):
        feed.append()
    sink.clean(force=True)
    sink.delete_records(1, 5)
    DeltaTable(path).alter.set_table_properties({"delta.appendOnly": "false"})
    feed.append()
    infos = [next(a["commitInfo"] for a in c if "commitInfo" in a) for c in delta_commits(path)]
    assert any("compactedSink" not in i for i in infos[1:])  # the property change
    assert CompactedStateSink(path, clock=clock).state().count() >= 0


def test_a_consumer_reads_every_record_in_offset_order_over_another_engines_files(
    spark, lake, clock
):
    register(spark)
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    feed = Feed(spark, sink, clock)
    for _ in range(3):
        feed.append()
    z_order(path)  # one file, every partition, rows in key order
    assert foreign_files(path)
    status = log_status(sink)
    assert status.foreign_files == 1
    assert "another engine's files: 1 " in render_table([status])
    expected = sorted((r.partition, r.offset, r.key) for r in sink.log().collect())
    rows = spark.read.format("compacted-state").load(path).collect()
    assert sorted((r.partition, r.offset, r.key) for r in rows) == expected
    for p in range(PARTITIONS):
        offsets = [r.offset for r in rows if r.partition == p]
        assert offsets == sorted(offsets)  # in offset order within each partition
