"""The latest record per key, over Arrow: the one rule a pass, a reader and an append share.

A key's newest record is its highest offset, or with a ``sequence_column`` its highest
sequence, a tie going to the higher offset (design.md §3, §13). The cleaner's offset map
(`sinks.cleaner.offset_map`), the Arrow readers (`sinks.cleaner.rules.arrow_latest_offsets`)
and ``combine.before.append`` (`sinks.produce.append_task.combined`, design.md §44) all
call `latest_offsets`; the Spark form of the same rule is `sinks.cleaner.rules`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sinks.log.records import OFFSET


def latest_offsets(
    keys: pa.Table, offsets: pa.ChunkedArray, sequence: pa.ChunkedArray | None = None
) -> tuple[pa.Table, np.ndarray]:
    """Arrow: each key's newest offset, over canonical keys.

    Takes the keys, their offsets and optionally their sequence, row for row. Returns
    the distinct keys and, in the same order, their newest offsets (design.md §13's
    order with a sequence). Keys Arrow cannot group (structs, lists) raise
    ``pa.ArrowNotImplementedError`` or ``pa.ArrowTypeError``. Pure.
    """
    table = keys.append_column(OFFSET, offsets)
    if sequence is None:
        latest = table.group_by(keys.column_names).aggregate([(OFFSET, "max")])
    else:
        columns = {"_sequence": sequence}
        keys_order = [("_sequence", "ascending", "at_start"), (OFFSET, "ascending")]
        if pa.types.is_floating(sequence.type):  # NaN is Spark's highest; Arrow puts it by nulls
            columns = {"_nan": pc.fill_null(pc.is_nan(sequence), False), **columns}
            keys_order.insert(0, ("_nan", "ascending"))
        sortable = table
        for name, column in columns.items():
            sortable = sortable.append_column(name, column)
        order = pc.sort_indices(sortable, options=pc.SortOptions(keys_order))
        ordered = table.take(order)
        latest = ordered.group_by(keys.column_names, use_threads=False).aggregate(
            [(OFFSET, "last")]
        )
    newest = latest.column(latest.num_columns - 1).to_numpy()
    return latest.select(keys.column_names), newest
