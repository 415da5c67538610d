"""The demo job: a streaming query of keyed updates and tombstones into a compacted log.

Spark's ``rate-micro-batch`` source numbers rows 0, 1, 2, …; row ``n`` becomes an
update of key ``user-(n * 7919 mod keys)`` in partition ``key mod partitions``,
and every ``tombstone_every``-th row deletes its key instead. Each micro-batch
prints what was appended, the dirty ratio and any cleaning pass; at the end the
sink's ``state()`` is checked against a plain replay of everything fed in.

The demo starts from an empty lake, so it wipes its lake first, and only its own:
the lake must be missing, empty, or an earlier demo's lake (`prepare_lake`). An earlier
demo's lake is recognised by the marker file the demo writes in it
(``compacted-sink-demo.json``), never by its layout alone: ``users``, ``_chk`` and
``_cleaner-offset-checkpoint`` are also what a user following the README creates.
Even then, a file the demo did not write anywhere in the lake makes it refuse.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from checkpoints import now_ms
from sinks import CleanerConfig, CompactedStateSink, NotACompactedLogError
from sinks.log import (
    DELTA_LOG_DIR,
    foreign_entries,
    is_delta_rs_data_path,
)

_MULTIPLIER = 7919  # a prime: successive rows touch keys spread over the key space

DEMO_MARKER = "compacted-sink-demo.json"
"""The file that makes a directory an earlier demo's lake (written when the demo starts)."""
LOG_DIR, CHECKPOINT_DIR, QUERY_CHECKPOINT_DIR = "users", "_cleaner-offset-checkpoint", "_chk"
# Spark's checkpoint files, with the checksum file Hadoop's local file system writes beside
# each (".<name>.crc") and a commit's temporary file (".<name>.<uuid>.tmp"), whose checksum
# ("..<name>.<uuid>.tmp.crc") outlives it when the query stops between the two.
_SPARK_CHECKPOINT_FILE = re.compile(
    r"users/(?:\.{0,2}metadata(?:\.[0-9a-f-]+\.tmp)?(?:\.crc)?"
    r"|(?:offsets|commits|sources/\d+)/\.{0,2}\d+(?:\.compact)?(?:\.[0-9a-f-]+\.tmp)?(?:\.crc)?)"
)
_SPARK_CHECKPOINT_DIR = re.compile(r"users|users/(?:offsets|commits|sources|sources/\d+)")


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


def expected_state(settings: DemoSettings, fed: int) -> dict[str, bytes]:
    """What the state must be after ``fed`` rows: a dict replay of the same rows."""
    state: dict[str, bytes] = {}
    for n in range(fed):
        key = f"{settings.key_prefix}{n * _MULTIPLIER % settings.keys}"
        if n % settings.tombstone_every == settings.tombstone_every - 1:
            state.pop(key, None)
        else:
            state[key] = _replayed_value(n, settings.value_bytes)
    return state


def demo_strangers(entries: list[tuple[str, bool]]) -> list[str]:
    """Of a lake's ``(relative path, is directory)`` entries, those an earlier demo did not
    write (sorted): anything beside its log, its checkpoint table, its query's checkpoint
    and its marker, or inside them anything not in their own layout and naming. Pure."""
    inside: dict[str, list[tuple[str, bool]]] = {}
    strangers = []
    for path, is_dir in entries:
        top, _, rest = path.strip("/").partition("/")
        if not rest and (
            (is_dir and top in (LOG_DIR, CHECKPOINT_DIR, QUERY_CHECKPOINT_DIR))
            or (not is_dir and top == DEMO_MARKER)
        ):
            continue
        if rest and top in (LOG_DIR, CHECKPOINT_DIR, QUERY_CHECKPOINT_DIR):
            inside.setdefault(top, []).append((rest, is_dir))
        else:
            strangers.append(path + ("/" if is_dir else ""))
    log_entries = [(p, d) for p, d in inside.get(LOG_DIR, []) if not _in_delta_log(p)]
    strangers += [f"{LOG_DIR}/{p}" for p in foreign_entries(log_entries)]
    for path, is_dir in inside.get(CHECKPOINT_DIR, []):
        if not (_in_delta_log(path) or (not is_dir and is_delta_rs_data_path(path))):
            strangers.append(f"{CHECKPOINT_DIR}/{path}" + ("/" if is_dir else ""))
    for path, is_dir in inside.get(QUERY_CHECKPOINT_DIR, []):
        pattern = _SPARK_CHECKPOINT_DIR if is_dir else _SPARK_CHECKPOINT_FILE
        if pattern.fullmatch(path) is None:
            strangers.append(f"{QUERY_CHECKPOINT_DIR}/{path}" + ("/" if is_dir else ""))
    return sorted(strangers)


def _in_delta_log(path: str) -> bool:
    return path == DELTA_LOG_DIR or path.startswith(DELTA_LOG_DIR + "/")


def prepare_lake(lake: Path) -> None:
    """Make ``lake`` an empty demo lake: create it, or wipe an earlier demo's lake.

    Raises `NotACompactedLogError` (nothing deleted) as `check_lake` does.
    """
    check_lake(lake)
    for name in (LOG_DIR, CHECKPOINT_DIR, QUERY_CHECKPOINT_DIR):
        shutil.rmtree(lake / name, ignore_errors=True)
    lake.mkdir(parents=True, exist_ok=True)
    (lake / DEMO_MARKER).write_text(
        json.dumps({"written_by": "compacted-sink demo", "written_ms": now_ms()})
    )


def check_lake(lake: Path) -> None:
    """Raise `NotACompactedLogError` unless ``lake`` is missing, empty, or an earlier demo's
    lake holding only what the demo wrote: a file, a non-empty directory without the
    demo's marker, an earlier demo's lake with a file it did not write. Reads only."""
    if lake.exists() and not lake.is_dir():
        raise NotACompactedLogError(
            f"--lake {lake}: a file, not a directory; choose another --lake", path=str(lake)
        )
    entries = (
        [
            (str(p.relative_to(lake)), p.is_dir() and not p.is_symlink())
            for p in sorted(lake.rglob("*"))
        ]
        if lake.exists()
        else []
    )
    if entries and not (lake / DEMO_MARKER).is_file():
        shown = ", ".join([p for p, _ in entries if "/" not in p][:5])
        raise NotACompactedLogError(
            f"--lake {lake} is not empty ({shown}) and is not an earlier demo's lake (it has "
            f"no {DEMO_MARKER}). The demo wipes its lake before it runs, so it runs only in "
            "a missing or empty directory or in a lake an earlier demo created. Nothing was "
            "deleted; choose another --lake (the default is lake-demo)",
            path=str(lake),
        )
    strangers = demo_strangers(entries)
    if strangers:
        shown = ", ".join(strangers[:5]) + (" ..." if len(strangers) > 5 else "")
        raise NotACompactedLogError(
            f"--lake {lake} is an earlier demo's lake, but holds {len(strangers)} file(s) or "
            f"folder(s) the demo did not write ({shown}). Nothing was deleted; move them "
            "away, or choose another --lake",
            path=str(lake),
        )


def run(spark: SparkSession, settings: DemoSettings, *, out=print) -> bool:
    """Run the demo; returns True when ``state()`` matches the replay.

    Refuses a lake that is not empty and not an earlier demo's (`prepare_lake`)."""
    lake = Path(settings.lake)
    prepare_lake(lake)
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
    expected = expected_state(settings, fed)
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
