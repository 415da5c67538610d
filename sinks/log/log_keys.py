"""`LogKeys`: what makes a record's key in a log, recorded on the log itself.

Kafka's compacted topic keys every record by its message key; here a log's key is
one or more columns, and "latest" may follow a ``sequence_column`` instead of the
offset (design.md §13). Both are written as Delta table properties when the log is
created, so that anyone holding only the path reads the state the sink keeps
(`sinks.reading.arrow_state`, other engines, the CLI):

- ``compacted.sink.key.columns``: the key columns, a JSON list (``["tenant", "id"]``);
- ``compacted.sink.sequence.column``: the sequence column, when there is one.

Invariant: a log's key never changes once the log exists. A sink opened on an
existing log with other key columns, or another sequence column, fails with
`KeyColumnsMismatchError` naming the log's; opened with ``key_columns=None`` it
takes the log's. A log created before the properties existed has none: its key
columns are read from its schema (every column before ``value``, the order
`sinks.produce.log_validator.prepare_batch` has always written) and it has no sequence
column; such a log accepts whatever a sink names, as it did before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sinks.errors import ConfigError, KeyColumnsMismatchError
from sinks.log.ownership import (
    KEY_COLUMNS_PROPERTY,
    check_compacted_log,
    check_new_log_location,
)
from sinks.log.records import PARTITION, VALUE

if TYPE_CHECKING:
    from sinks.log.log_table import LogSnapshot, LogTable

SEQUENCE_COLUMN_PROPERTY = "compacted.sink.sequence.column"
DEFAULT_KEY_COLUMNS = ("key",)


@dataclass(frozen=True, kw_only=True)
class LogKeys:
    """A log's key columns and its sequence column (None: latest is the highest offset).

    ``recorded`` is False for a log whose properties predate them (read from its schema).
    """

    key_columns: tuple[str, ...]
    sequence_column: str | None = None
    recorded: bool = True

    def __post_init__(self) -> None:
        if not self.key_columns:
            raise ConfigError("key_columns must name at least one column")

    def partitioned(self) -> LogKeys:
        """These keys with the partition first: the (partition, key) a log keeps the latest
        record of (a key column named ``partition`` is not repeated)."""
        own = tuple(k for k in self.key_columns if k != PARTITION)
        return replace(self, key_columns=(PARTITION, *own))

    def to_properties(self) -> dict[str, str]:
        """The Delta table properties that record these keys on a new log."""
        properties = {KEY_COLUMNS_PROPERTY: json.dumps(list(self.key_columns))}
        if self.sequence_column is not None:
            properties[SEQUENCE_COLUMN_PROPERTY] = self.sequence_column
        return properties

    @classmethod
    def from_properties(
        cls, configuration: Mapping[str, str | None], column_names: Sequence[str]
    ) -> LogKeys:
        """The keys a log records; for a log that records none, its schema's (see module doc).

        Raises `ConfigError` naming the property when its value is not a list of names.
        """
        text = configuration.get(KEY_COLUMNS_PROPERTY)
        if text is None:
            return cls(key_columns=_schema_keys(column_names), recorded=False)
        try:
            keys = json.loads(text)
        except ValueError:
            keys = None
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            raise ConfigError(
                f"table property {KEY_COLUMNS_PROPERTY} must be a JSON list of column names, "
                f"got {text!r}"
            )
        return cls(
            key_columns=tuple(keys),
            sequence_column=configuration.get(SEQUENCE_COLUMN_PROPERTY) or None,
        )

    def resolve(
        self, key_columns: Sequence[str] | None, sequence_column: str | None, *, log_path: str
    ) -> LogKeys:
        """The keys a sink opened with ``key_columns`` / ``sequence_column`` uses on this log.

        None takes the log's. A log that records its keys refuses others with
        `KeyColumnsMismatchError`; an older log takes the sink's.
        """
        keys = self.key_columns if key_columns is None else tuple(key_columns)
        sequence = self.sequence_column if sequence_column is None else sequence_column
        if not self.recorded:
            return LogKeys(key_columns=keys, sequence_column=sequence, recorded=False)
        if keys != self.key_columns:
            raise KeyColumnsMismatchError(
                f"{log_path}: the log is keyed by {list(self.key_columns)} (table property "
                f"{KEY_COLUMNS_PROPERTY}), the sink was given key_columns={list(keys)}; "
                "open it with key_columns=None (or the log's), or write to a new log"
            )
        if sequence != self.sequence_column:
            raise KeyColumnsMismatchError(
                f"{log_path}: the log orders records by sequence column "
                f"{self.sequence_column!r} (table property {SEQUENCE_COLUMN_PROPERTY}), the "
                f"sink was given sequence_column={sequence!r}; open it with the log's"
            )
        return self


def log_keys(snapshot: LogSnapshot, *, read_only: bool = False) -> LogKeys:
    """The keys ``snapshot``'s log records (as of that version). Reads no data file.

    Raises `NotACompactedLogError` when the table is not a compacted log (`sinks.log.ownership`),
    worded for a reader with ``read_only``.
    """
    check_compacted_log(snapshot.uri, snapshot.table, read_only=read_only)
    return LogKeys.from_properties(
        snapshot.table.metadata().configuration, snapshot.arrow_schema.names
    )


def opened_log_keys(
    log: LogTable, key_columns: Sequence[str] | str | None, sequence_column: str | None
) -> LogKeys:
    """The keys a sink opened on ``log`` uses: the log's when it exists (see `LogKeys.resolve`),
    else the sink's own, ``("key",)`` when it names none. A single column may be named by
    itself; an empty sequence is a `ValueError`. Opening never stops at another engine's
    change (`sinks.log.foreign.commits`): the sink's reads and writes do. Opening refuses,
    with `NotACompactedLogError`, a Delta table that is not a compacted log and a directory
    without one that holds files the sink did not write (`sinks.log.ownership`)."""
    if isinstance(key_columns, str):
        key_columns = (key_columns,)
    if key_columns is not None and not key_columns:
        raise ValueError("key_columns must name at least one column")
    snapshot = log.snapshot(verify=False)
    if snapshot is None:
        check_new_log_location(log.location)
        keys = DEFAULT_KEY_COLUMNS if key_columns is None else tuple(key_columns)
        return LogKeys(key_columns=keys, sequence_column=sequence_column)
    return log_keys(snapshot).resolve(key_columns, sequence_column, log_path=log.uri)


def _schema_keys(column_names: Sequence[str]) -> tuple[str, ...]:
    names = list(column_names)
    if VALUE not in names or names.index(VALUE) == 0:
        return DEFAULT_KEY_COLUMNS
    return tuple(names[: names.index(VALUE)])
