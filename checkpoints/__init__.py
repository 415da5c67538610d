"""The cleaner-offset checkpoint table shared by many compacted logs."""

from checkpoints.checkpoint_table import (
    CHECKPOINT_SCHEMA,
    CheckpointEntry,
    CleanerOffsetCheckpoint,
    CleanerState,
    other_history,
    split_histories,
)
from checkpoints.clock import Clock, now_ms
from checkpoints.consumer_offsets import (
    DEFAULT_CONSUMER_EXPIRATION_MS,
    ConsumerOffsets,
    ConsumerState,
    consumer_offsets_uri,
)

__all__ = [
    "CHECKPOINT_SCHEMA",
    "DEFAULT_CONSUMER_EXPIRATION_MS",
    "CheckpointEntry",
    "CleanerOffsetCheckpoint",
    "CleanerState",
    "Clock",
    "ConsumerOffsets",
    "ConsumerState",
    "consumer_offsets_uri",
    "now_ms",
    "other_history",
    "split_histories",
]
