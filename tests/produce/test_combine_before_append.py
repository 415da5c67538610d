"""``combine.before.append``: a batch's superseded records are not stored, against a model.

Random batches with repeated keys and tombstones go into two logs, one with the setting
and one without; both are checked against the model (each key's latest record of each
batch, the offsets every record would get). Spark-free where the append is (Arrow rows
through `LogAppender`); a streaming query with Spark's writer and a forced pass use Spark.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T

from sinks import CleanerConfig, CompactedStateSink
from sinks.errors import BadInputError, ConfigError
from sinks.log.location import LogLocation
from sinks.log.log_config import alter_log_config, opened_log_config
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogTable
from sinks.produce.append_batch import ArrowRecords
from sinks.produce.dead_letter import DeadLetterTable
from sinks.produce.log_append import LogAppender
from sinks.produce.spark_append import APPEND_WRITER_ENV, PYTHON_WRITER, SPARK_WRITER
from sinks.reading.arrow_state import read_state

SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType()),
        T.StructField("value", T.StringType()),
        T.StructField("partition", T.IntegerType()),
    ]
)
OFF = CleanerConfig(min_cleanable_dirty_ratio=1.0)
ON = CleanerConfig(min_cleanable_dirty_ratio=1.0, combine_before_append=True)

Record = tuple[str, str | None, int]  # key, value (None: a tombstone), partition


def random_batches(seed: int, *, batches: int = 6, size: int = 60) -> list[list[Record]]:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(12)]
    return [
        [
            (
                key := rng.choice(keys),
                None if rng.random() < 0.2 else f"{key}-{b}-{i}",
                int(key[1:]) % 3,  # a key lives in one partition, as in Kafka
            )
            for i in range(size)
        ]
        for b in range(batches)
    ]


def arrow_batch(records: list[Record]) -> ArrowRecords:
    keys, values, partitions = zip(*records, strict=True) if records else ((), (), ())
    table = pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "value": pa.array(values, pa.string()),
            "partition": pa.array(partitions, pa.int32()),
        }
    )
    return ArrowRecords(table, SCHEMA)


class Model:
    """The log as Kafka numbers it: every record's offset; what a combined append keeps."""

    def __init__(self) -> None:
        self.end: dict[int, int] = {}
        self.every: list[tuple[int, int, str, str | None]] = []  # partition, offset, key, value
        self.combined: list[tuple[int, int, str, str | None]] = []

    def append(self, records: list[Record]) -> None:
        numbered = []
        for key, value, p in records:
            offset = self.end.get(p, 0)
            self.end[p] = offset + 1
            numbered.append((p, offset, key, value))
        self.every.extend(numbered)
        last = {(p, key): (p, o, key, v) for p, o, key, v in numbered}
        self.combined.extend(sorted(last.values()))

    def state(self) -> dict[str, str]:
        latest: dict[str, str | None] = {}
        for _p, _o, key, value in sorted(self.every, key=lambda r: (r[0], r[1])):
            latest[key] = value
        return {k: v for k, v in latest.items() if v is not None}


def stored(path: Path) -> list[tuple[int, int, str, str | None]]:
    snapshot = LogTable(str(path)).snapshot()
    assert snapshot is not None
    rows = []
    for segment in snapshot.all_segments():
        table = pq.read_table(path / segment.path, columns=["partition", "offset", "key", "value"])
        rows.extend((r["partition"], r["offset"], r["key"], r["value"]) for r in table.to_pylist())
    return sorted(rows)


def state_of(path: Path) -> dict[str, str]:
    table = read_state(str(path))
    return {r["key"]: r["value"] for r in table.to_pylist()}


def appender(path: Path, config: CleanerConfig, **kwargs: object) -> LogAppender:
    return LogAppender(
        LogTable(str(path)),
        keys=LogKeys(key_columns=("key",)),
        config=config,
        writer=PYTHON_WRITER,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("seed", [1, 7, 2026])
def test_a_combined_log_keeps_each_keys_last_record_of_a_batch_at_its_offset(lake, seed):
    model = Model()
    off, on = appender(lake / "off", OFF), appender(lake / "on", ON)
    for batch_id, records in enumerate(random_batches(seed)):
        model.append(records)
        off.append(arrow_batch(records), app_id="app", batch_id=batch_id)
        info = on.append(arrow_batch(records), app_id="app", batch_id=batch_id)
        assert info.snapshot.log_end_offsets() == model.end  # same offsets, same end
    assert stored(lake / "off") == sorted(model.every)
    assert stored(lake / "on") == sorted(model.combined)  # tombstones that are last: kept
    assert len(model.combined) < len(model.every)
    assert state_of(lake / "on") == state_of(lake / "off") == model.state()
    for path in ("off", "on"):
        assert LogTable(str(lake / path)).snapshot().log_end_offsets() == model.end


def test_a_replayed_batch_is_skipped_as_without_combining(lake):
    records = random_batches(3, batches=1)[0]
    on = appender(lake / "on", ON)
    on.append(arrow_batch(records), app_id="app", batch_id=0)
    before = stored(lake / "on")
    again = on.append(arrow_batch(records), app_id="app", batch_id=0)
    assert again.already_committed and stored(lake / "on") == before


def test_combining_is_refused_with_a_minimum_compaction_lag():
    with pytest.raises(ConfigError, match="combine.before.append.*min.compaction.lag.ms=1000"):
        CleanerConfig(combine_before_append=True, min_compaction_lag_ms=1000)
    with pytest.raises(ConfigError, match="min.compaction.lag.ms"):
        CleanerConfig.from_properties(
            {"combine.before.append": "true", "min.compaction.lag.ms": "1"}
        )
    with pytest.raises(ConfigError, match="combine.before.append must be true or false"):
        CleanerConfig.from_properties({"combine.before.append": "yes"})
    assert not CleanerConfig().combine_before_append
    assert CleanerConfig.from_properties({"combine.before.append": "TRUE"}).combine_before_append


def test_the_setting_is_stored_on_the_log_and_read_back_when_it_is_opened(lake):
    appender(lake / "on", ON).append(arrow_batch([("a", "1", 0)]), app_id="app", batch_id=0)
    table = LogTable(str(lake / "on"))
    configuration = table.snapshot().table.metadata().configuration
    assert configuration["compacted.sink.topic.combine.before.append"] == "true"
    resolved = opened_log_config(table, None)
    assert resolved.config.combine_before_append
    assert resolved.sources["combine.before.append"] == "log"


def test_a_job_file_and_configs_take_the_setting(lake):
    from streaming.jobs.job import load_job  # the job file's reader, a layer above

    job = lake / "job.toml"
    job.write_text(
        '[source]\nformat = "rate"\n[sink]\npath = "lake/users"\n'
        '[cleaner]\n"combine.before.append" = true\n'
    )
    assert load_job(job).logs[0].config.combine_before_append
    appender(lake / "log", OFF).append(arrow_batch([("a", "1", 0)]), app_id="app", batch_id=0)
    table = LogTable(str(lake / "log"))
    change = alter_log_config(table, add={"combine.before.append": "true"})
    assert change.changes == {"combine.before.append": ("false", "true")}
    assert opened_log_config(table, None).config.combine_before_append
    with pytest.raises(ConfigError, match="min.compaction.lag.ms"):
        alter_log_config(table, add={"min.compaction.lag.ms": "60000"})


def test_a_bad_record_in_a_superseded_position_is_reported_as_without_combining(lake):
    big = "x" * 200
    records = [("a", big, 0), ("b", "1", 0), ("a", "2", 0)]  # the bad "a" is superseded
    errors = []
    for name, config in (("off", OFF), ("on", ON)):
        small = config.with_settings(message_max_bytes=100)
        with pytest.raises(BadInputError) as caught:
            appender(lake / name, small).append(arrow_batch(records), app_id="a", batch_id=0)
        errors.append(str(caught.value).replace(str(lake / name), "LOG"))
    assert errors[0] == errors[1] and "1" in errors[0]


def test_a_superseded_bad_record_is_a_dead_letter_and_the_rest_is_combined(lake):
    big = "x" * 200
    records = [("a", big, 0), ("b", "1", 0), ("b", "2", 0), ("a", "3", 0)]
    dead = lake / "dead"
    config = ON.with_settings(message_max_bytes=100)
    letters = DeadLetterTable(LogLocation(str(dead)))
    appender(lake / "on", config, dead_letters=letters).append(
        arrow_batch(records), app_id="app", batch_id=0
    )
    assert letters.read().num_rows == 1
    # The bad row took no offset (it never reached the log); b's first record is a gap.
    assert stored(lake / "on") == [(0, 1, "b", "2"), (0, 2, "a", "3")]


def test_a_log_ordered_by_a_sequence_column_is_not_combined(lake):
    """The latest record follows ``seq`` there, not the offset: the last row of a key in a
    batch may be the older one, so every row is stored and the state is the sequence's."""
    schema = T.StructType([*SCHEMA.fields, T.StructField("seq", T.LongType())])
    records = pa.table(
        {
            "key": pa.array(["a", "a", "b"], pa.string()),
            "value": pa.array(["new", "old", "b1"], pa.string()),
            "partition": pa.array([0, 0, 0], pa.int32()),
            "seq": pa.array([5, 3, 1], pa.int64()),
        }
    )
    log = LogAppender(
        LogTable(str(lake / "seq")),
        keys=LogKeys(key_columns=("key",), sequence_column="seq"),
        config=ON,
        writer=PYTHON_WRITER,
    )
    log.append(ArrowRecords(records, schema), app_id="app", batch_id=0)
    assert stored(lake / "seq") == [(0, 0, "a", "new"), (0, 1, "a", "old"), (0, 2, "b", "b1")]
    assert state_of(lake / "seq") == {"a": "new", "b": "b1"}


# -- with Spark: a streaming query, a forced pass ------------------------------------------


def test_a_stream_and_a_forced_pass_leave_the_same_log_with_or_without_combining(
    spark, lake, monkeypatch
):
    """Spark's writer writes the log without combining; the combined one takes the Python
    task; both hold what the model says, and after a forced pass the same records."""
    monkeypatch.setenv(APPEND_WRITER_ENV, SPARK_WRITER)  # read when the sinks are built
    model = Model()
    sinks = {
        name: CompactedStateSink(
            str(lake / name),
            key_columns=["key"],
            config=config,
            checkpoint_location=str(lake / f"_chk_{name}"),
            cleaning="inline",  # dirty ratio 1.0: no pass until the forced one
        )
        for name, config in (("off", OFF), ("on", ON))
    }
    source = lake / "in"
    source.mkdir()
    for number, records in enumerate(random_batches(11, batches=3, size=80)):
        model.append(records)
        lines = [json.dumps({"key": k, "value": v, "partition": p}) for k, v, p in records]
        batch_file = source / f"{number:02d}.json"
        batch_file.write_text("\n".join(lines) + "\n")
        # Spark's file source takes files oldest first by modification time: one second apart,
        # so that files written within the same tick are not taken in another order.
        os.utime(batch_file, (1_700_000_000 + number, 1_700_000_000 + number))
    stream = (
        spark.readStream.schema("key string, value string, partition int")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
    )
    for name, sink in sinks.items():
        query = (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(lake / f"_chk_{name}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None
    assert stored(lake / "off") == sorted(model.every)
    assert stored(lake / "on") == sorted(model.combined)
    for sink in sinks.values():
        assert {r["key"]: r["value"] for r in sink.state().collect()} == model.state()
        assert sink.clean(force=True) is not None
    assert stored(lake / "on") == stored(lake / "off")
    assert state_of(lake / "on") == state_of(lake / "off") == model.state()
