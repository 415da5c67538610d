"""Stale rewrites (`sinks.log.foreign.stale_rewrites` and `.stale_revert`) without Spark.

delta-rs lets two OPTIMIZEs planned at the same version both commit: the second removes
files the first removed already and adds their records again. That is the same stale
rewrite as an OPTIMIZE planned before one of the sink's passes (the Spark tests are in
tests/reliability/test_foreign_engines.py), on a plain delta-rs table: the guard finds
it from the commit's ``readVersion``, a reader sees through it and writes nothing, and a
writer's snapshot (``repair=True``) or `LogTable.repair` undoes it in one commit
(design.md §66).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sinks import ForeignChangeError
from sinks.log.foreign import commits as foreign_commits
from sinks.log.foreign.commits import CommitGuard, read_commit
from sinks.log.foreign.stale_revert import stats_json
from sinks.log.foreign.stale_rewrites import (
    UNDO_OPERATION,
    CommitSummary,
    gone_after,
    stale_rewrite,
)
from sinks.log.location import LogLocation
from sinks.log.log_table import LogTable

# -- pure ----------------------------------------------------------------------------------


def summary(version, *, added=(), removed=(), read=None, data_change=False):
    actions = [{"commitInfo": {"operation": "OPTIMIZE", "engineInfo": "delta-rs:py-1.6.6"}}]
    if read is not None:
        actions[0]["commitInfo"]["readVersion"] = read
    actions += [{"add": {"path": p, "dataChange": data_change}} for p in added]
    actions += [{"remove": {"path": p, "dataChange": data_change}} for p in removed]
    return CommitSummary.of(version, actions)


def test_a_commit_summary_unquotes_paths_and_reads_the_read_version():
    s = summary(4, added=["part%20a.parquet"], removed=["partition-0/x.parquet"], read=2)
    assert s.added == {"part a.parquet"} and s.removed == {"partition-0/x.parquet"}
    assert s.read_version == 2 and not s.changes_data
    assert summary(4, added=["a"], data_change=True).changes_data
    assert summary(4).read_version is None


def test_gone_after_forgets_files_added_back():
    window = [summary(3, removed=["a", "b"]), summary(4, added=["a"]), summary(5, removed=["c"])]
    assert gone_after(window) == {"b": 3, "c": 5}


def test_a_rewrite_is_stale_when_it_removes_a_file_gone_before_it():
    commit = summary(6, added=["new"], removed=["a", "b", "live"], read=2)
    rewrite = stale_rewrite(commit, {"a": 3, "b": 4, "other": 5})
    assert rewrite is not None
    assert rewrite.superseded == ("a", "b") and rewrite.overtaken_by == 3
    assert rewrite.restored == ("live",) and rewrite.added == ("new",)
    assert (rewrite.operation, rewrite.engine, rewrite.read_version) == (
        "OPTIMIZE",
        "delta-rs:py-1.6.6",
        2,
    )
    assert stale_rewrite(commit, {"other": 5}) is None


# -- on delta-rs tables --------------------------------------------------------------------


def write(path, n: int, start: int = 0):
    rows = {
        "key": [f"k{i}" for i in range(start, start + n)],
        "offset": pa.array(range(start, start + n), pa.int64()),
    }
    write_deltalake(path, pa.table(rows), mode="append")


def rows(path) -> Counter:
    table = DeltaTable(path).to_pyarrow_table()
    keys, offsets = table.column("key").to_pylist(), table.column("offset").to_pylist()
    return Counter(zip(keys, offsets, strict=True))


def open_log(path) -> LogTable:
    """The table as a log the sink has checked: a commit of its own records the version."""
    log = LogTable(path)
    own_commit(log)
    return log


def own_commit(log: LogTable) -> None:
    """A commit of the sink's own that changes nothing (it records the checked version)."""
    snapshot = log.snapshot(repair=True)
    assert snapshot is not None and snapshot.verified
    snapshot.commit(data_change=False, transactions={}, info={"operation": "test"})


def commit_info(path, version) -> dict:
    return next(
        a["commitInfo"] for a in read_commit(LogLocation(path), version) if "commitInfo" in a
    )


def two_optimizes_from_one_version(path) -> tuple[int, int]:
    """Two OPTIMIZEs read the table at one version and both commit; returns (first, second)."""
    first, second = DeltaTable(path), DeltaTable(path)
    first.optimize.compact()
    second.optimize.compact()
    stale = DeltaTable(path).version()
    return stale - 1, stale


def test_two_optimizes_planned_at_one_version_the_second_is_undone_once(tmp_path):
    path = str(tmp_path / "t")
    for i in range(3):
        write(path, 4, start=4 * i)
    expected = rows(path)
    log = open_log(path)
    first, stale = two_optimizes_from_one_version(path)
    assert commit_info(path, stale)["readVersion"] == first - 1  # what delta-rs records
    assert rows(path) == expected + expected  # delta-rs let every record in twice

    # A reader sees through it, and writes nothing.
    for reader in (log, LogTable(path)):
        seen = reader.snapshot()
        assert seen is not None and seen.seen_through is not None
        assert DeltaTable(path).version() == stale
        assert sum(f.num_records for f in seen.data_files()) == sum(expected.values())
        with pytest.raises(Exception, match="seen through"):
            seen.commit(data_change=False, transactions={}, info={})

    snapshot = log.snapshot(repair=True)  # a writer's
    assert snapshot is not None and snapshot.verified
    assert snapshot.version == stale + 1
    undo = commit_info(path, stale + 1)["compactedSink"]
    assert undo["operation"] == UNDO_OPERATION and undo["staleVersions"] == [stale]
    assert (undo["filesRemoved"], undo["filesRestored"]) == (1, 0)
    assert rows(path) == expected
    # Opened afresh (another process), the log holds nothing to undo.
    assert LogTable(path).snapshot().version == stale + 1
    assert log.snapshot().version == stale + 1


def test_without_a_short_window_the_guard_compares_with_the_files_live_before(
    tmp_path, monkeypatch
):
    """Past `WINDOW_MAX` commits since the read version (or with none recorded), the guard
    reads the snapshot before the commit instead: the same answer."""
    monkeypatch.setattr(foreign_commits, "WINDOW_MAX", 0)
    path = str(tmp_path / "t")
    for i in range(3):
        write(path, 2, start=2 * i)
    expected = rows(path)
    log = open_log(path)
    stale = DeltaTable(path)
    own_commit(log)  # a commit between the read and the OPTIMIZE's
    DeltaTable(path).optimize.compact()
    stale.optimize.compact()  # removes three files the first OPTIMIZE removed
    guard = CommitGuard(LogLocation(path))
    guard.checked = DeltaTable(path).version() - 3
    guard.check(DeltaTable(path).version(), checked=None, accepted=None)
    [rewrite] = guard.stale(DeltaTable(path).version(), checked=None, accepted=None)
    assert len(rewrite.superseded) == 3 and rewrite.restored == ()
    assert rewrite.overtaken_by is None  # the snapshot does not say which commit removed them
    log.snapshot(repair=True)
    assert rows(path) == expected


def test_the_guard_reads_each_commit_once(tmp_path, monkeypatch):
    path = str(tmp_path / "t")
    for i in range(4):
        write(path, 2, start=2 * i)
    log = open_log(path)
    reads = Counter()
    real = foreign_commits.read_commit

    def counting(location, version):
        reads[version] += 1
        return real(location, version)

    monkeypatch.setattr(foreign_commits, "read_commit", counting)
    stale = DeltaTable(path)
    own_commit(log)
    DeltaTable(path).optimize.compact()
    stale.optimize.compact()  # its window (the append and the first OPTIMIZE) was read already
    log.snapshot()
    assert reads and max(reads.values()) == 1


def test_a_stale_rewrite_is_undone_with_the_rearrangement_that_rewrote_its_file(tmp_path):
    """The next OPTIMIZE, planned after the stale one, merged its file with the first
    OPTIMIZE's before the sink looked: undoing both at once undoes rearrangements only."""
    path = str(tmp_path / "t")
    for i in range(3):
        write(path, 2, start=2 * i)
    expected = rows(path)
    log = open_log(path)
    _, stale = two_optimizes_from_one_version(path)
    DeltaTable(path).optimize.compact()  # the next OPTIMIZE merges its file with the first
    assert rows(path) == expected + expected
    assert log.snapshot().version == stale + 1  # read through, not undone
    undone = log.repair()
    assert undone is not None and [r.version for r in undone.rewrites] == [stale]
    undo = commit_info(path, stale + 2)["compactedSink"]
    assert undo["staleVersions"] == [stale] and undo["followedBy"] == [[stale + 1]]
    assert rows(path) == expected
    assert LogTable(path).snapshot().version == stale + 2
    assert LogTable(path).repair() is None  # nothing left to undo: nothing committed
    assert DeltaTable(path).version() == stale + 2


def test_a_stale_rewrite_whose_files_are_gone_stops_with_its_version(tmp_path):
    """A file the stale OPTIMIZE removed while it was live is no longer on storage (another
    engine's VACUUM, say): no undo is exact, so every reader stops, naming the version."""
    path = str(tmp_path / "t")
    for i in range(3):
        write(path, 2, start=2 * i)
    log = open_log(path)
    stale = DeltaTable(path)
    read_version = stale.version()
    snapshot = log.snapshot()
    first, *rest = snapshot.data_files()
    snapshot.commit(  # the sink's own rewrite of one file (a pass, here dropping it)
        removes=[first], data_change=False, transactions={}, info={"operation": "clean"}
    )
    stale.optimize.compact()  # removes that file again, and the two still live
    version = DeltaTable(path).version()
    assert commit_info(path, version)["readVersion"] == read_version
    (tmp_path / "t" / rest[0].path).unlink()
    for reader in (log, LogTable(path)):
        with pytest.raises(ForeignChangeError) as stopped:
            reader.snapshot()
        assert stopped.value.version == version
        message = str(stopped.value)
        assert f"Delta version {version} " in message and "OPTIMIZE" in message
        assert "gone from storage" in message and f"restore({version - 1})" in message
        assert f"`compacted-sink repair {path}`" in message  # and why it cannot help
    for writer in (lambda: LogTable(path).snapshot(repair=True), LogTable(path).repair):
        with pytest.raises(ForeignChangeError):
            writer()
    assert DeltaTable(path).version() == version  # nothing was written


def test_a_later_rearrangement_joins_the_stale_rewrite_whose_file_it_rewrote():
    rewrite = stale_rewrite(summary(6, added=["a6"], removed=["x", "y"], read=2), {"x": 4})
    assert rewrite is not None and rewrite.restored == ("y",)
    unrelated = summary(7, added=["b7"], removed=["z"], read=6)
    assert rewrite.followed(unrelated) is rewrite
    chained = rewrite.followed(summary(8, added=["c8"], removed=["a6", "n"], read=7))
    assert chained.added == ("c8",) and chained.followed_by == (8,)
    assert chained.restored_at() == [(6, ("y",)), (8, ("n",))]


def test_stats_json_states_what_delta_rs_recorded(tmp_path):
    path = str(tmp_path / "t")
    stamp = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC)
    table = pa.table(
        {
            "key": ["a", "b", None],
            "offset": pa.array([3, 1, 2], pa.int64()),
            "partition": pa.array([0, 0, 0], pa.int32()),
            "timestamp": pa.array([stamp, stamp + dt.timedelta(seconds=1), None]),
            "score": [1.5, -2.0, None],
            "value": [{"x": 1, "y": "p"}, {"x": 5, "y": None}, None],
        }
    )
    write_deltalake(path, table)
    [add] = [a["add"] for a in read_commit(LogLocation(path), 0) if "add" in a]
    [typed] = pa.table(DeltaTable(path).get_add_actions(flatten=False)).to_pylist()
    assert normalized(json.loads(stats_json(typed))) == normalized(json.loads(add["stats"]))


def normalized(stats):
    """Timestamps as instants (delta-rs writes "…:09.123Z", and "…:09Z" for whole seconds)."""
    if isinstance(stats, dict):
        return {k: normalized(v) for k, v in stats.items()}
    if isinstance(stats, str) and stats.endswith("Z") and "T" in stats:
        return dt.datetime.fromisoformat(stats.replace("Z", "+00:00"))
    return stats
