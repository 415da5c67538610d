"""The engine a log's commits go through: delta-rs, behind one seam (design.md §36).

The sink reads a log with delta-rs and commits four kinds of change to it: files added
and removed with the log's ``txn`` versions (an append, a pass, retention, an undo of a
stale rewrite), a schema change (§18), table properties (the topic's config, §29) and a
restore to an earlier version (the way on after another engine's change, §14). Each goes
through a `LogCommitter`, so the engine that writes the Delta log is named in this
module only; a table beside a log (the dead letters) is appended to through it too.
`DeltaRsCommitter` is the one the sink uses. A committer for Spark's own
Delta (an ``OptimisticTransaction`` of the session's ``DeltaLog``, through Py4J) would
implement the same methods, commit at the version of the table it is handed, and
raise the sink's `ConcurrentCommitError` on a conflict, so that the guards around a commit
in `sinks.log.log_table` (the foreign-change check, the token that finds a lost answer,
the rebase of a commit that removes files) hold for it unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, CommitProperties, Transaction
from deltalake.transaction import RemoveAction as _RemoveAction

from sinks.errors import ConcurrentCommitError
from sinks.log.location import LogLocation
from sinks.log.segment import DataFile

NO_RECORD = '"offset" < 0'
"""A predicate no record of a log matches: offsets start at 0."""


class NewFile(Protocol):
    """A file a commit adds: a segment just written, or a file an undo restores."""

    def add_action(self, *, data_change: bool, modification_time: int) -> AddAction: ...


class LogCommitter(Protocol):
    """What the sink needs from the engine that commits to a log's Delta log.

    Each method but `create_table` raises `ConcurrentCommitError` when another writer
    committed a conflicting change first; nothing of the commit landed then.
    """

    def create_table(
        self,
        location: LogLocation,
        schema: pa.Schema,
        *,
        configuration: Mapping[str, str] | None,
        name: str,
        description: str,
    ) -> None:
        """Create the log's table at ``location`` unless one exists (then do nothing)."""
        ...

    def commit_files(
        self,
        table: DeltaTable,
        *,
        adds: Iterable[NewFile],
        removes: Iterable[DataFile],
        data_change: bool,
        schema: pa.Schema,
        transactions: Mapping[str, int],
        metadata: Mapping[str, Any],
        timestamp_ms: int,
    ) -> None:
        """Commit ``removes`` and ``adds`` as the version after ``table``'s.

        A commit that adds only may be rebased by the engine over concurrent commits; one
        that removes files must not be (its caller rebases it, design.md §34).
        """
        ...

    def commit_schema(
        self, table: DeltaTable, schema: pa.Schema, *, metadata: Mapping[str, Any]
    ) -> None:
        """Commit ``schema`` as the log's schema, adding and removing no file."""
        ...

    def set_properties(
        self, table: DeltaTable, properties: Mapping[str, str], *, metadata: Mapping[str, Any]
    ) -> None:
        """Set table properties, the sink's own keys among them."""
        ...

    def restore(
        self,
        table: DeltaTable,
        version: int,
        *,
        transactions: Mapping[str, int],
        metadata: Mapping[str, Any],
        timestamp_ms: int,
    ) -> None:
        """Restore the log to ``version``, recording ``transactions`` in the same commit."""
        ...

    def append_rows(
        self, location: LogLocation, rows: pa.Table, *, transactions: Mapping[str, int]
    ) -> None:
        """Append ``rows`` to the plain Delta table at ``location`` (created with their schema
        when there is none), recording ``transactions`` in the same commit. For a table beside
        a log (the dead letters), not for a log."""
        ...


class DeltaRsCommitter:
    """Commits through delta-rs: ``create``, a write transaction, ``alter``, ``restore``."""

    def create_table(
        self,
        location: LogLocation,
        schema: pa.Schema,
        *,
        configuration: Mapping[str, str] | None,
        name: str,
        description: str,
    ) -> None:
        DeltaTable.create(
            location.uri,
            schema,
            mode="ignore",
            configuration=dict(configuration) if configuration else None,
            raise_if_key_not_exists=False,  # the sink's own properties (sinks.log.log_keys)
            storage_options=location.delta_options,
            name=name,
            description=description,
        )

    def commit_files(
        self,
        table: DeltaTable,
        *,
        adds: Iterable[NewFile],
        removes: Iterable[DataFile],
        data_change: bool,
        schema: pa.Schema,
        transactions: Mapping[str, int],
        metadata: Mapping[str, Any],
        timestamp_ms: int,
    ) -> None:
        removed = [
            _RemoveAction(f.path, data_change, timestamp_ms, f.size_bytes, {}) for f in removes
        ]
        actions: list[Any] = [*removed]
        actions += [
            a.add_action(data_change=data_change, modification_time=timestamp_ms) for a in adds
        ]
        properties = CommitProperties(
            app_transactions=_transactions(transactions, timestamp_ms),
            custom_metadata=dict(metadata),
            max_commit_retries=0 if removed else None,
        )
        with _conflicts_raised():
            table.create_write_transaction(actions, "append", schema, commit_properties=properties)

    def commit_schema(
        self, table: DeltaTable, schema: pa.Schema, *, metadata: Mapping[str, Any]
    ) -> None:
        # delta-rs drops a schema change in append mode without an error (design.md §34):
        # an overwrite that matches no record commits the schema and nothing else.
        with _conflicts_raised():
            write_deltalake(
                table,
                schema.empty_table(),
                mode="overwrite",
                schema_mode="overwrite",
                predicate=NO_RECORD,
                commit_properties=CommitProperties(custom_metadata=dict(metadata)),
            )

    def set_properties(
        self, table: DeltaTable, properties: Mapping[str, str], *, metadata: Mapping[str, Any]
    ) -> None:
        with _conflicts_raised():
            table.alter.set_table_properties(
                dict(properties),
                raise_if_not_exists=False,  # the sink's own keys are not Delta's
                commit_properties=CommitProperties(custom_metadata=dict(metadata)),
            )

    def restore(
        self,
        table: DeltaTable,
        version: int,
        *,
        transactions: Mapping[str, int],
        metadata: Mapping[str, Any],
        timestamp_ms: int,
    ) -> None:
        with _conflicts_raised():
            table.restore(
                version,
                commit_properties=CommitProperties(
                    app_transactions=_transactions(transactions, timestamp_ms),
                    custom_metadata=dict(metadata),
                ),
            )

    def append_rows(
        self, location: LogLocation, rows: pa.Table, *, transactions: Mapping[str, int]
    ) -> None:
        with _conflicts_raised():
            write_deltalake(
                location.uri,
                rows,
                mode="append",
                storage_options=location.delta_options,
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(a, v) for a, v in transactions.items()]
                ),
            )


TRIMMED_VERSION = "Invalid table version"
"""delta-rs's error when a commit file its transaction reads is gone: the version it read
from, or a later one it would rebase over, trimmed from the Delta log since it was read."""


@contextmanager
def _conflicts_raised() -> Iterator[None]:
    """Raise delta-rs's conflict as the sink's own `ConcurrentCommitError`; so too a commit
    whose read version the log has moved past and trimmed (the caller reads it again)."""
    try:
        yield
    except CommitFailedError as e:
        raise ConcurrentCommitError(str(e)) from e
    except DeltaError as e:
        if not str(e).startswith(TRIMMED_VERSION):
            raise
        raise ConcurrentCommitError(f"the log moved on and was trimmed since: {e}") from e


def _transactions(versions: Mapping[str, int], timestamp_ms: int) -> list[Transaction]:
    return [Transaction(app_id, v, timestamp_ms) for app_id, v in versions.items()]


DELTA_RS = DeltaRsCommitter()
"""The committer every log uses unless it is given another."""


def commit_rewrite(
    location: LogLocation,
    *,
    removes: Iterable[tuple[str, int]],
    adds: Iterable[tuple[str, int, str]],
    schema: pa.Schema,
    metadata: Mapping[str, Any],
    timestamp_ms: int,
) -> None:
    """One commit of a table that is not a log (the dead-letter table): files ``removes``
    ((path, size)) replaced by ``adds`` ((path, size, stats JSON)), with ``metadata`` as the
    commit's custom metadata and no predicate, so the commit names no row. Raises
    `ConcurrentCommitError` on a conflict."""
    actions: list[Any] = [_RemoveAction(p, True, timestamp_ms, s, {}) for p, s in removes]
    actions += [AddAction(p, s, {}, timestamp_ms, True, stats) for p, s, stats in adds]
    with _conflicts_raised():
        location.delta_table().create_write_transaction(
            actions,
            "append",
            schema,
            commit_properties=CommitProperties(custom_metadata=dict(metadata)),
        )
