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

`opened_log_config` is what every process applies (`sinks.config.resolve`);
`alter_log_config` changes what the log holds in one Delta commit, validated before
anything is written (design.md §29).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sinks.config import (
    DELETED_FILE_RETENTION_DURATION,
    FILE_DELETE_DELAY_MS,
    KAFKA_TOPIC_CONFIGS_NOT_APPLYING,
    PROPERTY_NAMES,
    TOPIC_CONFIG_PREFIX,
    TOPIC_PROPERTIES,
    CleanerConfig,
    LogConfig,
    ResolvedConfig,
    resolve,
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


def log_config(snapshot: LogSnapshot) -> LogConfig:
    """The topic config ``snapshot``'s log stores (as of that version). Reads no data file."""
    return LogConfig.from_table_properties(snapshot.table.metadata().configuration)


def opened_log_config(log: LogTable, config: CleanerConfig | None) -> ResolvedConfig:
    """The settings a process opened on ``log`` with ``config`` applies (`sinks.config.resolve`).

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
