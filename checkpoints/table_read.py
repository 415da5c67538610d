"""Reading a small Delta table whole, on the calling thread (design.md §58).

Why not delta-rs's ``DeltaTable.to_pyarrow_table``: it scans a pyarrow dataset whose file
system is a *Python* object (``PyFileSystem(DeltaStorageHandler)``) with pre-buffering on,
so the bytes it reads are Python-owned buffers held by Arrow's read cache, and the last
reference to that cache is dropped a moment later on one of Arrow's I/O threads. Dropping
a Python-owned buffer takes the GIL. When that moment falls in interpreter finalization,
CPython ends the I/O thread with ``pthread_exit``; its forced unwind meets a C++
destructor that may not throw, and libstdc++ aborts the process: ``terminate called
without an active exception``, SIGABRT, exit code 134, after the program's work was done
(13 of 20 runs of a script that only called ``to_pyarrow_table``; 5 of 20 reading the
cleaner-offset checkpoint with it). No thread of ours is involved, so `sinks.shutdown`
cannot stop it.

Here each file's bytes are read whole by the calling thread and copied into memory Arrow
owns, then decoded from there without Arrow's thread pools (``use_threads=False``): no
Python-owned buffer ever reaches an Arrow thread. (Handing Arrow the Python file itself
is not enough: the Parquet reader still reads some ranges with ``ReadAsync``, which runs
on an I/O thread: 1 abort in 16 runs.) The file system is still delta-rs's (the same one
``to_pyarrow_table`` uses, with the files' sizes from the table's log, so no listing or
HEAD is sent), and the table's schema is applied as a dataset scan would: a file written
before a column was added reads it as nulls, a partition column takes its value from the
table's log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

if TYPE_CHECKING:  # pyarrow.dataset imports pandas: only a read imports it (as delta-rs does)
    import pyarrow.dataset as ds


def read_whole_table(table: DeltaTable, columns: list[str] | None = None) -> pa.Table:
    """Every row of ``table`` (at the version it was opened at), with the table's schema
    (``columns`` only, in that order, when given). Read-only; reads each data file once,
    on this thread. Raises the store's errors (`OSError`)."""
    dataset = table.to_pyarrow_dataset()  # builds fragments from the log: reads no file
    schema = dataset.schema
    if columns is not None:
        schema = pa.schema([schema.field(name) for name in columns])
    pieces = [_read_fragment(dataset, fragment, schema) for fragment in dataset.get_fragments()]
    return pa.concat_tables(pieces) if pieces else schema.empty_table()


def _read_fragment(
    dataset: ds.FileSystemDataset, fragment: ds.Fragment, schema: pa.Schema
) -> pa.Table:
    from pyarrow.dataset import get_partition_keys

    partition = get_partition_keys(fragment.partition_expression)
    with dataset.filesystem.open_input_file(fragment.path) as source:
        data = source.read()  # on this thread (a Python file: Arrow's ReadAsync is no option)
    copy = pa.allocate_buffer(len(data))  # Arrow's memory: freed by any thread without the GIL
    pa.FixedSizeBufferWriter(copy).write(data)
    parquet = pq.ParquetFile(pa.BufferReader(copy))
    present = [name for name in schema.names if name in parquet.schema_arrow.names]
    read = parquet.read(columns=present, use_threads=False)
    rows = read.num_rows
    arrays = []
    for field in schema:
        if field.name in present:
            arrays.append(read[field.name].cast(field.type))
        elif field.name in partition:
            arrays.append(pa.array([partition[field.name]] * rows, field.type))
        else:  # a column added after this file was written
            arrays.append(pa.nulls(rows, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)
