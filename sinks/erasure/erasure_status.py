"""Where an erased key still is, and when each place goes (design.md §55).

`erasure_status` answers "is key K gone from the log's current state, history and
metadata, and if not, where is it and when does it go?" by reading, not by trusting the
Delta log: every file under the log's path (and the dead-letter table's) is listed from
storage, so an orphan counts; a Parquet file is decoded only in the row groups its
footer's min/max statistics and its key filter (`sinks.log.key_filter`, design.md §38)
cannot rule out; every JSON commit and every checkpoint (or sidecar) Parquet of both Delta
logs is read for the key's value in the key columns' ``minValues``/``maxValues``
(a string statistic truncated to a prefix of the key counts as naming it).

Each place has the time it goes by the log's config (`goes_at_ms`, None when nothing in
the config bounds it, with why), and a key's deadline is the latest of them. "none" means
the read found the key in no file. Times of removed files and Delta log files come from
their commits' and storage's stamps (wall time); the cleaner's terms (compaction lag,
delete horizon) from the sink's clock. Reads only; idempotent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sinks.config import LONG_MAX, CleanerConfig
from sinks.erasure.tombstones import dead_letter_matches, key_list
from sinks.log.history_window import LOG_RETENTION_DURATION, parse_interval_ms
from sinks.log.location import LogLocation
from sinks.log.log_format import DELTA_LOG_DIR, ERASURE_TXN
from sinks.log.log_table import LogSnapshot
from sinks.log.ownership import is_own_data_path, is_staged_write
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, TIMESTAMP, VALUE
from sinks.reading.lookup import candidate_row_groups, wanted_keys

PlaceKind = Literal[
    "live segment",
    "history segment",
    "orphan file",
    "delta commit",
    "delta checkpoint",
    "dead-letter row",
    "dead-letter history file",
    "dead-letter orphan file",
    "dead-letter delta commit",
    "dead-letter delta checkpoint",
    "delta checksum",
    "dead-letter delta checksum",
]

_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKSUM = re.compile(r"(\d{20})\.crc")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.\d+\.\d+)?(?:\.[^.]+)?\.parquet")
_TRUNCATED_STATS_CHARS = 32  # delta-rs and delta-spark cut string statistics to a prefix


@dataclass(frozen=True)
class Place:
    """One file that still holds a key's records or names its value.

    ``path`` is relative to ``table`` (the log's or the dead-letter table's URI);
    ``records`` counts the key's records in a data file (0 for Delta log files);
    ``goes_at_ms`` is when the log's config has it gone (None: not bounded, ``why`` says).
    """

    kind: PlaceKind
    table: str
    path: str
    records: int
    goes_at_ms: int | None
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "table": self.table,
            "path": self.path,
            "records": self.records,
            "goes_at_ms": self.goes_at_ms,
            "why": self.why,
        }


@dataclass(frozen=True)
class KeyErasure:
    """One key's places; ``deadline_ms`` the latest of their times (None: unbounded)."""

    key: Any
    places: tuple[Place, ...]

    @property
    def gone(self) -> bool:
        """True when no file under the paths holds the key ("none")."""
        return not self.places

    @property
    def deadline_ms(self) -> int | None:
        times = [p.goes_at_ms for p in self.places]
        if any(t is None for t in times):
            return None
        return max((t for t in times if t is not None), default=None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": _jsonable(self.key),
            "gone": self.gone,
            "deadline_ms": self.deadline_ms,
            "places": [p.as_dict() for p in self.places],
        }


@dataclass(frozen=True)
class ErasureStatus:
    """Every key's `KeyErasure`, what was read to prove it, and the overall deadline."""

    keys: tuple[KeyErasure, ...]
    now_ms: int
    files_listed: int
    files_decoded: int
    delta_log_files_read: int
    terms: dict[str, int] = field(default_factory=dict)

    @property
    def gone(self) -> bool:
        return all(k.gone for k in self.keys)

    @property
    def deadline_ms(self) -> int | None:
        if any(not k.gone and k.deadline_ms is None for k in self.keys):
            return None
        return max((k.deadline_ms for k in self.keys if k.deadline_ms is not None), default=None)

    def overdue(self) -> list[Place]:
        """The places whose time has passed (before ``now_ms``) and are still there: the
        cleaner or the segment deleter has not run, or failed (design.md §63). Pure."""
        return [
            p
            for k in self.keys
            for p in k.places
            if p.goes_at_ms is not None and p.goes_at_ms < self.now_ms
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "gone": self.gone,
            "deadline_ms": self.deadline_ms,
            "overdue": len(self.overdue()),
            "files_listed": self.files_listed,
            "files_decoded": self.files_decoded,
            "delta_log_files_read": self.delta_log_files_read,
            "terms": self.terms,
            "keys": [k.as_dict() for k in self.keys],
        }


def deadline_terms(config: CleanerConfig, log_retention_ms: int) -> dict[str, int]:
    """The terms an erasure's deadline adds up from, by the log's config (ms). Pure."""
    return {
        "min.compaction.lag.ms": config.min_compaction_lag_ms,
        "log.cleaner.backoff.ms": config.backoff_ms,
        "delete.retention.ms": config.delete_retention_ms,
        "file.delete.delay.ms": config.file_delete_delay_ms,
        "delta.logRetentionDuration": log_retention_ms,
        "log.retention.check.interval.ms": config.log_retention_check_interval_ms,
    }


@dataclass
class _Table:
    """One Delta table under scrutiny: its location, files, removes and checkpoints."""

    location: LogLocation
    dead_letters: bool
    live: set[str] = field(default_factory=set)
    removed: dict[str, int] = field(default_factory=dict)  # path -> deletionTimestamp
    checkpoints: list[int] = field(default_factory=list)
    log_files: list[pafs.FileInfo] = field(default_factory=list)
    data_files: list[pafs.FileInfo] = field(default_factory=list)
    root: str = ""
    fs: Any = None


def erasure_status(
    snapshot: LogSnapshot,
    keys: Any,
    *,
    key_columns: Sequence[str],
    config: CleanerConfig,
    now_ms: int,
    dead_letter_table: LogLocation | None = None,
    consumer_holds: Callable[[], Mapping[int, int]] = dict,
) -> ErasureStatus:
    """Per key of ``keys`` (one key, a tuple for several key columns, or a list), every
    place under the log of ``snapshot`` (and ``dead_letter_table``) holding it; see the
    module docstring. ``consumer_holds`` gives, per partition, the offset registered
    consumers have all read up to (called only when a tombstone's horizon has passed).
    Raises `BadInputError` for a key that does not fit the key columns. Reads only.
    """
    own = [k for k in key_columns if k != PARTITION]
    listed = key_list(keys)
    wanted = wanted_keys(listed, snapshot.arrow_schema, own)
    window = config.file_delete_delay_ms
    configuration = snapshot.table.metadata().configuration
    log_retention = _retention_ms(configuration.get(LOG_RETENTION_DURATION), window)
    terms = deadline_terms(config, log_retention)
    log = _table(snapshot.location, dead_letters=False)
    log.live = {f.path for f in snapshot.data_files()}
    tables = [log]
    if dead_letter_table is not None:
        delta = dead_letter_table.delta_table_if_any()
        if delta is not None:  # else no dead letter yet: no table
            dead = _table(dead_letter_table, dead_letters=True)
            adds = pa.table(delta.get_add_actions())
            dead.live = {_unquote(p) for p in adds.column("path").to_pylist()}
            tables.append(dead)
    places: dict[int, list[Place]] = {i: [] for i in range(wanted.num_rows)}
    decoded = log_read = 0
    for table in tables:
        log_read += _scan_delta_log(table, wanted, own, places, log_retention, terms)
    # The log's data files: decode what the filters cannot rule out.
    matches: list[tuple[pafs.FileInfo, pa.Table]] = []
    for info in log.data_files:
        found = _matching_rows(log, info, wanted, own, snapshot.arrow_schema)
        if found is not None:
            decoded += 1
            if found.num_rows:
                matches.append((info, found))
    _place_log_records(
        snapshot, log, matches, places, config, now_ms, consumer_holds, log_retention
    )
    if len(tables) > 1:
        decoded += _scan_dead_letters(tables[1], listed, key_columns, places, wanted, window, terms)
    per_key = tuple(
        KeyErasure(key=_key_of(wanted, i, own), places=tuple(places[i]))
        for i in range(wanted.num_rows)
    )
    return ErasureStatus(
        keys=per_key,
        now_ms=now_ms,
        files_listed=sum(len(t.data_files) + len(t.log_files) for t in tables),
        files_decoded=decoded,
        delta_log_files_read=log_read,
        terms=terms,
    )


# -- listing and the Delta logs -------------------------------------------------------------


def _table(location: LogLocation, *, dead_letters: bool) -> _Table:
    fs, root = location.filesystem()
    table = _Table(location, dead_letters, root=root, fs=fs)
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(root) + 1 :]
        if relative.startswith(DELTA_LOG_DIR + "/"):
            table.log_files.append(info)
        else:
            table.data_files.append(info)
    table.data_files.sort(key=lambda i: i.path)
    table.log_files.sort(key=lambda i: i.path)
    return table


def _scan_delta_log(
    table: _Table,
    wanted: pa.Table,
    own: Sequence[str],
    places: dict[int, list[Place]],
    log_retention_ms: int,
    terms: Mapping[str, int],
) -> int:
    """Read every commit and checkpoint of ``table``'s Delta log: note its removes, and a
    place for each key whose value a statistic names. Returns the files read."""
    stats_columns = ["record"] if table.dead_letters else list(own)
    values = [(i, _key_of_row(wanted, i, own)) for i in range(wanted.num_rows)]
    named: list[tuple[pafs.FileInfo, int | None, set[int]]] = []
    for info in table.log_files:
        name = info.path.rsplit("/", 1)[-1]
        version: int | None = None
        hits: set[int] = set()
        if m := _COMMIT.fullmatch(name):
            version = int(m.group(1))
            with table.fs.open_input_stream(info.path) as f:
                text = f.read().decode("utf-8")
            for line in text.splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                if "commitInfo" in action:  # another engine's predicate may quote the key
                    parameters = action["commitInfo"].get("operationParameters") or {}
                    hits |= _text_hits(json.dumps(parameters), values)
                if "remove" in action:
                    remove = action["remove"]
                    table.removed[_unquote(remove["path"])] = remove.get("deletionTimestamp") or 0
                for kind in ("add", "remove"):
                    if kind in action:
                        hits |= _stats_hits(action[kind].get("stats"), stats_columns, values, table)
        elif name.endswith(".parquet"):
            if m := _CHECKPOINT.fullmatch(name):
                version = int(m.group(1))
                table.checkpoints.append(version)
            hits |= _checkpoint_hits(table, info, stats_columns, values)
        else:  # .crc (delta-spark's checksums may list every file with its statistics)
            if m := _CHECKSUM.fullmatch(name):
                version = int(m.group(1))
            with table.fs.open_input_stream(info.path) as f:
                text = f.read().decode("utf-8", errors="replace")
            for stats in _nested_stats(text):
                hits |= _stats_hits(stats, stats_columns, values, table)
        if hits:
            named.append((info, version, hits))
    for info, version, hits in named:
        later = [c for c in table.checkpoints if version is not None and c > version]
        is_checkpoint = info.path.endswith(".parquet")
        kind: PlaceKind = (
            "delta checkpoint"
            if is_checkpoint
            else "delta commit"
            if _COMMIT.fullmatch(info.path.rsplit("/", 1)[-1])
            else "delta checksum"
        )
        if table.dead_letters:
            kind = f"dead-letter {kind}"  # type: ignore[assignment]
        mtime = _mtime_ms(info)
        if later:
            goes: int | None = mtime + log_retention_ms + terms["log.retention.check.interval.ms"]
            why = (
                "statistics name the key; trimmed once older than delta.logRetentionDuration "
                f"(a later checkpoint, version {later[0]}, exists)"
            )
        else:
            goes = mtime + log_retention_ms + terms["log.retention.check.interval.ms"]
            why = (
                "statistics name the key; trimmed once older than delta.logRetentionDuration, "
                "behind the checkpoint the segment deleter writes when none follows it"
            )
        relative = info.path[len(table.root) + 1 :]
        for i in hits:
            places[i].append(Place(kind, table.location.uri, relative, 0, goes, why))
    return len(table.log_files)


def _checkpoint_hits(
    table: _Table, info: pafs.FileInfo, columns: Sequence[str], values: list[tuple[int, Any]]
) -> set[int]:
    """Keys a checkpoint (or sidecar) Parquet names in its adds' and removes' statistics;
    notes its removes."""
    with table.fs.open_input_file(info.path) as f:
        parquet = pq.ParquetFile(f)
        names = parquet.schema_arrow.names
        read = [c for c in ("add", "remove") if c in names]
        if not read:
            return set()
        data = parquet.read(columns=read)
    hits: set[int] = set()
    for kind in read:
        column = data.column(kind).combine_chunks()
        valid = column.is_valid()
        if not pc.any(valid).as_py():
            continue
        rows = column.filter(valid)
        fields = {rows.type.field(i).name for i in range(rows.type.num_fields)}
        if kind == "remove" and "path" in fields:
            stamps = (
                rows.field("deletionTimestamp").to_pylist()
                if "deletionTimestamp" in fields
                else [0] * len(rows)
            )
            for path, stamp in zip(rows.field("path").to_pylist(), stamps, strict=True):
                table.removed.setdefault(_unquote(path), stamp or 0)
        if "stats" in fields:
            for stats in rows.field("stats").to_pylist():
                hits |= _stats_hits(stats, columns, values, table)
        if "stats_parsed" in fields:
            parsed = rows.field("stats_parsed")
            for side in ("minValues", "maxValues"):
                if side not in {parsed.type.field(i).name for i in range(parsed.type.num_fields)}:
                    continue
                bounds = parsed.field(side)
                bound_fields = {bounds.type.field(i).name for i in range(bounds.type.num_fields)}
                for c in columns:
                    if c in bound_fields:
                        for stat in set(bounds.field(c).to_pylist()):
                            hits |= _value_hits({c: stat}, columns, values, table)
    return hits


def _stats_hits(
    stats: str | None, columns: Sequence[str], values: list[tuple[int, Any]], table: _Table
) -> set[int]:
    if not stats:
        return set()
    try:
        parsed = json.loads(stats)
    except ValueError:
        return set()
    hits: set[int] = set()
    for side in ("minValues", "maxValues"):
        bounds = parsed.get(side) or {}
        hits |= _value_hits(bounds, columns, values, table)
    return hits


def _value_hits(
    bounds: Mapping[str, Any], columns: Sequence[str], values: list[tuple[int, Any]], table: _Table
) -> set[int]:
    hits = set()
    for i, key in values:
        if table.dead_letters:
            stat = bounds.get("record")
            if isinstance(stat, str) and any(
                _fragment(c, v) in stat or _names(stat, v) for c, v in key.items()
            ):
                hits.add(i)
        elif any(c in bounds and _names(bounds[c], key[c]) for c in columns):
            hits.add(i)
    return hits


def _text_hits(text: str, values: list[tuple[int, Any]]) -> set[int]:
    """Keys whose string value appears quoted in ``text`` (as JSON, as JSON inside a JSON
    string, or as a SQL literal): a commit's operation parameters (another engine's
    predicate), never a whole file (column names would match)."""
    hits = set()
    for i, key in values:
        for value in key.values():
            if not isinstance(value, str):
                continue
            quoted = json.dumps(value)
            tokens = (quoted, json.dumps(quoted)[1:-1], "'" + value.replace("'", "''") + "'")
            if any(t in text for t in tokens):
                hits.add(i)
    return hits


def _nested_stats(text: str) -> list[str]:
    """Every ``stats`` string inside the JSON documents of ``text`` (one a line or one)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for name, child in node.items():
                if name == "stats" and isinstance(child, str):
                    found.append(child)
                else:
                    walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    for document in [text, *text.splitlines()]:
        try:
            walk(json.loads(document))
        except ValueError:
            continue
    return found


def _names(stat: Any, value: Any) -> bool:
    """True when a statistic is the key's value, or a truncated prefix of it."""
    if stat is None:
        return False
    if stat == value or str(stat) == str(value):
        return True
    text = str(value)
    return isinstance(stat, str) and len(stat) >= _TRUNCATED_STATS_CHARS and text.startswith(stat)


def _fragment(column: str, value: Any) -> str:
    return f"{json.dumps(column)}: {json.dumps(_jsonable(value))}"


# -- the log's data files -------------------------------------------------------------------


def _matching_rows(
    table: _Table, info: pafs.FileInfo, wanted: pa.Table, own: Sequence[str], schema: pa.Schema
) -> pa.Table | None:
    """The records of a wanted key in one Parquet file (with a ``_wanted`` column); None when
    its footer statistics and key filters rule every row group out (nothing decoded)."""
    if not info.path.endswith(".parquet"):
        return None
    with table.fs.open_input_file(info.path) as source:
        parquet = pq.ParquetFile(source)
        metadata = parquet.metadata
        groups = _groups_by_statistics(metadata, parquet.schema_arrow, wanted, own)
        if groups:
            allowed = set(candidate_row_groups(_Source(source), metadata, wanted, own))
            groups = [g for g in groups if g in allowed]
        if not groups:
            return None
        present = parquet.schema_arrow.names
        columns = [
            c
            for c in [*own, PARTITION, OFFSET, TIMESTAMP, VALUE, DELETE_HORIZON_MS]
            if c in present
        ]
        if not all(k in present for k in own):
            return pa.table({})
        rows = parquet.read_row_groups(groups, columns=columns, use_threads=False)
    cast = {k: rows.column(k).cast(schema.field(k).type) for k in own}
    for k, column in cast.items():
        rows = rows.set_column(rows.schema.get_field_index(k), k, column)
    joined = rows.join(wanted, list(own), join_type="inner")
    return joined


def _groups_by_statistics(
    metadata: pq.FileMetaData, schema: pa.Schema, wanted: pa.Table, own: Sequence[str]
) -> list[int]:
    """Row groups whose key columns' min/max can hold a wanted key (without statistics:
    every one)."""
    index = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    groups = []
    for g in range(metadata.num_row_groups):
        row_group = metadata.row_group(g)
        maybe = np.ones(wanted.num_rows, dtype=bool)
        for k in own:
            if k not in index:
                continue
            stats = row_group.column(index[k]).statistics
            if stats is None or not stats.has_min_max:
                continue
            try:
                values = wanted.column(k).to_pylist()
                low, high = stats.min, stats.max
                inside = np.array([low <= v <= high for v in values], dtype=bool)
            except TypeError:
                continue
            maybe &= inside
        if maybe.any():
            groups.append(g)
    return groups


class _Source:
    """A random-access view of an open file, as `candidate_row_groups` reads filters."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def read_at(self, nbytes: int, offset: int) -> bytes:
        return self._file.read_at(nbytes, offset)


def _place_log_records(
    snapshot: LogSnapshot,
    log: _Table,
    matches: list[tuple[pafs.FileInfo, pa.Table]],
    places: dict[int, list[Place]],
    config: CleanerConfig,
    now_ms: int,
    consumer_holds: Callable[[], Mapping[int, int]],
    log_retention_ms: int,
) -> None:
    """A place per (key, file) of the log's data files, with when it goes. A live file goes
    from storage a window after the pass that removes it, and the Delta log entries that
    name it (its add action's statistics) a log retention after that pass."""
    delay = config.file_delete_delay_ms + config.log_retention_check_interval_ms
    live_delay = max(config.file_delete_delay_ms, log_retention_ms)
    live_delay += config.log_retention_check_interval_ms
    live_rows = [t for info, t in matches if info.path[len(log.root) + 1 :] in log.live]
    latest = _latest_live(live_rows)
    holds: Mapping[int, int] | None = None
    for info, rows in matches:
        relative = info.path[len(log.root) + 1 :]
        for i in sorted(set(rows.column("_wanted").to_pylist())):
            mine = rows.filter(pc.equal(rows.column("_wanted"), i))
            n = mine.num_rows
            if relative in log.live:
                goes, why = _live_term(snapshot, mine, latest.get(i, {}), config, now_ms)
                if goes is not None and why.startswith("tombstone") and goes <= now_ms:
                    holds = consumer_holds() if holds is None else holds
                    held = _held(mine, holds)
                    if held is not None:
                        goes, why = None, held
                if goes is not None:
                    goes += live_delay
                places[i].append(Place("live segment", log.location.uri, relative, n, goes, why))
            elif relative in log.removed:
                stamp = log.removed[relative]
                places[i].append(
                    Place(
                        "history segment",
                        log.location.uri,
                        relative,
                        n,
                        stamp + delay,
                        "removed from the log; deleted once out of the history window "
                        "(file.delete.delay.ms)",
                    )
                )
            else:
                places[i].append(_orphan(log, info, relative, n, config, "orphan file"))


def _latest_live(tables: list[pa.Table]) -> dict[int, dict[int, pa.Table]]:
    """Per wanted key and partition, its records in the live files."""
    out: dict[int, dict[int, pa.Table]] = {}
    if not tables:
        return out
    rows = pa.concat_tables(tables, promote_options="permissive")
    for row in (
        rows.select(["_wanted", PARTITION])
        .group_by(["_wanted", PARTITION])
        .aggregate([])
        .to_pylist()
    ):
        i, p = row["_wanted"], row[PARTITION]
        mask = pc.and_(pc.equal(rows.column("_wanted"), i), pc.equal(rows.column(PARTITION), p))
        out.setdefault(i, {})[p] = rows.filter(mask)
    return out


def _live_term(
    snapshot: LogSnapshot,
    rows: pa.Table,
    live_by_partition: Mapping[int, pa.Table],
    config: CleanerConfig,
    now_ms: int,
) -> tuple[int | None, str]:
    """When the key's records in one live file leave the live log (a pass), and why."""
    goes: int | None = 0
    why = ""
    for row in rows.to_pylist():
        p, offset = row[PARTITION], row[OFFSET]
        live = live_by_partition.get(p)
        newest = live.sort_by([(OFFSET, "descending")]).slice(0, 1).to_pylist()[0] if live else row
        mark = snapshot.txn_version(ERASURE_TXN.format(p))
        cleaned = snapshot.cleaner_offset(p) or 0
        pass_due = _pass_due(newest, mark, cleaned, config)
        if newest[VALUE] is not None:
            return None, (
                f"partition {p}: the key is live (its latest record, offset {newest[OFFSET]}, "
                "holds a value): erase it"
            )
        if row[OFFSET] == newest[OFFSET]:  # the erasure's tombstone itself
            horizon = row.get(DELETE_HORIZON_MS)
            if horizon is not None:
                due: int | None = horizon + config.backoff_ms
            elif pass_due is not None:
                due = pass_due + config.delete_retention_ms + config.backoff_ms
            else:
                due = None
            why = "tombstone: dropped by the first pass past its horizon (delete.retention.ms)"
        else:
            due = pass_due
            why = f"older record (offset {offset}): dropped by the first pass over the erasure"
        if due is None:
            return None, (
                f"partition {p}: no erasure mark covers offset {offset} and "
                "max.compaction.lag.ms is unlimited"
            )
        goes = max(goes or 0, due)
    return goes, why


def _pass_due(
    tombstone: Mapping[str, Any], mark: int | None, cleaned: int, config: CleanerConfig
) -> int | None:
    """When the first pass over the partition past the key's tombstone is due."""
    stamp = tombstone.get(TIMESTAMP)
    written = int(stamp.timestamp() * 1000) if stamp is not None else 0
    if cleaned > tombstone[OFFSET]:
        return written  # a pass already went past it
    if mark is not None and mark > tombstone[OFFSET]:
        return written + config.min_compaction_lag_ms + config.backoff_ms
    if config.max_compaction_lag_ms < LONG_MAX:
        return written + max(config.max_compaction_lag_ms, config.min_compaction_lag_ms)
    return None


def _held(rows: pa.Table, holds: Mapping[int, int]) -> str | None:
    for row in rows.to_pylist():
        if row[VALUE] is None and row.get(DELETE_HORIZON_MS) is not None:
            below = holds.get(row[PARTITION])
            if below is not None and row[OFFSET] >= below:
                return (
                    f"tombstone held for registered consumers of partition {row[PARTITION]} "
                    f"(read up to {below}): dropped once they read past offset {row[OFFSET]}, "
                    "or consumer.expiration.ms after their last commit"
                )
    return None


def _orphan(
    table: _Table,
    info: pafs.FileInfo,
    relative: str,
    n: int,
    config: CleanerConfig,
    kind: PlaceKind,
) -> Place:
    own = is_own_data_path(relative) or is_staged_write(relative)
    if own or table.dead_letters:
        return Place(
            kind,
            table.location.uri,
            relative,
            n,
            _mtime_ms(info) + config.file_delete_delay_ms + config.log_retention_check_interval_ms,
            "no commit names it; deleted by recovery or the segment deleter once older than "
            "file.delete.delay.ms",
        )
    return Place(
        kind,
        table.location.uri,
        relative,
        n,
        None,
        "not in the sink's naming: the sink never deletes it (design.md §26); the operator must",
    )


# -- the dead-letter table ------------------------------------------------------------------


def _scan_dead_letters(
    table: _Table,
    keys: list[Any],
    key_columns: Sequence[str],
    places: dict[int, list[Place]],
    wanted: pa.Table,
    window_ms: int,
    terms: Mapping[str, int],
) -> int:
    """A place per (key, dead-letter file) holding it; returns the files decoded."""
    order = [
        _key_of_row(wanted, i, [k for k in key_columns if k != PARTITION])
        for i in range(wanted.num_rows)
    ]
    decoded = 0
    for info in table.data_files:
        if not info.path.endswith(".parquet"):
            continue
        relative = info.path[len(table.root) + 1 :]
        with table.fs.open_input_file(info.path) as f:
            records = pq.ParquetFile(f).read(columns=["record"]).column("record").to_pylist()
        decoded += 1
        for i, key in enumerate(order):
            n = sum(1 for r in records if dead_letter_matches(r, [key]))
            if not n:
                continue
            if relative in table.live:
                place = Place(
                    "dead-letter row",
                    table.location.uri,
                    relative,
                    n,
                    None,
                    "a live dead letter: erase the key with the sink's dead_letter_table set",
                )
            elif relative in table.removed:
                place = Place(
                    "dead-letter history file",
                    table.location.uri,
                    relative,
                    n,
                    table.removed[relative] + window_ms + terms["log.retention.check.interval.ms"],
                    "removed by the erasure; deleted by the sink's vacuum once out of the window",
                )
            else:
                place = Place(
                    "dead-letter orphan file",
                    table.location.uri,
                    relative,
                    n,
                    _mtime_ms(info) + window_ms + terms["log.retention.check.interval.ms"],
                    "no commit of the dead-letter table names it",
                )
            places[i].append(place)
    del keys
    return decoded


# -- small helpers --------------------------------------------------------------------------


def _key_of_row(wanted: pa.Table, i: int, own: Sequence[str]) -> dict[str, Any]:
    row = wanted.slice(i, 1).to_pylist()[0]
    return {k: row[k] for k in own}


def _key_of(wanted: pa.Table, i: int, own: Sequence[str]) -> Any:
    row = _key_of_row(wanted, i, own)
    return row[own[0]] if len(own) == 1 else tuple(row[k] for k in own)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def _mtime_ms(info: pafs.FileInfo) -> int:
    return int(info.mtime.timestamp() * 1000) if info.mtime is not None else 0


def _retention_ms(value: str | None, default: int) -> int:
    return parse_interval_ms(value) if value else default


def _unquote(path: str) -> str:
    return unquote(path)
