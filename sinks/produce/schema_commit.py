"""Committing a log's evolved schema: one Delta commit that holds a ``metaData`` action only.

delta-rs's ``create_write_transaction`` drops a schema change in append mode without an
error (design.md §34), and in overwrite mode it removes every live file. So the schema
goes in a commit of its own, made through the log's committer (`sinks.log.committer`;
with delta-rs, ``write_deltalake``) as an overwrite whose predicate
no record matches (``offset < 0``; file statistics prune every file, so nothing is read):
delta-rs writes the new ``metaData`` (table id, properties and creation time kept) and
neither adds nor removes a file. It also accepts a type widening, which
``alter.add_columns`` refuses.

The append orders the two commits: this one first, then the batch's files, whose
commit carries the batch's ``txn``. A crash between the two leaves a log that every
reader reads (older files lack the new fields: readers fill them with null); the
retried batch finds the schema already evolved and appends once. Idempotent: a
schema equal to the snapshot's is not committed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql.types import StructType

from sinks.log.foreign.commits import check_writable
from sinks.log.log_format import commit_metadata
from sinks.log.log_table import LogSnapshot, log_arrow_schema


def commit_schema(snapshot: LogSnapshot, schema: StructType, *, info: Mapping[str, Any]) -> bool:
    """Commit ``schema`` as the log's schema against ``snapshot``; False when it already is.

    Raises `ConcurrentCommitError` when another writer committed a schema
    (or anything delta-rs finds conflicting) first: the caller refreshes and decides.
    ``info`` lands in the commit's metadata under ``compactedSink``.
    """
    if schema == snapshot.spark_schema:
        return False
    check_writable(snapshot.location, snapshot.table)
    snapshot.committer.commit_schema(
        snapshot.table_to_change(), log_arrow_schema(schema), metadata=commit_metadata(info)
    )
    return True
