"""Where a log lives: its Delta table's URI and the object store's options, as one value.

The URI is canonical (`sinks.log.uris`); the options use delta-rs's names
(`sinks.log.store_options`). A location is built once, where an address enters the library
(a public entry point: the sink's constructor, `read_state`, `lookup`, `replay`, the CLI)
and handed down whole: below those, no function takes ``storage_options`` beside a path
(design.md §70).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from checkpoints.table_read import read_whole_table
from sinks.log.filesystems import arrow_filesystem, delete_files, missing_files
from sinks.log.uris import normalize_uri


@dataclass(frozen=True)
class LogLocation:
    """Where a log lives: its Delta table's URI and the object store's options.

    What every layer takes instead of ``(uri, storage_options)``; options use delta-rs's
    names (`sinks.log.store_options`). Built once, by the public entry point the address
    came in through (design.md §70). Also the address of a directory the sink reads that
    is no Delta table (a streaming query's checkpoint).
    """

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def at(cls, path: str, storage_options: Mapping[str, str] | None = None) -> LogLocation:
        """``path`` (made canonical, `normalize_uri`) with ``storage_options``: what a public
        entry point builds from what its caller gave it. Pure."""
        return cls(normalize_uri(path), dict(storage_options or {}))

    @classmethod
    def of(cls, where: LogLocation | str) -> LogLocation:
        """``where`` as a location: a URI alone is one with no storage options. Pure."""
        return where if isinstance(where, LogLocation) else cls(where)

    @property
    def delta_options(self) -> dict[str, str] | None:
        """The options as delta-rs takes them: None when there are none."""
        return dict(self.storage_options) or None

    def delta_table(self, version: int | None = None) -> DeltaTable:
        """The Delta table here (at ``version``, else the latest), opened by delta-rs."""
        return DeltaTable(self.uri, version=version, storage_options=self.delta_options)

    def latest_version(self) -> int:
        """The latest version of the Delta table here (one read of its log); fails as
        `delta_table` does when there is no table. Read-only."""
        return self.delta_table().version()

    def txn_version(self, app_id: str) -> int | None:
        """The version the latest ``txn`` action of ``app_id`` records in the table here; None
        when there is none, or no table. Read-only."""
        try:
            return self.delta_table().transaction_version(app_id)
        except TableNotFoundError:
            return None

    def delta_table_if_any(self) -> DeltaTable | None:
        """The table here at its latest version; None when there is no table. Read-only."""
        try:
            return self.delta_table()
        except TableNotFoundError:
            return None

    def read_arrow(self) -> pa.Table | None:
        """Every row of the table here, at its latest version; None when there is no table.
        Read-only; read on this thread, not by ``to_pyarrow_table`` (design.md §58)."""
        try:
            return read_whole_table(self.delta_table())
        except TableNotFoundError:
            return None

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow file system and the table's root path in it (`arrow_filesystem`)."""
        return arrow_filesystem(self.uri, self.storage_options)

    def delete_files(self, paths: Iterable[str]) -> int:
        """Delete files (relative to the table here); one already gone is not an error.
        Idempotent; returns how many this call deleted (`sinks.log.filesystems.delete_files`)."""
        return delete_files(self.uri, list(paths), self.storage_options)

    def missing_files(self, paths: Iterable[str]) -> list[str]:
        """Which of ``paths`` (relative to the table here) no longer exist. Read-only
        (`sinks.log.filesystems.missing_files`)."""
        return missing_files(self.uri, paths, self.storage_options)
