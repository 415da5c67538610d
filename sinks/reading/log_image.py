"""Verification of an export or a restore: two images of a log compared, pure.

`compare_images` takes two `LogImage`s (records with their config and offsets) and
compares them column by column, naming each difference (`Comparison`). Exact mode
matches records by (partition, key columns) and compares every column, the config and
each partition's log start and end offsets; new-offsets mode, the lossy restore's,
compares only the live records by key and says what it left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sinks.log.log_keys import (
    KEY_COLUMNS_PROPERTY,
    SEQUENCE_COLUMN_PROPERTY,
)
from sinks.log.records import OFFSET, PARTITION, VALUE
from sinks.reading.export_format import (
    EXACT,
    NOT_CARRIED,
    CarriedConfig,
    PartitionOffsets,
    RestoreMode,
    avro_value,
)


@dataclass(frozen=True)
class LogImage:
    """One side of a verification: records (dicts of ``columns``) and what travels beside them."""

    name: str
    columns: tuple[str, ...]
    records: Iterable[Mapping[str, Any]]
    config: CarriedConfig
    partitions: Mapping[int, PartitionOffsets]


@dataclass(frozen=True)
class Comparison:
    """Two `LogImage`s compared: counts, and each difference named (the first few in full).

    ``differing`` counts records whose (partition, key) both sides hold, per column that
    differs. ``not_compared`` names what the mode does not keep.
    """

    source: str
    target: str
    mode: RestoreMode
    source_records: int
    target_records: int
    live_keys: int
    tombstones: int
    missing: int
    unexpected: int
    differing: Mapping[str, int]
    config_differences: tuple[str, ...]
    offset_differences: tuple[str, ...]
    examples: tuple[str, ...]
    compared: tuple[str, ...]
    not_compared: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (
            self.missing
            or self.unexpected
            or self.differing
            or self.config_differences
            or self.offset_differences
        )

    @property
    def differences(self) -> int:
        return (
            self.missing
            + self.unexpected
            + sum(self.differing.values())
            + len(self.config_differences)
            + len(self.offset_differences)
        )

    def summary(self) -> str:
        verdict = "matches" if self.ok else "DOES NOT match"
        scope = f"{self.source_records} records ({self.live_keys} live keys"
        scope += f", {self.tombstones} tombstones)" if self.mode == EXACT else ")"
        columns = ", ".join(f"{c} {n}" for c, n in sorted(self.differing.items())) or "none"
        text = (
            f"{self.target} {verdict} {self.source}: {scope} against {self.target_records}; "
            f"compared {', '.join(self.compared)}, config"
            + (", log start and end offsets" if self.mode == EXACT else "")
            + f"; {self.missing} missing, {self.unexpected} unexpected, differing columns: "
            f"{columns}; config differences {len(self.config_differences)}"
        )
        if self.mode == EXACT:
            text += f"; offset differences {len(self.offset_differences)}"
        if self.not_compared:
            text += f"; not compared ({self.mode} mode): {', '.join(self.not_compared)}"
        return text

    def lines(self) -> list[str]:
        """The summary, then the first differences in full."""
        more = self.differences - len(self.examples)
        tail = [f"  … and {more} more difference(s)"] if more > 0 else []
        return [self.summary(), *(f"  {e}" for e in self.examples), *tail]


def compare_images(
    source: LogImage, target: LogImage, *, mode: RestoreMode = EXACT, max_examples: int = 10
) -> Comparison:
    """Compare two images record by record, column by column; pure.

    Exact: records are matched by (partition, key columns) and every column is compared
    (``partition`` and ``offset`` included), then the carried config and each partition's
    log start and end offsets. New-offsets: only the source's live records, matched by
    key columns, without ``partition``, ``offset``, ``delete_horizon_ms``, nor the offsets.
    Holds the target's records in memory.
    """
    keys = source.config.key_columns
    exact = mode == EXACT
    ignored = () if exact else (PARTITION, OFFSET, *NOT_CARRIED)
    compared = tuple(c for c in source.columns if c not in ignored)
    group = (PARTITION, *keys) if exact else keys
    examples: list[str] = []

    def note(text: str) -> None:
        if len(examples) < max_examples:
            examples.append(text)

    def key_of(record: Mapping[str, Any]) -> str:
        return canonical({k: record.get(k) for k in group})

    theirs: dict[str, dict[str, Any]] = {}
    target_records = 0
    for record in target.records:
        target_records += 1
        theirs[key_of(record)] = dict(record)
    source_records = live = tombstones = missing = 0
    differing: dict[str, int] = {}
    for record in source.records:
        if record.get(VALUE) is None:
            tombstones += 1
            if not exact:
                continue
        else:
            live += 1
        source_records += 1
        key = key_of(record)
        other = theirs.pop(key, None)
        if other is None:
            missing += 1
            note(f"missing from {target.name}: {key} (offset {record.get(OFFSET)})")
            continue
        for column in compared:
            a, b = canonical_value(record.get(column)), canonical_value(other.get(column))
            if a != b:
                differing[column] = differing.get(column, 0) + 1
                note(
                    f"{key}: {column} differs: {source.name} {_short(a)}, {target.name} {_short(b)}"
                )
    for key, record in theirs.items():
        note(f"not in {source.name}: {key} (offset {record.get(OFFSET)})")
    config = _config_differences(source, target)
    for line in config:
        note(line)
    offsets = _offset_differences(source, target) if exact else []
    for line in offsets:
        note(line)
    return Comparison(
        source=source.name,
        target=target.name,
        mode=mode,
        source_records=source_records,
        target_records=target_records,
        live_keys=live,
        tombstones=tombstones,
        missing=missing,
        unexpected=len(theirs),
        differing=differing,
        config_differences=tuple(config),
        offset_differences=tuple(offsets),
        examples=tuple(examples),
        compared=compared,
        not_compared=tuple(c for c in ignored if c in source.columns)
        + (() if exact else ("tombstones", "log start and end offsets")),
    )


def _config_differences(source: LogImage, target: LogImage) -> list[str]:
    found = []
    a, b = source.config, target.config
    if a.key_columns != b.key_columns:
        found.append(f"config: key columns {list(a.key_columns)} vs {list(b.key_columns)}")
    if a.sequence_column != b.sequence_column:
        found.append(f"config: sequence column {a.sequence_column!r} vs {b.sequence_column!r}")
    ignored = {KEY_COLUMNS_PROPERTY, SEQUENCE_COLUMN_PROPERTY}
    for name in sorted((set(a.properties) | set(b.properties)) - ignored):
        if a.properties.get(name) != b.properties.get(name):
            found.append(
                f"config: {name} is {a.properties.get(name)!r} in {source.name}, "
                f"{b.properties.get(name)!r} in {target.name}"
            )
    return found


def _offset_differences(source: LogImage, target: LogImage) -> list[str]:
    found = []
    for p in sorted(set(source.partitions) | set(target.partitions)):
        a, b = source.partitions.get(p), target.partitions.get(p)
        if a is None or b is None:
            found.append(f"partition {p}: only in {source.name if b is None else target.name}")
            continue
        for name in ("log_start_offset", "log_end_offset"):
            if getattr(a, name) != getattr(b, name):
                found.append(
                    f"partition {p}: {name.replace('_', ' ')} {getattr(a, name)} in "
                    f"{source.name}, {getattr(b, name)} in {target.name}"
                )
    return found


def canonical(record: Mapping[str, Any]) -> str:
    """A record as comparable text: Arrow's and Avro's Python values alike (maps as dicts)."""
    return json.dumps(avro_value(dict(record)), sort_keys=True, default=str)


def canonical_value(value: Any) -> str:
    return json.dumps(avro_value(value), sort_keys=True, default=str)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
