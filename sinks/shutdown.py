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
open (design.md §10).

This is the process's one exit registry. A thread registered after that hook ran (a
worker started by a call still in flight when the wait for calls timed out) is stopped
by an ``atexit`` handler over the same registry.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar

from sinks.errors import InterpreterExitingError

logger = logging.getLogger(__name__)

EXIT_TIMEOUT_S = 30.0
"""How long the exit waits, in all, for the registered threads to finish their round."""


class Stoppable(Protocol):
    """What can be stopped at exit: ``shutdown`` stops it after its current round and
    waits up to ``timeout_s`` for that. Must be idempotent."""

    def shutdown(self, timeout_s: float | None = None) -> None: ...


P = ParamSpec("P")
R = TypeVar("R")


class _Calls:
    """The sink calls in flight (a ``foreachBatch`` runs on one of py4j's daemon threads)."""

    def __init__(self) -> None:
        self.count = 0
        self.exiting = False
        self.condition = threading.Condition()
        self.depth = threading.local()  # a call inside a call (the hook's inline pass) goes on

    def drain(self, timeout_s: float) -> bool:
        """Refuse new calls, then wait for those in flight; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self.condition:
            self.exiting = True
            while self.count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.condition.wait(remaining)
        return True


_calls = _Calls()


def finished_before_exit(call: Callable[P, R]) -> Callable[P, R]:
    """Decorate a call that runs native code (a batch's append, a pass): the interpreter's
    exit waits for it to finish, and refuses it (`InterpreterExitingError`, before it
    starts) once the exit has begun. Installs the exit hook on first use."""

    @functools.wraps(call)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        _hook()
        depth = getattr(_calls.depth, "n", 0)
        with _calls.condition:
            if _calls.exiting and depth == 0:
                raise InterpreterExitingError(
                    "the interpreter is exiting: this call was refused before it wrote "
                    "anything (a restarted query runs the batch again)"
                )
            _calls.count += 1
        _calls.depth.n = depth + 1
        try:
            return call(*args, **kwargs)
        finally:
            _calls.depth.n = depth
            with _calls.condition:
                _calls.count -= 1
                _calls.condition.notify_all()

    return guarded


_registered: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_lock = threading.Lock()
_hooked = False


def stop_at_exit(stoppable: Stoppable) -> None:
    """Stop ``stoppable`` (``shutdown``) before the interpreter finalizes. Idempotent.

    Held weakly: an object collected before exit needs no stopping. Call it when the
    thread starts, so the exit hook is installed after the libraries' own.
    """
    with _lock:
        _registered.add(stoppable)
    _hook()


def forget(stoppable: Stoppable) -> None:
    """No longer stop ``stoppable`` at exit (it was shut down already)."""
    with _lock:
        _registered.discard(stoppable)


def stop_all(timeout_s: float = EXIT_TIMEOUT_S) -> int:
    """Refuse new sink calls, wait for those in flight, then shut down every registered
    object; ``timeout_s`` is shared by all. Returns how many objects were shut down."""
    deadline = time.monotonic() + timeout_s
    if not _calls.drain(timeout_s):
        logger.warning("sink calls still running at exit after %.0f s", timeout_s)
    return _stop_registered(deadline)


def _stop_registered(deadline: float) -> int:
    with _lock:
        pending = list(_registered)
        _registered.clear()
    for stoppable in pending:
        try:
            stoppable.shutdown(max(0.0, deadline - time.monotonic()))
        except Exception:  # one failed stop must not keep the others running
            logger.warning("stopping %r at exit failed", stoppable, exc_info=True)
    return len(pending)


def _stop_latecomers() -> None:
    """At ``atexit``: stop what was registered after `stop_all` ran (nothing, usually)."""
    _stop_registered(time.monotonic() + EXIT_TIMEOUT_S)


def _hook() -> None:
    global _hooked
    with _lock:
        if not _hooked:
            _hooked = _install(stop_all)


def _install(hook: Callable[[], object]) -> bool:
    """Run ``hook`` at interpreter exit before ``atexit`` handlers when possible."""
    atexit.register(_stop_latecomers)  # registered first, so it runs after ``hook``
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(hook)
            return True
        except RuntimeError:  # the interpreter is already shutting down its threads
            pass
    atexit.register(hook)
    return True
