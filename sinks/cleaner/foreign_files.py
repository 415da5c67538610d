"""Files another engine wrote into a log, rewritten into segments before a pass.

Another engine's OPTIMIZE, Z-order or auto compaction leaves files that are not one
partition's offset-ordered run (design.md §14). A pass plans over segments only, so
the cleaner first rewrites them (`sinks.maintenance.rearrangement.absorb`), holding
the claim on every partition of the log meanwhile.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from deltalake.exceptions import CommitFailedError
from pyspark.sql import SparkSession

from sinks.cleaner.rules import spark_latest_offsets
from sinks.errors import CleanerError
from sinks.log.log_table import LogSnapshot
from sinks.maintenance.rearrangement import absorb

if TYPE_CHECKING:
    from sinks.cleaner.log_cleaner import LogCleaner

logger = logging.getLogger("compacted_sink")


def absorb_foreign_files(
    spark: SparkSession, cleaner: LogCleaner, snapshot: LogSnapshot
) -> LogSnapshot | None:
    """Rewrite another engine's files into segments (`sinks.maintenance.rearrangement`),
    holding every partition of the log; None when some partition is busy elsewhere.

    Every partition, because a foreign file may hold any of them, and a pass over a
    partition must not run while its records sit outside its segments.
    """
    partitions = snapshot.partitions
    claimed = set(cleaner.manager.start_cleaning(partitions))
    if claimed != set(partitions):
        cleaner.manager.abort_cleaning(claimed)
        logger.info("files another engine wrote in %s wait: partitions busy", cleaner.log.uri)
        return None
    try:
        with cleaner.manager.heartbeating(claimed):
            fresh = cleaner.log.snapshot() or snapshot
            report = absorb(
                spark,
                cleaner.log,
                fresh,
                stats_columns=cleaner.cleaner.stats_columns(fresh),
                segment_bytes=cleaner.config.segment_bytes,
                key_columns=cleaner.cleaner.key_columns,
                sequence_column=cleaner.cleaner.sequence_column,
                latest_offsets=spark_latest_offsets,
            )
    except CommitFailedError as e:
        raise CleanerError(
            f"another writer rewrote the same files first ({e}); tried again next round",
            log_path=cleaner.log.uri,
            partition=partitions[0],
        ) from e
    finally:
        cleaner.manager.abort_cleaning(claimed)
    if report is not None:
        logger.info("cleaner: %s: %s", cleaner.log.uri, report.summary())
    return cleaner.log.snapshot()
