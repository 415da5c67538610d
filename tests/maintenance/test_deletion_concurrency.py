"""Deletion beside a streaming query and a concurrent cleaner loses nothing.

A streaming query appends (its sink cleans on its background worker and deletes
expired files every second, one second after they left the log); a second sink
object on the same log, in another thread, keeps cleaning and vacuuming. The window
is short, so files do leave storage while the query runs. At the end ``state()``
equals a replay of every row fed in, every live file exists, and files were deleted.
"""

from __future__ import annotations

import os
import threading
import time

from pyspark.sql import DataFrame

from sinks import CleanerConfig, CleanerError, CommitConflictError, CompactedStateSink
from sinks.maintenance.file_inventory import list_data_files
from streaming.jobs.demo import DemoSettings, expected_state, keyed_updates

BATCHES = 10
# A background pass runs niced (log.cleaner.nice): on a machine busy with other work (a
# fresh clone's `make test` keeps both cores busy) its files leave the log later.
DELETION_WAIT_S = 60
CONFIG = CleanerConfig(
    min_cleanable_dirty_ratio=0.2,
    delete_retention_ms=0,
    file_delete_delay_ms=1_000,
    log_retention_check_interval_ms=1_000,
)


def deleted_yet(deleted: list[str], sink: CompactedStateSink) -> bool:
    """Whether the other sink's vacuum or the query's own deleter removed files yet."""
    report = sink.log_cleaner.segment_deleter.last_report
    return bool(deleted) or (report is not None and bool(report.deleted))


def test_deletion_beside_a_streaming_query_and_a_concurrent_cleaner(spark, lake):
    settings = DemoSettings(lake=str(lake), keys=300, partitions=2, rows_per_batch=200)
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=CONFIG)
    other = CompactedStateSink(path, config=CONFIG)
    done, stop = threading.Event(), threading.Event()
    deleted: list[str] = []
    errors: list[BaseException] = []

    def hook(batch: DataFrame, batch_id: int) -> None:
        if batch_id >= BATCHES:
            return  # started before the query stopped: not part of the replay
        sink(batch, batch_id)
        if batch_id + 1 >= BATCHES:
            done.set()

    def cleaner() -> None:
        while not stop.is_set():
            if not os.path.exists(os.path.join(path, "_delta_log")):
                stop.wait(0.2)
                continue
            try:
                other.clean(force=True)
            except (CleanerError, CommitConflictError):
                pass  # lost a race with the query's own cleaner: expected, nothing committed
            try:
                deleted.extend(other.vacuum().deleted)
            except Exception as e:  # collected and failed on below
                errors.append(e)
            stop.wait(0.3)

    worker = threading.Thread(target=cleaner, daemon=True)
    worker.start()
    query = (
        keyed_updates(spark, settings)
        .writeStream.foreachBatch(hook)
        .option("checkpointLocation", str(lake / "_chk"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        while not done.wait(0.5):
            assert query.exception() is None, query.exception()
        # Files leave storage file.delete.delay.ms after they left the log: a query faster
        # than that window gets it, up to a bound, before the cleaners stop.
        # Read while the query runs: the sink's close below runs its deleter once more, and
        # that run's report (files skipped beside the other sink's live pass) replaces the
        # one that saw files leave.
        deadline = time.monotonic() + DELETION_WAIT_S
        seen = deleted_yet(deleted, sink)
        while not seen and time.monotonic() < deadline:
            stop.wait(0.3)
            seen = deleted_yet(deleted, sink)
    finally:
        query.stop()
        sink.close()
        stop.set()
        worker.join(120)

    assert errors == []
    fed = BATCHES * settings.rows_per_batch
    state = {r["key"]: bytes(r["value"]) for r in other.state().collect()}
    assert state == expected_state(settings, fed)
    live = {s.path for s in other.log_table.snapshot().all_segments()}
    on_disk = {f.path for f in list_data_files(other.log_table)}
    assert live <= on_disk
    assert seen, "the window is short: files should have left storage while the query ran"
