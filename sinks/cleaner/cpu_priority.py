"""A background pass's tasks run at a lower CPU priority than the query's.

Kafka's cleaner threads share a broker's cores with the produce path and rely on
the Throttler alone. On a Spark executor the pass's tasks and the query's tasks
share cores too, so the pass also gives up the CPU: each task recopies on a
thread niced by ``log.cleaner.nice`` (as RocksDB lowers its compaction pool's
CPU priority and Cassandra its compaction threads'). When the query's task wants
the core, it gets it; when it does not, the pass runs at full speed.

Linux keeps a nice value per thread, so the work runs on a short-lived thread of
its own and a reused Python worker keeps its priority for the tasks after it.
Elsewhere (no per-thread nice) the work runs unchanged on the calling thread.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

MAX_NICE = 19
_PER_THREAD = sys.platform.startswith("linux") and hasattr(os, "setpriority")
_DONE = object()


def lower_thread_priority(niceness: int) -> bool:
    """Raise the calling thread's nice value by ``niceness`` (capped at 19); False if
    this platform cannot nice one thread."""
    if niceness <= 0 or not _PER_THREAD:
        return False
    tid = threading.get_native_id()
    current = os.getpriority(os.PRIO_PROCESS, tid)
    os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, current + niceness))
    return True


def at_lower_priority(niceness: int, produce: Callable[[], Iterator[T]]) -> Iterator[T]:
    """Yield ``produce()``'s items, computed on a thread niced by ``niceness``.

    The producer runs at most two items ahead; its exception is raised here; if the
    consumer stops early, the producer stops at its next item.
    """
    if niceness <= 0 or not _PER_THREAD:
        yield from produce()
        return
    handoff: queue.Queue[object] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        lower_thread_priority(niceness)
        try:
            for item in produce():
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            put(e)

    worker = threading.Thread(target=work, name="log-cleaner-task", daemon=True)
    worker.start()
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        worker.join()
