"""delta-spark's RESTORE and INSERT on the log, accepted: every reader stays a replay of the
records the table holds, through later batches and passes; rows without the log's columns,
advice after a VACUUM, a refused clone and the history, as a user of delta-spark meets them.

The same operations by delta-rs alone are in tests/log/test_accept_foreign_changes.py.
"""

from __future__ import annotations

import pytest
from testkit import arrow_append, assert_offsets_unique, state_of

from sinks import (
    CleanerConfig,
    CompactedSinkError,
    CompactedStateSink,
    ForeignChangeError,
    MissingDataFileError,
    read_state,
)
from sinks.log.log_format import HISTORY_OPERATION_KEY
from sinks.log.log_table import LogTable
from sinks.maintenance.recovery import CLEAN_SHUTDOWN_MARKER

pytestmark = pytest.mark.delta_spark

CONFIG = CleanerConfig(min_cleanable_dirty_ratio=0.99, delete_retention_ms=1_000)
NO_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"


def append(spark, sink, rows, batch_id: int, *, through_spark: bool = False) -> None:
    """A batch of ``(key, value)`` rows in partition 0: through the sink's `LogAppender`
    without Spark feeding it (`testkit.arrow_append`; the subject here is delta-spark's
    change and its acceptance), or through ``sink(frame, batch_id)``."""
    rows = [(k, v, 0) for k, v in rows]
    schema = "key string, value string, partition int"
    if through_spark:
        sink(spark.createDataFrame(rows, schema).coalesce(1), batch_id)
    else:
        arrow_append(sink, rows, schema, batch_id, spark=spark)


def run(spark, path: str, statement: str) -> None:
    spark.sql(statement.replace("LOG", f"delta.`{path}`"))


def replayed_by_spark(spark, path: str) -> dict[str, str]:
    """The state a replay of the records delta-spark reads from the table gives."""
    latest: dict[tuple[int, str], tuple[int, str | None]] = {}
    snapshot = LogTable(path).snapshot(verify=False)
    starts = {p: snapshot.log_start_offset(p) for p in snapshot.partitions}
    for r in spark.read.format("delta").load(path).collect():
        if r.offset < starts.get(r.partition, 0):
            continue
        at = (r.partition, r.key)
        if at not in latest or latest[at][0] < r.offset:
            latest[at] = (r.offset, r.value)
    return {k: v for (_, k), (_, v) in latest.items() if v is not None}


def assert_every_reader(spark, path: str, sink, clock) -> dict[str, str]:
    expected = replayed_by_spark(spark, path)
    assert state_of(sink) == expected
    assert state_of(CompactedStateSink(path, config=CONFIG, clock=clock)) == expected
    arrow = read_state(path)
    assert dict(zip(arrow["key"].to_pylist(), arrow["value"].to_pylist(), strict=True)) == (
        expected
    )
    logged = sorted((r.partition, r.offset, r.key) for r in sink.log().collect())
    read = sorted(
        (r.partition, r.offset, r.key) for r in spark.read.format("delta").load(path).collect()
    )
    assert logged == read
    assert_offsets_unique(path)
    return expected


def test_a_spark_restore_to_before_a_pass_then_accept_gives_each_key_once(
    delta_spark, lake, clock
) -> None:
    spark, path = delta_spark, str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0, through_spark=True)
    clock.advance(2_000)
    append(spark, sink, [("a", "2")], 1, through_spark=True)
    version = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first().version
    clock.advance(2_000)
    sink.clean(force=True)
    append(spark, sink, [("c", "1")], 2)

    run(spark, path, f"RESTORE TABLE LOG TO VERSION AS OF {version}")

    with pytest.raises(ForeignChangeError, match="RESTORE"):
        sink.state().collect()
    sink.accept_foreign_changes()
    assert assert_every_reader(spark, path, sink, clock) == {"a": "2", "b": "1"}
    append(spark, sink, [("d", "1")], 3)
    clock.advance(2_000)
    sink.clean(force=True)
    assert assert_every_reader(spark, path, sink, clock) == {"a": "2", "b": "1", "d": "1"}


def test_a_spark_insert_accepted_survives_the_next_append_and_pass(
    delta_spark, lake, clock
) -> None:
    spark, path = delta_spark, str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)  # offsets 0 and 1
    run(
        spark,
        path,
        "INSERT INTO LOG (key, value, partition, offset, timestamp) VALUES "
        "('a', 'inserted', 0, 2, now()), ('x', 'inserted', 0, 3, now())",
    )
    sink.accept_foreign_changes()
    assert state_of(sink) == {"a": "inserted", "b": "1", "x": "inserted"}

    append(spark, sink, [("b", "2"), ("c", "1")], 1)
    clock.advance(2_000)
    sink.clean(force=True)

    expected = {"a": "inserted", "b": "2", "c": "1", "x": "inserted"}
    assert assert_every_reader(spark, path, sink, clock) == expected


def test_spark_rows_without_partition_or_offset_are_refused_by_name(
    delta_spark, lake, clock
) -> None:
    spark, path = delta_spark, str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)
    run(spark, path, "INSERT INTO LOG (key, value) VALUES ('q', 'no offset')")
    version = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first().version

    with pytest.raises(ForeignChangeError) as refused:
        sink.accept_foreign_changes()
    message = str(refused.value)
    assert f"Delta version {version}" in message and "1 row(s)" in message, message

    # The way on it names: delete the rows with that engine, then accept.
    run(spark, path, "DELETE FROM LOG WHERE partition IS NULL OR offset IS NULL")
    sink.accept_foreign_changes()
    append(spark, sink, [("c", "1")], 1)
    clock.advance(2_000)
    sink.clean(force=True)
    assert assert_every_reader(spark, path, sink, clock) == {"a": "1", "b": "1", "c": "1"}


def test_after_a_vacuum_an_old_version_is_no_reason_to_restore(delta_spark, lake, clock) -> None:
    spark, path = delta_spark, str(lake / "log")
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)
    clock.advance(2_000)
    append(spark, sink, [("a", "2")], 1)
    clock.advance(2_000)
    sink.clean(force=True)
    expected = state_of(sink)
    spark.conf.set(NO_RETENTION_CHECK, "false")
    try:
        run(spark, path, "VACUUM LOG RETAIN 0 HOURS")
    finally:
        spark.conf.set(NO_RETENTION_CHECK, "true")

    with pytest.raises(MissingDataFileError) as failed:
        sink.state(as_of=1).collect()

    message = str(failed.value)
    assert "--to-version" not in message and "nothing needs repair" in message, message
    assert state_of(sink) == expected == replayed_by_spark(spark, path)


def test_a_refused_clone_gets_no_marker_and_history_names_the_sinks_operations(
    delta_spark, lake, clock
) -> None:
    spark, path, clone = delta_spark, str(lake / "log"), lake / "clone"
    sink = CompactedStateSink(path, config=CONFIG, clock=clock, cleaning="inline")
    append(spark, sink, [("a", "1"), ("b", "1")], 0)
    clock.advance(2_000)
    append(spark, sink, [("a", "2")], 1)
    spark.sql(f"CREATE TABLE delta.`{clone}` SHALLOW CLONE delta.`{path}`")

    refusing = CompactedStateSink(str(clone), config=CONFIG, clock=clock)
    with pytest.raises(CompactedSinkError, match="SHALLOW CLONE"):
        refusing.state().collect()
    refusing.close()
    assert not (clone / CLEAN_SHUTDOWN_MARKER).exists()

    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    ours = [
        (h.version, h.operationParameters[HISTORY_OPERATION_KEY], h.userMetadata)
        for h in sorted(history, key=lambda h: h.version)
        if HISTORY_OPERATION_KEY in (h.operationParameters or {})
    ]
    operations = [o for _, o, _ in ours]
    assert operations[0] == "append" and "clean" in operations, ours
    assert all(line.startswith("compacted-sink ") for _, _, line in ours), ours
