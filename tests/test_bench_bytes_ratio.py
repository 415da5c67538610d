"""bench/bytes_ratio.py's model: the expected distinct keys among independent draws, against
the draws themselves (the live-table size the MERGE baselines rewrite each batch)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.bytes_ratio import expected_distinct
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
