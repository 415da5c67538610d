"""Kafka records the log already holds (a redelivery) are dropped, and counted.

A second query from a fresh checkpoint reads the topic again from the start: its
records below the log end offset are already in the log. They are dropped, as
before, and now counted on the batch's line and in ``last_append``.
"""

from __future__ import annotations

from sinks import CompactedStateSink

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
    assert "dropped 6 redelivered record(s) whose offsets the log already holds" in report.summary()

    again(spark.createDataFrame(first, KAFKA), 1)  # nothing new at all
    assert (again.last_append.records, again.last_append.redelivered) == (0, 6)
