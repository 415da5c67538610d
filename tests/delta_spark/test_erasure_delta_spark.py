"""Erasure with delta-spark on the table (design.md §54, §55): delta-spark's OPTIMIZE
between an erasure and its pass, and delta-spark's own checkpoints (statistics as JSON and
as a struct, ``stats_parsed``), leave no byte of the key once `erasure_status` says none."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from testkit import arrow_append

from sinks import CleanerConfig, CompactedStateSink

pytestmark = pytest.mark.delta_spark

SCHEMA = "key string, value string, partition int"
WINDOW_MS = 15_000  # longer than the passes take here: no checkpoint forgets a remove still due
LAG_MS = 600_000
ERASED = "erase-me-delta-spark"


def bytes_naming(root: Path, key: str) -> list[str]:
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        hit = key.encode() in path.read_bytes()
        if not hit and path.suffix == ".parquet":
            hit = key in json.dumps(pq.read_table(path).to_pylist(), default=str)
        if hit:
            found.append(str(path.relative_to(root)))
    return found


def test_delta_sparks_optimize_and_checkpoints_beside_an_erasure(delta_spark, lake, clock_at):
    clock = clock_at(int(time.time() * 1000))
    path = lake / "log"
    config = CleanerConfig(
        min_cleanable_dirty_ratio=0.99,
        min_compaction_lag_ms=LAG_MS,  # the erasure's pass waits: OPTIMIZE comes first
        delete_retention_ms=3_600_000,
        file_delete_delay_ms=WINDOW_MS,
        log_retention_check_interval_ms=3_600_000,
    )
    sink = CompactedStateSink(str(path), config=config, clock=clock)
    for b in range(3):
        rows = [(f"keep-{b}-{i}", "v", i % 2) for i in range(4)] + [(ERASED, f"x{b}", 0)]
        arrow_append(sink, rows, SCHEMA, b, delta_spark)
    sink.erase(ERASED)
    delta_spark.sql(f"OPTIMIZE delta.`{path}`").collect()
    kinds = {p.kind for p in sink.erasure_status(ERASED).keys[0].places}
    assert "delta checksum" in kinds  # delta-spark's .crc lists the files with statistics

    clock.advance(LAG_MS + 1_000)
    sink.clean()
    assert sink.log().where(f"key = '{ERASED}' and value is not null").count() == 0
    clock.advance(3_600_000 + 60_000)
    sink.clean()  # the tombstone's horizon has passed
    # The deleter runs before delta-spark's next checkpoint, which would drop the removes
    # that have left the window: OPTIMIZE's file, in delta-spark's naming, would then be an
    # orphan the sink never deletes (design.md §26; erasure_status names it, with why).
    time.sleep(WINDOW_MS / 1000 + 0.3)
    sink.vacuum()
    for b in range(10, 21):  # delta-spark's commits: its checkpoint every 10
        delta_spark.sql(
            f"INSERT INTO delta.`{path}` (key, value, partition, offset, timestamp) "
            f"VALUES ('later-{b}', 'x', 1, {1000 + b}, current_timestamp())"
        ).collect()
    sink.accept_foreign_changes()
    time.sleep(WINDOW_MS / 1000 + 0.3)
    clock.now = max(clock.now, int(time.time() * 1000))
    sink.vacuum()

    final = sink.erasure_status(ERASED)
    assert final.gone, [p.as_dict() for k in final.keys for p in k.places]
    assert bytes_naming(path, ERASED) == []
