"""The options of ``format("compacted-state")``, parsed once on the driver; errors name the option.

The Kafka source's options where Spark's Kafka source has them (``startingOffsets``,
``startingTimestamp``, ``endingOffsets``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``), and a consumer group's (``consumer.id``,
``consumer.expiration.ms``), and Delta's change feed's (``readChangeFeed``,
``startingVersion``, ``endingVersion``); `streaming.consumers.consumer_source` says what each means.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from checkpoints import (
    DEFAULT_CONSUMER_EXPIRATION_MS,
    ConsumerOffsets,
    consumer_offsets_uri,
)
from sinks import CHECKPOINT_TABLE_DIR
from sinks.errors import ConfigError
from sinks.log import normalize_uri, sibling
from streaming.consumers.consumer_position import Positions, parse_starting_offsets


@dataclass(frozen=True)
class SourceOptions:
    """The reader's options, parsed on the driver; errors name the option."""

    path: str
    starting_offsets: str | Positions
    starting_timestamp_ms: int | None
    ending_offsets: str | Positions
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    consumer_id: str | None
    consumer_expiration_ms: int
    checkpoint_table: str
    read_change_feed: bool = False  # Delta's readChangeFeed (design.md §56)
    starting_version: int | None = None  # the feed's first commit version (Delta's name)
    ending_version: int | None = None  # the feed's last commit version, inclusive (batch reads)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        path = options.get("path")
        if not path:
            raise ConfigError("format 'compacted-state' needs a path: .load(path)")
        path = normalize_uri(path)
        ending = parse_starting_offsets(options.get("endingOffsets", "latest"))
        if ending == "earliest":
            raise ConfigError("option 'endingOffsets' must be latest or a JSON map")
        return cls(
            path=path,
            starting_offsets=parse_starting_offsets(options.get("startingOffsets", "earliest")),
            starting_timestamp_ms=_int(options, "startingTimestamp", minimum=0),
            ending_offsets=ending,
            max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", minimum=1),
            fail_on_data_loss=_bool(options, "failOnDataLoss", default=True),
            consumer_id=options.get("consumer.id") or None,
            consumer_expiration_ms=_int(options, "consumer.expiration.ms", minimum=1)
            or DEFAULT_CONSUMER_EXPIRATION_MS,
            checkpoint_table=normalize_uri(
                options.get("checkpoint_table") or sibling(path, CHECKPOINT_TABLE_DIR)
            ),
            read_change_feed=_bool(options, "readChangeFeed", default=False),
            starting_version=_int(options, "startingVersion", minimum=0),
            ending_version=_int(options, "endingVersion", minimum=0),
        )

    def consumer_offsets(self) -> ConsumerOffsets:
        return ConsumerOffsets(consumer_offsets_uri(self.checkpoint_table))


def _int(options: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    text = options.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError as e:
        raise ConfigError(f"option {name!r} must be an integer; got {text!r}") from e
    if value < minimum:
        raise ConfigError(f"option {name!r} must be >= {minimum}; got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, *, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise ConfigError(f"option {name!r} must be true or false; got {text!r}")
    return text.strip().lower() == "true"
