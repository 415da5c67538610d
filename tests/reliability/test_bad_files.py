"""Bad data files (issue 21, point 5): a live file deleted or truncated fails by name.

A person deletes a segment, or a copy stops halfway: ``state()``, `read_state` and a
pass stop with `MissingDataFileError` / `CorruptDataFileError` naming the file and the
version that added it, instead of a Java or Arrow stack. The documented repair,
``compacted-sink restore LOG --to-version V`` to before the version that added the
file, brings the log back with nothing lost inside the history window.
"""

from __future__ import annotations

import os

import pytest
from testkit import Oracle, assert_offsets_unique, state_of

from sinks import (
    CleanerConfig,
    CleanerError,
    CompactedStateSink,
    CorruptDataFileError,
    MissingDataFileError,
    read_state,
)
from streaming.cli import main as cli

SCHEMA = "key string, value string, partition int"


def feed(spark, sink, oracle: Oracle, batch_id: int) -> None:
    rows = [(f"k{i}", f"v{batch_id}-{i}", i % 2) for i in range(batch_id % 3, 12, 1 + batch_id % 2)]
    if batch_id % 2:
        rows.append(("k0", None, 0))
    sink(spark.createDataFrame(rows, SCHEMA), batch_id)
    oracle.apply((k, v) for k, v, _ in rows)


def arrow_state(path: str) -> dict[str, str]:
    table = read_state(path)
    return dict(
        zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
    )


def assert_pass_fails(sink, error: type[Exception], path: str) -> None:
    """A pass fails as `CleanerError` caused by ``error``, naming ``path``."""
    with pytest.raises(CleanerError, match=path) as failed:
        sink.clean(force=True)
    assert isinstance(failed.value.__cause__, error)


def appended_and_cleaned(spark, lake, clock, batches: int) -> tuple[CompactedStateSink, Oracle]:
    """A sink that appended ``batches`` batches, then ran a forced pass."""
    sink = CompactedStateSink(
        str(lake / "log"),
        config=CleanerConfig(min_cleanable_dirty_ratio=1.0, delete_retention_ms=3_600_000),
        clock=clock,
    )
    oracle = Oracle()
    for batch_id in range(batches):
        feed(spark, sink, oracle, batch_id)
        clock.advance(100)
    assert sink.clean(force=True) is not None
    return sink, oracle


@pytest.fixture
def cleaned_log(spark, lake, clock):
    """Three appends, a forced pass, two more appends: (sink, oracle, pass version)."""
    sink, oracle = appended_and_cleaned(spark, lake, clock, 3)
    pass_version = sink.log_table.snapshot().version
    for batch_id in range(3, 5):
        feed(spark, sink, oracle, batch_id)
    return sink, oracle, pass_version


def live_file(sink, *, cleaned: bool) -> tuple[str, int]:
    """A live segment's path and the version that added it: the pass's output or an append's."""
    snapshot = sink.log_table.snapshot()
    ends = {p: snapshot.cleaner_offset(p) or 0 for p in snapshot.segments}
    for segment in snapshot.all_segments():
        if (segment.last_offset < ends[segment.partition]) == cleaned:
            return segment.path, snapshot.version
    raise AssertionError("no such segment")


def test_a_deleted_file_fails_state_read_state_and_a_pass_by_name(spark, cleaned_log, lake):
    sink, _, pass_version = cleaned_log
    path, _ = live_file(sink, cleaned=True)
    os.remove(lake / "log" / path)

    for read in (lambda: sink.state().collect(), lambda: read_state(sink.path)):
        with pytest.raises(MissingDataFileError) as failed:
            read()
        error = failed.value
        assert error.path == path and error.added_version == pass_version
        assert path in str(error) and f"added by version {pass_version} (clean)" in str(error)
        assert f"--to-version {pass_version - 1}" in str(error)
    assert_pass_fails(sink, MissingDataFileError, path)


def test_a_truncated_file_fails_state_and_a_pass_by_name(spark, cleaned_log, lake):
    sink, _, pass_version = cleaned_log
    path, _ = live_file(sink, cleaned=False)
    file = lake / "log" / path
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])  # a copy that stopped halfway

    with pytest.raises(CorruptDataFileError) as failed:
        sink.state().collect()
    assert failed.value.path == path and failed.value.added_version > pass_version
    assert f"is {len(data) // 2} bytes where its add action says {len(data)}" in str(failed.value)
    with pytest.raises(CorruptDataFileError, match=path):
        read_state(sink.path)
    assert_pass_fails(sink, CorruptDataFileError, path)


def test_restore_to_before_the_pass_that_wrote_a_lost_segment_loses_nothing(
    spark, lake, clock, capsys
):
    sink, oracle = appended_and_cleaned(spark, lake, clock, 4)
    path, pass_version = live_file(sink, cleaned=True)
    os.remove(lake / "log" / path)  # the pass's output is lost; the files it replaced wait
    with pytest.raises(MissingDataFileError) as failed:
        read_state(sink.path)

    before = failed.value.added_version - 1
    assert cli(["restore", sink.path, "--to-version", str(before)]) == 0
    assert f"back at version {before}" in capsys.readouterr().out

    reopened = CompactedStateSink(sink.path, config=sink.config, clock=clock)
    assert state_of(reopened) == oracle.state == arrow_state(sink.path)
    feed(spark, reopened, oracle, 4)  # the sink goes on: appends and passes
    assert reopened.clean(force=True) is not None
    assert state_of(reopened) == oracle.state
    assert_offsets_unique(sink.path)
