"""A process that uses the sink, then exits: the subject of `test_shutdown`.

``python exit_script.py MODE LOG [close]``:

- ``spark``: a streaming query into the sink at LOG (which cleans in the background),
  a forced pass, ``state()``; ``close()`` only when asked; the session is left running
  and the interpreter exits with everything still up;
- ``arrow`` (no Spark): `read_state` and the CLI's ``status`` and ``clean --once`` on the
  log at LOG, then a worker thread (a daemon, like the cleaner's) left reading the
  state through delta-rs and pyarrow in a loop while the interpreter exits. It is
  registered with `sinks.shutdown.stop_at_exit`, as the cleaner's worker is, unless
  ``EXIT_SCRIPT_UNREGISTERED=1`` (the control: that is what aborts).

Exit code 0 is the only good outcome.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path


def spark_run(log: Path, close: bool) -> None:
    from pyspark.sql import SparkSession

    from sinks import CleanerConfig, CompactedStateSink

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
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


if __name__ == "__main__":
    mode, log = sys.argv[1], Path(sys.argv[2])
    if mode == "spark":
        spark_run(log, close="close" in sys.argv[3:])
    else:
        arrow_run(log)
