"""A small Delta table of keyed rows, upserted with MERGE: what the checkpoint tables share.

The cleaner-offset checkpoint (`checkpoints.checkpoint_table`) and the consumer offsets
(`checkpoints.consumer_offsets`) are both a few rows per log, rewritten often by many
processes. Each upsert is one MERGE on the key columns, retried when a concurrent commit
wins; a compare-and-set is one MERGE that applies only while the rows are as read, and is
not retried (the caller reads again and decides). After either, every ``COMPACT_EVERY``
versions the table's small files are compacted (and, for a table no one else vacuums,
its removed files deleted). A table created by an earlier version with fewer columns
gains the new ones (nullable) on its next write.

A commit whose answer the store lost counts once (design.md §39): a MERGE that fails so
is taken as made when the table holds every row it wrote, column for column (`holds`),
and an upsert whose rows are already there has nothing left to do. (A log finds its own
commits by a token instead, `sinks.log.landed_commits`; reading commit files back needs a
storage client this bottom layer does not have, and delta-rs's own, `deltalake.fs`, hangs
on moto's listings and HEADs, where the fault tests run.)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.schema import Field

COMPACT_EVERY = 50  # versions between compactions of the table's small files
RETRIES = 10


class KeyedTable:
    """The Delta table at ``uri`` with ``schema``, keyed by ``keys``; created on first write."""

    def __init__(
        self,
        uri: str,
        schema: pa.Schema,
        keys: Sequence[str],
        *,
        name: str,
        properties: Mapping[str, str],
        storage_options: Mapping[str, str] | None = None,
        vacuum_hours: int | None = None,
    ) -> None:
        self.uri = uri
        self.schema = schema
        self.keys = tuple(keys)
        self.name = name
        self.properties = dict(properties)
        self.storage_options = dict(storage_options or {})
        self.vacuum_hours = vacuum_hours

    def table(self) -> DeltaTable | None:
        """The table as of now; None before the first write."""
        try:
            return DeltaTable(self.uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def rows(self) -> list[dict[str, object]]:
        """Every row of the table as of now, as dicts; [] before the first write. Read-only.

        Read with pyarrow (``to_pyarrow_table``): delta-rs's own query engine reads a few
        small files about four times faster, but its reads of a file's footer fail on moto's
        S3, where the fault tests run. Raises the store's errors (`OSError`).
        """
        table = self.table()
        return [] if table is None else table.to_pyarrow_table().to_pylist()

    def open_or_create(self) -> DeltaTable:
        """The table, created with its properties if it does not exist yet."""
        table = self.table()
        if table is not None:
            return self._evolved(table)
        try:
            DeltaTable.create(
                self.uri,
                self.schema,
                mode="ignore",
                storage_options=self.storage_options or None,
                name=self.name,
                configuration=self.properties,
            )
        except Exception:
            if self.table() is None:
                raise  # not a concurrent creator: a real failure
        created = self.table()
        assert created is not None
        return created

    def _evolved(self, table: DeltaTable) -> DeltaTable:
        """``table`` with the columns of ``schema`` it lacks added (nullable; older rows read
        them as null, unknown): a table written by an earlier version keeps working."""
        have = set(table.schema().to_arrow().names)
        missing = [f for f in self.schema if f.name not in have]
        if not missing:
            return table
        try:
            table.alter.add_columns([Field.from_arrow(f.with_nullable(True)) for f in missing])
        except (DeltaError, OSError):
            pass  # a concurrent writer added them first (or will: the merge retries)
        return DeltaTable(self.uri, storage_options=self.storage_options or None)

    def upsert(self, rows: pa.Table) -> None:
        """Insert or replace ``rows`` by key in one commit; retried on conflicts."""
        if rows.num_rows == 0:
            return
        predicate = " AND ".join(f't."{k}" = s."{k}"' for k in self.keys)
        for attempt in range(RETRIES):
            table = self.open_or_create()
            try:
                (
                    table.merge(rows, predicate=predicate, source_alias="s", target_alias="t")
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute()
                )
                break
            except (DeltaError, OSError) as e:
                if self.holds(rows):
                    break  # it landed, and the store lost the answer
                if not isinstance(e, CommitFailedError) or attempt == RETRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        self._compact_when_due(table)

    def compare_and_set_rows(
        self, rows: pa.Table, update_if: str | None, insert_if: str | None
    ) -> int | None:
        """Write ``rows`` in one commit, each only where it may go: over its key's row while
        ``update_if`` (a SQL predicate over the target ``t`` and the source ``s``) holds, or
        as a new row where its key has none and ``insert_if`` (over ``s``) holds.

        Returns how many rows were written; 0 when a concurrent commit made delta-rs reject
        this one (then none was). None when the commit failed and yet some of ``rows`` are
        in the table: the store lost the answer of a commit that landed, and only reading
        the rows back tells which it wrote (`held`). A store error past the client's
        retries is raised when none of them is there.
        """
        table = self.open_or_create()
        predicate = " AND ".join(f't."{k}" = s."{k}"' for k in self.keys)
        merger = table.merge(rows, predicate=predicate, source_alias="s", target_alias="t")
        if update_if is not None:
            merger = merger.when_matched_update_all(predicate=update_if)
        if insert_if is not None:
            merger = merger.when_not_matched_insert_all(predicate=insert_if)
        try:
            metrics = merger.execute()
        except (DeltaError, OSError) as e:
            if any(self.held(rows)):
                self._compact_when_due(table)
                return None
            if isinstance(e, CommitFailedError):
                return 0
            raise
        written = int(metrics["num_target_rows_inserted"] + metrics["num_target_rows_updated"])
        if written:
            self._compact_when_due(table)
        return written

    def holds(self, rows: pa.Table) -> bool:
        """Whether the table now holds every row of ``rows``, equal in each of its columns."""
        return all(self.held(rows))

    def held(self, rows: pa.Table) -> list[bool]:
        """For each row of ``rows``, whether the table now holds it, equal in each column.

        Reads the table (a few rows per log); a store error while reading counts as no.
        """
        try:
            current = self.rows()
        except (DeltaError, OSError):
            return [False] * rows.num_rows
        by_key = {tuple(r[k] for k in self.keys): r for r in current}
        found = (by_key.get(tuple(wanted[k] for k in self.keys)) for wanted in rows.to_pylist())
        return [
            row is not None and all(row.get(c) == v for c, v in wanted.items())
            for row, wanted in zip(found, rows.to_pylist(), strict=True)
        ]

    def _compact_when_due(self, table: DeltaTable) -> None:
        """Every ``COMPACT_EVERY`` versions: compact the small files (and vacuum, if asked)."""
        table.update_incremental()
        if table.version() % COMPACT_EVERY != 0:
            return
        try:
            table.optimize.compact()
            if self.vacuum_hours is not None:
                table.vacuum(
                    retention_hours=self.vacuum_hours,
                    dry_run=False,
                    enforce_retention_duration=False,
                )
        except CommitFailedError:
            pass  # a concurrent writer won: the next due version compacts
