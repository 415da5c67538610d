"""`sinks.warn_once`: a warning said the first time a process meets its subject (design.md
§67). Pure."""

from __future__ import annotations

import logging
import threading

import pytest

from sinks import warn_once as warn_once_module
from sinks.warn_once import first_time, warn_once


@pytest.fixture(autouse=True)
def said_afresh(monkeypatch):
    monkeypatch.setattr(warn_once_module, "_SAID", set())


def test_a_subject_is_said_once_and_another_subject_again(caplog):
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        assert warn_once(("stale rewrite", "/lake/a", 4), "log %s: version %d", "/lake/a", 4)
        assert not warn_once(("stale rewrite", "/lake/a", 4), "log %s: version %d", "/lake/a", 4)
        assert warn_once(("stale rewrite", "/lake/a", 5), "log %s: version %d", "/lake/a", 5)
    assert [r.getMessage() for r in caplog.records] == [
        "log /lake/a: version 4",
        "log /lake/a: version 5",
    ]


def test_of_many_threads_meeting_a_subject_one_is_first():
    firsts: list[bool] = []
    barrier = threading.Barrier(8)

    def meet() -> None:
        barrier.wait()
        firsts.append(first_time("one subject"))

    threads = [threading.Thread(target=meet) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(firsts) == [False] * 7 + [True]
