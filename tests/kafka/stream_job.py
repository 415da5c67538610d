"""A streaming query from Kafka into the sink, run as its own process so a test can SIGKILL it.

    python stream_job.py BOOTSTRAP TOPIC LOG CHECKPOINT BATCHES_FILE JARS

Triggers every 200 ms, 300 offsets a batch; after each batch the sink committed, its id is
appended to BATCHES_FILE (so the test knows the query is mid-stream). Runs until killed.
"""

from __future__ import annotations

import sys

from sinks import CleanerConfig, CompactedStateSink
from streaming.jobs.session import local_session


def main(bootstrap: str, topic: str, log: str, checkpoint: str, batches: str, jars: str) -> None:
    spark = local_session(
        "kafka-kill-test",
        "local[2]",
        conf={"spark.jars": jars, "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
    )
    sink = CompactedStateSink(
        log, key_columns=("key",), config=CleanerConfig(min_cleanable_dirty_ratio=1.0)
    )

    def hook(batch_df, batch_id: int) -> None:
        sink(batch_df, batch_id)
        with open(batches, "a") as out:
            out.write(f"{batch_id}\n")

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "300")
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(hook)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:7])
