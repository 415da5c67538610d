"""Time travel across an erasure (design.md §54, §64; issue 64, point 3): inside the history
window every reader shows the key at a version before the erasure; a restore to such a
version is refused by name unless the caller asks for the keys to be erased again, and
then the restored log holds none of them. (After the window every reader and `restore`
raise `HistoryExpiredError`: tests/maintenance/test_erasure.py.)"""

from __future__ import annotations

import os
import time

import pytest
from testkit import arrow_append, state_of

from sinks import (
    CleanerConfig,
    CompactedSinkError,
    CompactedStateSink,
    ErasureRestoreError,
    MissingDataFileError,
    lookup,
    read_state,
)

SCHEMA = "key string, value string, partition int"
ERASED = ["erase-me-alpha", "erase-me-bravo"]
DELETED = "deleted-then-erased"  # a plain delete after the version, then an erasure


def as_dict(frame) -> dict[str, str]:
    return {r["key"]: r["value"] for r in frame.collect()}


def config() -> CleanerConfig:
    return CleanerConfig(
        min_cleanable_dirty_ratio=0.99,
        delete_retention_ms=3_600_000,
        file_delete_delay_ms=600_000,  # nothing leaves the window during the test
        log_retention_check_interval_ms=3_600_000,
    )


def test_every_read_before_an_erasure_shows_the_key_and_a_restore_across_it_erases_it_again(
    spark, lake, clock_at
):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=config(), clock=clock_at(int(time.time() * 1000)))
    for b in range(2):
        rows = [(f"keep-{i}", f"v{b}", i % 2) for i in range(4)]
        rows += [(ERASED[0], f"alpha-{b}", 0), (ERASED[1], f"bravo-{b}", 1), (DELETED, "d", 1)]
        arrow_append(sink, rows, SCHEMA, b, spark)
    before = sink.log_table.snapshot().version
    expected_before = state_of(sink)
    arrow_append(sink, [(DELETED, None, 1)], SCHEMA, 2, spark)  # deleted after `before`
    report = sink.erase([*ERASED, DELETED])
    assert report.tombstones == 3  # the plain delete no erasure covered gets one too
    arrow_append(sink, [("later", "x", 0)], SCHEMA, 3, spark)
    erased_at = report.version

    # Inside the window, every reader shows the key at a version before the erasure.
    assert as_dict(sink.state(as_of=before)) == expected_before
    travelled = sink.log(as_of=before).where(f"key = '{ERASED[0]}'").collect()
    assert sorted(r["value"] for r in travelled) == ["alpha-0", "alpha-1"]
    assert lookup(path, ERASED[1], as_of=before).column("value").to_pylist() == ["bravo-1"]
    old = read_state(path, as_of=before)
    assert set(ERASED) <= set(old.column("key").to_pylist())
    # ... and at the erasure's version, none does.
    assert not set(ERASED) & set(as_dict(sink.state(as_of=erased_at)))
    assert lookup(path, ERASED[0], as_of=erased_at).num_rows == 0

    # A restore across the erasure is refused by name, and commits nothing.
    version = sink.log_table.snapshot().version
    with pytest.raises(ErasureRestoreError, match=r"erased 3 key\(s\)") as refused:
        sink.restore(before)
    assert "erasure(s) committed after it" in str(refused.value)
    assert not any(key in str(refused.value) for key in [*ERASED, DELETED])  # names no key
    assert sink.log_table.snapshot().version == version

    # Asked for, it restores and erases the keys again in the next commits.
    sink.restore(before, reerase=True)
    state = state_of(sink)
    assert state == {k: v for k, v in expected_before.items() if k not in [*ERASED, DELETED]}
    assert "later" not in state  # the restore undid the batch after the erasure
    for key in [*ERASED, DELETED]:
        assert lookup(path, key).num_rows == 0
        assert key not in read_state(path).column("key").to_pylist()
    sink.clean()  # the re-erasure's marks make the pass: only tombstones are left of them
    live = sink.log().where(f"key in ('{ERASED[0]}', '{ERASED[1]}', '{DELETED}')").collect()
    assert live and all(r["value"] is None for r in live)
    assert sink.erase([*ERASED, DELETED]).tombstones == 0  # erased once, by the restore


def test_a_restore_with_no_erasure_after_its_version_needs_no_reerase(spark, lake, clock_at):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=config(), clock=clock_at(int(time.time() * 1000)))
    arrow_append(sink, [("a", "1", 0), (ERASED[0], "x", 0)], SCHEMA, 0, spark)
    sink.erase(ERASED[0])
    after_erasure = sink.log_table.snapshot().version
    arrow_append(sink, [("a", "2", 0)], SCHEMA, 1, spark)
    sink.restore(after_erasure)
    assert state_of(sink) == {"a": "1"}


def test_a_version_whose_files_are_gone_is_refused_by_name_by_every_read_and_by_restore(
    spark, lake, clock_at
):
    """Another engine's VACUUM with a shorter retention deletes a file the sink still keeps
    in its window: a read of a version that needs it names the file, never a partial state."""
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=config(), clock=clock_at(int(time.time() * 1000)))
    arrow_append(sink, [("a", "1", 0), (ERASED[0], "x", 0)], SCHEMA, 0, spark)
    arrow_append(sink, [("a", "2", 0), (ERASED[0], "y", 0)], SCHEMA, 1, spark)
    before = sink.log_table.snapshot().version
    sink.erase(ERASED[0])
    sink.clean()  # removes the files that held the key's values (kept for the window)
    live = {f.path for f in sink.log_table.snapshot().data_files()}
    old = sink.log_table.snapshot(before).data_files()
    gone = sorted(f.path for f in old if f.path not in live)
    assert gone
    os.remove(os.path.join(path, gone[0]))
    version = sink.log_table.snapshot().version

    for read in (
        lambda: sink.state(as_of=before).collect(),
        lambda: sink.log(as_of=before).collect(),
        lambda: lookup(path, ERASED[0], as_of=before),
        lambda: read_state(path, as_of=before),
    ):
        with pytest.raises(MissingDataFileError, match=gone[0]):
            read()
    with pytest.raises(CompactedSinkError, match=gone[0]):
        sink.restore(before, reerase=True)
    assert sink.log_table.snapshot().version == version  # nothing committed
    assert ERASED[0] not in state_of(sink)
