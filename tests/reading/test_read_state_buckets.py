"""`read_state` weighs a dirty tail's contenders a bucket of keys at a time (design.md §50).

A ``dedupe_buffer_size`` too small for the contenders at once splits them into buckets by a
hash of the canonical key (every record of a key in one bucket, keys compared by value): the
superseded records, hence the state, are the same as weighed at once, and against
``state()``; the weighing's peak memory falls with the buffer. Logs are fed without Spark
(`arrow_append`) and cleaned by a real pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from testkit import arrow_append, segment

from sinks import CleanerConfig, CompactedStateSink, read_state, read_state_batches
from sinks.cleaner.offset_map import BYTES_PER_MAPPED_RECORD
from sinks.log.segment import ForeignFile
from sinks.reading.arrow_state import StatePlan
from sinks.reading.superseded import contenders_bound, rival_files, weighing_buckets

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
KV = "key string, value string"
KVP = "key string, value string, partition int"
KVS = "key string, value string, seq long"
REPO = Path(__file__).resolve().parents[2]


def _sorted_rows(table: pa.Table) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def _state_rows(sink) -> list[str]:
    rows = sink.state().collect()
    return sorted(json.dumps(r.asDict(recursive=True), sort_keys=True) for r in rows)


def _plan(sink, dedupe_buffer_size: int) -> StatePlan:
    return StatePlan.of(sink.log_table.snapshot(), dedupe_buffer_size=dedupe_buffer_size)


# -- pure ----------------------------------------------------------------------------------


def test_buckets_keep_each_within_the_buffer_however_many_it_takes():
    per_bucket = 1_000_000 // BYTES_PER_MAPPED_RECORD
    assert weighing_buckets(0, 1_000_000) == 1
    assert weighing_buckets(per_bucket, 1_000_000) == 1
    assert weighing_buckets(per_bucket + 1, 1_000_000) == 2
    assert weighing_buckets(100 * per_bucket, 1_000_000) == 100  # no cap: a pass's is 8
    assert weighing_buckets(5, 1) == 5  # a buffer below one record: one a bucket


def test_rivals_are_the_clean_files_of_the_tail_s_partitions():
    clean = [segment(0, 0, 9), segment(1, 0, 9), segment(2, 0, 9)]
    dirty = [segment(1, 10, 14)]
    assert rival_files(clean, dirty) == [clean[1]]
    assert contenders_bound([clean[1]], dirty) == 5 + 5  # no more rivals than tail records
    assert contenders_bound([clean[1]], [segment(1, 10, 39)]) == 30 + 10
    ranged = ForeignFile("f.parquet", 10, 3, (2, 3), "merged by OPTIMIZE")
    assert rival_files(clean, [*dirty, ranged]) == clean[1:]
    unknown = ForeignFile("g.parquet", 10, 3, None, "no statistics")
    assert rival_files(clean, [unknown]) == clean


# -- against the state at once and state() -------------------------------------------------


def test_a_small_buffer_weighs_in_buckets_to_the_same_state(spark, lake, clock):
    """Two partitions, a clean section, a tail overriding clean and dirty records, tombstones,
    a new key: weighed in many buckets, the same superseded offsets, rows and batches."""
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    rows = [(f"k{i:03d}", f"v{i}", i % 2) for i in range(200)]
    for start in range(0, 200, 50):
        arrow_append(sink, rows[start : start + 50], KVP, start // 50, spark=spark)
    sink.clean(force=True)
    tail = [(f"k{i:03d}", None if i % 7 == 0 else f"w{i}", i % 2) for i in range(0, 200, 3)]
    tail += [(f"k{i:03d}", f"x{i}", i % 2) for i in range(0, 200, 5)] + [("new", "n", 1)]
    arrow_append(sink, tail[:60], KVP, 4, spark=spark)
    arrow_append(sink, tail[60:], KVP, 5, spark=spark)

    at_once, bucketed = _plan(sink, 1 << 30), _plan(sink, 4_000)
    assert at_once.superseded.buckets == 1 and bucketed.superseded.buckets > 10
    assert bucketed.superseded.count == at_once.superseded.count > 0
    assert {p: o.tolist() for p, o in bucketed.superseded.offsets.items()} == {
        p: o.tolist() for p, o in at_once.superseded.offsets.items()
    }
    small = read_state(sink.path, dedupe_buffer_size=4_000)
    assert _sorted_rows(small) == _sorted_rows(read_state(sink.path))
    assert _sorted_rows(small.select(["key", "value"])) == _state_rows(sink)
    streamed = read_state_batches(sink.path, batch_rows=16, dedupe_buffer_size=4_000).read_all()
    assert _sorted_rows(streamed) == _sorted_rows(small)
    got = {r["key"]: r["value"] for r in small.to_pylist()}
    assert got["k015"] == "x15" and "k021" not in got and got["k001"] == "v1"
    dead = [i for i in range(0, 200, 21) if i % 5]  # tombstoned, not written again after
    assert got["new"] == "n" and len(got) == 201 - len(dead)


def test_a_sequence_column_weighed_in_buckets_lets_clean_records_win(spark, lake, clock):
    sink = CompactedStateSink(
        str(lake / "log"), sequence_column="seq", config=NO_CLEAN, clock=clock
    )
    arrow_append(sink, [(f"k{i:02d}", f"c{i}", 10) for i in range(60)], KVS, 0, spark=spark)
    sink.clean(force=True)
    tail = [(f"k{i:02d}", f"t{i}", 5 if i % 2 else 20) for i in range(0, 60, 2)]
    tail += [(f"k{i:02d}", None, 30) for i in range(0, 60, 9)]
    arrow_append(sink, tail, KVS, 1, spark=spark)
    bucketed = _plan(sink, 2_000)
    assert bucketed.superseded.buckets > 5
    small = read_state(sink.path, dedupe_buffer_size=2_000)
    assert _sorted_rows(small) == _sorted_rows(read_state(sink.path))
    assert _sorted_rows(small.select(["key", "value"])) == _state_rows(sink)
    got = {r["key"]: r["value"] for r in small.to_pylist()}
    assert got["k02"] == "t2" and got["k01"] == "c1" and "k18" not in got


# -- the weighing's memory -----------------------------------------------------------------

_PEAK = """
import json, sys, tracemalloc
import pyarrow as pa
import pyarrow.acero  # what the weighing imports on first use: not its memory
from sinks.log.log_table import LogTable
from sinks.reading.arrow_state import StatePlan

snapshot = LogTable(sys.argv[1]).snapshot()
pool, base = pa.default_memory_pool(), pa.total_allocated_bytes()
tracemalloc.start()
plan = StatePlan.of(snapshot, threads=2, dedupe_buffer_size=int(sys.argv[2]))
numpy_peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({
    "arrow": pool.max_memory() - base, "numpy": numpy_peak,
    "buckets": plan.superseded.buckets, "superseded": plan.superseded.count,
}))
"""


def _weighing_peak(path: str, dedupe_buffer_size: int) -> dict:
    """The weighing (`StatePlan.of`) alone in a process of its own: Arrow's pool's peak above
    what it held before, and Python's (numpy's) peak as tracemalloc traces it."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, path, str(dedupe_buffer_size)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_the_weighing_s_peak_memory_falls_with_the_buffer(spark, lake, clock):
    """80,000 keys cleaned into small segments, then 80,000 uniform updates in 16 segments:
    160,000 contenders, one bucket against 512 MiB, 20 against 2 MB. The small buffer's
    peak (Arrow's pool and numpy's arrays) stays within the buffer and a few fixed megabytes,
    less than half the peak at once; both find the same superseded records."""
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, segment_bytes=64 * 1024)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    keys = 80_000
    for b in range(8):
        rows = [(f"key-{i:08d}", f"v{i}") for i in range(b * 10_000, (b + 1) * 10_000)]
        arrow_append(sink, rows, KV, b, spark=spark)
    sink.clean(force=True)
    for b in range(16):
        ids = [(b * 7_919 + j * 104_729) % keys for j in range(5_000)]
        arrow_append(sink, [(f"key-{i:08d}", f"u{b}") for i in ids], KV, 8 + b, spark=spark)
    tiny = 8_000 * BYTES_PER_MAPPED_RECORD
    large, small = _weighing_peak(sink.path, 512 << 20), _weighing_peak(sink.path, tiny)
    assert large["buckets"] == 1 and small["buckets"] == 20
    assert small["superseded"] == large["superseded"] == 80_000  # each tail record or its rival
    at_once, bucketed = large["arrow"] + large["numpy"], small["arrow"] + small["numpy"]
    assert bucketed < at_once / 2, (large, small)
    # Beyond the buffer: a row group's narrow columns a thread, Parquet's and Acero's buffers.
    assert bucketed < tiny + 5_000_000, (large, small)
