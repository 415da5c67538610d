"""``compression.type``: the codec of every data file the sink writes, stored on the log.

Both append writers (pyarrow's, Spark's) and a pass write the codec the log's config names;
a log that changes it keeps reading its older files; a value Kafka does not know is refused
by name.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from sinks import CleanerConfig, CompactedStateSink
from sinks.errors import ConfigError
from sinks.log.log_config import alter_log_config
from sinks.produce.spark_append import APPEND_WRITER_ENV, PYTHON_WRITER, SPARK_WRITER
from sinks.reading.arrow_state import read_state

KEEP = dict(min_cleanable_dirty_ratio=1.0)


def codecs(sink) -> dict[str, set[str]]:
    """Each live file's name and the codecs of its column chunks."""
    snapshot = sink.log_table.snapshot()
    out = {}
    for f in snapshot.data_files():
        meta = pq.ParquetFile(f"{sink.path}/{f.path}").metadata
        out[f.path] = {
            meta.row_group(g).column(c).compression
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
        }
    return out


@pytest.mark.parametrize("writer", [PYTHON_WRITER, SPARK_WRITER])
def test_appends_and_a_pass_write_the_logs_codec(spark, lake, monkeypatch, writer):
    monkeypatch.setenv(APPEND_WRITER_ENV, writer)
    config = CleanerConfig(compression_type="lz4", **KEEP)
    sink = CompactedStateSink(str(lake / "log"), config=config)
    rows = [(f"k{i % 7}", f"v{i}") for i in range(40)]
    sink(spark.createDataFrame(rows, "key string, value string"), 0)
    assert set().union(*codecs(sink).values()) == {"LZ4"}  # pyarrow names Parquet's LZ4_RAW so
    sink.clean(force=True)
    assert set().union(*codecs(sink).values()) == {"LZ4"}  # pyarrow names Parquet's LZ4_RAW so
    assert read_state(sink.path).num_rows == 7
    assert (
        sink.log_table.snapshot()
        .table.metadata()
        .configuration["compacted.sink.topic.compression.type"]
        == "lz4"
    )


def test_a_log_that_changes_codec_reads_every_file(spark, lake):
    sink = CompactedStateSink(str(lake / "log"), config=CleanerConfig(**KEEP))
    sink(spark.createDataFrame([("a", "1"), ("b", "2")], "key string, value string"), 0)
    assert set().union(*codecs(sink).values()) == {"ZSTD"}  # the default
    alter_log_config(sink.log_table, add={"compression.type": "uncompressed"})
    reopened = CompactedStateSink(sink.path)
    reopened(spark.createDataFrame([("b", "3"), ("c", "4")], "key string, value string"), 1)
    assert {frozenset(c) for c in codecs(reopened).values()} == {
        frozenset({"ZSTD"}),
        frozenset({"UNCOMPRESSED"}),
    }
    state = {r["key"]: r["value"] for r in reopened.state().collect()}
    assert state == {"a": "1", "b": "3", "c": "4"}


def test_an_unknown_codec_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"compression\.type must be one of zstd, lz4.*'brotli'"):
        CleanerConfig(compression_type="brotli")
    assert CleanerConfig.from_properties({"compression.type": "producer"}).parquet_codec == "zstd"


def test_a_replay_writes_the_codec_the_source_log_carries(spark, lake):
    from sinks.reading.replay import RestoreSource, replay

    config = CleanerConfig(compression_type="lz4", **KEEP)
    source = CompactedStateSink(str(lake / "log"), config=config)
    source(spark.createDataFrame([("a", "1"), ("b", "2")], "key string, value string"), 0)
    replay(RestoreSource.of_log(spark, source.path), str(lake / "copy"))
    copy = CompactedStateSink(str(lake / "copy"))
    assert copy.config.compression_type == "lz4"
    assert set().union(*codecs(copy).values()) == {"LZ4"}
    assert {r["key"]: r["value"] for r in copy.state().collect()} == {"a": "1", "b": "2"}
