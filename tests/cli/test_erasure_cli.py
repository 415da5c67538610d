"""``compacted-sink erase`` and ``erasure-status`` without Spark (design.md §54, §55): the
erase appends its tombstones and marks the partitions, the status lists every file still
holding the key, and the next round cleans the marked partitions whatever their ratio; a
``restore`` across the erasure is refused by name unless ``--reerase`` (design.md §64)."""

from __future__ import annotations

import json

from sinks import CleanerConfig, CompactedStateSink

SCHEMA = "key string, value string, partition int"


def test_erase_and_erasure_status_from_the_command_line(spark, no_spark_cli, tmp_path):
    path = tmp_path / "lake" / "users"
    sink = CompactedStateSink(str(path), config=CleanerConfig(min_cleanable_dirty_ratio=1.0))
    sink(spark.createDataFrame([(f"u{i}", f"v{i}", i % 2) for i in range(10)], SCHEMA), 0)
    sink(spark.createDataFrame([("u1", "w1", 1), ("u2", "w2", 0)], SCHEMA), 1)
    (tmp_path / "keys.txt").write_text("u2\n\n")
    before = str(sink.log_table.snapshot().version)

    erase, as_json, as_text, again, refused, restored = no_spark_cli(
        ("erase", "lake/users", "u1", "--keys-file", "keys.txt"),
        ("erasure-status", "lake/users", "u1", "u2", "nobody", "--json"),
        ("erasure-status", "lake/users", "u1"),
        ("erase", "lake/users", "u1"),
        ("restore", "lake/users", "--to-version", before),
        ("restore", "lake/users", "--to-version", before, "--reerase"),
        cwd=tmp_path,
    )

    assert erase.returncode == 0, erase.stderr
    assert "erased 2 key(s): 2 tombstone(s) appended" in erase.stdout
    assert "next cleaning round" in erase.stdout
    status = json.loads(as_json.stdout)
    by_key = {k["key"]: k for k in status["keys"]}
    assert not by_key["u1"]["gone"] and not by_key["u2"]["gone"]
    assert {p["kind"] for p in by_key["u1"]["places"]} >= {"live segment", "delta commit"}
    assert by_key["nobody"]["gone"]  # never written: none
    assert status["terms"]["delete.retention.ms"] == 86_400_000
    assert as_text.stdout.startswith("u1: ") and "live segment" in as_text.stdout
    assert "0 tombstone(s)" in again.stdout  # exactly once
    assert refused.returncode == 1
    assert "would bring back erased keys" in refused.stderr and "2 key(s)" in refused.stderr
    assert restored.returncode == 0, restored.stderr
    assert {r["key"] for r in sink.state().collect()} == {f"u{i}" for i in range(10)} - {"u1", "u2"}

    stats = CompactedStateSink(str(path)).clean()  # the erasure mark, not the ratio (1.0)
    assert stats is not None
    live = {(r["key"], r["value"]) for r in sink.log().where("key in ('u1', 'u2')").collect()}
    assert live == {("u1", None), ("u2", None)}
