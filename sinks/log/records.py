"""The log's records: their columns, and the log start offset's rule on Arrow and Spark.

A record of the log is its key column(s), ``value`` and payload columns, plus the
metadata the log adds (``partition``, ``offset``, ``timestamp``, ``delete_horizon_ms``).
`at_or_above` / `spark_at_or_above` keep the records at or above a partition's floor
(design.md §22). Turning a micro-batch into records, with Kafka's producer-side checks
and offset assignment, is `sinks.produce.log_validator`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame  # the Arrow readers import no pyspark (design.md §59)

RecordsT = TypeVar("RecordsT", pa.Table, pa.RecordBatch)

PARTITION = "partition"
OFFSET = "offset"
TIMESTAMP = "timestamp"
VALUE = "value"
DELETE_HORIZON_MS = "delete_horizon_ms"
INPUT_ORDER = "_input_order"
METADATA_COLUMNS = (PARTITION, OFFSET, TIMESTAMP, DELETE_HORIZON_MS)
DECODE_ERROR = "_decode_error"
"""A batch column a decoder may fill with why a row's payload could not be decoded."""
TRANSIENT_COLUMNS = (INPUT_ORDER, DECODE_ERROR)
"""Columns that ride with a batch to the append task for its checks and never reach the log."""


def sql_name(column: str) -> str:
    """``column`` as a quoted SQL identifier (any name, backticks included)."""
    return "`" + column.replace("`", "``") + "`"


def at_or_above(records: RecordsT, floors: Mapping[int, int]) -> RecordsT:
    """The rows whose offset is at or above their partition's floor (0 where none is given).

    The log start offset's rule (design.md §22: records below it are gone) on Arrow;
    `spark_at_or_above` is the same rule on Spark, and the redelivery filter
    (`drop_below_log_end`) uses it with the log end offsets as floors.
    """
    return records.filter(pa.array(~below(records, floors)))


def below(records: RecordsT, floors: Mapping[int, int]) -> np.ndarray:
    """Per row, whether its offset lies below its partition's floor (0 where none is given):
    `at_or_above`'s complement, as a mask. Pure."""
    partitions = records.column(PARTITION).to_numpy(zero_copy_only=False)
    floor = np.zeros(records.num_rows, dtype=np.int64)
    for p, start in floors.items():
        floor[partitions == p] = start
    return records.column(OFFSET).to_numpy(zero_copy_only=False) < floor


def spark_at_or_above(df: DataFrame, floors: Mapping[int, int]) -> DataFrame:
    """`at_or_above` on a DataFrame: the rows at or above their partition's floor."""
    floors = {p: start for p, start in floors.items() if start > 0}
    if not floors:
        return df
    return df.filter(f"{sql_name(OFFSET)} >= coalesce({sql_map(floors)}[{sql_name(PARTITION)}], 0)")


def sql_map(entries: Mapping[int, int], *, long_keys: bool = False) -> str:
    """A literal ``map<int, bigint>`` of ``entries`` in SQL (partition → offset);
    ``map<bigint, bigint>`` with ``long_keys``."""
    key_suffix = "L" if long_keys else ""
    pairs = ", ".join(f"{int(k)}{key_suffix}, {int(v)}L" for k, v in entries.items())
    return f"map({pairs})" if pairs else "map()"
