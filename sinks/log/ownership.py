"""What a compacted log owns: how the sink recognises its own logs, files and directories.

The sink writes and deletes only what is its own (design.md §26, §27). Three rules, each a
pure function here with a thin I/O wrapper:

1. **A compacted log** is a Delta table that carries a mark only this package leaves:
   the table property ``compacted.sink.key.columns`` (every log created since the
   property exists), or the table description ``compacted-state log`` (every log this
   package ever created: `LogTable.create` has set it from the first version), or a
   ``compacted-sink/partitions`` ``txn`` action (committed with every append since the
   first version; a log whose description another engine changed keeps it). A table with
   none of them is someone else's: every command refuses it with
   `NotACompactedLogError` saying what it is, and nothing is committed to it.
2. **A location with no Delta table** may become a log when it is missing, empty, or
   holds only what a killed first batch of the sink leaves (its own data files and
   directories, below). Anything else (a stranger's Parquet files, a ``data.txt``, a
   folder) is refused: the sink never creates a log over someone else's files.
3. **A file inside a log's directory** is the log's own when a commit of the log names
   it (an add, or a remove still in the Delta log), or when its path, relative to the
   log, is in the sink's layout and naming (`is_own_data_path`):

   - ``partition-<p>/<base offset, 20 digits>-<32 hex>.parquet``: a segment, as
     `sinks.log.segment.segment_path` names every file an append, a pass or a
     rearrangement writes;
   - ``_staging/<32 hex>.parquet``: rows the data source sink staged for a commit;
   - anything under ``_staging/<32 hex>/``: one append's staged Spark write (Spark's
     Parquet writer names the files, its partition directories and checksum files);
     the append renames the files to segments and removes the directory, and recovery
     removes a directory a killed append left (`is_staged_write`).

   Recovery's orphans and the segment deleter's untracked files are taken only from
   files that are the log's own by this rule, whatever their age; any other file is
   left in place and reported (``not ours, left alone``).

Other things the sink keeps inside a log: ``_delta_log/`` (Delta's own) and
``_compacted_sink/`` (the clean-shutdown marker, `sinks.maintenance.recovery`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pyarrow.fs as pafs

from sinks.errors import NotACompactedLogError
from sinks.log.location import LogLocation
from sinks.log.log_format import DELTA_LOG_DIR, MARKER_DIR, PARTITIONS_TXN, STAGING_DIR

if TYPE_CHECKING:
    from deltalake import DeltaTable

LOG_DESCRIPTION = "compacted-state log"
"""The Delta table description `LogTable.create` gives every log."""
KEY_COLUMNS_PROPERTY = "compacted.sink.key.columns"
"""The table property a log records its key columns in (`sinks.log.log_keys`)."""
CHECKPOINT_TABLE_NAME = "cleaner-offset-checkpoint"  # the name checkpoints/ creates it with


SEGMENT_FILE = re.compile(r"partition-\d+/\d{20}-[0-9a-f]{32}\.parquet")
STAGED_FILE = re.compile(rf"{STAGING_DIR}/[0-9a-f]{{32}}\.parquet")
STAGED_WRITE_DIR = re.compile(rf"{STAGING_DIR}/[0-9a-f]{{32}}")
"""One append's staging directory for Spark's writer (`sinks.produce.spark_append`)."""
_STAGED_WRITE_ENTRY = re.compile(rf"{STAGING_DIR}/[0-9a-f]{{32}}(?:/.+)?")
_OWN_DIRECTORY = re.compile(rf"partition-\d+|{STAGING_DIR}|{MARKER_DIR}|{DELTA_LOG_DIR}")
_MARKER_FILE = re.compile(rf"{MARKER_DIR}/[^/]+")

DELTA_RS_DATA_FILE = re.compile(
    r"(?:[^/]+=[^/]*/)*part-\d{5}-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}-c\d{3}"
    r"(?:\.[a-z0-9]+)?\.parquet"
)
"""How delta-rs (and Spark's Delta) name the data files they write: the cleaner-offset
checkpoint table's own files."""

_LISTED = 5  # paths an error message names at most


# -- pure rules ------------------------------------------------------------------------------


def is_own_data_path(relative: str) -> bool:
    """Whether ``relative`` (a path inside a log, Delta-escaped or not) is named as the sink
    names the data files it writes: a segment or a staged file (module docstring, rule 3)."""
    path = unquote(relative).lstrip("/")
    return SEGMENT_FILE.fullmatch(path) is not None or STAGED_FILE.fullmatch(path) is not None


def is_staged_write(relative: str) -> bool:
    """Whether ``relative`` (a file or directory inside a log) is, or lies in, an append's
    staging directory for Spark's writer (module docstring, rule 3)."""
    return _STAGED_WRITE_ENTRY.fullmatch(unquote(relative).strip("/")) is not None


def is_delta_rs_data_path(relative: str) -> bool:
    """Whether ``relative`` is named as delta-rs names a data file (``part-00000-<uuid>-c000``)."""
    return DELTA_RS_DATA_FILE.fullmatch(unquote(relative).lstrip("/")) is not None


def foreign_entries(entries: Iterable[tuple[str, bool]]) -> list[str]:
    """Of a listing without a Delta table, ``(relative path, is directory)`` pairs, the paths
    that a killed first batch of the sink could not have left (rule 2), sorted.

    The sink's own: its data files (`is_own_data_path`), the marker directory's files,
    and its directories (``partition-<p>``, ``_staging``, ``_compacted_sink`` and an
    empty ``_delta_log``). A file in ``_delta_log`` with no loadable table is not.
    """
    foreign = []
    for path, is_dir in entries:
        path = path.strip("/")
        if is_dir:
            if _OWN_DIRECTORY.fullmatch(path) is None and not is_staged_write(path):
                foreign.append(path + "/")
        elif not (is_own_data_path(path) or _MARKER_FILE.fullmatch(path) or is_staged_write(path)):
            foreign.append(path)
    return sorted(foreign)


def log_mark(
    configuration: Mapping[str, str | None], description: str | None, partitions_txn: int | None
) -> str | None:
    """Which mark of this package a Delta table carries (rule 1), or None: not a log."""
    if configuration.get(KEY_COLUMNS_PROPERTY) is not None:
        return f"table property {KEY_COLUMNS_PROPERTY}"
    if description == LOG_DESCRIPTION:
        return f"description {LOG_DESCRIPTION!r}"
    if partitions_txn is not None:
        return f"txn {PARTITIONS_TXN}"
    return None


@dataclass(frozen=True)
class TableFacts:
    """What a refusal says about a Delta table that is not a compacted log."""

    version: int
    name: str | None
    description: str | None
    columns: tuple[str, ...]

    def what(self) -> str:
        """The table in words: what it is, as far as its metadata says."""
        if self.name == CHECKPOINT_TABLE_NAME:
            return (
                f"the cleaner-offset checkpoint table the sink keeps beside its logs "
                f"(Delta v{self.version})"
            )
        if {"log_path", "reason", "batch_id"} <= set(self.columns):
            return f"a dead-letter table of the sink (Delta v{self.version})"
        shown = ", ".join(self.columns[:8]) + (", ..." if len(self.columns) > 8 else "")
        named = f" {self.name!r}" if self.name else ""
        return f"a Delta table{named} (Delta v{self.version}, columns {shown})"


def not_a_log_message(uri: str, facts: TableFacts, *, read_only: bool = False) -> str:
    """Why the Delta table at ``uri`` is refused, and what to do; ``read_only``: for a
    command that only reads (``lookup``, ``read_state``, ``export``), which neither writes
    nor would create a log there."""
    what = (
        f"{uri} is not a compacted log: it is {facts.what()}, and it carries none of the marks "
        f"this sink leaves on the logs it creates (table property {KEY_COLUMNS_PROPERTY}, "
        f"description {LOG_DESCRIPTION!r})."
    )
    if read_only:
        return f"{what} Nothing was written to it or read from it. Give the path of a compacted log"
    return (
        f"{what} Nothing was written to it. Give the path of a "
        "compacted log, or a new (missing or empty) directory for a new one; to compact this "
        "table's records, read them with Spark and feed them to a sink at another path"
    )


def not_empty_message(uri: str, foreign: list[str], *, read_only: bool = False) -> str:
    """Why ``uri``, no Delta table, is refused (``foreign``: what the sink did not write);
    ``read_only`` as for `not_a_log_message`."""
    shown = ", ".join(foreign[:_LISTED]) + (
        f" and {len(foreign) - _LISTED} more" if len(foreign) > _LISTED else ""
    )
    what = (
        f"{uri} is not a compacted log: it is not a Delta table, and it holds "
        f"{len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} the sink did not write "
        f"({shown})."
    )
    if read_only:
        return f"{what} Nothing was written to it or read from it. Give the path of a compacted log"
    return (
        f"{what} The sink creates a log only in a missing or empty directory, so that it "
        "never mixes with (or deletes) someone else's files. Nothing was written. Choose a new "
        "path for the log, or move those files away"
    )


# -- I/O -------------------------------------------------------------------------------------


def check_compacted_log(uri: str, table: DeltaTable, *, read_only: bool = False) -> str:
    """The mark that makes the Delta table at ``uri`` a compacted log; raises
    `NotACompactedLogError` (saying what it is and what to do, worded for a reader with
    ``read_only``) when it carries none. Reads the table's metadata (and, for a log older
    than its marks, one txn lookup)."""
    metadata = table.metadata()
    mark = log_mark(metadata.configuration, metadata.description, None)
    if mark is None:
        mark = log_mark({}, None, table.transaction_version(PARTITIONS_TXN))
    if mark is None:
        facts = TableFacts(
            version=table.version(),
            name=metadata.name,
            description=metadata.description,
            columns=tuple(f.name for f in table.schema().fields),
        )
        raise NotACompactedLogError(not_a_log_message(uri, facts, read_only=read_only), path=uri)
    return mark


def check_log_location(location: LogLocation, *, read_only: bool = False) -> None:
    """Raise `NotACompactedLogError` unless ``location`` holds a compacted log or may become
    one (``read_only``: the refusal worded for a reader)."""
    from deltalake.exceptions import TableNotFoundError

    try:
        table = location.delta_table()
    except TableNotFoundError:
        check_new_log_location(location, read_only=read_only)
        return
    check_compacted_log(location.uri, table, read_only=read_only)


def check_new_log_location(location: LogLocation, *, read_only: bool = False) -> None:
    """Raise `NotACompactedLogError` when ``location``, where no Delta table loads, holds
    anything a killed first batch of the sink could not have left (rule 2); ``read_only``:
    the refusal worded for a reader. One recursive LIST."""
    foreign = foreign_entries(list_entries(location))
    if foreign:
        uri = location.uri
        raise NotACompactedLogError(not_empty_message(uri, foreign, read_only=read_only), path=uri)


def list_entries(location: LogLocation) -> list[tuple[str, bool]]:
    """Every file and directory under ``location``: (path relative to it, is directory)."""
    fs, root = location.filesystem()
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except NotADirectoryError:
        infos = []
    if not infos and fs.get_file_info(root).type == pafs.FileType.File:
        return [("(a file, not a directory)", False)]
    entries = []
    for info in infos:
        relative = info.path[len(root) :].strip("/")
        if info.type == pafs.FileType.Directory:
            entries.append((relative, True))
        elif info.type == pafs.FileType.File:
            entries.append((relative, False))
    return entries


def foreign_files(paths: Iterable[str], referenced: set[str]) -> list[str]:
    """Of data files found inside a log, those neither named by its commits (``referenced``)
    nor in its own naming: someone else's, left alone (rule 3). Pure."""
    return sorted(p for p in paths if p not in referenced and not is_own_data_path(p))
