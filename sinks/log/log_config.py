"""The topic's config on the log: read when a process opens it, changed by one commit.

Kafka stores a topic's configs with the topic (``kafka-configs --alter``) and every
broker's cleaner obeys them. Here a log stores its topic-level settings
(`sinks.config.TOPIC_PROPERTIES`) as Delta table properties, ``compacted.sink.topic.<name>``
(beside ``compacted.sink.key.columns``, `sinks.log.log_keys`), written when the log is
created. The prefix keeps them apart from Delta's ``delta.*`` and from any other tool's
keys in the same table, says what they are to someone reading ``SHOW TBLPROPERTIES``, and
lets tools that carry ``compacted.sink.*`` (export, replay) carry them too. The history
window (``file.delete.delay.ms``) is stored once, as Delta's
``delta.deletedFileRetentionDuration``, which other engines' VACUUM obeys.

`LogConfig` is what a log holds, `resolve` what a process applies of it beside its own
settings (Kafka's rule: the topic's config beats the broker's defaults, an explicit
override beats the topic's); `opened_log_config` is that, for a log a process opens;
`alter_log_config` changes what the log holds in one Delta commit, validated before
anything is written (design.md §29).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Literal

from sinks.config import (
    DELETE_RETENTION_MS,
    DELETED_FILE_RETENTION_DURATION,
    FIELD_OF,
    FILE_DELETE_DELAY_MS,
    KAFKA_TOPIC_CONFIGS_NOT_APPLYING,
    PROPERTY_NAMES,
    TOPIC_CONFIG_PREFIX,
    TOPIC_PROPERTIES,
    CleanerConfig,
    format_interval,
    property_text,
    topic_key,
)
from sinks.errors import ConfigError, NotACompactedLogError
from sinks.log.history_window import DEFAULT_WINDOW_MS, table_properties
from sinks.log.log_format import COMMIT_INFO_KEY
from sinks.log.log_keys import KEY_COLUMNS_PROPERTY
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.records import OFFSET, PARTITION, VALUE

logger = logging.getLogger("compacted_sink")

ALTER_OPERATION = "alter topic config"
"""The ``operation`` in an alter commit's ``compactedSink`` info (Delta's: SET TBLPROPERTIES)."""


ConfigSource = Literal["log", "override", "default"]


@dataclass(frozen=True)
class LogConfig:
    """The topic-level settings a log stores (Kafka's ``LogConfig`` overrides of a topic).

    ``properties`` maps Kafka's dotted names to the text the log holds; a setting the log
    does not hold is absent. ``recorded`` is False for a log created before topic configs
    were stored (it holds no ``compacted.sink.topic.*`` property): defaults apply there,
    or what the process passes. A deleted setting is held as an empty value (delta-rs
    cannot remove a table property) and reads as absent.
    """

    properties: Mapping[str, str]
    recorded: bool = True

    @classmethod
    def from_table_properties(cls, configuration: Mapping[str, str | None]) -> LogConfig:
        """The config in a log's Delta table properties. Raises `ConfigError` naming the
        property when a stored value is invalid; an unknown ``compacted.sink.topic.*`` key
        is ignored with a warning."""
        stored: dict[str, str] = {}
        recorded = False
        for name, value in configuration.items():
            if not name.startswith(TOPIC_CONFIG_PREFIX):
                continue
            recorded = True
            key = name.removeprefix(TOPIC_CONFIG_PREFIX)
            if key not in TOPIC_PROPERTIES or key == FILE_DELETE_DELAY_MS:
                # A newer version's setting, or a hand-made typo: never a reason to stop.
                logger.warning("table property %s is not a topic config here; ignored", name)
                continue
            if value:
                stored[key] = value
        window = configuration.get(DELETED_FILE_RETENTION_DURATION)
        if window:
            stored[FILE_DELETE_DELAY_MS] = window
        try:
            parsed = CleanerConfig.from_properties(_as_properties(stored))
        except ConfigError as e:
            raise ConfigError(f"the log's stored config ({TOPIC_CONFIG_PREFIX}*): {e}") from None
        return cls({key: property_text(getattr(parsed, FIELD_OF[key])) for key in stored}, recorded)

    @property
    def config(self) -> CleanerConfig:
        """The log's settings; defaults for what it does not hold."""
        return CleanerConfig.from_properties(self.properties)


def topic_table_properties(config: CleanerConfig) -> dict[str, str]:
    """The Delta table properties a new log stores ``config``'s topic-level settings in
    (``file.delete.delay.ms`` goes in as Delta's window, `sinks.log.history_window`)."""
    return {
        TOPIC_CONFIG_PREFIX + key: value
        for key, value in config.topic_properties().items()
        if key != FILE_DELETE_DELAY_MS
    }


@dataclass(frozen=True)
class ResolvedConfig:
    """The settings a process applies to one log, and where each topic-level one comes from.

    ``sources``: per topic-level setting, ``"log"`` (the log holds it), ``"override"``
    (this process set it explicitly, to another value than the log's, or on a log that
    holds none) or ``"default"``. ``overrides``: (setting, the log's value, this
    process's) for every explicit setting that differs from what the log holds.
    """

    config: CleanerConfig
    sources: Mapping[str, ConfigSource]
    overrides: tuple[tuple[str, str, str], ...] = ()
    recorded: bool = True

    def override_line(self, log_path: str) -> str | None:
        """The one line that says this process overrides the log's config; None when not."""
        if not self.overrides:
            return None
        changes = ", ".join(f"{key} {theirs} -> {mine}" for key, theirs, mine in self.overrides)
        return (
            f"log {log_path}: this process overrides the log's config ({changes}); the log's "
            f"values stay for every other process (compacted-sink configs --path {log_path} "
            "--alter changes them)"
        )

    def describe(self) -> list[tuple[str, str, ConfigSource]]:
        """(setting, value, source) for every topic-level setting, in `TOPIC_PROPERTIES` order."""
        values = self.config.topic_properties()
        return [(key, values[key], self.sources[key]) for key in TOPIC_PROPERTIES]


def resolve(log: LogConfig | None, process: CleanerConfig, *, log_path: str) -> ResolvedConfig:
    """The settings ``process`` applies to a log that stores ``log`` (None: no log yet).

    Kafka's rule: a topic's own config beats the broker's defaults, and an explicit
    override beats the topic's. Here the log's stored settings beat this process's
    defaults; a setting the process named (`CleanerConfig.explicit`) beats the log's,
    and `ResolvedConfig.override_line` says so. Process settings (``log.cleaner.*``)
    are always the process's own.

    One exception: a process may never shorten the log's ``delete.retention.ms``. A
    shorter delete horizon loses data where no one looks: a consumer that lags between
    the two values misses the delete and keeps the key forever, and nothing in the log
    shows it. So it is refused with `ConfigError`, naming both values and the command
    that changes the log's config for every process, instead of being kept quietly (the
    process's settings would then lie about what it does) or applied with a warning
    that a scheduled job's logs bury. Every other override is reversible or visible in
    the log itself (retention removes records from every reader at once) and is applied.
    """
    if log is None:
        sources = {k: "override" if k in process.explicit else "default" for k in TOPIC_PROPERTIES}
        return ResolvedConfig(process, sources)  # type: ignore[arg-type]
    stored = log.config
    values = {f.name: getattr(process, f.name) for f in fields(CleanerConfig)}
    sources: dict[str, ConfigSource] = {}
    overrides = []
    for key in TOPIC_PROPERTIES:
        field = FIELD_OF[key]
        held = key in log.properties
        mine, theirs = getattr(process, field), getattr(stored, field)
        if key in process.explicit:
            values[field] = mine
            sources[key] = "log" if held and mine == theirs else "override"
            if (held or log.recorded) and mine != theirs:  # what every other process applies
                overrides.append((key, property_text(theirs), property_text(mine)))
        elif held:
            values[field] = theirs
            sources[key] = "log"
        else:
            sources[key] = "default"
    shorter = next((o for o in overrides if o[0] == DELETE_RETENTION_MS), None)
    if shorter is not None and int(shorter[2]) < int(shorter[1]):
        _, theirs, mine = shorter
        raise ConfigError(
            f"log {log_path}: this process sets {DELETE_RETENTION_MS}={mine} "
            f"({_human_ms(int(mine))}), shorter than the log's {theirs} ({_human_ms(int(theirs))}):"
            f" a consumer lagging between the two would miss deletes. Leave "
            f"{DELETE_RETENTION_MS} out of this process's settings to use the log's, or change "
            f"the log's for every process: compacted-sink configs --path {log_path} --alter "
            f"--add-config {DELETE_RETENTION_MS}={mine}"
        )
    config = CleanerConfig(**values)
    object.__setattr__(config, "_explicit", process.__dict__.get("_explicit", frozenset()))
    return ResolvedConfig(config, sources, tuple(overrides), log.recorded)


def _as_properties(stored: Mapping[str, str]) -> dict[str, str]:
    # The window is held in Delta's interval text under Delta's name.
    return {
        (DELETED_FILE_RETENTION_DURATION if key == FILE_DELETE_DELAY_MS else key): value
        for key, value in stored.items()
    }


def _human_ms(ms: int) -> str:
    return format_interval(ms).removeprefix("interval ")


def log_config(snapshot: LogSnapshot) -> LogConfig:
    """The topic config ``snapshot``'s log stores (as of that version). Reads no data file."""
    return LogConfig.from_table_properties(snapshot.table.metadata().configuration)


def opened_log_config(log: LogTable, config: CleanerConfig | None) -> ResolvedConfig:
    """The settings a process opened on ``log`` with ``config`` applies (`resolve`).

    None takes the log's settings (defaults where it holds none). A process's explicit
    settings that differ from the log's are applied and said in one warning line; a
    shorter ``delete.retention.ms`` than the log's raises `ConfigError`. A log that does
    not exist yet will be created with ``config``.
    """
    process = config if config is not None else CleanerConfig()
    snapshot = log.snapshot(verify=False)
    stored = log_config(snapshot) if snapshot is not None else None
    resolved = resolve(stored, process, log_path=log.uri)
    line = resolved.override_line(log.uri)
    if line is not None:
        logger.warning("%s", line)
    return resolved


@dataclass(frozen=True)
class ConfigChange:
    """What `alter_log_config` committed: each changed setting's (old, new) text (None:
    not held, the default applies), and the Delta version of the commit (None: no change)."""

    log_path: str
    changes: Mapping[str, tuple[str | None, str | None]]
    version: int | None

    def summary(self) -> str:
        if self.version is None:
            return f"{self.log_path}: nothing to change"
        said = ", ".join(
            f"{key} {old if old is not None else '(default)'} -> "
            f"{new if new is not None else '(default)'}"
            for key, (old, new) in self.changes.items()
        )
        return f"{self.log_path}: {said} (Delta v{self.version}, {ALTER_OPERATION})"


def alter_log_config(
    log: LogTable, *, add: Mapping[str, str] | None = None, delete: Sequence[str] = ()
) -> ConfigChange:
    """Set ``add`` and delete ``delete`` (back to the default) on the log, in one Delta commit.

    Kafka's ``kafka-configs --alter --add-config k=v --delete-config k``. Every key must be
    a topic-level setting and every value valid (`CleanerConfig.from_properties`, together
    with the settings the log keeps): otherwise `ConfigError` names the key and nothing is
    committed. Idempotent: a change to what the log already holds commits nothing. The
    commit is Delta's SET TBLPROPERTIES, with ``compactedSink.operation`` =
    `ALTER_OPERATION`; processes that open the log afterwards apply it.
    """
    add = {topic_key(k): v for k, v in (add or {}).items()}
    delete = [topic_key(k) for k in delete]
    snapshot = log.snapshot(verify=False)
    if snapshot is None:
        raise FileNotFoundError(f"no compacted log at {log.uri}")
    _check_compacted_log(snapshot)
    for key in [*add, *delete]:
        _check_topic_key(key)
    both = sorted(set(add) & set(delete))
    if both:
        raise ConfigError(f"{both[0]}: given to both --add-config and --delete-config")
    current = log_config(snapshot)
    wanted = {k: v for k, v in current.properties.items() if k not in delete}
    try:
        parsed = CleanerConfig.from_properties({**wanted, **add})
    except ConfigError as e:
        raise ConfigError(f"{e}; nothing committed to {log.uri}") from None
    normalized = parsed.topic_properties()
    for key in add:
        wanted[key] = normalized[key]
    changes = {
        key: (current.properties.get(key), wanted.get(key))
        for key in TOPIC_PROPERTIES
        if current.properties.get(key) != wanted.get(key) and (key in add or key in delete)
    }
    if not changes:
        return ConfigChange(log.uri, {}, None)
    properties: dict[str, str] = {}
    for key, (_, new) in changes.items():
        if key == FILE_DELETE_DELAY_MS:
            properties.update(table_properties(int(new) if new is not None else DEFAULT_WINDOW_MS))
        else:
            properties[TOPIC_CONFIG_PREFIX + key] = new or ""
    snapshot.committer.set_properties(
        snapshot.table_to_change(),
        properties,
        metadata={
            COMMIT_INFO_KEY: {
                "operation": ALTER_OPERATION,
                "added": {k: new for k, (_, new) in changes.items() if new is not None},
                "deleted": [k for k, (_, new) in changes.items() if new is None],
            }
        },
    )
    after = log.snapshot(verify=False)
    assert after is not None
    logger.info("altered the config of %s: %s", log.uri, changes)
    return ConfigChange(log.uri, changes, after.version)


def _check_compacted_log(snapshot: LogSnapshot) -> None:
    """Refuse another table: a config commit would change a table this sink does not own."""
    configuration = snapshot.table.metadata().configuration
    names = set(snapshot.spark_schema.names)
    if KEY_COLUMNS_PROPERTY in configuration or {VALUE, PARTITION, OFFSET} <= names:
        return
    raise NotACompactedLogError(
        f"{snapshot.uri} is a Delta table but not a compacted log (no "
        f"{KEY_COLUMNS_PROPERTY} property, columns {sorted(names)}); nothing committed: "
        "configs changes only logs a compacted-state sink wrote",
        path=snapshot.uri,
    )


def _check_topic_key(key: str) -> None:
    if key in TOPIC_PROPERTIES:
        return
    if key == DELETED_FILE_RETENTION_DURATION:
        raise ConfigError(f"{key}: set the history window as {FILE_DELETE_DELAY_MS} (ms)")
    if key in KAFKA_TOPIC_CONFIGS_NOT_APPLYING:
        raise ConfigError(
            f"{key} is a Kafka topic config that does not apply to a log on Delta (segments, "
            "flushing, compression, replication, tiered storage are Delta's or Spark's here): "
            "nothing to store"
        )
    if key not in PROPERTY_NAMES:
        raise ConfigError(
            f"unknown topic config {key!r}; topic configs: {', '.join(TOPIC_PROPERTIES)}"
        )
    raise ConfigError(
        f"{key} is a process setting (cluster-wide in Kafka), not a topic config: set it in "
        f"the job file or the process's CleanerConfig. Topic configs: {', '.join(TOPIC_PROPERTIES)}"
    )
