"""Kafka's Throttler and the per-pass budget, as pure planning (no Spark)."""

from __future__ import annotations

from testkit import segment

from sinks.cleaner.log_to_clean import LogToClean, within_budget
from sinks.cleaner.throttler import Throttler, budget_summary
from sinks.config import CleanerConfig


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_throttler_sleeps_down_to_the_desired_rate():
    t = FakeTime()
    throttler = Throttler(100.0, clock=t.clock, sleep=t.sleep)
    t.now = 1.0
    assert throttler.maybe_throttle(300) == 2.0  # 300 bytes at 100/s take 3 s, not 1
    t.now += 1.0
    assert throttler.maybe_throttle(50) == 0.0  # under the rate: no sleep
    assert t.slept == [2.0]


def test_throttler_waits_for_the_check_interval_and_is_off_when_unlimited():
    t = FakeTime()
    throttler = Throttler(1.0, clock=t.clock, sleep=t.sleep)
    t.now = 0.1
    assert throttler.maybe_throttle(1_000) == 0.0  # within 300 ms: only counted
    t.now = 0.5
    assert throttler.maybe_throttle(0) > 0
    assert Throttler(float("inf")).maybe_throttle(10**12) == 0.0


def test_budget_summary_names_kafkas_keys():
    assert budget_summary(CleanerConfig()) == ""
    line = budget_summary(
        CleanerConfig.from_properties(
            {
                "log.cleaner.max.bytes.per.pass": str(64 << 20),
                "log.cleaner.io.max.bytes.per.second": str(10 << 20),
            }
        )
    )
    assert line == (
        "log.cleaner.max.bytes.per.pass 64.0 MiB, log.cleaner.io.max.bytes.per.second 10.0 MiB/s"
    )


def log(partition: int, first_dirty: int, first_uncleanable: int, dirty: int) -> LogToClean:
    return LogToClean(
        log_path="t",
        partition=partition,
        first_dirty_offset=first_dirty,
        first_uncleanable_offset=first_uncleanable,
        clean_bytes=100,
        cleanable_bytes=dirty,
    )


SEGMENTS = {
    0: [
        segment(0, 0, 9),
        segment(0, 10, 19),
        segment(0, 20, 29),
        segment(0, 30, 39),
    ],  # clean [0, 10)
    1: [segment(1, 0, 9), segment(1, 10, 19)],  # clean [0, 10)
}


def test_budget_cuts_in_the_dirty_section_dirtiest_partition_first():
    logs = [log(0, 10, 40, 300), log(1, 10, 20, 100)]
    plan = within_budget(logs, SEGMENTS, 300)
    assert [(p.partition, p.first_uncleanable_offset) for p in plan.partitions] == [(0, 30)]
    assert plan.bytes_read == 300 and plan.work_left


def test_budget_always_makes_progress_and_takes_whole_partitions_that_fit():
    logs = [log(0, 10, 40, 300), log(1, 10, 20, 100)]
    tiny = within_budget(logs, SEGMENTS, 1)
    assert [(p.partition, p.first_uncleanable_offset) for p in tiny.partitions] == [(0, 20)]
    assert tiny.work_left
    everything = within_budget(logs, SEGMENTS, 10**9)
    assert [(p.partition, p.first_uncleanable_offset) for p in everything.partitions] == [
        (0, 40),
        (1, 20),
    ]
    assert not everything.work_left and everything.bytes_read == 600
