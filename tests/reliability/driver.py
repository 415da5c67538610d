"""A separate process for the crash and concurrency tests: ``python driver.py <scenario> <lake>``.

``COMPACTED_SINK_CRASH_AT`` (see `sinks.crash_points`) names where it dies with
SIGKILL. Each scenario first commits known batches (printing ``committed <id>``),
then does the step that is to be killed. ``vacuum`` and ``recovery`` start no Spark: the
log they are given was written before (``vacuum``'s batches 0, 1, 2 by the test, with
`vacuum_config`). The test checks the log left behind from its own process, through a
new sink object on the same path (a restart).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The repository root first: its packages (checkpoints, sinks, streaming) must win over the
# test folders of the same names, which an editable install's finder would otherwise lose to.
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # the library, then testkit

from testkit import bad_rows_frame, batch_frame, vacuum_config  # noqa: E402

LOG = "log"
DEAD = "dead-letters"


def spark_session():
    from streaming.jobs.session import local_session

    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "1",
        "spark.ui.enabled": "false",
        "spark.driver.memory": "1g",
        # A fresh JVM compiles each query's generated Java (Janino) before it runs a row:
        # on three batches of 24 rows that is about 2 of a process's 14 CPU seconds.
        # Interpreted evaluation computes the same rows; the sink is what is tested here.
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    }
    return local_session("crash-driver", "local[1]", conf=conf)


def main(scenario: str, lake: str) -> None:
    from sinks.crash_points import CRASH_AT_ENV

    # Armed only for the step that is to be killed, not for the batches committed first.
    crash_at = os.environ.pop(CRASH_AT_ENV, None)
    path = os.path.join(lake, LOG)
    if scenario == "recovery":
        # No Spark: recovery reads the Delta log and Parquet footers only.
        from sinks.log.log_table import LogTable
        from sinks.maintenance.recovery import recover_log
        from sinks.sink import CompactedStateSink

        sink = CompactedStateSink(path)
        os.environ[CRASH_AT_ENV] = crash_at or ""
        recover_log(LogTable(path), sink.checkpoints, file_delete_delay_ms=0)
        print("recovered", flush=True)
        return

    from sinks import CleanerConfig, CompactedStateSink

    if scenario == "vacuum":
        # The deletion reads the Delta log and deletes files: no Spark in this process.
        sink = CompactedStateSink(path, config=vacuum_config())
        os.environ[CRASH_AT_ENV] = crash_at or ""
        sink.vacuum()
        print("finished", flush=True)
        return
    spark = spark_session()
    if scenario == "cleaner_loop":
        cleaner_loop(spark, path, lake)
        return
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0)
    dead = os.path.join(lake, DEAD) if scenario == "dead_letter" else None
    sink = CompactedStateSink(path, config=config, dead_letter_table=dead)
    for batch_id in range(3):
        sink(batch_frame(spark, batch_id), batch_id)
        print("committed", batch_id, flush=True)
    os.environ[CRASH_AT_ENV] = crash_at or ""
    if scenario in ("append", "staged"):
        sink(batch_frame(spark, 3), 3)
    elif scenario in ("clean", "checkpoint"):
        sink.clean(force=True)
    elif scenario == "dead_letter":
        sink(bad_rows_frame(spark, 3), 3)
    elif scenario == "schema":  # batch 3 brings a new column: killed between the two commits
        from pyspark.sql import functions as F

        sink(batch_frame(spark, 3).withColumn("note", F.lit("n3")), 3)
    print("finished", flush=True)


def cleaner_loop(spark, path: str, lake: str) -> None:
    import json
    import time

    from sinks import CleanerConfig, CleanerError, CommitConflictError, CompactedStateSink

    sink = CompactedStateSink(path, config=CleanerConfig(min_cleanable_dirty_ratio=0.0))
    passes = conflicts = skipped = 0
    print("ready", flush=True)
    while not os.path.exists(os.path.join(lake, "stop")):
        if not os.path.exists(os.path.join(path, "_delta_log")):
            time.sleep(0.2)
            continue
        try:
            stats = sink.clean(force=True)
        except (CleanerError, CommitConflictError) as e:
            conflicts += 1
            print("conflict", e, flush=True)
            continue
        if stats is None:
            skipped += 1
            time.sleep(0.2)
        else:
            passes += 1
    print(json.dumps({"passes": passes, "conflicts": conflicts, "skipped": skipped}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
