"""The bench's baselines (bench/systems.py) on a tiny workload: every system ends on the same
state, and the delta-spark ones commit idempotently (txnAppId / txnVersion)."""

from __future__ import annotations

import dataclasses

import pytest
from pyspark.sql import SparkSession

from bench.measure import PeakRss
from bench.run import BASELINES, run_workload
from bench.systems import DeltaSparkAppendSystem, DeltaSparkMergeSystem, checksum, make_system
from bench.workload import Workload, generate

pytestmark = pytest.mark.delta_spark


def _tiny() -> Workload:
    # Zipf: keys repeat within a batch, so the MERGE baselines' latest-per-key dedupe counts.
    return Workload(
        name="tiny-zipf",
        keys=300,
        batches=2,
        records_per_batch=400,
        skew="zipf",
        tombstone_fraction=0.1,
        record_size="512B",
        systems=BASELINES,
    )


def test_every_baseline_ends_on_the_same_state(delta_spark: SparkSession, tmp_path) -> None:
    result = run_workload(delta_spark, _tiny(), str(tmp_path), BASELINES, PeakRss(delta_spark))

    systems = result["systems"]
    assert sorted(systems) == sorted(BASELINES)
    states = {name: (s["live_keys"], s["state_checksum"]) for name, s in systems.items()}
    assert len(set(states.values())) == 1, states
    assert result["states_agree"]
    live = next(iter(states.values()))[0]
    assert 0 < live < 300  # tombstones deleted keys


def _txns(commits: list[list[dict]]) -> list[dict]:
    return [a["txn"] for commit in commits for a in commit if "txn" in a]


@pytest.mark.parametrize("system_type", [DeltaSparkMergeSystem, DeltaSparkAppendSystem])
def test_delta_spark_baselines_commit_each_batch_once(
    delta_spark: SparkSession, tmp_path, delta_commits, system_type
) -> None:
    files = generate(_tiny(), str(tmp_path / "input"))
    system = system_type(str(tmp_path / "system"))
    for batch_id, path in enumerate(files[:2]):
        system.ingest(delta_spark, batch_id, path)
    before = delta_commits(system.table_uri)
    state = checksum(system.state(delta_spark))

    system.ingest(delta_spark, 1, files[1])  # the batch again, as after a restart

    after = delta_commits(system.table_uri)
    assert len(after) == len(before)
    assert checksum(system.state(delta_spark)) == state
    assert [(t["appId"], t["version"]) for t in _txns(after)] == [
        (system.app_id, 0),
        (system.app_id, 1),
    ]
    assert delta_spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None


def test_the_sink_at_dirty_ratio_075_ends_on_the_same_state(
    delta_spark: SparkSession, tmp_path
) -> None:
    systems = ("compacted_sink", "compacted_sink_dirty_075")
    tiny = dataclasses.replace(_tiny(), systems=systems)

    result = run_workload(delta_spark, tiny, str(tmp_path), systems, PeakRss(delta_spark))

    assert sorted(result["systems"]) == sorted(systems)
    assert result["states_agree"]
    assert 0 < result["systems"]["compacted_sink_dirty_075"]["live_keys"] < 300


@pytest.mark.parametrize(
    ("name", "ratio"), [("compacted_sink_dirty_075", 0.75), ("compacted_sink_dirty_020", 0.2)]
)
def test_a_tuned_system_cleans_at_its_ratio(tmp_path, name: str, ratio: float) -> None:
    system = make_system(name, str(tmp_path))
    try:
        assert system.sink.config.min_cleanable_dirty_ratio == ratio
        assert system.name == name
    finally:
        system.close()
