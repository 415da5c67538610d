"""A read-only command on a path that is not a compacted log says it only read.

``read_state``, ``lookup``, ``export`` and the ``lookup`` command refuse a Delta table
that is not a log, and a directory of someone else's files, as the writers do, but in a
reader's words: nothing written or read, give a log's path; never the writer's "choose a
new path" or "a new directory for a new one", which read as if the command would create a
log there. The writers keep their own words. No Spark.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from sinks import CompactedStateSink, NotACompactedLogError, lookup, read_state
from streaming.cli import main

READER = "Nothing was written to it or read from it. Give the path of a compacted log"
WRITER_ONLY = ("new (missing or empty) directory", "Choose a new path", "move those files")


@pytest.fixture
def strangers(tmp_path):
    plain = tmp_path / "plain"
    write_deltalake(str(plain), pa.table({"id": [1, 2], "name": ["a", "b"]}))
    files = tmp_path / "files"
    files.mkdir()
    pq.write_table(pa.table({"id": [1]}), files / "part-0001.parquet")
    return {"a Delta table": str(plain), "not a Delta table": str(files)}


def test_readers_refuse_in_a_readers_words(strangers, capsys):
    for what, path in strangers.items():
        for read, args in ((read_state, (path,)), (lookup, (path, "a"))):
            with pytest.raises(NotACompactedLogError) as refused:
                read(*args)
            message = str(refused.value)
            assert f"{path} is not a compacted log: it is {what}" in message
            assert READER in message
            assert not any(words in message for words in WRITER_ONLY), message
        assert main(["lookup", path, "a"]) == 1
        line = capsys.readouterr().err.strip()
        assert line.startswith("compacted-sink lookup: NotACompactedLogError: ") and READER in line


def test_writers_keep_their_own_words(strangers):
    with pytest.raises(NotACompactedLogError, match="or a new \\(missing or empty\\) directory"):
        CompactedStateSink(strangers["a Delta table"])
    with pytest.raises(NotACompactedLogError, match="Choose a new path for the log"):
        CompactedStateSink(strangers["not a Delta table"])
