"""A small Delta table of keyed rows, rewritten whole: what the checkpoint tables share.

The cleaner-offset checkpoint (`checkpoints.checkpoint_table`) and the consumer offsets
(`checkpoints.consumer_offsets`) are both a few rows per log, rewritten often by many
processes. Every write reads the table, puts its rows in by key and commits the table's
rows as one file, removing the files it read, as the version after the one it read and
no other (design.md §47): any commit between the read and the commit refuses it. An
upsert is retried on that refusal; a compare-and-set writes only the rows still as the
caller read them, and is not retried (the caller reads again and decides). The table is
one file after every write; for a table no one else vacuums, its removed files are
deleted every ``VACUUM_EVERY`` versions. A table created by an earlier version with fewer
columns gains the new ones (nullable) on its next write; columns a later version added
are kept as they are.

A commit whose answer the store lost counts once (design.md §39): a write that fails so
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
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.schema import Field
from deltalake.transaction import CommitProperties

from checkpoints.table_read import read_whole_table

VACUUM_EVERY = 50  # versions between two deletions of the removed files (`vacuum_hours`)
RETRIES = 10

Row = dict[str, object]
Key = tuple[object, ...]


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

    def rows(self, where: Mapping[str, object] | None = None) -> list[Row]:
        """Every row of the table as of now (with ``where``, those equal to it in each column
        it names), as dicts; [] before the first write. Read-only.

        Read with pyarrow on this thread (`read_whole_table`, not ``to_pyarrow_table``, whose
        I/O threads can abort the process at exit: design.md §58); delta-rs's own query
        engine reads a few small files about four times faster, but its reads of a file's
        footer fail on moto's S3, where the fault tests run. Raises the store's errors
        (`OSError`).
        """
        table = self.table()
        if table is None:
            return []
        current = read_whole_table(table)
        for column, value in (where or {}).items():
            # A mask, not an expression: an expression runs Acero on Arrow's thread pool.
            current = current.filter(pc.equal(current[column], value))
        return current.to_pylist()

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
            pass  # a concurrent writer added them first (or will: the write retries)
        return DeltaTable(self.uri, storage_options=self.storage_options or None)

    def upsert(self, rows: pa.Table) -> None:
        """Insert or replace ``rows`` by key in one commit; retried on conflicts.

        Idempotent. Raises the store's errors past the retries (`OSError`, `DeltaError`)
        when the rows are not in the table.
        """
        if rows.num_rows == 0:
            return
        for attempt in range(RETRIES):
            table = self.open_or_create()
            try:
                self._rewrite(table, self._read(table), rows)
                break
            except (DeltaError, OSError) as e:
                if self.holds(rows):
                    return  # it landed, and the store lost the answer
                if not self._refused(e, table) or attempt == RETRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        self._vacuum_when_due(table)

    def compare_and_set_rows(
        self, rows: pa.Table, expected: Sequence[Mapping[str, object] | None]
    ) -> list[bool]:
        """Write ``rows`` in one commit, each only where it may go: over its key's row while
        that row still has the values its ``expected`` names (column by column), or as a
        new row where its key has none and its ``expected`` is None.

        Returns, for each row, whether it was written: none when none could go, or another
        commit came first and refused this one. When the commit failed and yet some of
        ``rows`` are in the table, the store lost the answer of a commit that landed: the
        rows read back tell which (`held`). A store error past the client's retries is
        raised when none of them is there.
        """
        table = self.open_or_create()
        try:
            current = self._read(table)
            found = current.rows_of(self._keys_of(rows))
            may_go = [_still(row, values) for row, values in zip(found, expected, strict=True)]
            if not any(may_go):
                return may_go
            self._rewrite(table, current, rows.filter(pa.array(may_go, pa.bool_())))
        except (DeltaError, OSError) as e:
            landed = self.held(rows)
            if any(landed):
                return landed
            if self._refused(e, table):
                return [False] * rows.num_rows
            raise
        self._vacuum_when_due(table)
        return may_go

    def holds(self, rows: pa.Table) -> bool:
        """Whether the table now holds every row of ``rows``, equal in each of its columns."""
        return all(self.held(rows))

    def held(self, rows: pa.Table) -> list[bool]:
        """For each row of ``rows``, whether the table now holds it, equal in each column.

        Reads the table (a few rows per log); a store error while reading counts as no.
        """
        try:
            table = self.table()
            current = None if table is None else self._read(table)
        except (DeltaError, OSError):
            current = None
        if current is None:
            return [False] * rows.num_rows
        found = current.rows_of(self._keys_of(rows))
        return [_still(row, wanted) for row, wanted in zip(found, rows.to_pylist(), strict=True)]

    def _refused(self, error: Exception, table: DeltaTable) -> bool:
        """Whether a write against ``table`` that failed with ``error`` (and did not land) was
        refused because another commit came first: a conflict, or the table is now past the
        version read (delta-rs raises `Invalid table version` when that version's commit file
        was trimmed since)."""
        if isinstance(error, CommitFailedError):
            return True
        try:
            latest = self.table()
        except (DeltaError, OSError):
            return False
        return latest is not None and latest.version() > table.version()

    def _keys_of(self, table: pa.Table) -> list[Key]:
        """The key of each row of ``table``, in order (its key columns read, no other)."""
        return list(zip(*(table[k].to_pylist() for k in self.keys), strict=True))

    def _read(self, table: DeltaTable) -> _Rows:
        """``table``'s rows, with their keys."""
        current = read_whole_table(table)
        return _Rows(current, self._keys_of(current))

    def _rewrite(self, table: DeltaTable, current: _Rows, rows: pa.Table) -> None:
        """Commit ``current`` (``table``'s rows) with ``rows`` put in by key, as one file, as
        the version after ``table``'s. Raises when any commit came in between (delta-rs is
        not let rebase it: every write reads the whole table), `CommitFailedError` or, when
        the version read was trimmed since, a `DeltaError` (`_refused` tells both)."""
        written = self._keys_of(rows)
        replaced = set(written)
        untouched = current.table.filter(
            pa.array([key not in replaced for key in current.keys], pa.bool_())
        )
        carried = current.rows_at(written)
        schema = current.table.schema
        for field in schema:
            if field.name not in rows.schema.names:  # a column only a later version knows
                rows = rows.append_column(field, carried[field.name])
        merged = pa.concat_tables([untouched, rows.select(schema.names).cast(schema)])
        write_deltalake(
            table,
            merged,
            mode="overwrite",
            commit_properties=CommitProperties(max_commit_retries=0),
        )

    def _vacuum_when_due(self, table: DeltaTable) -> None:
        """Every ``VACUUM_EVERY`` versions, for a table no one else vacuums: delete the files
        removed more than ``vacuum_hours`` ago."""
        if self.vacuum_hours is None or table.version() % VACUUM_EVERY != 0:
            return
        try:
            table.vacuum(
                retention_hours=self.vacuum_hours, dry_run=False, enforce_retention_duration=False
            )
        except CommitFailedError:
            pass  # a concurrent writer won: the next due version vacuums


class _Rows:
    """A table's rows as read, with the key of each row (read once, for every lookup)."""

    def __init__(self, table: pa.Table, keys: list[Key]) -> None:
        self.table = table
        self.keys = keys
        self.at = {key: i for i, key in enumerate(keys)}

    def rows_at(self, keys: Sequence[Key]) -> pa.Table:
        """For each of ``keys``, its row; a row of nulls where it has none."""
        return self.table.take(pa.array([self.at.get(key) for key in keys], pa.int64()))

    def rows_of(self, keys: Sequence[Key]) -> list[Row | None]:
        """For each of ``keys``, its row as a dict; None where it has none."""
        found = self.rows_at(keys).to_pylist()
        return [row if key in self.at else None for key, row in zip(keys, found, strict=True)]


def _still(row: Mapping[str, object] | None, expected: Mapping[str, object] | None) -> bool:
    """Whether a key's ``row`` (None: the key has none) is as ``expected`` says: None for no
    row, else equal in each column it names (a column the row lacks reads as None)."""
    if expected is None:
        return row is None
    return row is not None and all(row.get(c) == v for c, v in expected.items())
