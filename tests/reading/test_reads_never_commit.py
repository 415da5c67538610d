"""Reads never commit, not even over another engine's stale rewrite (design.md §28, §66).

Two OPTIMIZEs planned at one version both commit (delta-rs lets the second through): the
second brings every record back twice, a stale rewrite a commit of the sink's own undoes.
Every read-only entry point, in the library and on the command line, reads the log through
that undo and leaves the Delta log at the stale version; ``repair`` (the library's and the
command's) then commits the undo, once. The log is written by the sink without Spark
(`testkit.arrow_append`); ``state()`` and ``log()`` read it on Spark.
"""

from __future__ import annotations

import logging

from deltalake import DeltaTable
from testkit import arrow_append

from sinks import CleanerConfig, CompactedStateSink, lookup, read_state
from sinks.log.foreign.stale_rewrites import UNDO_OPERATION
from streaming.cli import main
from streaming.status.gauges import log_status

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
KVP = "key string, value string, partition int"


def stale_log(path: str, clock) -> tuple[CompactedStateSink, dict[str, str], int]:
    """A log with a pending stale rewrite; (its sink, its state, the stale version)."""
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    state: dict[str, str] = {}
    for batch in range(3):
        rows = [(f"k{i}", f"v{batch}.{i}", i % 2) for i in range(batch, batch + 4)]
        arrow_append(sink, rows, KVP, batch)
        state.update((k, v) for k, v, _ in rows)
        clock.advance(100)
    first, second = DeltaTable(path), DeltaTable(path)
    first.optimize.compact()
    second.optimize.compact()  # removes the files the first removed: stale
    return sink, state, DeltaTable(path).version()


def as_dict(table) -> dict[str, str]:
    keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
    return dict(zip(keys, values, strict=True))


def test_every_read_only_entry_point_leaves_the_log_at_its_version(
    spark, lake, clock, capsys, caplog, delta_commits
):
    path = str(lake / "users")
    sink, state, stale = stale_log(path, clock)
    records = sum(1 for _ in range(3) for _ in range(4))
    caplog.set_level(logging.WARNING, logger="compacted_sink")

    def unchanged(what: str) -> None:
        assert DeltaTable(path).version() == stale, f"{what} committed"

    assert as_dict(read_state(path)) == state
    unchanged("read_state")
    assert as_dict(read_state(path, as_of=stale)) == state
    unchanged("read_state(as_of)")
    assert as_dict(lookup(path, ["k0", "k5"])) == {"k0": state["k0"], "k5": state["k5"]}
    unchanged("lookup")
    assert {r.key: r.value for r in sink.state().collect()} == state
    unchanged("state()")
    assert sink.log().count() == records  # each record once, not twice
    unchanged("log()")
    assert sink.dirty_ratio() >= 0
    unchanged("dirty_ratio()")
    assert log_status(sink) is not None
    unchanged("status")
    assert sink.erasure_status(["k0"]) is not None
    unchanged("erasure_status")
    assert "compacted-sink repair" in caplog.text  # a read names the way to undo it

    export = str(lake / "export")
    for argv in (
        ["status", path],
        ["status", path, "--json"],
        ["lookup", path, "k0"],
        ["erasure-status", path, "k0"],
        ["configs", "--path", path, "--describe"],
        ["consumers", path],
        ["export", path, "--to", export],
    ):
        assert main(argv) == 0, argv
        unchanged(" ".join(argv[:1]))
    capsys.readouterr()

    # The repair commits the undo once; then the log holds each record once.
    assert main(["repair", path]) == 0
    line = capsys.readouterr().out
    assert f"undid stale rewrite(s) at Delta version(s) {stale}" in line
    assert f"now version {stale + 1}" in line
    undo = delta_commits(path)[-1]
    info = next(a["commitInfo"] for a in undo if "commitInfo" in a)["compactedSink"]
    assert (info["operation"], info["staleVersions"]) == (UNDO_OPERATION, [stale])
    assert sink.repair() == stale + 1  # nothing left: nothing committed
    assert main(["repair", path]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert DeltaTable(path).version() == stale + 1
    assert as_dict(read_state(path)) == state
    assert sum(f.num_records for f in sink.log_table.snapshot().data_files()) == records
