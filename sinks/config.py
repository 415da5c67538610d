"""`CleanerConfig`: the topic-level settings of Kafka's log cleaner, in snake_case.

Ports `CleanerConfig` / `LogConfig` from Kafka: an immutable value with Kafka's
dotted property names as constants and their defaults. `from_properties` reads
the dotted names (as a job's TOML or a topic's config would carry them) and
every error names the offending key.

The topic-level settings (`TOPIC_PROPERTIES`: Kafka's topic configs) live on the log
itself, as Delta table properties (`sinks.log.log_config.LogConfig`,
``compacted.sink.topic.<name>``); the
others (``log.cleaner.*``, ``log.retention.check.interval.ms``) are the process's, as a
broker's are. A config remembers which settings its maker named (`CleanerConfig.explicit`),
so that a process's explicit choice can be told from a default
(`sinks.log.log_config.resolve`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from checkpoints.cleaner_states import BACKOFF_BASE_MS
from sinks.errors import ConfigError
from sinks.warn_once import first_time, warn_once

logger = logging.getLogger("compacted_sink")

CleanupPolicy = Literal["compact", "delete", "compact,delete"]

CLEANUP_POLICY = "cleanup.policy"
MIN_CLEANABLE_DIRTY_RATIO = "min.cleanable.dirty.ratio"
DELETE_RETENTION_MS = "delete.retention.ms"
MIN_COMPACTION_LAG_MS = "min.compaction.lag.ms"
MAX_COMPACTION_LAG_MS = "max.compaction.lag.ms"
SEGMENT_BYTES = "segment.bytes"
RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
MESSAGE_MAX_BYTES = "message.max.bytes"
FILE_DELETE_DELAY_MS = "file.delete.delay.ms"
DELETED_FILE_RETENTION_DURATION = "delta.deletedFileRetentionDuration"
LOG_RETENTION_CHECK_INTERVAL_MS = "log.retention.check.interval.ms"
LOG_CLEANER_IO_MAX_BYTES_PER_SECOND = "log.cleaner.io.max.bytes.per.second"
LOG_CLEANER_MAX_BYTES_PER_PASS = "log.cleaner.max.bytes.per.pass"
LOG_CLEANER_THREADS = "log.cleaner.threads"
LOG_CLEANER_NICE = "log.cleaner.nice"
LOG_CLEANER_BACKOFF_MS = "log.cleaner.backoff.ms"
LOG_CLEANER_DEDUPE_BUFFER_SIZE = "log.cleaner.dedupe.buffer.size"
COMBINE_BEFORE_APPEND = "combine.before.append"
COMPRESSION_TYPE = "compression.type"

MAX_MESSAGE_BYTES = "max.message.bytes"
"""Kafka's topic-level name for ``message.max.bytes`` (the broker's): the same setting here."""

LONG_MAX = 2**63 - 1

# Kafka's segment.bytes default is 1 GiB of log; a Parquet file of that size is
# too coarse for Spark's parallelism, so files default to 128 MiB.
DEFAULT_SEGMENT_BYTES = 128 * 1024 * 1024
KAFKA_DEFAULT_SEGMENT_BYTES = 1024 * 1024 * 1024

_POLICIES = ("compact", "delete", "compact,delete")

COMPRESSION_TYPES = ("zstd", "lz4", "snappy", "gzip", "uncompressed", "producer")
"""Kafka's ``compression.type`` values: the codec of the Parquet pages the sink writes.
``producer`` (Kafka's default: keep what the producer sent) has no producer codec to keep
here and means the sink's default, ``zstd``."""

_UNITS_MS = {
    "week": 7 * 86_400_000,
    "day": 86_400_000,
    "hour": 3_600_000,
    "minute": 60_000,
    "second": 1_000,
    "millisecond": 1,
}
_INTERVAL = re.compile(r"^(?:interval\s+)?(\d+)\s*([a-z]+?)s?$")


TOPIC_CONFIG_PREFIX = "compacted.sink.topic."
"""Where a log stores a topic-level setting: ``compacted.sink.topic.delete.retention.ms``."""

TOPIC_PROPERTIES = (
    CLEANUP_POLICY,
    MIN_CLEANABLE_DIRTY_RATIO,
    DELETE_RETENTION_MS,
    MIN_COMPACTION_LAG_MS,
    MAX_COMPACTION_LAG_MS,
    SEGMENT_BYTES,
    RETENTION_MS,
    RETENTION_BYTES,
    MESSAGE_MAX_BYTES,
    FILE_DELETE_DELAY_MS,
    COMBINE_BEFORE_APPEND,
    COMPRESSION_TYPE,
)
"""Kafka's topic-level settings (and ``combine.before.append``, not Kafka's): stored on the
log, obeyed by every process that opens it.
``file.delete.delay.ms`` is stored as Delta's own ``delta.deletedFileRetentionDuration``
(`sinks.log.history_window`), so that other engines' VACUUM keeps the same window."""

KAFKA_TOPIC_CONFIGS_NOT_APPLYING = frozenset(
    {
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "flush.messages",
        "flush.ms",
        "follower.replication.throttled.replicas",
        "index.interval.bytes",
        "leader.replication.throttled.replicas",
        "local.retention.bytes",
        "local.retention.ms",
        "message.downconversion.enable",
        "message.format.version",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.difference.max.ms",
        "message.timestamp.type",
        "min.insync.replicas",
        "preallocate",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
        "remote.storage.enable",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
    }
)
"""Kafka's topic-level configs (Kafka 3.x and 4.x ``kafka-configs --describe --all``) that
mean nothing for a log on Delta: segment rolling, flushing, compression of record batches,
replication, tiered storage, timestamp checks. `CleanerConfig.from_properties` accepts them
and says once per process that they do not apply."""

MEANINGS_HERE = {
    SEGMENT_BYTES: (
        "here the largest Parquet file a cleaner pass writes (default 128 MiB), not the size "
        "at which Kafka rolls a segment: the sink writes one file per partition and batch"
    ),
}
"""Kafka's names that mean something else here: what each means here, for errors and docs."""


@dataclass(frozen=True, kw_only=True)
class CleanerConfig:
    """How one log is cleaned and retained. Immutable; defaults are Kafka's unless noted.

    - ``cleanup_policy``: ``"compact"``, ``"delete"`` or ``"compact,delete"``.
    - ``min_cleanable_dirty_ratio``: clean a partition once its dirty ratio exceeds this.
    - ``delete_retention_ms``: how long a tombstone stays after the pass that first kept it.
    - ``min_compaction_lag_ms`` / ``max_compaction_lag_ms``: a record stays uncompacted at
      least / at most this long.
    - ``segment_bytes``: the largest Parquet file a pass writes (default 128 MiB, not 1 GiB).
    - ``retention_ms`` / ``retention_bytes``: time and size retention (``-1`` = unlimited),
      applied when the policy contains ``delete``.
    - ``message_max_bytes``: the largest value accepted (Kafka's ``message.max.bytes``).
    - ``file_delete_delay_ms``: the history window (also accepted as Delta's
      ``delta.deletedFileRetentionDuration``, in ms or as ``"interval 7 days"``). A data file
      leaves storage once it has been out of the log (removed by a pass, retention or
      ``delete_records``) this long, and a file no commit names once it is this old; time
      travel (``state(as_of=...)``) reaches back this far. Default 7 days, Delta's default,
      not Kafka's 60 s: Delta readers (time travel, other engines, lagging streams) read
      removed files long after the commit that removed them, and other engines' VACUUM uses
      the same table property. See `sinks.log.history_window`.
    - ``compression_type``: the codec of the data files the sink writes (appends, passes,
      replays): ``zstd`` (the default: the smallest files), ``lz4`` (about twice the bytes of
      ``zstd`` for values that compress poorly, and about half the CPU to decode: the fastest
      state read, docs/benchmarks.md), ``snappy``, ``gzip``, ``uncompressed``; ``producer``
      means ``zstd``. Kafka's topic config of the same name. Files already written keep
      their codec; readers read any.
    - ``combine_before_append``: an append stores only the last record of each (partition,
      key) of its micro-batch; the records it supersedes keep their offsets as gaps, as a
      pass leaves them (default False: Kafka stores every record; not a Kafka setting).
      Refused with ``min_compaction_lag_ms`` > 0. See design.md §44.
    - ``log_retention_check_interval_ms``: how often the cleaner deletes expired files
      (Kafka's broker-level ``log.retention.check.interval.ms``, 5 minutes).
    - ``log_cleaner_io_max_bytes_per_second``: Kafka's Throttler: passes are spaced so the
      cleaner reads and writes at most this many bytes a second on average (default: no limit).
    - ``log_cleaner_max_bytes_per_pass``: the most input bytes one pass reads; a larger
      cleanable section is cleaned in several bounded passes, dirtiest partitions first
      (default: no limit; not a Kafka setting).
    - ``log_cleaner_threads``: how many Spark tasks a pass on the background cleaner
      thread runs at once (Kafka's cleaner threads, default 1), so the query's own jobs
      keep the other cores; a direct ``clean()`` uses every core.
    - ``log_cleaner_nice``: how much a background pass lowers its tasks' CPU priority
      (a Unix nice increment, 0-19, default 10; not a Kafka setting): a core the pass
      shares with the query goes to the query's tasks first. Linux only; 0 turns it off.
      See `sinks.cleaner.throttler.at_lower_priority`.
    - ``backoff_ms``: Kafka's ``log.cleaner.backoff.ms`` (15 s): how long the cleaner loop
      sleeps when no log is cleanable, and the first wait before a partition whose pass
      failed is tried again (doubling per failure, capped at an hour).
    - ``dedupe_buffer_size``: the memory one pass task's offset map may use (Kafka's
      ``log.cleaner.dedupe.buffer.size``; default 512 MiB, not Kafka's 128 MiB, as a key
      here is held exactly, not as a 16-byte digest). Building the map costs about 256
      bytes a mapped record with 16-byte keys (`sinks.cleaner.offset_map.BYTES_PER_MAPPED_RECORD`),
      so the default maps 2.1 M records at once; a larger dirty section is mapped a hash
      bucket of keys at a time, holding 8 bytes a key between buckets (up to 8 buckets:
      about 13 M records of a partition in one pass); beyond that a partition is cleaned
      in several passes, as Kafka's. Each of a pass's concurrent tasks holds its own map.
    """

    cleanup_policy: CleanupPolicy = "compact"
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    retention_ms: int = 604_800_000
    retention_bytes: int = -1
    message_max_bytes: int = 1_048_588
    file_delete_delay_ms: int = 604_800_000
    combine_before_append: bool = False
    compression_type: str = "zstd"
    log_retention_check_interval_ms: int = 300_000
    log_cleaner_io_max_bytes_per_second: float = float("inf")
    log_cleaner_max_bytes_per_pass: int = LONG_MAX
    log_cleaner_threads: int = 1
    log_cleaner_nice: int = 10
    backoff_ms: int = BACKOFF_BASE_MS
    dedupe_buffer_size: int = 512 * 1024 * 1024

    _explicit: ClassVar[frozenset[str]]

    def __new__(cls, **settings: Any) -> CleanerConfig:
        # The settings named at construction, kept beside the fields (not one of them: two
        # configs with equal values are equal). `dataclasses.replace` names every field, so
        # its result counts every setting as explicit: use `with_settings`.
        config = super().__new__(cls)
        object.__setattr__(config, "_explicit", frozenset(settings))
        return config

    def __post_init__(self) -> None:
        _check_policy(CLEANUP_POLICY, self.cleanup_policy)
        ratio = self.min_cleanable_dirty_ratio
        if not isinstance(ratio, int | float) or not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"{MIN_CLEANABLE_DIRTY_RATIO} must be in [0, 1], got {ratio!r}")
        for name in (
            DELETE_RETENTION_MS,
            MIN_COMPACTION_LAG_MS,
            MAX_COMPACTION_LAG_MS,
            FILE_DELETE_DELAY_MS,
            LOG_RETENTION_CHECK_INTERVAL_MS,
            LOG_CLEANER_BACKOFF_MS,
        ):
            _check_int(name, getattr(self, FIELD_OF[name]), minimum=0)
        try:
            _check_int(SEGMENT_BYTES, self.segment_bytes, minimum=1)
        except ConfigError as e:
            raise ConfigError(f"{e} ({SEGMENT_BYTES} is {MEANINGS_HERE[SEGMENT_BYTES]})") from None
        _check_int(MESSAGE_MAX_BYTES, self.message_max_bytes, minimum=1)
        rate = self.log_cleaner_io_max_bytes_per_second
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise ConfigError(f"{LOG_CLEANER_IO_MAX_BYTES_PER_SECOND} must be > 0, got {rate!r}")
        _check_int(LOG_CLEANER_MAX_BYTES_PER_PASS, self.log_cleaner_max_bytes_per_pass, minimum=1)
        _check_int(LOG_CLEANER_THREADS, self.log_cleaner_threads, minimum=1)
        _check_int(LOG_CLEANER_NICE, self.log_cleaner_nice, minimum=0)
        _check_int(LOG_CLEANER_DEDUPE_BUFFER_SIZE, self.dedupe_buffer_size, minimum=1)
        if self.log_cleaner_nice > 19:
            raise ConfigError(f"{LOG_CLEANER_NICE} must be in [0, 19], got {self.log_cleaner_nice}")
        for name in (RETENTION_MS, RETENTION_BYTES):
            _check_int(name, getattr(self, FIELD_OF[name]), minimum=-1)
        if self.max_compaction_lag_ms < self.min_compaction_lag_ms:
            raise ConfigError(
                f"{MAX_COMPACTION_LAG_MS} ({self.max_compaction_lag_ms}) must not be below "
                f"{MIN_COMPACTION_LAG_MS} ({self.min_compaction_lag_ms})"
            )
        if self.compression_type not in COMPRESSION_TYPES:
            raise ConfigError(
                f"{COMPRESSION_TYPE} must be one of {', '.join(COMPRESSION_TYPES)}, "
                f"got {self.compression_type!r}"
            )
        if not isinstance(self.combine_before_append, bool):
            raise ConfigError(
                f"{COMBINE_BEFORE_APPEND} must be true or false, got {self.combine_before_append!r}"
            )
        if self.combine_before_append and self.min_compaction_lag_ms > 0:
            # Kafka promises a record stays uncompacted that long (design.md §44).
            raise ConfigError(
                f"{COMBINE_BEFORE_APPEND}=true drops superseded records at the append, which "
                f"breaks {MIN_COMPACTION_LAG_MS}={self.min_compaction_lag_ms} (a record stays "
                f"uncompacted at least that long): set {MIN_COMPACTION_LAG_MS}=0 or "
                f"{COMBINE_BEFORE_APPEND}=false"
            )

    @property
    def parquet_codec(self) -> str:
        """``compression_type`` as pyarrow's Parquet writer names it."""
        return PARQUET_CODECS[self.compression_type]

    @property
    def compact(self) -> bool:
        """True when the policy cleans by key."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """True when the policy applies time and size retention."""
        return "delete" in self.cleanup_policy

    @property
    def explicit(self) -> frozenset[str]:
        """The settings (Kafka's dotted names) this config was built with, not left to defaults."""
        named = self.__dict__.get("_explicit", frozenset())
        return frozenset(key for key, field in FIELD_OF.items() if field in named)

    def with_settings(self, **changes: Any) -> CleanerConfig:
        """This config with ``changes`` (snake_case fields); what was explicit stays explicit."""
        named = set(self.__dict__.get("_explicit", frozenset())) | set(changes)
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return type(self)(**{k: v for k, v in {**values, **changes}.items() if k in named})

    def topic_properties(self) -> dict[str, str]:
        """The topic-level settings (`TOPIC_PROPERTIES`) as Kafka's dotted names and text."""
        return {key: property_text(getattr(self, FIELD_OF[key])) for key in TOPIC_PROPERTIES}

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any] | str) -> CleanerConfig:
        """Build a config from Kafka's dotted names; values may be strings, as in a properties file.

        ``properties`` is a mapping, or the text ``kafka-configs --describe`` prints for a
        topic (`parse_kafka_describe`), so a topic's whole config is taken as it is. Kafka's
        topic configs that do not apply here (`KAFKA_TOPIC_CONFIGS_NOT_APPLYING`) are
        accepted and named in one warning, once per process for each key. Kafka's
        ``max.message.bytes`` is ``message.max.bytes``.

        Raises `ConfigError` naming the key for an unknown key or an invalid value (for
        ``segment.bytes``, saying what it means here, `MEANINGS_HERE`). Pure but for the
        warning.
        """
        if isinstance(properties, str):
            properties = parse_kafka_describe(properties)
        kwargs: dict[str, Any] = {}
        not_applying = []
        for key, raw in properties.items():
            field = FIELD_OF.get(key) or _ALIASES.get(key)
            if field is None and key in KAFKA_TOPIC_CONFIGS_NOT_APPLYING:
                not_applying.append(key)
                continue
            if field is None:
                known = ", ".join(sorted([*FIELD_OF, *_ALIASES]))
                raise ConfigError(
                    f"unknown cleaner property {key!r}; known: {known} (and Kafka's topic "
                    "configs that do not apply to a log on Delta, accepted and ignored: "
                    f"{', '.join(sorted(KAFKA_TOPIC_CONFIGS_NOT_APPLYING))})"
                )
            try:
                kwargs[field] = _parse(key, raw, _TYPE_OF[field])
            except ConfigError as e:
                meaning = MEANINGS_HERE.get(key)
                raise ConfigError(f"{e} ({key} is {meaning})" if meaning else str(e)) from None
        _say_not_applying(not_applying)
        if kwargs.get("segment_bytes") == KAFKA_DEFAULT_SEGMENT_BYTES:
            warn_once(
                (SEGMENT_BYTES, KAFKA_DEFAULT_SEGMENT_BYTES),
                "%s=%d (Kafka's default) is %s: leave it out for 128 MiB files",
                SEGMENT_BYTES,
                KAFKA_DEFAULT_SEGMENT_BYTES,
                MEANINGS_HERE[SEGMENT_BYTES],
            )
        return cls(**kwargs)

    def to_properties(self) -> dict[str, str]:
        """The config as Kafka's dotted names with string values (inverse of `from_properties`)."""
        return {key: property_text(getattr(self, field)) for key, field in FIELD_OF.items()}


PARQUET_CODECS = {
    "zstd": "zstd",
    "producer": "zstd",
    "lz4": "lz4",  # pyarrow writes Parquet's LZ4_RAW
    "snappy": "snappy",
    "gzip": "gzip",
    "uncompressed": "none",
}
"""pyarrow's name of each ``compression.type``'s Parquet codec."""

FIELD_OF = {
    CLEANUP_POLICY: "cleanup_policy",
    MIN_CLEANABLE_DIRTY_RATIO: "min_cleanable_dirty_ratio",
    DELETE_RETENTION_MS: "delete_retention_ms",
    MIN_COMPACTION_LAG_MS: "min_compaction_lag_ms",
    MAX_COMPACTION_LAG_MS: "max_compaction_lag_ms",
    SEGMENT_BYTES: "segment_bytes",
    RETENTION_MS: "retention_ms",
    RETENTION_BYTES: "retention_bytes",
    MESSAGE_MAX_BYTES: "message_max_bytes",
    FILE_DELETE_DELAY_MS: "file_delete_delay_ms",
    COMBINE_BEFORE_APPEND: "combine_before_append",
    COMPRESSION_TYPE: "compression_type",
    LOG_RETENTION_CHECK_INTERVAL_MS: "log_retention_check_interval_ms",
    LOG_CLEANER_IO_MAX_BYTES_PER_SECOND: "log_cleaner_io_max_bytes_per_second",
    LOG_CLEANER_MAX_BYTES_PER_PASS: "log_cleaner_max_bytes_per_pass",
    LOG_CLEANER_THREADS: "log_cleaner_threads",
    LOG_CLEANER_NICE: "log_cleaner_nice",
    LOG_CLEANER_BACKOFF_MS: "backoff_ms",
    LOG_CLEANER_DEDUPE_BUFFER_SIZE: "dedupe_buffer_size",
}
"""The `CleanerConfig` field each dotted name sets."""
# Other names for the same field: the history window under its Delta table property name,
# the largest value under Kafka's topic-level name.
_ALIASES = {
    DELETED_FILE_RETENTION_DURATION: "file_delete_delay_ms",
    MAX_MESSAGE_BYTES: "message_max_bytes",
}
_TYPE_OF = {f.name: f.type for f in fields(CleanerConfig)}
PROPERTY_NAMES = frozenset([*FIELD_OF, *_ALIASES])
"""Every dotted name `CleanerConfig.from_properties` accepts."""


def topic_key(key: str) -> str:
    """The name this package stores a topic config under: Kafka's topic-level
    ``max.message.bytes`` is ``message.max.bytes``; every other name is itself."""
    return MESSAGE_MAX_BYTES if key == MAX_MESSAGE_BYTES else key


def _say_not_applying(keys: list[str]) -> None:
    """One warning naming the Kafka topic configs in ``keys`` not already named in this process."""
    new = [key for key in sorted(set(keys)) if first_time(("kafka config not applying", key))]
    if not new:
        return
    logger.warning(
        "Kafka topic config%s %s do%s not apply to a log on Delta (segments, flushing, "
        "compression, replication, tiered storage are Delta's or Spark's here): ignored",
        "s" if len(new) > 1 else "",
        ", ".join(new),
        "" if len(new) > 1 else "es",
    )


_DESCRIBE_ENTRY = re.compile(r"^\s*([A-Za-z0-9_.\-]+)=(.*?)(?:\s+sensitive=(?:true|false).*)?$")


def parse_kafka_describe(text: str) -> dict[str, str]:
    """The settings in the text ``kafka-configs --describe`` (with or without ``--all``)
    prints for a topic, or a properties file's ``key=value`` lines: ``{name: value}``.

    Header lines (``Dynamic configs for topic users are:``, ``All configs for ...``),
    blank lines and ``#`` comments are skipped; each entry's ``sensitive=...`` and
    ``synonyms={...}`` are dropped. Left out: an entry whose value is Kafka's built-in
    default (``--all`` prints them with ``synonyms={DEFAULT_CONFIG:...}``), so the sink's
    own defaults apply where they differ (``segment.bytes``, ``file.delete.delay.ms``),
    and a sensitive value Kafka hides (``null`` with ``sensitive=true``). Raises
    `ConfigError` naming the line for any other line. Pure.
    """
    settings: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")) or stripped.endswith(" are:"):
            continue
        match = _DESCRIBE_ENTRY.match(line)
        if match is None:
            raise ConfigError(
                f"line {number} of a topic config is not KEY=VALUE (as kafka-configs "
                f"--describe prints): {stripped!r}"
            )
        key, value = match.group(1), match.group(2).strip()
        if value == "null" and "sensitive=true" in line:
            continue
        if "synonyms={DEFAULT_CONFIG:" in line:
            continue
        settings[key] = value
    return settings


def property_text(value: Any) -> str:
    """A setting's value as a properties file holds it (booleans as Kafka's ``true``/``false``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse(key: str, raw: Any, type_name: Any) -> Any:
    text = str(raw).strip()
    if type_name in ("bool", bool):
        if isinstance(raw, bool):
            return raw
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ConfigError(f"{key} must be true or false, got {raw!r}")
    if key == DELETED_FILE_RETENTION_DURATION and not text.lstrip("-").isdigit():
        return parse_interval_ms(text, key=key)
    try:
        if type_name in ("int", int):
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(text) if not isinstance(raw, float) else int(raw)
        if type_name in ("float", float):
            return float(text)
    except ValueError:
        raise ConfigError(f"{key} must be a {type_name}, got {raw!r}") from None
    if key == CLEANUP_POLICY:
        text = ",".join(part.strip() for part in text.split(","))
        if text == "delete,compact":
            text = "compact,delete"
    return text


def _check_policy(key: str, value: Any) -> None:
    if value not in _POLICIES:
        raise ConfigError(f"{key} must be one of {', '.join(_POLICIES)}, got {value!r}")


def _check_int(key: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")


# -- Delta's interval text (the history window as a table property) -------------------------


def format_interval(ms: int) -> str:
    """Delta's interval text for ``ms`` in the largest unit dividing it (``interval 7 days``)."""
    for unit, size in _UNITS_MS.items():
        if ms and ms % size == 0:
            count = ms // size
            return f"interval {count} {unit}{'s' if count != 1 else ''}"
    return f"interval {ms} milliseconds"


def parse_interval_ms(text: str, *, key: str = DELETED_FILE_RETENTION_DURATION) -> int:
    """Milliseconds of Delta's ``interval <n> <unit>`` (``"interval 7 days"``, ``"1 hour"``).

    Raises `ConfigError` naming ``key`` for anything else.
    """
    match = _INTERVAL.match(text.strip().lower())
    unit = match.group(2).removesuffix("s") if match else None
    if match is None or unit not in _UNITS_MS:
        raise ConfigError(
            f"{key} must be milliseconds or 'interval <n> <unit>' "
            f"(units: {', '.join(_UNITS_MS)}), got {text!r}"
        )
    return int(match.group(1)) * _UNITS_MS[unit]
