"""A process that uses the sink, then exits: the subject of `test_shutdown`.

``python exit_script.py MODE LOG [close]``:

- ``spark``: a streaming query into the sink at LOG (which cleans in the background),
  a forced pass, ``state()``; ``close()`` only when asked; the session is left running
  and the interpreter exits with everything still up;
- ``arrow`` (no Spark): `read_state` and the CLI's ``status`` and ``clean --once`` on the
  log at LOG, then a worker thread (a daemon, like the cleaner's) left reading the
  state through delta-rs and pyarrow in a loop while the interpreter exits. It is
  registered with `sinks.shutdown.stop_at_exit`, as the cleaner's worker is, unless
  ``EXIT_SCRIPT_UNREGISTERED=1`` (the control: that is what aborts);
- ``reader`` (no Spark): a service's reads of the log at LOG and its tables, each once,
  then a plain exit: `read_state`, `lookup`, ``status`` (the cleaner-offset checkpoint),
  a consumer's offsets reset and deleted (delta-rs's DELETE, on its query engine), and
  last the consumers read again;
- ``checkpoints`` (no Spark, nothing else imported): the log's cleaner-offset checkpoint
  and consumer offsets read, right before a plain exit (the tables the sink and the CLI read
  and rewrite whole, `checkpoints.keyed_table`); the fastest exit after such a read, where
  ``to_pyarrow_table`` aborted in 5 of 20 runs;
- ``to-pyarrow-table`` (no Spark, the control of ``reader``): delta-rs's own
  ``DeltaTable.to_pyarrow_table`` of the log, which aborts at exit (design.md §58);
- ``user``: a user's script with Spark, as an issue reported it: appends (the sink called
  as ``foreachBatch`` calls it, cleaning in the background), ``state()``, `read_state`,
  `lookup`, ``close()``, then the interpreter exits with the session up.

Exit code 0 is the only good outcome.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path


def small_session():
    """A local Spark session for a script that uses the sink once (imported here only: the
    reader modes must not import pyspark)."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_run(log: Path, close: bool) -> None:
    from sinks import CleanerConfig, CompactedStateSink

    spark = small_session()
    source, checkpoint = log.parent / "in", log.parent / "_chk"
    source.mkdir(parents=True, exist_ok=True)
    for i in range(4):
        rows = [{"key": f"k{j % 7}", "value": f"v{i}-{j}"} for j in range(20)]
        (source / f"{i}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sink = CompactedStateSink(
        str(log),
        config=CleanerConfig(min_cleanable_dirty_ratio=0.01),
        checkpoint_location=str(checkpoint),
    )
    query = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    sink.clean(force=True)
    assert sink.state().count() == 7
    if close:
        sink.close()


class StateReadingWorker:
    """A daemon thread reading the log's state in a loop, stopped like the cleaner's worker."""

    def __init__(self, log: str) -> None:
        self.log = log
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, name="state-reader", daemon=True)

    def run(self) -> None:
        from sinks import read_state

        while not self.stopped.is_set():
            read_state(self.log)

    def shutdown(self, timeout_s: float | None = None) -> None:
        self.stopped.set()
        self.thread.join(timeout_s)


def arrow_run(log: Path) -> None:
    from sinks import read_state
    from sinks.shutdown import stop_at_exit
    from streaming.cli import main as cli

    assert read_state(str(log)).num_rows > 0
    assert cli(["status", str(log)]) == 0
    assert cli(["clean", str(log), "--once"]) == 0
    worker = StateReadingWorker(str(log))
    if os.environ.get("EXIT_SCRIPT_UNREGISTERED") != "1":
        stop_at_exit(worker)
    worker.thread.start()
    worker.stopped.wait(0.3)  # exit while it is inside delta-rs or pyarrow


def reader_run(log: str) -> None:
    from sinks import lookup, read_state
    from streaming.cli import main as cli
    from streaming.consumers import consumer_report, delete_consumer, reset_offsets

    assert read_state(log).num_rows > 0
    assert lookup(log, "k1").num_rows == 1
    assert cli(["status", log]) == 0
    reset_offsets(log, "exit-probe", "earliest")
    assert [c.consumer.consumer_id for c in consumer_report(log)] == ["exit-probe"]
    assert delete_consumer(log, "exit-probe") == 1
    print("read")
    # Last, right before the exit: a read of the consumer offsets' table (a small Delta
    # table the checkpoints' `KeyedTable` reads whole), which is what aborted (design.md §58).
    assert consumer_report(log) == []


def checkpoints_run(log: str) -> None:
    from checkpoints import CleanerOffsetCheckpoint, ConsumerOffsets, consumer_offsets_uri

    checkpoint = str(Path(log).parent / "_cleaner-offset-checkpoint")
    assert ConsumerOffsets(consumer_offsets_uri(checkpoint)).consumers(log, now_ms=0) == []
    assert CleanerOffsetCheckpoint(checkpoint).read()


KEPT: list[object] = []  # what the control read, alive until the exit as in a user's script


def control_run(log: str) -> None:
    from deltalake import DeltaTable

    KEPT.append(DeltaTable(log).to_pyarrow_table())
    print(KEPT[0].num_rows)  # type: ignore[attr-defined]


def user_run(log: Path) -> None:
    from sinks import CleanerConfig, CompactedStateSink, lookup, read_state

    spark = small_session()
    sink = CompactedStateSink(str(log), config=CleanerConfig(min_cleanable_dirty_ratio=0.01))
    for batch_id in range(3):
        rows = [(f"k{i}", f"v{batch_id}-{i}") for i in range(50)]
        sink(spark.createDataFrame(rows, "key string, value string"), batch_id)
    assert sink.state().count() == 50
    assert read_state(str(log)).num_rows == 50
    assert lookup(str(log), "k3").column("value").to_pylist() == ["v2-3"]
    sink.close()
    print("done")


if __name__ == "__main__":
    mode, log = sys.argv[1], Path(sys.argv[2])
    if mode == "spark":
        spark_run(log, close="close" in sys.argv[3:])
    elif mode == "reader":
        reader_run(str(log))
    elif mode == "checkpoints":
        checkpoints_run(str(log))
    elif mode == "to-pyarrow-table":
        control_run(str(log))
    elif mode == "user":
        user_run(log)
    else:
        arrow_run(log)
