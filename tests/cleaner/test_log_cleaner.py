"""Cleaning off the batch's path: the `LogCleaner` worker beside a streaming query."""

from __future__ import annotations

import json
import os
import pickle
import threading

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable

from sinks import CleanerConfig, CompactedStateSink
from sinks.crash_points import APPEND_BEFORE_COMMIT, CLEAN_BEFORE_COMMIT, armed

EAGER = CleanerConfig(min_cleanable_dirty_ratio=0.01)
KV = "key string, value string"


def batch(spark, n, keys=5):
    rows = [(f"k{(n * 7 + i) % keys}", f"v{n}-{i}") for i in range(6)]
    return spark.createDataFrame(rows, KV).coalesce(1)


def expected_state(spark, batches, keys=5):
    latest = {}
    for n in batches:
        for i in range(6):
            latest[f"k{(n * 7 + i) % keys}"] = f"v{n}-{i}"
    return spark.createDataFrame(sorted(latest.items()), KV)


def commit_kinds(path):
    kinds = []
    for h in reversed(DeltaTable(path).history()):
        info = h.get("compactedSink") or {}
        kinds.append((json.loads(info) if isinstance(info, str) else info).get("operation"))
    return [k for k in kinds if k]


def sorted_state(sink):
    return sink.state().orderBy("key")


def test_passes_run_on_the_worker_inside_a_streaming_query(spark, lake, clock, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    for n in range(4):
        rows = [{"key": f"k{(n * 7 + i) % 5}", "value": f"v{n}-{i}"} for i in range(6)]
        written = source / f"{n}.json"
        written.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(written, (1_700_000_000 + n, 1_700_000_000 + n))  # the file source's order
    sink = CompactedStateSink(str(lake / "log"), config=EAGER, clock=clock)
    passes = []
    sink.add_pass_listener(lambda stats: passes.append(threading.current_thread().name))
    inline = []

    def hook(df, batch_id):
        sink(df, batch_id)
        inline.append(sink.last_append.clean)

    query = (
        spark.readStream.schema(KV)
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(hook)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    sink.close()

    assert inline == [None] * 4  # no batch waited for a pass
    assert passes and all(name.startswith("log-cleaner-") for name in passes)
    assert not sink.log_cleaner.running  # close() stopped the worker
    assert "clean" in commit_kinds(sink.path)
    assert_df_equality(sorted_state(sink), expected_state(spark, range(4)))


def test_an_append_does_not_wait_for_a_pass_in_flight(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=EAGER, clock=clock, cleaning="background")
    in_pass, release = threading.Event(), threading.Event()

    def hold_the_pass():
        in_pass.set()
        assert release.wait(120)

    with armed(CLEAN_BEFORE_COMMIT, hold_the_pass):
        sink(batch(spark, 0), 0)  # wakes the worker, whose pass stops before its commit
        assert in_pass.wait(120)
        sink(batch(spark, 1), 1)  # appends and commits while the pass is held
        assert sink.last_append.records == 6 and sink.last_append.clean is None
        release.set()
        assert sink.await_cleaner(120)
    sink.close()

    kinds = commit_kinds(path)
    assert kinds[:3] == ["append", "append", "clean"]  # the held pass committed after batch 1
    assert_df_equality(sorted_state(sink), expected_state(spark, range(2)))


def test_a_pass_committing_first_only_makes_the_append_retry(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=EAGER, clock=clock, cleaning="background")
    in_pass, release = threading.Event(), threading.Event()

    def hold_the_pass():
        in_pass.set()
        assert release.wait(120)

    def let_the_pass_commit_first():
        release.set()
        assert sink.await_cleaner(120)

    with armed(CLEAN_BEFORE_COMMIT, hold_the_pass):
        sink(batch(spark, 0), 0)
        assert in_pass.wait(120)
        with armed(APPEND_BEFORE_COMMIT, let_the_pass_commit_first):
            sink(batch(spark, 1), 1)  # written before the pass's commit, committed after it
    assert sink.await_cleaner(120)
    sink.close()

    assert commit_kinds(path)[:3] == ["append", "clean", "append"]
    assert_df_equality(sorted_state(sink), expected_state(spark, range(2)))
    offsets = sorted(r.offset for r in sink.log().collect())
    assert len(offsets) == len(set(offsets))


def test_a_sink_with_a_running_worker_pickles_without_it(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=EAGER, clock=clock, cleaning="background")
    sink(batch(spark, 0), 0)
    copy = pickle.loads(pickle.dumps(sink))
    assert sink.await_cleaner(120)
    sink.close()
    assert copy._log_cleaner is None and copy.path == sink.path
    copy(batch(spark, 1), 1)  # the copy appends and makes a worker of its own
    assert copy.await_cleaner(120)
    copy.close()
    assert_df_equality(sorted_state(copy), expected_state(spark, range(2)))


@pytest.fixture
def plans(monkeypatch, lake) -> list[int]:
    """One entry per `LogPlanner.plan` call of a log under ``lake`` from here on (clear it
    to count anew). Another test's sink whose cleaner thread still runs in this process
    plans its own log: not counted."""
    from sinks.cleaner.pass_planning import LogPlanner

    calls: list[int] = []
    original = LogPlanner.plan

    def counted(self, *args, **kwargs):
        if str(lake) in str(self.log.uri):
            calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LogPlanner, "plan", counted)
    return calls


@pytest.fixture
def choices(monkeypatch, lake) -> list[int]:
    """One entry per choice of the filthiest partitions (`CleaningPlan.choose`'s only
    call of `filthiest_cleanable`) among logs under ``lake`` from here on."""
    from sinks.cleaner import pass_planning

    calls: list[int] = []
    original = pass_planning.filthiest_cleanable

    def counted(candidates, *args, **kwargs):
        if any(str(lake) in c.log_path for c in candidates):
            calls.append(1)
        return original(candidates, *args, **kwargs)

    monkeypatch.setattr(pass_planning, "filthiest_cleanable", counted)
    return calls


def test_a_batch_plans_the_log_once(spark, lake, clock, plans, choices):
    """The hand-over measures the log once: whether a round has work, the batch's dirty
    ratio and the pass share one plan, and the pass's new version is measured for the
    report (before: two plans a batch, four with a pass; then three with a pass, the
    pass planning its version again)."""
    never = CleanerConfig(min_cleanable_dirty_ratio=1.0)
    idle = CompactedStateSink(str(lake / "idle"), config=never, clock=clock, cleaning="inline")
    idle(batch(spark, 0), 0)  # the first round gives the segment deleter its turn
    plans.clear()
    idle(batch(spark, 1), 1)  # nothing cleanable, the deleter not due: no round
    assert len(plans) == 1 and idle.last_append.clean is None
    plans.clear()
    eager = CompactedStateSink(str(lake / "eager"), config=EAGER, clock=clock, cleaning="inline")
    choices.clear()
    eager(batch(spark, 0), 0)  # a key repeats: a pass runs inline
    assert eager.last_append.clean is not None
    assert len(plans) == 2  # the batch's plan (the pass's too), the pass's new version
    assert len(choices) == 1  # whether a round has work and what the pass claims: one choice


def test_a_round_of_the_cleaner_thread_plans_its_pass_once(spark, lake, clock, plans, choices):
    """The thread measures a log to choose it, and its pass goes on from that measure
    instead of planning the same version again (before: two plans a pass)."""
    from sinks.cleaner.log_cleaner import CleanerLoop
    from sinks.cleaner.pass_planning import RoundRequest

    # backoff 0: checkpoint rows are read fresh by every plan, so the choice's plan serves
    never = CleanerConfig(min_cleanable_dirty_ratio=1.0, backoff_ms=0)
    sink = CompactedStateSink(str(lake / "log"), config=never, clock=clock, cleaning="inline")
    sink(batch(spark, 0), 0)
    sink(batch(spark, 1), 1)  # nothing cleanable by ratio: no pass yet
    assert sink.last_append.clean is None
    plans.clear()
    choices.clear()
    loop = CleanerLoop([sink.log_cleaner], request=RoundRequest(force=True))
    assert loop.run_once(spark) == 1
    assert len(plans) == 1
    assert len(choices) == 1  # the log's choice, its work and its pass's claim share one
    assert_df_equality(sorted_state(sink), expected_state(spark, range(2)))
