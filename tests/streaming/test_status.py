"""Status gauges, their history and plot, and the cleaner loop over several logs."""

from __future__ import annotations

from pyspark.sql import types as T

from sinks import CleanerConfig, CompactedStateSink
from streaming.jobs.job import LogSpec
from streaming.jobs.registered_logs_cleaner import RegisteredLogsCleaner
from streaming.jobs.registry import LogRef, discover_logs
from streaming.status.gauges import log_status
from streaming.status.status_history import history
from streaming.status.status_render import plot_history, render_json, render_table

SCHEMA = T.StructType(
    [T.StructField("key", T.StringType()), T.StructField("value", T.StringType())]
)
CONFIG = CleanerConfig(min_cleanable_dirty_ratio=0.9)


def fill(spark, sink: CompactedStateSink, batches: list[int]) -> None:
    for batch_id, keys in enumerate(batches):
        rows = [(f"k{i}", f"v{batch_id}-{i}") for i in range(keys)]
        sink(spark.createDataFrame(rows, SCHEMA), batch_id)


def test_status_history_plot_and_the_cleaner_loop(spark, lake, tmp_path) -> None:
    users = CompactedStateSink(str(lake / "users"), key_columns=("key",), config=CONFIG)
    orders = CompactedStateSink(str(lake / "orders"), key_columns=("key",), config=CONFIG)
    fill(spark, users, [20, 20, 20])  # batch 0 is cleaned (100 % dirty); 1 and 2 stay dirty
    fill(spark, orders, [20, 5])

    status = log_status(users)
    assert status is not None
    (p0,) = status.partitions
    assert (p0.log_start_offset, p0.first_dirty_offset, p0.log_end_offset) == (0, 20, 60)
    assert p0.first_uncleanable_offset == 60 and p0.records == 60 - 0
    assert 0.5 < p0.dirty_ratio < 0.9 and not p0.cleanable
    assert p0.recopy_ratio is not None and p0.last_clean_ms is not None
    table = render_table([status])
    assert "first dirty" in table and "cleanable now: none" in table
    assert '"first_dirty_offset": 20' in render_json([status])

    refs = [
        LogRef(LogSpec(path=s.path, key_columns=("key",), config=CONFIG)) for s in (users, orders)
    ]
    lines: list[str] = []
    loop = RegisteredLogsCleaner(refs, force=True, out=lines.append)
    assert loop.grab_filthiest().ref.spec.path == users.path  # users is the dirtier
    assert loop.run_once() == 2
    cleaned = [line.split()[1] for line in lines if line.startswith("cleaned ")]
    assert cleaned == [users.path, orders.path]  # filthiest first
    assert log_status(users).dirty_ratio == 0.0
    assert loop.run_once() == 0  # then a line per log saying why, per partition
    assert [line.split(": ")[:3] for line in lines[-2:]] == [
        [users.path, "nothing to clean", "p0"],
        [orders.path, "nothing to clean", "p0"],
    ]

    points = history(users)
    assert [p.operation for p in points][-1] == "clean"
    assert max(p.dirty_ratio for p in points) == 1.0
    plotted = plot_history({users.path: points}, str(tmp_path / "users.png"), threshold=0.9)
    assert open(plotted, "rb").read(4) == b"\x89PNG"

    entry = users.checkpoints.read(users.path)[(users.path, 0)]
    users.checkpoints.write(
        [entry.with_changes(cleaner_state="uncleanable", uncleanable_reason="disk on fire")]
    )
    marked = log_status(users)
    assert [p.partition for p in marked.uncleanable] == [0]
    assert "p0 uncleanable: disk on fire" in render_table([marked])
    assert marked.to_dict()["uncleanable_bytes"] == marked.size_bytes

    found = discover_logs(checkpoint_tables=[users.checkpoint_path])
    assert [(r.spec.path, r.spec.key_columns, r.inferred) for r in found] == [
        (orders.path, ("key",), True),
        (users.path, ("key",), True),
    ]
