"""The log cleaner, as Kafka's: ten modules, one concept each, named as Kafka names them.

- `log_cleaner`: ``LogCleaner``, one log's rounds (`LogCleaner.run_round`: retention, a
  pass, the segment deleter), the hand-over after an append, the one loop over one or
  many logs (`CleanerLoop`, Kafka's ``CleanerThread``: run by the ``clean`` command and
  by the sink's worker thread, `CleanerWorker`).
- `cleaner_manager`: ``LogCleanerManager``, the partitions' cleaner states and
  checkpoints in the cleaner-offset checkpoint table: claims, transitions, pauses.
- `pass_planning`: the log measured into a `CleaningPlan` (Kafka's ``cleanableOffsets``)
  and chosen in one place (`LogPlanner.choose`), a round's `RoundRequest` (what is
  forced, the plan, the budget: one frozen value handed down), consumer holds, and each
  partition's share of a pass; pure but for two table reads.
- `cleaner`: ``Cleaner``, the driver's half of one pass top to bottom
  (`Cleaner.run_pass`): choose and claim (a `CleaningPass`), plan, one Spark job, one
  commit, the checkpoint.
- `recopy_task`: the executors' half: `RecopyTask`, the Spark task that builds a
  partition's offset map and recopies its files, shared with the state readers.
- `offset_map`: ``OffsetMap``, exact, over keys encoded as Spark groups them.
- `throttler`: ``Throttler``, the pass's I/O rate, and its share of the cores
  (`TaskBudget`) and their CPU priority.
- `log_to_clean`: ``LogToClean``, pure planning over numbers from the Delta log
  (cleanable offsets, dirty ratio, the filthiest partitions, output groups, why a
  partition is not cleanable).
- `cleaner_stats`: ``CleanerStats``, the figures of one pass (``CleanerConfig`` is
  `sinks.config`'s).
- `rules`: what a pass keeps, in Spark and in Arrow side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.lazy_names import lazy_names

if TYPE_CHECKING:
    from sinks.cleaner.cleaner import Cleaner
    from sinks.cleaner.cleaner_manager import CleanerManager
    from sinks.cleaner.cleaner_stats import CleanerStats, format_bytes
    from sinks.cleaner.log_cleaner import Candidate, CleanerLoop, LogCleaner, RoundReport
    from sinks.cleaner.log_to_clean import (
        LogToClean,
        OffsetsToClean,
        cleanable_offsets,
        dirty_ratio,
        nothing_cleanable_line,
    )
    from sinks.cleaner.pass_planning import RoundRequest
    from sinks.cleaner.throttler import TaskBudget, budget_summary

_MODULE_OF = {
    "Candidate": "sinks.cleaner.log_cleaner",
    "Cleaner": "sinks.cleaner.cleaner",
    "CleanerLoop": "sinks.cleaner.log_cleaner",
    "CleanerManager": "sinks.cleaner.cleaner_manager",
    "CleanerStats": "sinks.cleaner.cleaner_stats",
    "LogCleaner": "sinks.cleaner.log_cleaner",
    "LogToClean": "sinks.cleaner.log_to_clean",
    "OffsetsToClean": "sinks.cleaner.log_to_clean",
    "RoundReport": "sinks.cleaner.log_cleaner",
    "RoundRequest": "sinks.cleaner.pass_planning",
    "TaskBudget": "sinks.cleaner.throttler",
    "budget_summary": "sinks.cleaner.throttler",
    "cleanable_offsets": "sinks.cleaner.log_to_clean",
    "dirty_ratio": "sinks.cleaner.log_to_clean",
    "format_bytes": "sinks.cleaner.cleaner_stats",
    "nothing_cleanable_line": "sinks.cleaner.log_to_clean",
}
"""Each name and its module, imported on first use: the Arrow readers import modules of
this package, whose Spark modules they must not import (design.md §59)."""


__getattr__ = lazy_names(__name__, globals(), _MODULE_OF)


__all__ = [
    "Candidate",
    "Cleaner",
    "CleanerManager",
    "CleanerStats",
    "CleanerLoop",
    "LogCleaner",
    "LogToClean",
    "OffsetsToClean",
    "RoundReport",
    "RoundRequest",
    "TaskBudget",
    "budget_summary",
    "cleanable_offsets",
    "dirty_ratio",
    "format_bytes",
    "nothing_cleanable_line",
]
