"""Two engines committing at once: a delta-spark job and the sink racing on one local log.

Each round, one thread runs a delta-spark job's step (an append of keyed rows in the log's
schema, ``OPTIMIZE``, or a ``DELETE`` of one key) while another runs the sink's (an append,
or a forced pass), each after a random pause. Both commit to the same Delta log through its
put-if-absent commit files, so one of two commits planned at the same version loses and
retries. Afterwards the Delta log must hold each engine's intended commits exactly once, and
Spark's Delta read, ``log()``, ``state()`` and ``read_state`` must agree with a replay of the
Delta log's own order.

delta-spark's appends and DELETEs change records behind the sink's back, which the sink
refuses by name (``ForeignChangeError``, docs/operations.md, "Other engines on the log"): the
sink's thread accepts them, as the operator of such a job would, and tries its step again.
The job's rows carry keys and a partition of their own (``j*``, partition 2) with offsets it
numbers itself, so the two engines' offsets never meet; its DELETEs hit both key sets.

``COMPACTED_SINK_RACE_SEED`` replays a run (the seed is printed); ``..._ROUNDS`` sets rounds.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest
from chispa import assert_df_equality
from pyspark.sql import Window
from pyspark.sql import functions as F

from sinks import (
    CleanerConfig,
    CommitConflictError,
    CompactedStateSink,
    ForeignChangeError,
    read_state,
)
from sinks.log.log_format import COMMIT_INFO_KEY
from sinks.spark_session import warn_unsafe_beside_delta_spark

pytestmark = pytest.mark.delta_spark

SEED = int(os.environ.get("COMPACTED_SINK_RACE_SEED") or random.randrange(1_000_000))
ROUNDS = int(os.environ.get("COMPACTED_SINK_RACE_ROUNDS") or 50)
SINK_KEYS = [f"s{i}" for i in range(10)]  # partitions 0 and 1
JOB_KEYS = [f"j{i}" for i in range(6)]  # partition 2, numbered by the job
JOB_PARTITION = 2
TAG = "race-job"  # the job's commits carry "race-job <step>" as Delta's userMetadata
DELTA_CONFLICT = re.compile(r"(Concurrent\w+|ProtocolChanged|MetadataChanged)Exception")
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


@dataclass
class Tally:
    """What one engine tried and met."""

    steps: Counter = field(default_factory=Counter)
    conflicts: Counter = field(default_factory=Counter)  # by kind
    retries: int = 0


class SinkConflicts(logging.Handler):
    """Counts the conflicts the sink met and retried by itself (its log lines)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: Counter = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "conflicted" in message:
            self.seen["append" if message.startswith("append") else "pass"] += 1


def job_step(spark, path: str, rng: random.Random, n: int, offsets: list[int], tally: Tally):
    """One step of the delta-spark job, retried until it commits; what it intended."""
    kind = rng.choices(["append", "OPTIMIZE", "DELETE"], weights=[3, 1, 2])[0]
    tag = f"{TAG} {kind} {n}"
    if kind == "append":
        rows = []
        for _ in range(rng.randrange(1, 5)):
            rows.append((rng.choice(JOB_KEYS), f"job{n}-{rng.random():.6f}", offsets[0]))
            offsets[0] += 1
        values = ", ".join(
            f"('{k}', '{v}', {JOB_PARTITION}, {o}, current_timestamp(), NULL)" for k, v, o in rows
        )
        statement = f"INSERT INTO delta.`{path}` VALUES {values}"
        intent = ("append", [(k, v) for k, v, _ in rows])
    else:
        key = rng.choice(SINK_KEYS + JOB_KEYS)
        statement = f"OPTIMIZE delta.`{path}`"
        if kind == "DELETE":
            statement = f"DELETE FROM delta.`{path}` WHERE key = '{key}'"
        intent = ("delete", key) if kind == "DELETE" else ("optimize", None)

    def run() -> None:
        # SQL takes userMetadata from the session; only this thread commits through Spark.
        spark.conf.set(USER_METADATA, tag)
        try:
            spark.sql(statement).collect()
        finally:
            spark.conf.unset(USER_METADATA)

    tally.steps[kind] += 1
    while True:
        try:
            run()
            return tag, intent
        except Exception as e:  # Delta's conflicts arrive as Py4J errors
            conflict = DELTA_CONFLICT.search(str(e))
            if conflict is None:
                raise
            tally.conflicts[conflict.group(0)] += 1
            tally.retries += 1


def sink_step(spark, sink, rng: random.Random, batch_id: int, tally: Tally):
    """One step of the sink, retried until it is done; the batch it intended, if any."""
    rows = None
    if rng.random() < 0.7:
        rows = []
        for _ in range(rng.randrange(2, 8)):
            key = rng.choice(SINK_KEYS)
            value = None if rng.random() < 0.15 else f"b{batch_id}-{rng.random():.6f}"
            rows.append((key, value, int(key[1:]) % 2))
        frame = spark.createDataFrame(rows, "key string, value string, partition int")
    tally.steps["append" if rows else "pass"] += 1
    while True:
        try:
            if rows:
                sink(frame, batch_id)
            else:
                sink.clean(force=True)
            return rows
        except ForeignChangeError:
            # The job's appends and DELETEs change records: accepted as its operator would.
            tally.conflicts["ForeignChangeError"] += 1
            try:
                sink.accept_foreign_changes()
            except ForeignChangeError:
                # The job committed again between the accept and the recovery after it: that
                # change is new, refused by name, and accepted on the next try.
                tally.conflicts["ForeignChangeError"] += 1
        except CommitConflictError:
            tally.conflicts["CommitConflictError"] += 1
        tally.retries += 1


def replay(commits: list[list[dict]], batches: dict[int, list], jobs: dict[str, tuple]):
    """The state both engines wrote, in the Delta log's order, and which commit made what.

    A DELETE removes the records of its key that its snapshot held (versions up to its
    ``readVersion``): a blind append committed after that snapshot keeps its rows, as
    Delta's WriteSerializable isolation allows. Pure."""
    records: dict[str, list[tuple[int, str | None]]] = {}  # key -> [(version, value)]
    seen: Counter = Counter()
    for version, actions in enumerate(commits):
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        ours = info.get(COMMIT_INFO_KEY) or {}
        rows: list = []
        if ours.get("operation") == "append":
            seen[("sink", ours["batchId"])] += 1
            rows = [(k, v) for k, v, _ in batches[ours["batchId"]]]
        elif str(info.get("userMetadata", "")).startswith(TAG):
            tag = info["userMetadata"]
            seen[("job", tag)] += 1
            what, detail = jobs[tag]
            if what == "append":
                rows = detail
            elif what == "delete":
                read = info.get("readVersion", version - 1)
                kept = [r for r in records.get(detail, []) if r[0] > read]
                records[detail] = kept
        for key, value in rows:
            records.setdefault(key, []).append((version, value))
    state = {}
    for key, history in records.items():
        if history and history[-1][1] is not None:
            state[key] = history[-1][1]
    return state, seen


def test_delta_spark_and_the_sink_commit_at_once_and_lose_nothing(
    delta_spark, lake, delta_commits
) -> None:
    spark, path = delta_spark, str(lake / "users")
    print(f"race seed {SEED} ({ROUNDS} rounds): COMPACTED_SINK_RACE_SEED={SEED} replays it")
    config = CleanerConfig(min_cleanable_dirty_ratio=0.3)
    sink = CompactedStateSink(path, config=config, cleaning="inline")
    seeds = random.Random(SEED)
    job_rng, sink_rng, pauses = (random.Random(seeds.random()) for _ in range(3))
    batches: dict[int, list] = {0: [("s0", "first", 0), ("s1", "first", 1)]}
    sink(spark.createDataFrame(batches[0], "key string, value string, partition int"), 0)
    jobs: dict[str, tuple] = {}
    job_tally, sink_tally = Tally(), Tally()
    sink_conflicts = SinkConflicts()
    sink_logger = logging.getLogger("compacted_sink")
    level = sink_logger.level
    sink_logger.addHandler(sink_conflicts)
    sink_logger.setLevel(logging.INFO)  # the conflicts it retries are logged at INFO
    job_offsets = [0]
    failures: list[BaseException] = []
    started = time.monotonic()

    def after(pause: float, step) -> None:
        try:
            time.sleep(pause)
            step()
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    try:
        for n in range(1, ROUNDS + 1):

            def job(n=n) -> None:
                tag, intent = job_step(spark, path, job_rng, n, job_offsets, job_tally)
                jobs[tag] = intent

            def ours(n=n) -> None:
                rows = sink_step(spark, sink, sink_rng, n, sink_tally)
                if rows:
                    batches[n] = rows

            threads = [
                threading.Thread(target=after, args=(pauses.uniform(0, 0.4), step))
                for step in (job, ours)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if failures:
                raise failures[0]
    finally:
        sink_logger.removeHandler(sink_conflicts)
        sink_logger.setLevel(level)
    elapsed = time.monotonic() - started
    sink.accept_foreign_changes()  # the job's last step may be a change not yet accepted

    expected, seen = replay(delta_commits(path), batches, jobs)
    intended = Counter({("sink", b): 1 for b in batches}) + Counter({("job", t): 1 for t in jobs})
    # OPTIMIZE with nothing to compact, and a DELETE of a key no file holds, commit nothing.
    idle = {("job", t) for t, (what, _) in jobs.items() if what != "append"}
    lost = [c for c in intended if c not in seen and c not in idle]
    duplicated = [c for c, times in seen.items() if times > 1]
    unknown = [c for c in seen if c not in intended]
    print(
        f"race seed {SEED}: {ROUNDS} rounds in {elapsed:.1f} s; delta-spark steps "
        f"{dict(job_tally.steps)}, conflicts {dict(job_tally.conflicts)}, retries "
        f"{job_tally.retries}; sink steps {dict(sink_tally.steps)}, refusals/conflicts "
        f"{dict(sink_tally.conflicts)}, retries {sink_tally.retries}, conflicts retried inside "
        f"the sink {dict(sink_conflicts.seen)}; commits {len(delta_commits(path))}, "
        f"lost {len(lost)}, duplicated {len(duplicated)}"
    )
    assert (lost, duplicated, unknown) == ([], [], [])

    columns = ["key", "value", "partition", "offset"]
    log = sink.log().select(*columns)
    assert_df_equality(
        spark.read.format("delta").load(path).select(*columns),
        log,
        ignore_row_order=True,
        ignore_nullable=True,
    )
    state = sink.state()
    assert {r.key: r.value for r in state.collect()} == expected
    assert_df_equality(
        state.select("key", "value"),
        spark.createDataFrame(sorted(expected.items()), "key string, value string"),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    newest = Window.partitionBy("key").orderBy(F.col("offset").desc())
    folded = (
        spark.read.format("delta")
        .load(path)
        .withColumn("n", F.row_number().over(newest))
        .where("n = 1 AND value IS NOT NULL")
    )
    assert_df_equality(
        folded.select("key", "value"), state.select("key", "value"), ignore_row_order=True
    )
    arrow = read_state(path)
    assert dict(zip(arrow["key"].to_pylist(), arrow["value"].to_pylist(), strict=True)) == expected


def test_the_sink_warns_once_when_the_session_delta_spark_can_overwrite_its_commits(
    delta_spark, lake, caplog
) -> None:
    spark = delta_spark
    # An S3 log: only the session's settings are read, no S3 is reached. A bucket of its own:
    # the warning is once per log and process, and other tests open S3 logs on this session.
    uri = f"s3://race-warning-{uuid.uuid4().hex[:8]}/users"
    warning = warn_unsafe_beside_delta_spark(spark, uri)
    assert warning is not None and "S3SingleDriverLogStore" in warning, warning
    assert warn_unsafe_beside_delta_spark(spark, uri) is None  # once per log

    path = str(lake / "users")
    sink = CompactedStateSink(path, cleaning="inline")
    batch = spark.createDataFrame([("k", "v", 0)], "key string, value string, partition int")
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        sink(batch, 0)
        sink(batch, 1)
    warned = [r.getMessage() for r in caplog.records if "HDFSLogStore" in r.getMessage()]
    assert len(warned) == 1 and path in warned[0], warned
