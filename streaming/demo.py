"""The demo job: a streaming query of keyed updates and tombstones into a compacted log.

Spark's ``rate-micro-batch`` source numbers rows 0, 1, 2, …; row ``n`` becomes an
update of key ``user-(n * 7919 mod keys)`` in partition ``key mod partitions``,
and every ``tombstone_every``-th row deletes its key instead. Each micro-batch
prints what was appended, the dirty ratio and any cleaning pass; at the end the
sink's ``state()`` is checked against a plain replay of everything fed in.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks import CleanerConfig, CompactedStateSink

_MULTIPLIER = 7919  # a prime: successive rows touch keys spread over the key space


@dataclass(frozen=True, kw_only=True)
class DemoSettings:
    lake: str = "lake-demo"
    keys: int = 2_000
    partitions: int = 4
    rows_per_batch: int = 1_000
    batches: int = 30
    tombstone_every: int = 50
    min_cleanable_dirty_ratio: float = 0.5
    key_prefix: str = "user-"
    value_bytes: int | None = None  # None: "v<n>"; else hex digests of this size (incompressible)


def keyed_updates(spark: SparkSession, settings: DemoSettings) -> DataFrame:
    """The built-in source: a stream of keyed updates and tombstones in the Kafka shape."""
    rows = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", settings.rows_per_batch)
        .option("numPartitions", 1)
        .load()
    )
    n = F.col("value")
    key_id = (n * _MULTIPLIER) % settings.keys
    return rows.select(
        F.concat(F.lit(settings.key_prefix), key_id.cast("string")).alias("key"),
        F.when(n % settings.tombstone_every == settings.tombstone_every - 1, F.lit(None))
        .otherwise(_value(n, settings.value_bytes))
        .cast("binary")
        .alias("value"),
        (key_id % settings.partitions).cast("int").alias("partition"),
    )


def _value(n: Column, value_bytes: int | None) -> Column:
    if value_bytes is None:
        return F.concat(F.lit("v"), n.cast("string"))
    # Hex digests: values that do not compress away, as real payloads rarely do.
    digest = F.sha2(n.cast("string"), 256)
    return F.substring(F.concat(*[digest] * (value_bytes // 64 + 1)), 1, value_bytes)


def replay(settings: DemoSettings, fed: int) -> dict[str, bytes]:
    """What the state must be after ``fed`` rows: a dict replay of the same rows."""
    state: dict[str, bytes] = {}
    for n in range(fed):
        key = f"{settings.key_prefix}{n * _MULTIPLIER % settings.keys}"
        if n % settings.tombstone_every == settings.tombstone_every - 1:
            state.pop(key, None)
        else:
            state[key] = _replayed_value(n, settings.value_bytes)
    return state


def run(spark: SparkSession, settings: DemoSettings, *, out=print) -> bool:
    """Run the demo; returns True when ``state()`` matches the replay."""
    lake = Path(settings.lake)
    shutil.rmtree(lake, ignore_errors=True)
    config = CleanerConfig(
        min_cleanable_dirty_ratio=settings.min_cleanable_dirty_ratio,
        delete_retention_ms=0,
    )
    sink = CompactedStateSink(str(lake / "users"), key_columns=("key",), config=config)
    sink.add_pass_listener(lambda stats: out(f"cleaner: {stats.summary()}"))
    done = threading.Event()
    appended = 0

    def hook(batch: DataFrame, batch_id: int) -> None:
        nonlocal appended
        sink(batch, batch_id)
        report = sink.last_append
        assert report is not None
        appended += report.records
        out(report.summary())
        if batch_id + 1 >= settings.batches:
            done.set()

    out(
        f"demo: {settings.batches} micro-batches of {settings.rows_per_batch} updates over "
        f"{settings.keys} keys in {settings.partitions} partitions, 1 in "
        f"{settings.tombstone_every} a tombstone; min.cleanable.dirty.ratio="
        f"{settings.min_cleanable_dirty_ratio}; lake {lake.resolve()}"
    )
    query = (
        keyed_updates(spark, settings)
        .writeStream.foreachBatch(hook)
        .option("checkpointLocation", str(lake / "_chk" / "users"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    while not done.wait(0.5):
        if query.exception() is not None:
            raise query.exception()  # type: ignore[misc]
    query.stop()
    sink.close()  # waits for the background cleaner's pass in flight

    started = time.monotonic()
    fed = settings.batches * settings.rows_per_batch
    expected = replay(settings, fed)
    state = {r["key"]: bytes(r["value"]) for r in sink.state().collect()}
    stored = sink.log().count()
    matches = state == expected
    out(
        f"log: {appended} records appended, {stored} stored after cleaning "
        f"({stored / max(appended, 1):.0%}); dirty ratio now {sink.dirty_ratio():.2f}"
    )
    verdict = "matches" if matches else "DOES NOT match"
    out(
        f"state(): {len(state)} live keys; {verdict} a replay of all {fed} records fed in "
        f"({len(expected)} live keys) [checked in {time.monotonic() - started:.1f} s]"
    )
    return matches


def _replayed_value(n: int, value_bytes: int | None) -> bytes:
    if value_bytes is None:
        return f"v{n}".encode()
    digest = hashlib.sha256(str(n).encode()).hexdigest()
    return (digest * (value_bytes // 64 + 1))[:value_bytes].encode()
