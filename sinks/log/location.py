"""Where a log lives: its Delta table's URI and the object store's options, as one value.

The URI is canonical (`sinks.log.uris`); the options use delta-rs's names
(`sinks.log.store_options`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from checkpoints.table_read import read_whole_table
from sinks.log.filesystems import arrow_filesystem


@dataclass(frozen=True)
class LogLocation:
    """Where a log lives: its Delta table's URI and the object store's options.

    What low-level helpers take instead of ``(uri, storage_options)``; options use
    delta-rs's names (`sinks.log.store_options`). Built once, by `LogTable`.
    """

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

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
