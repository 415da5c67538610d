"""Per-file Delta statistics written by the executors: what readers may skip files by."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

from sinks import CleanerConfig, CompactedStateSink


def test_statistics_of_long_string_keys_and_microsecond_timestamps(
    spark, lake, clock, delta_commits
):
    long_low, long_high = "a" * 40 + "1", "z" * 40
    early = dt.datetime(2024, 1, 1, 0, 0, 0, 123456)
    late = dt.datetime(2024, 1, 1, 0, 0, 1, 999999)
    schema = "key string, value string, timestamp timestamp"
    rows = [(long_low, "1", early), ("m", None, late), (long_high, "3", early)]
    sink = CompactedStateSink(
        str(lake / "log"), config=CleanerConfig(min_cleanable_dirty_ratio=1.0), clock=clock
    )
    sink(spark.createDataFrame(rows, schema).coalesce(1), 0)

    (add,) = [a["add"] for a in delta_commits(sink.path)[-1] if "add" in a]
    stats = json.loads(add["stats"])
    low, high, nulls = stats["minValues"], stats["maxValues"], stats["nullCount"]
    assert stats["numRecords"] == 3
    assert (low["offset"], high["offset"], low["partition"], high["partition"]) == (0, 2, 0, 0)
    # a truncated minimum is still a lower bound; a maximum is never truncated below the truth
    assert low["key"] == "a" * 32
    assert "key" not in high or high["key"] >= long_high
    # timestamps in milliseconds: the minimum rounded down, the maximum rounded up
    assert low["timestamp"] == "2024-01-01T00:00:00.123Z"
    assert high["timestamp"] == "2024-01-01T00:00:02.000Z"
    assert (nulls["key"], nulls["value"], nulls["delete_horizon_ms"]) == (0, 1, 3)

    (segment,) = sink.log_table.snapshot().segments[0]
    epoch_ms = int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
    assert (segment.base_offset, segment.last_offset, segment.num_records) == (0, 2, 3)
    assert segment.min_timestamp_ms == epoch_ms + 123
    assert segment.max_timestamp_ms == epoch_ms + 2000
    assert segment.max_timestamp_ms == epoch_ms + 2_000
    assert segment.size_bytes == add["size"]


def test_a_snapshot_reads_its_files_without_importing_pandas(spark, lake, clock):
    """A consumer's stream opens snapshots in a Python process Spark starts for every query;
    pyarrow turning timestamp statistics into datetimes imported pandas there, a fifth of
    the query's start (#33). The statistics are read as integers instead."""
    sink = CompactedStateSink(
        str(lake / "log"), config=CleanerConfig(min_cleanable_dirty_ratio=1.0), clock=clock
    )
    sink(spark.range(10).selectExpr("cast(id as string) as key", "'v' as value"), 0)
    opened = (
        "import sys\n"
        "from sinks.log.log_table import LogTable\n"
        "snapshot = LogTable(sys.argv[1]).snapshot()\n"
        "(segment,) = snapshot.segments[0]\n"
        "assert segment.min_timestamp_ms is not None and snapshot.log_end_offsets() == {0: 10}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", opened, sink.path], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
