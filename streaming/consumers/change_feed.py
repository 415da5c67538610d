"""The change feed of one partition, computed where a Spark task runs: appends in, changes out.

Delta's Change Data Feed names each change of a row: ``insert``, ``update_preimage`` and
``update_postimage``, ``delete``, with ``_commit_version`` and ``_commit_timestamp``. Here a
change is a key's state moving at one append (design.md §56): for each key the append
wrote, its state before the commit (the *before-image*) and after it. A key's
before-image is its latest live record in the snapshot of the version before the
append's first commit in the task, found with the lookup's key filters
(`sinks.reading.lookup.KeyLookup`), read by time travel inside the history window
(design.md §57): a pass that cleaned the record away since left its file on storage
for that long. Then the task's appends are applied in version order, each key's state
carried from one to the next.

Per key and append: no state before, a live record after: ``insert``; live before and
after: ``update_preimage`` (the old record) then ``update_postimage`` (the new), also
when the value did not change, as a Delta MERGE's update; live before, a tombstone after:
``delete`` (the old record's columns, as Delta's delete row holds the deleted row); a
tombstone of a key not live: nothing. Several records of one key in one append are one
change (the append's latest, by offset or by ``sequence_column``), as a MERGE of the
batch's latest per key; with a ``sequence_column`` a record that loses to the state's is
no change. Each row is a record's image: its own ``partition``, ``offset`` and
``timestamp`` (a pre-image or a delete row shows the record it retracts).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from sinks.log import OFFSET, PARTITION, VALUE, LogKeys, LogTable, Segment, log_keys
from sinks.python_tasks import freeze_imports
from sinks.reading import KeyLookup
from sinks.spark_compat import InputPartition
from streaming.consumers.consumer_position import FetchRange
from streaming.consumers.fetch_plan import ConsumerReadPartition
from streaming.consumers.fetcher import RangeReader

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
INSERT = "insert"
UPDATE_PREIMAGE = "update_preimage"
UPDATE_POSTIMAGE = "update_postimage"
DELETE = "delete"
CHANGE_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)
_BATCH_ROWS = 65_536


def change_schema(record_schema: pa.Schema) -> pa.Schema:
    """The feed's rows: the record's columns, then Delta's three change columns."""
    return (
        record_schema.append(pa.field(CHANGE_TYPE, pa.string()))
        .append(pa.field(COMMIT_VERSION, pa.int64()))
        .append(pa.field(COMMIT_TIMESTAMP, pa.timestamp("us", tz="UTC")))
    )


@dataclass(frozen=True)
class PartitionAppend:
    """What one append added to one partition: its files and offsets ``[first, until)``."""

    version: int
    timestamp_ms: int
    paths: tuple[str, ...]
    first: int
    until: int


class ChangeFeedPartition(InputPartition):
    """One Spark task of the feed: one partition's appends, in version order, and the
    version whose state holds their keys' before-images (-1: none, the state is empty)."""

    def __init__(
        self, partition: int, before_version: int, appends: Sequence[PartitionAppend]
    ) -> None:
        super().__init__((partition, before_version, appends[0].version if appends else -1))
        self.partition = partition
        self.before_version = before_version
        self.appends = tuple(appends)


@dataclass(frozen=True)
class ChangeFeedTask:
    """The picklable function each Spark task runs over a `ChangeFeedPartition`."""

    table_uri: str
    record_schema: pa.Schema  # the source's columns (the log's, without delete_horizon_ms)

    def __call__(self, task: ChangeFeedPartition) -> Iterator[pa.RecordBatch]:
        freeze_imports()
        log = LogTable(self.table_uri)
        reader = RangeReader(self.table_uri, self.record_schema)
        appended = [(a, self._records(reader, task.partition, a)) for a in task.appends]
        keys = log_keys(log.snapshot(verify=False))
        own = [k for k in keys.key_columns if k != PARTITION]
        state = self._before(log, task, own, [r for _, r in appended])
        rows: list[dict[str, Any]] = []
        for append, records in appended:
            rows += apply_append(state, records, own, keys, append.version, append.timestamp_ms)
        schema = change_schema(self.record_schema)
        yield from pa.Table.from_pylist(rows, schema).to_batches(max_chunksize=_BATCH_ROWS)

    def _records(
        self, reader: RangeReader, partition: int, append: PartitionAppend
    ) -> list[dict[str, Any]]:
        fetch = FetchRange(partition, append.first, append.until)
        read = ConsumerReadPartition(fetch, append.paths, [False] * len(append.paths), False)
        return [row for batch in reader(read) for row in batch.to_pylist()]

    def _before(
        self,
        log: LogTable,
        task: ChangeFeedPartition,
        own: list[str],
        appended: list[list[dict[str, Any]]],
    ) -> dict[tuple, dict[str, Any]]:
        """Each written key's live record at ``before_version``, by key."""
        wanted = list(dict.fromkeys(tuple(r[k] for k in own) for rows in appended for r in rows))
        if task.before_version < 0 or not wanted:
            return {}
        snapshot = log.snapshot(task.before_version, verify=False)
        assert snapshot is not None
        lookup = KeyLookup.of(snapshot)
        files = tuple(
            f for f in lookup.files if not isinstance(f, Segment) or f.partition == task.partition
        )
        lookup = replace(lookup, files=files)
        found = lookup.find([k if len(k) > 1 else k[0] for k in wanted])
        return {
            tuple(r[k] for k in own): r for r in found.to_pylist() if r[PARTITION] == task.partition
        }


def apply_append(
    state: dict[tuple, dict[str, Any]],
    records: list[dict[str, Any]],
    own: Sequence[str],
    keys: LogKeys,
    version: int,
    timestamp_ms: int,
) -> list[dict[str, Any]]:
    """The change rows of one append's ``records`` (one partition's, in offset order)
    against ``state`` (each key's newest record, tombstones included), which it updates. Pure
    but for ``state``."""
    latest: dict[tuple, dict[str, Any]] = {}
    for record in records:
        key = tuple(record[k] for k in own)
        if key not in latest or _order(record, keys) >= _order(latest[key], keys):
            latest[key] = record
    stamp = {COMMIT_VERSION: version, COMMIT_TIMESTAMP: _utc(timestamp_ms)}
    rows: list[dict[str, Any]] = []
    for key, after in sorted(latest.items(), key=lambda item: item[1][OFFSET]):
        before = state.get(key)
        if before is not None and _order(before, keys) > _order(after, keys):
            continue  # an older event (sequence_column) loses to the state: no change
        state[key] = after
        was = before is not None and before.get(VALUE) is not None
        now = after.get(VALUE) is not None
        if was and now:
            rows.append({**before, CHANGE_TYPE: UPDATE_PREIMAGE, **stamp})
            rows.append({**after, CHANGE_TYPE: UPDATE_POSTIMAGE, **stamp})
        elif now:
            rows.append({**after, CHANGE_TYPE: INSERT, **stamp})
        elif was:
            rows.append({**before, CHANGE_TYPE: DELETE, **stamp})
    return rows


def _order(record: Mapping[str, Any], keys: LogKeys) -> tuple:
    sequence = keys.sequence_column
    if sequence is None or sequence == OFFSET:
        return (record[OFFSET],)
    return (record.get(sequence) is not None, record.get(sequence), record[OFFSET])


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
