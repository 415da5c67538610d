"""A small Delta table read whole on the caller's thread (design.md §58) is the table as
delta-rs's ``to_pyarrow_table`` scans it: every file, partition values from the log, a column
added after a file was written read as null, and an empty table. No Spark."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from checkpoints.table_read import read_whole_table


def test_a_table_read_whole_on_this_thread_is_the_table_as_delta_rs_scans_it(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"p": [1, 1, 2], "k": ["a", "b", "c"]}), partition_by=["p"])
    write_deltalake(
        path,
        pa.table({"p": [2], "k": ["d"], "n": [7]}),
        mode="append",
        schema_mode="merge",
    )  # a column added: the older files read it as null
    table = DeltaTable(path)
    read = read_whole_table(table)
    expected = table.to_pyarrow_table()
    assert read.schema == expected.schema
    assert read.sort_by("k").to_pylist() == expected.sort_by("k").to_pylist()
    assert read.sort_by("k").to_pylist()[0] == {"p": 1, "k": "a", "n": None}
    assert read_whole_table(table, ["n", "k"]).sort_by("k").column("n").to_pylist() == [
        None,
        None,
        None,
        7,
    ]
    empty = str(tmp_path / "empty")
    DeltaTable.create(empty, pa.schema([("k", pa.string())]))
    assert read_whole_table(DeltaTable(empty)).num_rows == 0
