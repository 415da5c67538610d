"""A model-based test: random batches, tombstones, clock moves, passes, retention and restarts.

After every step the log is checked against a plain model of everything appended:
``state()`` equals the dict oracle over the records at or above each log start
offset; offsets are unique, increasing and continue from the log end (design.md §1);
records at or above a pass's end are untouched (design.md §5); below it each key has
at most one record, its latest below the end (design.md §6); a tombstone kept below it
carries the horizon of the pass that first kept it and has not outlived a later
pass (design.md §7). Figures: ``max_examples=5`` histories of one append plus 8 to 12 steps each,
derandomized (the same histories on every run), deadline None. The batches are fed
without Spark (`testkit.arrow_append`: the sink's own append, the Python writer a small
batch takes through Spark too); passes and ``state()`` run on Spark.
"""

from __future__ import annotations

import shutil
import tempfile

from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testkit import arrow_append, state_of

from sinks import CleanerConfig, CompactedStateSink

CONFIG = CleanerConfig(
    cleanup_policy="compact,delete",
    min_cleanable_dirty_ratio=0.5,
    delete_retention_ms=1_000,
    min_compaction_lag_ms=500,
    retention_ms=6_000,
    file_delete_delay_ms=0,
)
KEYS = [f"k{i}" for i in range(6)]
SCHEMA = "key string, value string, partition int"

record = st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.sampled_from(["a", "b", "c"])))
batch = st.lists(record, min_size=1, max_size=6)
append = st.tuples(st.just("append"), batch)
tick = st.tuples(st.just("tick"), st.sampled_from([0, 700, 1_500, 4_000]))
clean = st.tuples(st.just("clean"), st.booleans(), st.sampled_from([0, 700]))  # force, tick first
delete_records = st.tuples(
    st.just("delete_records"), st.sampled_from([0, 1]), st.sampled_from([0.5, 1.0])
)
restart = st.tuples(st.just("restart"))
# Appends, ticks and passes weigh more than retention and restarts (one_of would
# collapse repeated strategies; sampling a list keeps the weights).
step = st.sampled_from(
    [append, append, append, tick, tick, clean, clean, clean, delete_records, restart]
).flatmap(lambda chosen: chosen)
FIGURES = {"examples": 0, "steps": 0, "records_checked": 0, "passes": 0, "restarts": 0}


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


class LogModel:
    """Every record ever appended, per partition, and the figures the checks need."""

    def __init__(self) -> None:
        self.records: dict[int, list[tuple[str, str | None]]] = {0: [], 1: []}
        self.starts = {0: 0, 1: 0}
        self.pass_starts: set[int] = set()
        self.last_pass_start: dict[int, int] = {}
        self.checked = 0

    def append(self, rows) -> None:
        for key, value in rows:
            self.records[partition_of(key)].append((key, value))

    def passed(self, stats) -> None:
        if stats is not None:
            FIGURES["passes"] += 1
            self.pass_starts.add(stats.start_ms)
            for p in stats.partitions:
                self.last_pass_start[p] = stats.start_ms

    def state(self) -> dict[str, str]:
        latest: dict[str, str | None] = {}
        for p, records in self.records.items():
            for key, value in records[self.starts[p] :]:
                latest[key] = value
        return {k: v for k, v in latest.items() if v is not None}

    def latest_below(self, p: int, end: int) -> dict[str, int]:
        latest = {}
        for offset in range(self.starts[p], min(end, len(self.records[p]))):
            latest[self.records[p][offset][0]] = offset
        return latest


def partition_of(key: str) -> int:
    return int(key[1:]) % 2


def check(sink, model: LogModel) -> None:
    snapshot = sink.log_table.snapshot()
    if snapshot is None:
        assert not any(model.records.values())
        return
    for p in (0, 1):
        start = snapshot.log_start_offset(p)
        assert start >= model.starts[p], "the log start offset went back"
        model.starts[p] = start
        assert snapshot.log_end_offset(p) == len(model.records[p]), "offsets do not continue"
    assert state_of(sink) == model.state()

    live = DeltaTable(sink.path).to_pyarrow_table(
        columns=["key", "value", "partition", "offset", "delete_horizon_ms"]
    )
    by_partition: dict[int, list[dict]] = {0: [], 1: []}
    for row in live.to_pylist():
        if row["offset"] >= model.starts[row["partition"]]:
            by_partition[row["partition"]].append(row)
    for p, rows in by_partition.items():
        offsets = [r["offset"] for r in rows]
        assert len(offsets) == len(set(offsets)), f"partition {p} repeats an offset"
        end = snapshot.cleaner_offset(p) or 0
        for r in rows:  # every stored record is the one appended at its offset
            assert (r["key"], r["value"]) == model.records[p][r["offset"]]
        present = set(offsets)
        for offset in range(max(end, model.starts[p]), len(model.records[p])):
            assert offset in present, f"rule 5: offset {offset} >= {end} was touched"
        below = [r for r in rows if r["offset"] < end]
        keys = [r["key"] for r in below]
        assert len(keys) == len(set(keys)), "rule 6: a key has two records below the pass end"
        latest = model.latest_below(p, end)
        for r in below:
            assert latest[r["key"]] == r["offset"], "rule 6: a superseded record survived"
        for offset in latest.values():
            if model.records[p][offset][1] is not None:
                assert offset in present, "rule 6: the latest record of a key was lost"
        for r in below:
            if r["value"] is None:
                horizon = r["delete_horizon_ms"]
                assert horizon is not None, "rule 7: a kept tombstone has no delete horizon"
                assert horizon - CONFIG.delete_retention_ms in model.pass_starts
                assert horizon >= model.last_pass_start.get(p, 0), "rule 7: expired, not removed"
        model.checked += len(rows)
        FIGURES["records_checked"] += len(rows)


@settings(
    max_examples=5,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(first=batch, steps=st.lists(step, min_size=8, max_size=12))
def test_random_histories_match_the_model(spark, first, steps):
    lake = tempfile.mkdtemp(prefix="model-")
    try:
        clock = Clock()
        path = f"{lake}/log"
        sink = CompactedStateSink(path, config=CONFIG, clock=clock)
        model = LogModel()
        batch_id = 0
        FIGURES["examples"] += 1
        for action, *args in [("append", first), *steps]:
            FIGURES["steps"] += 1
            if action == "append":
                rows = [(k, v, partition_of(k)) for k, v in args[0]]
                arrow_append(sink, rows, SCHEMA, batch_id, spark=spark)
                batch_id += 1
                model.append(args[0])
                model.passed(sink.last_append.clean if sink.last_append else None)
            elif action == "tick":
                clock.now += args[0]
            elif action == "clean":
                clock.now += args[1]
                if sink.log_table.snapshot() is not None:
                    model.passed(sink.clean(force=args[0]))
            elif action == "delete_records":
                p, fraction = args
                snapshot = sink.log_table.snapshot()
                if snapshot is not None:
                    start, end = snapshot.log_start_offset(p), snapshot.log_end_offset(p)
                    sink.delete_records(p, start + round((end - start) * fraction))
            elif action == "restart":
                FIGURES["restarts"] += 1
                sink = CompactedStateSink(path, config=CONFIG, clock=clock)
                if sink.log_table.snapshot() is not None:
                    sink.recover()
            check(sink, model)
    finally:
        shutil.rmtree(lake, ignore_errors=True)
    print("model-based test figures:", FIGURES)
