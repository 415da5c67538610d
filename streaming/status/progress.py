"""Progress: a line per micro-batch, and progress lines for long work (a pass, a replay, an export).

Three pieces, all printing plain text lines (to stderr by default, so a job's
stdout stays machine-readable):

- `ProgressHook` wraps a sink's foreachBatch hook and prints the sink's own
  summary of each batch (records appended, dirty ratio), and a line for each
  pass the sink's cleaner commits, inline or from its background worker.
- `ProgressListener` is a `StreamingQueryListener`: Spark's view of each
  micro-batch (input rows, rate, duration), for queries whose sink is not ours.
- `spark_progress` is a context manager that follows Spark's task counts while
  long work runs and prints ``<label>: done/total tasks done (of those known so
  far), elapsed`` (the status tracker on a classic session, a progress handler on
  Spark Connect). No percentage: long work runs several Spark jobs and Spark learns
  a job's tasks when it starts, so done/total would run backwards at each new job.

Under Spark Connect a `StreamingQueryListener` added with ``spark.streams.addListener``
runs in the client, so `ProgressListener` prints where the query was started.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from sinks import CleanerStats, CompactedStateSink
from sinks.spark_session import is_connect

Out = Callable[[str], None]


def stderr_line(line: str) -> None:
    """Print one progress line to stderr, flushed (the default ``out``)."""
    print(line, file=sys.stderr, flush=True)


class ProgressHook:
    """A foreachBatch hook: runs ``sink`` on the batch, then prints its one-line summary.

    Passes print their own line when they commit (a pass that ran inline is part
    of the batch's line instead). Idempotent exactly as the sink is (a replayed
    batch prints "already committed").
    """

    def __init__(
        self, sink: CompactedStateSink, *, out: Out = stderr_line, label: str = ""
    ) -> None:
        self.sink = sink
        self.out = out
        self.label = label
        self._listening = False
        self._in_hook = threading.local()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        if not self._listening:
            self.sink.add_pass_listener(self._passed)
            self._listening = True
        self._in_hook.active = True
        try:
            self.sink(batch_df, batch_id)
        finally:
            self._in_hook.active = False
        report = self.sink.last_append
        if report is not None:
            self.out(f"{self.label}{report.summary()}")

    def __getstate__(self) -> dict[str, object]:
        # A thread-local cannot be pickled; a hook shipped to Spark Connect's foreachBatch
        # worker makes its own, and registers with the sink's cleaner there.
        state = dict(self.__dict__)
        del state["_in_hook"]
        state["_listening"] = False
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._in_hook = threading.local()

    def _passed(self, stats: CleanerStats) -> None:
        if not getattr(self._in_hook, "active", False):  # an inline pass is in the batch's line
            self.out(f"{self.label}cleaner: {stats.summary()}")


class ProgressListener(StreamingQueryListener):
    """Prints one line per micro-batch from Spark's `StreamingQueryProgress`."""

    def __init__(self, out: Out = stderr_line) -> None:
        self.out = out

    def onQueryStarted(self, event) -> None:
        self.out(f"query {event.name or event.id} started (run {event.runId})")

    def onQueryProgress(self, event) -> None:
        self.out(progress_line(event.progress))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        tail = f" with error: {event.exception.splitlines()[0]}" if event.exception else ""
        self.out(f"query {event.id} terminated{tail}")


def progress_line(p) -> str:
    """One line for a `StreamingQueryProgress`: batch, input rows, rate, duration."""
    total_ms = (p.durationMs or {}).get("triggerExecution", 0)
    rate = p.processedRowsPerSecond or 0.0
    return (
        f"query {p.name or p.id} batch {p.batchId}: {p.numInputRows} input rows, "
        f"{rate:.0f} rows/s, {total_ms / 1000:.1f} s"
    )


@contextmanager
def query_progress(query, *, out: Out = stderr_line, every_s: float = 1.0) -> Iterator[None]:
    """Print a `progress_line` per micro-batch of ``query`` while the block runs.

    Polls ``query.recentProgress`` from a daemon thread, and once more at the end.
    For Spark Connect, where the query's hook prints in the server's process: a
    `ProgressListener` would do too, but its event thread cannot be stopped without
    waiting on the server, and a stuck stream would keep the process alive.
    """
    seen: set[int] = set()
    stop = threading.Event()

    def poll() -> None:
        try:
            for p in query.recentProgress:
                if p.batchId not in seen:
                    seen.add(p.batchId)
                    out(progress_line(p))
        except Exception:  # a query that ended mid-poll: the last poll reports
            pass

    def loop() -> None:
        while not stop.wait(every_s):
            poll()

    thread = threading.Thread(target=loop, name="query-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        poll()


@contextmanager
def spark_progress(
    spark: SparkSession, label: str, *, out: Out = stderr_line, every_s: float = 2.0
) -> Iterator[None]:
    """Print ``label: done/total tasks`` lines while the block runs Spark jobs.

    Prints only when the count changed, at most every ``every_s``, and a final line
    with the elapsed time. A classic session is polled through the status tracker
    of the block's job group, in a daemon thread; a Spark Connect session, which has
    no status tracker, reports the progress of each operation to a handler that the
    block registers (the tasks of the operation running now are counted).
    """
    started = time.monotonic()
    if is_connect(spark):
        handler = _ConnectProgress(label, out, every_s, started)
        spark.registerProgressHandler(handler)
        try:
            yield
        finally:
            spark.removeProgressHandler(handler)
            out(f"{label}: done in {time.monotonic() - started:.1f} s")
        return
    context = spark.sparkContext
    group = f"compacted-sink-{label}-{time.monotonic_ns()}"
    context.setJobGroup(group, label, interruptOnCancel=False)
    tracker = context.statusTracker()
    stop = threading.Event()

    def poll() -> None:
        last = None
        while not stop.wait(every_s):
            done = total = 0
            for job_id in tracker.getJobIdsForGroup(group):
                job = tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job else []:
                    stage = tracker.getStageInfo(stage_id)
                    if stage:
                        done += stage.numCompletedTasks
                        total += stage.numTasks
            if total and (done, total) != last:
                last = (done, total)
                out(
                    f"{label}: {done}/{total} tasks done (of those known so far), "
                    f"{time.monotonic() - started:.0f} s"
                )

    thread = threading.Thread(target=poll, name=f"progress-{label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        context.setLocalProperty("spark.jobGroup.id", None)
        out(f"{label}: done in {time.monotonic() - started:.1f} s")


class _ConnectProgress:
    """A Spark Connect progress handler printing ``label: done/total tasks`` lines."""

    def __init__(self, label: str, out: Out, every_s: float, started: float) -> None:
        self.label = label
        self.out = out
        self.every_s = every_s
        self.started = started
        self._last: tuple[int, int] | None = None
        self._printed = 0.0

    def __call__(self, stages, inflight_tasks: int, operation_id, done: bool) -> None:
        stages = list(stages or [])
        total = sum(s.num_tasks for s in stages)
        finished = sum(s.num_completed_tasks for s in stages)
        now = time.monotonic()
        if not total or (finished, total) == self._last or now - self._printed < self.every_s:
            return
        self._last, self._printed = (finished, total), now
        self.out(
            f"{self.label}: {finished}/{total} tasks done (of those known so far), "
            f"{now - self.started:.0f} s"
        )
