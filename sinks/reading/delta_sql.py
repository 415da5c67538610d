"""The state as one SQL query, for engines that read the log's Delta table directly.

DuckDB (``delta_scan``), Trino, Spark with Delta, Databricks SQL read the log as a
plain Delta table: every stored record, several per key until a pass runs,
tombstones included. The state is the latest record per (partition, key) with the
tombstones dropped. Offsets only grow within a partition and cleaning never
rewrites them, so the highest offset over every live file is the latest record,
whichever files are clean (design.md §1 and §3); with a sequence column, the
highest (sequence, offset), as `sinks.cleaner.rules` orders.

What SQL over the raw table cannot see: the log start offsets that
``delete_records`` and retention keep in Delta ``txn`` actions. Records below a
log start offset that still lie in a live file (one straddling it) show up here;
`sinks.read_state` hides them. Pure: builds text, runs nothing.
"""

from __future__ import annotations

from sinks.log.log_keys import DEFAULT_KEY_COLUMNS, LogKeys

DEFAULT_KEYS = LogKeys(key_columns=DEFAULT_KEY_COLUMNS)
"""A log keyed by ``key`` alone, without a sequence column."""


def state_query(source: str, keys: LogKeys = DEFAULT_KEYS) -> str:
    """A SELECT of the state's key columns (``keys``, the log's: `sinks.log.log_keys`),
    ``value`` and payload from ``source``.

    ``source`` is a table expression, e.g. ``delta_scan('lake/users')`` in DuckDB.
    The result keeps every column of the log but the metadata (``partition``,
    ``offset``, ``timestamp``, ``delete_horizon_ms``) and the window's row number.
    """
    sequence_column = keys.sequence_column
    partition_by = ", ".join(_quote(k) for k in keys.key_columns)
    order = [f"{_quote(sequence_column)} DESC NULLS LAST"] if sequence_column else []
    order.append('"offset" DESC')
    return (
        'SELECT * EXCLUDE ("partition", "offset", "timestamp", delete_horizon_ms, _latest)\n'
        "FROM (\n"
        f"  SELECT *, row_number() OVER (\n"
        f'    PARTITION BY "partition", {partition_by} ORDER BY {", ".join(order)}) AS _latest\n'
        f"  FROM {source}\n"
        ")\n"
        "WHERE _latest = 1 AND value IS NOT NULL"
    )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
