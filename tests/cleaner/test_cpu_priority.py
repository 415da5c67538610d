"""A background pass's tasks run on a niced thread; the caller's thread keeps its priority."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from sinks import CleanerConfig, ConfigError
from sinks.cleaner.throttler import MAX_NICE, at_lower_priority, lower_thread_priority

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice")


def thread_nice() -> int:
    """The calling thread's nice value (Linux keeps one per thread)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def in_thread(fn):
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=fn()))
    thread.start()
    thread.join()
    return result["value"]


@linux_only
def test_lowering_one_thread_leaves_the_others_alone():
    base = thread_nice()

    def lowered():
        assert lower_thread_priority(3)
        return thread_nice()

    assert in_thread(lowered) == min(MAX_NICE, base + 3)
    assert thread_nice() == base


@linux_only
def test_items_are_computed_niced_and_handed_over_in_order():
    base = thread_nice()

    def produce():
        for i in range(5):
            yield i, thread_nice()

    items = list(at_lower_priority(10, produce))
    assert [i for i, _ in items] == list(range(5))
    assert {nice for _, nice in items} == {min(MAX_NICE, base + 10)}
    assert thread_nice() == base


def test_no_niceness_runs_on_the_callers_thread():
    caller = threading.get_native_id()
    assert list(at_lower_priority(0, lambda: iter([threading.get_native_id()]))) == [caller]


def test_the_producers_error_is_raised_to_the_consumer():
    def produce():
        yield 1
        raise ValueError("segment 3 is corrupt")

    items = at_lower_priority(10, produce)
    assert next(items) == 1
    with pytest.raises(ValueError, match="segment 3 is corrupt"):
        next(items)


def test_a_consumer_that_stops_early_stops_the_producer():
    produced = []

    def produce():
        for i in range(1_000):
            produced.append(i)
            yield i

    items = at_lower_priority(10, produce)
    assert next(items) == 0
    items.close()  # joins the producer, which stops at its next hand-over
    assert len(produced) < 10
    assert not [t for t in threading.enumerate() if t.name == "log-cleaner-task"]


def test_the_setting_is_a_nice_increment():
    assert CleanerConfig().log_cleaner_nice == 10
    assert CleanerConfig.from_properties({"log.cleaner.nice": "0"}).log_cleaner_nice == 0
    with pytest.raises(ConfigError, match="log.cleaner.nice must be in \\[0, 19\\], got 20"):
        CleanerConfig(log_cleaner_nice=20)
