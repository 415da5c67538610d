"""The cleaner-offset checkpoint table shared by many compacted logs."""

from checkpoints.checkpoint_table import (
    CHECKPOINT_SCHEMA,
    CheckpointEntry,
    CleanerOffsetCheckpoint,
    CleanerState,
    other_history,
    split_histories,
)

__all__ = [
    "CHECKPOINT_SCHEMA",
    "CheckpointEntry",
    "CleanerOffsetCheckpoint",
    "CleanerState",
    "other_history",
    "split_histories",
]
