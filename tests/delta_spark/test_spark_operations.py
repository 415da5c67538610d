"""Every delta-spark operation on the log, run between the sink's appends and passes.

Each operation is either absorbed (``state()``, ``read_state``, ``log()`` and the consumers'
source stay exact, and the sink keeps appending and cleaning), or refused by every reader
and writer with an error that names the Delta version, the operation and the way on.
docs/operations.md ("Spark's own Delta on the log") holds the table these tests check.
The feed's first three batches are the same in every test: appended once (`three_batches`),
each test reopens a copy of that log at the path they were appended at.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from chispa import assert_df_equality
from testkit import Oracle, arrow_append

from sinks import (
    CleanerConfig,
    CompactedSinkError,
    CompactedStateSink,
    SchemaMismatchError,
    TableFeatureError,
    read_state,
)
from sinks.log.foreign.commits import foreign_change
from streaming.consumers.datasource import register

pytestmark = pytest.mark.delta_spark

PARTITIONS = 2
CONFIG = CleanerConfig(min_cleanable_dirty_ratio=0.99, delete_retention_ms=1_000)
NO_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"


class Feed:
    """Random keyed updates and tombstones into a sink, remembered by an oracle.

    The module's first three batches go through Spark (``sink(frame, batch_id)``); the
    tests' own batches through the sink's `LogAppender` without Spark feeding them
    (`testkit.arrow_append`): their subject is delta-spark's operation on the log.
    """

    def __init__(self, spark, sink, clock, *, through_spark: bool = False) -> None:
        self.spark, self.sink, self.clock = spark, sink, clock
        self.through_spark = through_spark
        self.rng = random.Random(11)
        self.oracle = Oracle()
        self.batch_id = 0
        self.extra: str | None = None  # a nullable string column the batches carry as null

    def append(self, n: int = 30) -> None:
        rows = []
        for _ in range(n):
            key = f"k{self.rng.randrange(40)}"
            value = None if self.rng.random() < 0.15 else f"v{self.batch_id}-{self.rng.random()}"
            rows.append((key, value, int(key[1:]) % PARTITIONS))
        schema = "key string, value string, partition int"
        if self.extra:
            rows = [(*row, None) for row in rows]
            schema += f", {self.extra} string"
        if self.through_spark:
            self.sink(self.spark.createDataFrame(rows, schema), self.batch_id)
        else:
            arrow_append(self.sink, rows, schema, self.batch_id, spark=self.spark)
        self.batch_id += 1
        self.oracle.apply((row[0], row[1]) for row in rows)
        self.clock.advance(400)


@pytest.fixture(scope="module")
def three_batches(classic_spark, tmp_path_factory) -> tuple[Path, Feed]:
    """The feed's first three batches (and the pass the sink ran inline after the first),
    appended once for the module by a sink then closed; every test starts from them.

    Returns the module's directory, whose ``built/`` holds the lake as the sink left it,
    and the feed as it left it. The cleaner's checkpoint table names the log's path, so
    each test gets the copy at that same path (`lake`).
    """
    work = tmp_path_factory.mktemp("three-batches")
    clock = _Clock()
    path = str(work / "lake" / "users")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    feed = Feed(classic_spark, sink, clock, through_spark=True)
    for _ in range(3):
        feed.append()
    sink.close()
    (work / "lake").rename(work / "built")
    return work, feed


class _Clock:
    """The ``clock`` fixture's start, for a log built once per module."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def lake(delta_spark, three_batches) -> Path:
    """This module's lake, holding a fresh copy of `three_batches`'s (the previous test's
    lake removed), at the path its sink appended at; delta-spark forgets the tables it read
    there, as in a lake of its own."""
    work, _ = three_batches
    lake = work / "lake"
    shutil.rmtree(lake, ignore_errors=True)
    shutil.copytree(work / "built", lake)
    delta_spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    return lake


@pytest.fixture
def fed(delta_spark, three_batches, lake, clock) -> Feed:
    """A sink reopened on `lake`'s log of three batches, and a feed that goes on where they
    left it (its random draws, oracle, batch id and clock): the log and state a test's own
    three appends would have left."""
    _, done = three_batches
    clock.now = done.clock.now
    sink = CompactedStateSink(str(lake / "users"), config=CONFIG, clock=clock, cleaning="inline")
    feed = Feed(delta_spark, sink, clock)
    feed.rng.setstate(done.rng.getstate())
    feed.oracle.state, feed.oracle.records = dict(done.oracle.state), done.oracle.records
    feed.batch_id = done.batch_id
    return feed


def sql(spark, path: str) -> Callable[[str], None]:
    def run(statement: str) -> None:
        spark.sql(statement.replace("LOG", f"delta.`{path}`"))

    return run


def _dv(spark, path: str) -> None:
    sql(spark, path)("ALTER TABLE LOG SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")


def _vacuum_beyond(spark, path: str) -> None:
    spark.conf.set(NO_RETENTION_CHECK, "false")
    try:
        sql(spark, path)("VACUUM LOG RETAIN 0 HOURS")
    finally:
        spark.conf.set(NO_RETENTION_CHECK, "true")


def _restore(spark, path: str) -> None:
    sql(spark, path)("RESTORE TABLE LOG TO VERSION AS OF 2")


def _delete(spark, path: str) -> None:
    sql(spark, path)("DELETE FROM LOG WHERE key = 'k1'")


def _update(spark, path: str) -> None:
    sql(spark, path)("UPDATE LOG SET value = 'changed' WHERE key = 'k2'")


def _merge(spark, path: str) -> None:
    spark.createDataFrame([("k3", "merged")], "key string, value string").createOrReplaceTempView(
        "changes"
    )
    sql(spark, path)(
        "MERGE INTO LOG t USING changes s ON t.key = s.key "
        "WHEN MATCHED THEN UPDATE SET t.value = s.value"
    )


AUTO_OPTIMIZE = (
    "ALTER TABLE LOG SET TBLPROPERTIES ('delta.autoOptimize.optimizeWrite' = 'true', "
    "'delta.autoOptimize.autoCompact' = 'true')"
)
AUTO_COMPACT_MIN_FILES = "spark.databricks.delta.autoCompact.minNumFiles"


def _auto_optimized_insert(spark, path: str) -> None:
    """Optimized writes and auto compaction on, then two delta-spark INSERTs of keyed rows in
    the log's schema; each is followed by an auto compaction (``OPTIMIZE``, ``auto``)."""
    sql(spark, path)(AUTO_OPTIMIZE)
    spark.conf.set(AUTO_COMPACT_MIN_FILES, "2")  # compact this small log's files at once
    try:
        for n in range(2):
            sql(spark, path)(
                f"INSERT INTO LOG VALUES ('k{n}', 'spark', {n % PARTITIONS}, {1_000 + n}, "
                "current_timestamp(), NULL)"
            )
    finally:
        spark.conf.unset(AUTO_COMPACT_MIN_FILES)
    operations = [
        r.operation for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 4").collect()
    ]
    assert operations == ["OPTIMIZE", "WRITE", "OPTIMIZE", "WRITE"], operations


def _clone_elsewhere(spark, path: str) -> None:
    """A SHALLOW CLONE of the log's previous version at another path, to restore from."""
    spark.sql(f"CREATE TABLE delta.`{path}-clone` SHALLOW CLONE delta.`{path}` VERSION AS OF 2")


def _clone_put_back(spark, path: str) -> None:
    """A clone of an older version put back over the log: delta-spark refuses it itself,
    and the log's files stay as the clone elsewhere left them (so what follows also checks
    `_clone_elsewhere` alone)."""
    _clone_elsewhere(spark, path)
    cloned = _files(path)
    with pytest.raises(Exception, match="DELTA_UNSUPPORTED_NON_EMPTY_CLONE"):
        spark.sql(f"CREATE OR REPLACE TABLE delta.`{path}` SHALLOW CLONE delta.`{path}-clone`")
    assert _files(path) == cloned


def _files(path: str) -> dict[str, bytes]:
    """Every file under ``path`` (the Delta log and data files) and its bytes."""
    return {str(f.relative_to(path)): f.read_bytes() for f in Path(path).rglob("*") if f.is_file()}


def _with_dv(change: Callable) -> Callable:
    def run(spark, path: str) -> None:
        _dv(spark, path)
        change(spark, path)

    return run


def _property(name: str, value: str) -> Callable:
    def run(spark, path: str) -> None:
        sql(spark, path)(f"ALTER TABLE LOG SET TBLPROPERTIES ('{name}' = '{value}')")

    return run


OPERATIONS: dict[str, tuple[Callable, str]] = {
    # name: (what delta-spark runs, "absorbed" or the operation a refusal names)
    "OPTIMIZE": (lambda s, p: sql(s, p)("OPTIMIZE LOG"), "absorbed"),
    "OPTIMIZE ZORDER BY": (lambda s, p: sql(s, p)("OPTIMIZE LOG ZORDER BY (key)"), "absorbed"),
    "VACUUM inside the window": (lambda s, p: sql(s, p)("VACUUM LOG"), "absorbed"),
    "VACUUM beyond the window": (_vacuum_beyond, "absorbed"),
    "RESTORE": (_restore, "RESTORE"),
    "DELETE": (_delete, "DELETE"),
    "DELETE, deletion vectors": (_with_dv(_delete), "DELETE"),
    "UPDATE": (_update, "UPDATE"),
    "UPDATE, deletion vectors": (_with_dv(_update), "UPDATE"),
    "MERGE": (_merge, "MERGE"),
    "MERGE, deletion vectors": (_with_dv(_merge), "MERGE"),
    "ADD COLUMNS": (
        lambda s, p: sql(s, p)("ALTER TABLE LOG ADD COLUMNS (note string)"),
        "absorbed, batches need note",
    ),
    "deletion vectors on": (_dv, "absorbed"),
    "column mapping by name": (
        _property("delta.columnMapping.mode", "name"),
        "absorbed",
    ),
    "change data feed": (_property("delta.enableChangeDataFeed", "true"), "absorbed"),
    "v2 checkpoints": (_property("delta.checkpointPolicy", "v2"), "absorbed"),
    "row tracking": (_property("delta.enableRowTracking", "true"), "unwritable rowTracking"),
    "clustering": (
        lambda s, p: sql(s, p)("ALTER TABLE LOG CLUSTER BY (key)"),
        "unwritable clustering",
    ),
    "optimized writes and auto compaction on": (lambda s, p: sql(s, p)(AUTO_OPTIMIZE), "absorbed"),
    "optimized writes and auto compaction, then a delta-spark INSERT": (
        _auto_optimized_insert,
        "WRITE",
    ),
    # One test for two cases: the refused put-back leaves the log as the clone elsewhere did.
    "SHALLOW CLONE to another path, then put back over the log": (
        _clone_put_back,
        "absorbed, the clone refused",
    ),
    # DEEP CLONE is not in open-source delta-spark (a syntax error in 4.4): Databricks only.
    "CHECK constraint": (
        lambda s, p: sql(s, p)("ALTER TABLE LOG ADD CONSTRAINT known CHECK (partition >= 0)"),
        "absorbed",
    ),
}


def assert_exact(spark, path: str, feed: Feed) -> None:
    """Every reader gives what was fed in: state(), read_state, log() against Spark's Delta
    read, and the consumers' source against log()."""
    for sink in (feed.sink, CompactedStateSink(path, config=CONFIG, clock=feed.clock)):
        assert {r.key: r.value for r in sink.state().collect()} == feed.oracle.state
    arrow = read_state(path)
    assert dict(zip(arrow["key"].to_pylist(), arrow["value"].to_pylist(), strict=True)) == (
        feed.oracle.state
    )
    columns = ["key", "value", "partition", "offset"]
    log = feed.sink.log().select(*columns)
    assert_df_equality(
        spark.read.format("delta").load(path).select(*columns),
        log,
        ignore_row_order=True,
        ignore_nullable=True,
        ignore_metadata=True,  # column mapping's ids and physical names
    )
    register(spark)
    consumed = spark.read.format("compacted-state").load(path).select(*columns)
    assert_df_equality(
        consumed, log, ignore_row_order=True, ignore_nullable=True, ignore_metadata=True
    )


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_a_delta_spark_operation_is_absorbed_or_refused_by_name(
    delta_spark, lake, clock, fed, name
) -> None:
    spark, path, feed = delta_spark, str(lake / "users"), fed
    sink = feed.sink
    clock.advance(2_000)
    sink.clean(force=True)
    feed.append()
    operation, expected = OPERATIONS[name]

    operation(spark, path)

    if expected == "absorbed, batches need note":
        # The log's schema is the producer's contract: a batch without the new column is a
        # dropped column, refused by name before anything is written; one with it appends.
        with pytest.raises(SchemaMismatchError, match="'note'"):
            feed.append()
        feed.extra = "note"
        expected = "absorbed"
    if expected == "absorbed, the clone refused":
        # The clone's files stay in the log's directory: the sink refuses to own it, by name.
        with pytest.raises(CompactedSinkError, match="SHALLOW CLONE"):
            CompactedStateSink(f"{path}-clone", config=CONFIG, clock=clock).state().collect()
        expected = "absorbed"
    if expected == "absorbed":
        feed.append()
        clock.advance(2_000)
        sink.clean(force=True)
        feed.append()
        assert_exact(spark, path, feed)
        if name == "VACUUM beyond the window":
            with pytest.raises(CompactedSinkError, match="version 1"):
                sink.state(as_of=1).collect()
        return
    version = first_foreign_change(path)
    if expected.startswith("unwritable "):
        # Readable as it is; every commit refused, naming the feature and its version.
        feature = expected.split()[1]
        assert_exact(spark, path, feed)
        # The version that added the feature (enabling it may take several commits).
        added = f"Delta version {version_of(path, feature)} "
        with pytest.raises(TableFeatureError) as refused:
            feed.append()
        with pytest.raises(TableFeatureError) as failed:
            sink.clean(force=True)
        for message in (str(refused.value), str(failed.value)):
            assert added in message and feature in message, message
            assert "DROP FEATURE" in message, message
        assert_exact(spark, path, feed)
        return
    assert_refused(spark, path, sink, version, expected)


def first_foreign_change(path: str) -> int:
    """The first version another engine changed records in, where the sink stops (later
    commits, such as an auto compaction, may follow it), else the newest version."""
    commits = sorted((Path(path) / "_delta_log").glob("*.json"))
    for commit in commits:
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        if foreign_change(int(commit.stem), actions) is not None:
            return int(commit.stem)
    return int(commits[-1].stem)


def version_of(path: str, feature: str) -> int:
    """The first version whose protocol action names ``feature`` (from the Delta log)."""
    log = Path(path) / "_delta_log"
    for commit in sorted(log.glob("*.json")):
        for line in commit.read_text().splitlines():
            protocol = json.loads(line).get("protocol") if line.strip() else None
            if protocol and feature in (protocol.get("writerFeatures") or []):
                return int(commit.stem)
    raise AssertionError(f"no version of {path} adds {feature}")


def assert_refused(spark, path: str, sink, version: int, expected: str) -> None:
    """Every reader and writer raises an error of the sink's naming the version and
    ``expected`` (the operation or the feature)."""
    clock = sink.clock if hasattr(sink, "clock") else None
    fresh = CompactedStateSink(path, config=CONFIG, clock=clock)
    register(spark)
    attempts = {
        "state()": lambda: sink.state().collect(),
        "log()": lambda: sink.log().collect(),
        "read_state": lambda: read_state(path),
        "a new sink's append": lambda: fresh(
            spark.createDataFrame([("k0", "x", 0)], "key string, value string, partition int"),
            10_000,
        ),
        "clean()": lambda: sink.clean(force=True),
    }
    for what, attempt in attempts.items():
        with pytest.raises(CompactedSinkError) as refused:
            attempt()
        message = str(refused.value)
        assert f"version {version}" in message, (what, message)
        assert expected in message, (what, message)
    with pytest.raises(Exception, match=f"version {version}") as consumer:
        spark.read.format("compacted-state").load(path).collect()
    assert expected in str(consumer.value)


def test_deletion_vectors_accepted_are_refused_until_reorg_purge_then_absorbed(
    delta_spark, lake, clock, fed
) -> None:
    spark, path, feed = delta_spark, str(lake / "users"), fed
    sink = feed.sink
    _with_dv(_delete)(spark, path)
    deleted = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first().version
    assert_refused(spark, path, sink, deleted, "DELETE")

    sink.accept_foreign_changes()
    feed.oracle.state.pop("k1", None)  # the engine's DELETE removed every record of k1
    assert_refused(spark, path, sink, deleted + 1, "deletion vector")

    sql(spark, path)("REORG TABLE LOG APPLY (PURGE)")
    feed.batch_id += 1
    feed.append()
    clock.advance(2_000)
    sink.clean(force=True)
    assert_exact(spark, path, feed)


@pytest.mark.parametrize("kind", ["SHALLOW"])  # DEEP CLONE is not in open-source Delta
def test_a_clone_of_an_older_version_restores_the_log_elsewhere(
    delta_spark, lake, clock, fed, kind
) -> None:
    spark, path, copy = delta_spark, str(lake / "users"), str(lake / "restored")
    feed = fed
    sink = feed.sink
    clock.advance(2_000)
    sink.clean(force=True)
    version = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first().version
    expected = dict(feed.oracle.state)
    feed.append()  # after the version the clone restores

    spark.sql(f"CREATE TABLE delta.`{copy}` {kind} CLONE delta.`{path}` VERSION AS OF {version}")

    try:
        restored = CompactedStateSink(copy, config=CONFIG, clock=clock, cleaning="inline")
        state = {r.key: r.value for r in restored.state().collect()}
    except CompactedSinkError as refused:
        assert kind == "SHALLOW" and "SHALLOW CLONE" in str(refused), str(refused)
        assert "outside its own directory" in str(refused) and "compacted-sink replay" in str(
            refused
        )
        return
    assert state == expected
    arrow = read_state(copy)
    assert dict(zip(arrow["key"].to_pylist(), arrow["value"].to_pylist(), strict=True)) == (
        expected
    )
    offsets = {(r.partition, r.offset) for r in sink.log(as_of=version).collect()}
    assert {(r.partition, r.offset) for r in restored.log().collect()} == offsets
    clone_feed = Feed(spark, restored, clock)
    clone_feed.oracle.state = dict(expected)
    clone_feed.batch_id = 100
    clone_feed.append()
    clock.advance(2_000)
    restored.clean(force=True)
    assert {r.key: r.value for r in restored.state().collect()} == clone_feed.oracle.state
    new = {(r.partition, r.offset) for r in restored.log().collect()} - offsets
    ends = {}
    for p, o in offsets:
        ends[p] = max(ends.get(p, -1), o)
    assert all(o > ends.get(p, -1) for p, o in new)  # offsets continue after the clone's
