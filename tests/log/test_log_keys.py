"""The log's key columns and sequence column, recorded as Delta table properties.

Pure checks of `LogKeys` (parsing, the fallback for older logs, the mismatch
message), and the sink end to end: a new log records its keys, a sink opened
with ``key_columns=None`` takes them, and other key columns fail naming the log's.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from sinks import CleanerConfig, CompactedStateSink, ConfigError, KeyColumnsMismatchError
from sinks.log.log_keys import KEY_COLUMNS_PROPERTY, SEQUENCE_COLUMN_PROPERTY, LogKeys
from sinks.log.log_table import LogTable
from sinks.reading.arrow_state import read_state

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
LOG_COLUMNS = ["tenant", "id", "value", "partition", "offset", "timestamp", "delete_horizon_ms"]


def test_properties_round_trip():
    keys = LogKeys(key_columns=("tenant", "id"), sequence_column="seq")
    assert LogKeys.from_properties(keys.to_properties(), LOG_COLUMNS) == keys
    assert LogKeys(key_columns=("key",)).to_properties() == {KEY_COLUMNS_PROPERTY: '["key"]'}


def test_a_log_without_properties_takes_its_keys_from_its_schema():
    keys = LogKeys.from_properties({}, LOG_COLUMNS)
    assert keys == LogKeys(key_columns=("tenant", "id"), recorded=False)
    assert keys.resolve(("other",), None, log_path="p").key_columns == ("other",)
    assert LogKeys.from_properties({}, ["value", "x"]).key_columns == ("key",)


def test_a_malformed_property_names_itself():
    with pytest.raises(ConfigError, match=KEY_COLUMNS_PROPERTY.replace(".", r"\.")):
        LogKeys.from_properties({KEY_COLUMNS_PROPERTY: "tenant,id"}, LOG_COLUMNS)


def test_other_keys_or_sequence_fail_naming_the_logs():
    keys = LogKeys(key_columns=("tenant", "id"), sequence_column="seq")
    assert keys.resolve(None, None, log_path="lake/t") == keys
    with pytest.raises(KeyColumnsMismatchError, match=r"keyed by \['tenant', 'id'\]"):
        keys.resolve(("key",), None, log_path="lake/t")
    with pytest.raises(KeyColumnsMismatchError, match="sequence column 'seq'"):
        keys.resolve(("tenant", "id"), "other", log_path="lake/t")


def test_the_sink_records_its_keys_and_a_reopened_sink_takes_them(spark, lake, clock):
    path = str(lake / "log")
    fresh = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    assert fresh.key_columns == ("key",)  # a new log with None: ("key",)

    composite = str(lake / "composite")
    sink = CompactedStateSink(
        composite, key_columns=("tenant", "id"), sequence_column="seq", clock=clock
    )
    schema = "tenant string, id int, value string, seq long"
    sink(spark.createDataFrame([("t", 1, "v", 1)], schema), 0)
    configuration = DeltaTable(composite).metadata().configuration
    assert configuration[KEY_COLUMNS_PROPERTY] == '["tenant", "id"]'
    assert configuration[SEQUENCE_COLUMN_PROPERTY] == "seq"

    reopened = CompactedStateSink(composite)
    assert (reopened.key_columns, reopened.sequence_column) == (("tenant", "id"), "seq")
    with pytest.raises(KeyColumnsMismatchError, match=r"keyed by \['tenant', 'id'\]"):
        CompactedStateSink(composite, key_columns=("key",))
    assert read_state(composite).to_pylist() == [{"tenant": "t", "id": 1, "value": "v", "seq": 1}]


def test_a_log_created_before_the_properties_is_read_by_its_schema(spark, lake, clock):
    path = str(lake / "old")
    schema = "tenant string, id int, value string"
    batch = spark.createDataFrame([("t", 1, "v"), ("t", 2, None)], schema)
    CompactedStateSink(path, key_columns=("tenant", "id"), clock=clock)(batch, 0)
    # An older log: the same table without the key properties.
    old = str(lake / "old-copy")
    snapshot = LogTable(path).snapshot()
    LogTable(old).create(snapshot.spark_schema)
    assert KEY_COLUMNS_PROPERTY not in DeltaTable(old).metadata().configuration
    sink = CompactedStateSink(old, key_columns=("tenant", "id"), clock=clock)
    sink(batch, 0)
    assert CompactedStateSink(old).key_columns == ("tenant", "id")
    assert read_state(old).to_pylist() == [{"tenant": "t", "id": 1, "value": "v"}]
