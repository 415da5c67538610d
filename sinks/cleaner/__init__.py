"""The log cleaner: Kafka's ``LogCleaner``, ``LogCleanerManager`` and ``Cleaner``, kept apart.

- `log_to_clean`: pure planning over numbers from the Delta log (cleanable
  offsets, dirty ratio, the filthiest partitions, output groups).
- `cleaner`: one pass, planned on the driver, run as one Spark task per partition
  (`clean_segments`, each building its `offset_map` over `key_encoding`'s keys), and
  one commit; `rules`: what a pass keeps, in Spark and in Arrow side by side.
- `cleaner_manager`: which partitions may be cleaned, their states and
  checkpoints, in the cleaner-offset checkpoint table.
- `log_cleaner`: one log's cleaning (its `Cleaner`, `CleanerManager`, retention,
  deleter), planned by `cleaning_plan`; `cleaner_thread`: the one worker loop
  over one or many logs (the sink's thread and the ``clean`` command).
- `cleaner_stats`: the figures of one pass.
"""

from sinks.cleaner.cleaner import Cleaner
from sinks.cleaner.cleaner_manager import CleanerManager
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_to_clean import LogToClean, OffsetsToClean

__all__ = ["Cleaner", "CleanerManager", "CleanerStats", "LogToClean", "OffsetsToClean"]
