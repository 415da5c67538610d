"""Stopping the sink's threads before the interpreter exits: Kafka's broker shutdown, which
stops the cleaner threads before it closes the logs.

Why it matters: a *daemon* thread that is inside a native call which released the GIL
(pyarrow reading Parquet, delta-rs committing on its tokio runtime) when the
interpreter finalizes is ended by CPython with ``pthread_exit`` the moment it tries to
take the GIL back. ``pthread_exit`` unwinds the thread's stack by force; reaching a C++
frame that may not throw (pyarrow's), libstdc++ calls ``std::terminate``, which prints
``terminate called without an active exception`` and aborts the whole process
(SIGABRT, exit code 134) after the program's work was done. The cleaner's worker is
such a daemon thread (a query must never wait on it), and so are the threads of a pass
it runs (the heartbeat, the niced reader).

The cure is to have no such thread left inside native code when finalization starts:
everything registered here (`stop_at_exit`) is stopped and joined, each after the round
it is running, before Python runs its ``atexit`` handlers. That order matters too:
pyspark's ``atexit`` handler kills the JVM and pyarrow's finalizes S3, and a pass cut
off by either fails half-way. The hook runs where ``concurrent.futures`` joins its
pools (``threading._register_atexit``, at the start of ``Py_FinalizeEx``, before
``atexit``), falling back to ``atexit`` on interpreters without it. A thread still busy
after `EXIT_TIMEOUT_S` is left as a crash would leave it: the log recovers on the next
open (SPEC rule 10).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Protocol

logger = logging.getLogger(__name__)

EXIT_TIMEOUT_S = 30.0
"""How long the exit waits, in all, for the registered threads to finish their round."""


class Stoppable(Protocol):
    """What can be stopped at exit: ``shutdown`` stops it after its current round and
    waits up to ``timeout_s`` for that. Must be idempotent."""

    def shutdown(self, timeout_s: float | None = None) -> None: ...


_registered: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_lock = threading.Lock()
_hooked = False


def stop_at_exit(stoppable: Stoppable) -> None:
    """Stop ``stoppable`` (``shutdown``) before the interpreter finalizes. Idempotent.

    Held weakly: an object collected before exit needs no stopping. Call it when the
    thread starts, so the exit hook is installed after the libraries' own.
    """
    global _hooked
    with _lock:
        _registered.add(stoppable)
        if not _hooked:
            _hooked = _install(stop_all)


def forget(stoppable: Stoppable) -> None:
    """No longer stop ``stoppable`` at exit (it was shut down already)."""
    with _lock:
        _registered.discard(stoppable)


def stop_all(timeout_s: float = EXIT_TIMEOUT_S) -> int:
    """Shut down every registered object, sharing ``timeout_s`` among them; returns how many."""
    with _lock:
        pending = list(_registered)
        _registered.clear()
    deadline = time.monotonic() + timeout_s
    for stoppable in pending:
        try:
            stoppable.shutdown(max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - one failed stop must not keep the others running
            logger.warning("stopping %r at exit failed", stoppable, exc_info=True)
    return len(pending)


def _install(hook) -> bool:
    """Run ``hook`` at interpreter exit before ``atexit`` handlers when possible."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(hook)
            return True
        except RuntimeError:  # the interpreter is already shutting down its threads
            pass
    atexit.register(hook)
    return True
