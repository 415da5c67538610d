"""Kafka records the log already holds (a redelivery) are dropped, and counted.

A second query from a fresh checkpoint reads the topic again from the start: its
records below the log end offset are already in the log. They are dropped, as
before, and now counted on the batch's line and in ``last_append``.
"""

from __future__ import annotations

import random

import pytest
from deltalake import DeltaTable
from testkit import arrow_append, state_of

from sinks import BadInputError, CleanerConfig, CompactedStateSink, read_state
from sinks.produce import log_append

KAFKA = "key string, value string, partition int, offset long"


def test_redelivered_offsets_are_counted_on_the_batch_line(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), clock=clock)
    first = [(f"k{i}", f"v{i}", i % 2, i // 2) for i in range(6)]  # offsets 0..2 in p0 and p1
    sink(spark.createDataFrame(first, KAFKA), 0)
    assert sink.last_append.redelivered == 0
    assert "redelivered record" not in sink.last_append.summary()

    again = CompactedStateSink(str(lake / "log"), sink_id="another-query", clock=clock)
    replayed = [*first, ("k6", "v6", 0, 3), ("k7", "v7", 1, 3)]
    again(spark.createDataFrame(replayed, KAFKA), 0)
    report = again.last_append
    assert (report.records, report.redelivered) == (2, 6)
    assert "dropped 6 redelivered record(s) below the log end offset (6 the log holds)" in (
        report.summary()
    )

    again(spark.createDataFrame(first, KAFKA), 1)  # nothing new at all
    assert (again.last_append.records, again.last_append.redelivered) == (0, 6)


# -- a record below the log end offset is dropped only when the log proves it obsolete ----------


def test_a_record_below_the_log_end_the_log_never_held_fails_the_batch(spark, lake, clock):
    """The repro: offset 20 first, then offset 10 of another key, which the log never held."""
    sink = CompactedStateSink(str(lake / "log"), clock=clock)
    sink(spark.createDataFrame([("a", "late", 0, 20)], KAFKA), 0)
    version = DeltaTable(str(lake / "log")).version()
    with pytest.raises(BadInputError) as caught:
        sink(spark.createDataFrame([("b", "early", 0, 10)], KAFKA), 1)
    message = str(caught.value)
    assert "partition 0: 1 record(s) at offsets 10-10 (keys 'b')" in message
    assert "below the log end offset 21" in message and "nothing was written" in message
    assert 'startingOffsets {"0": 21}' in message
    assert DeltaTable(str(lake / "log")).version() == version
    assert state_of(sink) == {"a": "late"}


def test_superseded_and_deleted_records_below_the_log_end_are_counted_by_reason(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), clock=clock)
    rows = [("k", "v0", 0, 0), ("k", "v1", 0, 1), ("j", "w2", 0, 2), ("m", "x3", 0, 3)]
    arrow_append(sink, rows, KAFKA, 0, spark=spark)
    sink.clean(force=True)  # k@0 leaves the log: superseded by k@1
    sink.delete_records(0, 1)
    again = CompactedStateSink(str(lake / "log"), sink_id="another-query", clock=clock)
    # k@0 is gone (below the log start), j@2 is held, and z@1's offset was k's, but z's newer
    # record comes in the same batch above the log end.
    arrow_append(
        again,
        [("k", "v0", 0, 0), ("z", "old", 0, 1), ("j", "w2", 0, 2), ("z", "new", 0, 5)],
        KAFKA,
        0,
        spark=spark,
    )
    report = again.last_append
    assert (report.records, report.redelivered) == (1, 3)
    assert (report.redeliveries.held, report.redeliveries.superseded) == (1, 1)
    assert report.redeliveries.deleted == 1
    assert (
        "1 the log holds, 1 superseded by newer records of their keys, 1 below the log start"
        in (report.summary())
    )
    assert read_state_dict(lake / "log") == {"k": "v1", "j": "w2", "m": "x3", "z": "new"}


def test_a_held_offset_of_another_key_is_not_taken_for_a_redelivery(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), clock=clock)
    arrow_append(sink, [("a", "1", 0, 0), ("b", "1", 0, 1)], KAFKA, 0, spark=spark)
    with pytest.raises(BadInputError, match=r"offsets 0-0 \(keys 'q'\)"):
        arrow_append(sink, [("q", "other", 0, 0)], KAFKA, 1, spark=spark)


def test_a_sequence_column_decides_what_supersedes_a_late_record(spark, lake, clock):
    schema = "key string, value string, partition int, offset long, seq long"
    sink = CompactedStateSink(str(lake / "log"), sequence_column="seq", clock=clock)
    arrow_append(sink, [("a", "new", 0, 5, 9), ("b", "b", 0, 6, 1)], schema, 0, spark=spark)
    arrow_append(
        sink, [("a", "older", 0, 2, 3)], schema, 1, spark=spark
    )  # ranked below a@5: obsolete
    assert sink.last_append.redeliveries.superseded == 1
    with pytest.raises(BadInputError, match="keys 'b'"):  # ranked above b@6: would win
        arrow_append(sink, [("b", "newer", 0, 3, 7)], schema, 2, spark=spark)
    assert read_state_dict(lake / "log") == {"a": "new", "b": "b"}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_record_below_the_log_end_is_lost_without_an_error_or_a_count(
    spark, lake, seed, clock_at
):
    """Against a model: random batches of explicit offsets (new ones with gaps, records the
    log held again, late ones into gaps and below the first offset, shuffled), with passes
    and delete_records between. Each batch either fails by name, changing nothing, or
    appends its records at or above the log end and counts every one below it."""
    rng = random.Random(seed)
    clock = clock_at(1_700_000_000_000)
    sink = CompactedStateSink(
        str(lake / "log"),
        sink_id=f"seed-{seed}",
        clock=clock,
        config=CleanerConfig(min_cleanable_dirty_ratio=0.01),
    )
    appended: dict[tuple[int, int], str] = {}  # (partition, offset) -> key, ever appended
    values: dict[tuple[int, int], str] = {}
    end = {0: 0, 1: 0}
    start = {0: 0, 1: 0}
    keys = {0: ["k0", "k1", "k2", "k3"], 1: ["k4", "k5", "k6", "k7"]}  # one partition a key
    failures = 0
    for batch_id in range(12):
        batch: dict[tuple[int, int], tuple[str, str]] = {}
        for p in (0, 1):
            offset = end[p]
            for _ in range(rng.randint(0, 4)):  # new records, offsets with gaps
                offset += rng.randint(1, 3)
                batch[(p, offset)] = (rng.choice(keys[p]), f"v{batch_id}.{offset}")
            held = [o for (q, o) in appended if q == p]
            for o in rng.sample(held, min(len(held), rng.randint(0, 3))):  # redelivered
                batch[(p, o)] = (appended[(p, o)], values[(p, o)])
            if rng.random() < 0.3:  # late: an offset below the log end the log never took
                gaps = [o for o in range(end[p]) if (p, o) not in appended]
                if gaps:
                    batch[(p, rng.choice(gaps))] = (rng.choice(keys[p]), f"late{batch_id}")
        rows = [(k, v, p, o) for (p, o), (k, v) in batch.items()]
        rng.shuffle(rows)
        below = [(p, o, k) for (p, o), (k, _) in batch.items() if o < end[p]]
        above = [(p, o, k) for (p, o), (k, _) in batch.items() if o >= end[p]]

        def proven(p, o, k, above=above):
            if o < start[p]:
                return True
            later = [
                q_o
                for (q, q_o), key in appended.items()
                if q == p and key == k and q_o >= max(o, start[p])
            ]
            later += [q_o for (q, q_o, key) in above if q == p and key == k]
            return any(q_o > o or appended.get((p, o)) == k for q_o in later)

        if not rows:
            continue
        if all(proven(*r) for r in below):
            arrow_append(sink, rows, KAFKA, batch_id, spark=spark)
            assert sink.last_append.redelivered == len(below)
            for p, o, k in above:
                appended[(p, o)], values[(p, o)] = k, batch[(p, o)][1]
                end[p] = max(end[p], o + 1)
        else:
            failures += 1
            version = DeltaTable(str(lake / "log")).version() if appended else None
            with pytest.raises(BadInputError, match="below the log end offset"):
                arrow_append(sink, rows, KAFKA, batch_id, spark=spark)
            if version is not None:
                assert DeltaTable(str(lake / "log")).version() == version
        if appended and batch_id % 4 == 3:
            sink.clean(force=True)
        if appended and batch_id == 7:
            start[1] = min(end[1], 2)
            sink.delete_records(1, start[1])
        expected = {}
        for (p, o), k in sorted(appended.items(), key=lambda e: e[0][1]):
            if o >= start[p]:
                expected[k] = values[(p, o)]
        assert read_state_dict(lake / "log") == (expected if appended else {})
    assert failures  # the workload did try late records


def test_a_batch_of_only_redeliveries_retries_its_commit_after_a_pass(
    spark, lake, clock, monkeypatch
):
    """A pass commits between the batch's read of the log and its empty commit: the commit is
    refused by delta-rs as concurrent, and retried, as an append of files is."""
    path = str(lake / "log")
    never = CleanerConfig(min_cleanable_dirty_ratio=1.0)  # the forced pass below cleans
    sink = CompactedStateSink(path, clock=clock, config=never)
    rows = [(f"k{i % 3}", f"v{i}", 0, i) for i in range(10)]
    arrow_append(sink, rows, KAFKA, 0, spark=spark)
    cleaner = CompactedStateSink(path, sink_id="cleaner", clock=clock)
    real = log_append.commit_empty
    raced = []

    def pass_first(snapshot, app_id, batch_id):
        if not raced:
            raced.append(cleaner.clean(force=True))
        return real(snapshot, app_id, batch_id)

    monkeypatch.setattr(log_append, "commit_empty", pass_first)
    again = CompactedStateSink(path, sink_id="second-query", clock=clock)
    arrow_append(again, rows, KAFKA, 0, spark=spark)
    assert raced and raced[0] is not None  # the pass did commit in between
    assert again.last_append.redelivered == 10 and again.last_append.records == 0
    assert DeltaTable(path).transaction_version(again.transactional_id.app_id(None)) == 0
    assert read_state_dict(lake / "log") == {"k0": "v9", "k1": "v7", "k2": "v8"}


def read_state_dict(path) -> dict[str, str]:
    table = read_state(str(path))
    return dict(
        zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
    )
