"""A pass beaten by another writer is planned again, without Spark (Kafka's
``LogCleaningAbortedException``): `Cleaner.run_pass` retries on the typed abort only, at most
``PASS_ATTEMPTS`` times, then raises `CleanerError` from it. A real log and checkpoint
table on ``tmp_path``; the choice of partitions is what each attempt is made to lose.
"""

from __future__ import annotations

import pytest
from pyspark.sql.types import StringType, StructField, StructType

from checkpoints import CleanerOffsetCheckpoint
from sinks.cleaner.cleaner import PASS_ATTEMPTS, Cleaner, CleaningPass
from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.pass_planning import LogPlanner, RoundRequest
from sinks.config import CleanerConfig
from sinks.errors import CleanerError, LogCleaningAbortedError
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogTable

NOW = 1_700_000_000_000
FORCED = RoundRequest(force=True)


class Beaten(Cleaner):
    """A cleaner whose choice is beaten by another writer the first ``losses`` times."""

    def __init__(self, *args, losses: int, error: Exception | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.losses, self.error, self.attempts = losses, error, 0

    def claim_filthiest(self, snapshot, request) -> CleaningPass | None:
        self.attempts += 1
        if self.attempts <= self.losses:
            raise self.error or LogCleaningAbortedError(f"beaten at version {snapshot.version}")
        return None  # nothing left to clean once the other writer's pass landed


def cleaner(tmp_path, **kwargs) -> Beaten:
    log = LogTable(str(tmp_path / "log"))
    log.create(StructType([StructField("key", StringType()), StructField("value", StringType())]))
    checkpoints = CleanerOffsetCheckpoint(str(tmp_path / "checkpoints"))
    config = CleanerConfig()
    return Beaten(
        log,
        CleanerManager(checkpoints, log.uri, clock=lambda: NOW),
        LogPlanner(log, checkpoints, config, clock=lambda: NOW),
        config,
        keys=LogKeys(key_columns=("key",)),
        clock=lambda: NOW,
        **kwargs,
    )


def test_a_beaten_pass_is_planned_again(tmp_path):
    beaten = cleaner(tmp_path, losses=PASS_ATTEMPTS - 1)
    assert beaten.run_pass(None, FORCED) is None  # type: ignore[arg-type]  # no Spark job
    assert beaten.attempts == PASS_ATTEMPTS


def test_a_pass_beaten_every_time_fails_as_a_cleaner_error_from_the_abort(tmp_path):
    beaten = cleaner(tmp_path, losses=PASS_ATTEMPTS)
    with pytest.raises(CleanerError, match=f"after {PASS_ATTEMPTS} attempts") as failed:
        beaten.run_pass(None, FORCED)  # type: ignore[arg-type]
    assert isinstance(failed.value.__cause__, LogCleaningAbortedError)
    assert beaten.attempts == PASS_ATTEMPTS


def test_any_other_failure_is_not_retried(tmp_path):
    failure = CleanerError("pass failed", log_path="log", partition=0)
    beaten = cleaner(tmp_path, losses=1, error=failure)
    with pytest.raises(CleanerError) as failed:
        beaten.run_pass(None, FORCED)  # type: ignore[arg-type]
    assert failed.value is failure and beaten.attempts == 1
