"""bench/peers.py's report: two processes' result files (one per pyspark) merged into one
table, and a state that differs from the expected one, or expected states that differ
between the processes, reported as disagreeing. No Spark: the files are written here."""

from __future__ import annotations

import json

import pytest

from bench.peers import directory_size, hudi_latest_slices, report


def _system(rows: int, digest: int, agrees: bool) -> dict:
    return {
        "ingest_s": 10.0,
        "drain_s": 0.0,
        "p50_batch_s": 1.0,
        "p99_batch_s": 2.0,
        "bytes_written": 5_000_000,
        "table_bytes": 2_000_000,
        "files": 4,
        "state_read_s": 0.5,
        "live_keys": rows,
        "state_checksum": digest,
        "state_agrees": agrees,
        "arrow_read": {"s": 0.1, "rows": rows},
        "per_batch": [{"batch": b, "s": 1.0, "bytes_written": 1_000_000} for b in range(5)],
    }


def _run(spark: str, expected: tuple[int, int], systems: dict) -> dict:
    return {
        "mode": "quick",
        "versions": {"spark": spark, "pyspark": spark},
        "load_before": "load average: 1.0",
        "load_after": "load average: 1.0",
        "generated_utc": "2026-11-26 14:00 UTC",
        "total_s": 60.0,
        "notes": [],
        "workloads": [
            {
                "name": "w",
                "keys": 100,
                "batches": 5,
                "records_per_batch": 10,
                "skew": "uniform",
                "input_bytes": 1_000_000,
                "expected": {"live_keys": expected[0], "state_checksum": expected[1]},
                "systems": systems,
            }
        ],
    }


def _write(tmp_path, name: str, run: dict) -> None:
    (tmp_path / name).write_text(json.dumps(run))


def test_both_processes_agreeing_make_one_table(tmp_path) -> None:
    _write(
        tmp_path,
        "peers-pyspark3.5.9.json",
        _run("3.5.9", (90, 7), {"paimon_pk": _system(90, 7, True)}),
    )
    _write(
        tmp_path,
        "peers-pyspark4.2.0.json",
        _run("4.2.0", (90, 7), {"compacted_sink": _system(90, 7, True)}),
    )

    text = report(str(tmp_path))

    merged = json.loads((tmp_path / "results.json").read_text())["workloads"][0]
    assert merged["expected_states_agree"] and merged["all_states_agree"]
    assert merged["systems"]["paimon_pk"]["spark"] == "3.5.9"
    assert merged["systems"]["compacted_sink"]["spark"] == "4.2.0"
    assert "| compacted_sink | 4.2.0 |" in text and "| paimon_pk | 3.5.9 |" in text
    assert (tmp_path / "PEERS.md").exists() and (tmp_path / "peers.png").exists()


def test_a_system_rerun_is_reported_from_its_newest_run(tmp_path) -> None:
    older = _run("3.5.9", (90, 7), {"paimon_pk": _system(90, 7, True)})
    older["workloads"][0]["systems"]["hudi_mor"] = _system(90, 7, True)
    newer = _run("3.5.9", (90, 7), {"paimon_pk": {**_system(90, 7, True), "state_read_s": 0.25}})
    newer["generated_utc"] = "2026-12-03 15:00 UTC"
    # The older file's name sorts after the newer's, as the untagged file does after a tag.
    _write(tmp_path, "peers-pyspark3.5.9.json", older)
    _write(tmp_path, "peers-pyspark3.5.9-reads.json", newer)

    report(str(tmp_path))

    systems = json.loads((tmp_path / "results.json").read_text())["workloads"][0]["systems"]
    assert systems["paimon_pk"]["state_read_s"] == 0.25
    assert systems["hudi_mor"]["state_read_s"] == 0.5


def test_a_system_off_the_expected_state_is_reported(tmp_path) -> None:
    _write(
        tmp_path,
        "peers-pyspark3.5.9.json",
        _run("3.5.9", (90, 7), {"hudi_mor": _system(91, 8, False)}),
    )
    _write(
        tmp_path,
        "peers-pyspark4.2.0.json",
        _run("4.2.0", (90, 7), {"compacted_sink": _system(90, 7, True)}),
    )

    text = report(str(tmp_path))

    merged = json.loads((tmp_path / "results.json").read_text())["workloads"][0]
    assert merged["expected_states_agree"] and not merged["all_states_agree"]
    assert "| hudi_mor | 3.5.9 |" in text and "**NO**" in text


@pytest.mark.parametrize(
    ("name", "spark"),
    [("peers-pyspark4.2.0.json", "4.2.0"), ("peers-pyspark3.5.9-sink-side.json", "3.5.9")],
    ids=["two Sparks", "one Spark"],
)
def test_processes_reading_different_expected_states_disagree(tmp_path, name, spark) -> None:
    """The processes' files, not their Spark versions, are what must agree (`make
    bench-peers` runs every system on one Spark)."""
    _write(
        tmp_path,
        "peers-pyspark3.5.9.json",
        _run("3.5.9", (90, 7), {"paimon_pk": _system(90, 7, True)}),
    )
    _write(tmp_path, name, _run(spark, (90, 6), {"compacted_sink": _system(90, 6, True)}))

    report(str(tmp_path))

    merged = json.loads((tmp_path / "results.json").read_text())["workloads"][0]
    assert not merged["expected_states_agree"] and not merged["all_states_agree"]


def test_directory_size_leaves_out_hadoop_files_and_skipped_directories(tmp_path) -> None:
    (tmp_path / ".hoodie").mkdir()
    (tmp_path / ".hoodie" / "meta").write_bytes(b"x" * 100)
    (tmp_path / "part-0.parquet").write_bytes(b"x" * 10)
    (tmp_path / ".part-0.parquet.crc").write_bytes(b"x" * 3)
    (tmp_path / "_SUCCESS").write_bytes(b"")

    size = directory_size(str(tmp_path), skip=(".hoodie",))

    assert (size.bytes, size.files) == (10, 1)


def test_hudi_latest_slices_count_the_newest_base_and_its_logs(tmp_path) -> None:
    files = {
        "fg1-0_0-1-1_20261126100000000.parquet": 100,  # an older slice, retained
        "fg1-0_0-2-2_20261126110000000.parquet": 200,
        ".fg1-0_20261126100000000.log.1_0-3-3": 7,  # written against the older base
        ".fg1-0_20261126110000000.log.1_0-4-4": 30,
        ".fg1-0_20261126110000000.log.2_0-5-5": 40,
        "fg2-0_0-6-6_20261126110000000.parquet": 50,
        ".hoodie_partition_metadata": 9,
    }
    for name, size in files.items():
        (tmp_path / name).write_bytes(b"x" * size)

    size = hudi_latest_slices(str(tmp_path))

    assert (size.bytes, size.files) == (200 + 30 + 40 + 50, 4)


def test_the_goals_say_met_or_not_for_each_peer(tmp_path) -> None:
    sink = {**_system(90, 7, True), "ingest_cpu_s": 20.0}
    sink["read_while_writing"] = {"s": 0.4, "rows": 50, "consistent": True}
    slower = {**_system(90, 7, True), "ingest_s": 5.0, "ingest_cpu_s": 30.0}
    cow = {**_system(90, 7, True), "bytes_written": 12_000_000}
    _write(tmp_path, "peers-pyspark3.5.9.json", _run("3.5.9", (90, 7), {"hudi_mor": slower}))
    _write(
        tmp_path,
        "peers-pyspark4.2.0.json",
        _run("4.2.0", (90, 7), {"compacted_sink": sink, "delta_spark_merge": cow}),
    )

    text = report(str(tmp_path))

    # hudi ingests in 5 s against the sink's 10: not met; by CPU 30 against 20: met.
    assert "| hudi_mor | 0.50x **not met** | 1.50x met | 1.00x met | 1.00x met |" in text
    # copy-on-write MERGE wrote 12 MB against 5: 2.4x fewer, short of the 3x goal.
    assert "| delta_spark_merge |" in text and "2.40x **not met** (goal 3x)" in text
    assert "| 0.40 | yes |" in text  # the read beside a write, consistent
