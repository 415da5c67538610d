"""bench/bytes_ratio.py's model: the expected distinct keys among independent draws, against
the draws themselves (the live-table size the MERGE baselines rewrite each batch)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.bytes_ratio import expected_distinct, markdown, rows, totals
from bench.workload import Workload, key_ids


@pytest.mark.parametrize("skew", ["uniform", "zipf"])
def test_expected_distinct_keys_match_the_generated_keys(skew) -> None:
    workload = Workload(name="model", keys=20_000, batches=1, records_per_batch=1, skew=skew)
    rng = np.random.default_rng(11)
    for draws in (2_000, 20_000, 100_000):
        seen = [len(np.unique(key_ids(rng, workload, draws))) for _ in range(5)]

        expected = expected_distinct(workload.keys, skew, draws)

        assert np.mean(seen) == pytest.approx(expected, rel=0.01)


def test_every_key_is_seen_in_the_end() -> None:
    assert expected_distinct(1_000, "uniform", 10**6) == pytest.approx(1_000)
    assert expected_distinct(1_000, "zipf", 10**8) == pytest.approx(1_000, rel=1e-3)


def _workload(systems: dict) -> dict:
    return {
        "name": "w",
        "keys": 1_000,
        "batches": 3,
        "records_per_batch": 100,
        "skew": "uniform",
        "tombstone_fraction": 0.0,
        "input_bytes": 3_000,
        "systems": systems,
    }


def _system(per_batch: list[int], table: int = 900, live: int = 300) -> dict:
    return {
        "bytes_written": sum(per_batch) + 500,  # the drain after the last batch
        "table_bytes": table,
        "live_keys": live,
        "per_batch": [{"bytes_written": b, "table_bytes": table} for b in per_batch],
    }


def test_the_cumulative_ratio_is_merge_bytes_over_the_sinks_up_to_each_batch() -> None:
    workload = _workload(
        {
            "compacted_sink": _system([1_000, 3_000, 1_000]),
            "delta_spark_merge": _system([1_000, 2_000, 3_000]),
        }
    )

    table = rows(workload)

    assert [r["delta_spark_merge/compacted_sink"] for r in table] == [1.0, 0.75, 1.2]
    assert [r["compacted_sink_amp"] for r in table] == [1.0, 2.0, 5_000 / 3_000]
    assert totals(workload) == {"delta_spark_merge/compacted_sink": 6_500 / 5_500}
    assert "| – |" in markdown({"workloads": [workload]})  # no delta-rs MERGE in this run
