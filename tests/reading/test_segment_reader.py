"""`ordered_map`: the state read's thread pool keeps the segments' order and stays bounded."""

from __future__ import annotations

import threading
import time

import pytest

from sinks.reading.segment_reader import ordered_map


def test_results_come_in_the_items_order_whatever_order_they_finish_in():
    def slow_first(i: int) -> int:
        time.sleep(0.02 if i % 3 == 0 else 0.0)
        return i * i

    assert list(ordered_map(slow_first, range(20), threads=4)) == [i * i for i in range(20)]


def test_at_most_threads_calls_run_ahead_of_the_consumer():
    started: list[int] = []
    lock = threading.Lock()

    def note(i: int) -> int:
        with lock:
            started.append(i)
        return i

    results = ordered_map(note, range(100), threads=3)
    assert next(results) == 0
    time.sleep(0.05)
    assert len(started) <= 4  # the one consumed and at most three ahead
    results.close()


def test_a_call_s_error_is_raised_when_its_result_is_reached():
    def fails_at_two(i: int) -> int:
        if i == 2:
            raise FileNotFoundError("gone")
        return i

    results = ordered_map(fails_at_two, range(5), threads=2)
    assert [next(results), next(results)] == [0, 1]
    with pytest.raises(FileNotFoundError):
        next(results)
