"""A consumer's positions: starting offsets, micro-batch ends, fetch ranges and data loss."""

from __future__ import annotations

import pytest

from sinks.errors import ConfigError
from streaming.consumers.consumer_position import (
    DataLossError,
    FetchRange,
    fetch_ranges,
    first_offsets_at,
    from_offset,
    lag,
    next_positions,
    parse_starting_offsets,
    starting_positions,
    to_offset,
)

STARTS = {0: 0, 1: 5}
ENDS = {0: 10, 1: 20}


def test_starting_offsets_parse_kafka_forms() -> None:
    assert parse_starting_offsets("Earliest") == "earliest"
    assert parse_starting_offsets("latest") == "latest"
    assert parse_starting_offsets('{"0": 42, "1": -2}') == {0: 42, 1: -2}
    with pytest.raises(ConfigError, match="startingOffsets"):
        parse_starting_offsets("soonest")
    with pytest.raises(ConfigError, match="startingOffsets"):
        parse_starting_offsets('{"0": -7}')


def test_starting_positions_earliest_latest_and_per_partition() -> None:
    kw = {"log_start_offsets": STARTS, "log_end_offsets": ENDS}
    assert starting_positions("earliest", **kw) == {0: 0, 1: 5}
    assert starting_positions("latest", **kw) == {0: 10, 1: 20}
    assert starting_positions({0: 3, 1: -1}, **kw) == {0: 3, 1: 20}
    assert starting_positions({1: -2}, **kw) == {0: 0, 1: 5}  # unnamed: earliest
    assert starting_positions({0: 3, 7: 4}, **kw) == {0: 3, 1: 5, 7: 4}


def test_first_offsets_at_a_timestamp_as_offsets_for_times() -> None:
    timestamps = {0: ([0, 1, 2, 3], [100, 300, 200, 400]), 1: ([5, 6], [100, 150])}
    assert first_offsets_at(timestamps, 200, ENDS) == {0: 1, 1: 20}


def test_next_positions_read_everything_without_a_limit() -> None:
    assert next_positions({0: 4, 1: 5}, ENDS) == {0: 10, 1: 20}
    assert next_positions({0: 10, 1: 20}, ENDS) == {0: 10, 1: 20}  # nothing new: start as is


def test_next_positions_share_max_offsets_by_lag() -> None:
    end = next_positions({0: 0, 1: 0}, {0: 10, 1: 30}, max_offsets=8)
    assert sum(end.values()) == 8
    assert end == {0: 2, 1: 6}
    tiny = next_positions({0: 0, 1: 0}, {0: 10, 1: 30}, max_offsets=1)
    assert sum(tiny.values()) == 1
    assert next_positions({0: 0}, {0: 3}, max_offsets=100) == {0: 3}


def test_a_new_partition_starts_at_its_log_start() -> None:
    end = next_positions({0: 10}, {0: 10, 1: 50}, max_offsets=5, log_start_offsets={1: 40})
    assert end == {0: 10, 1: 45}
    assert fetch_ranges({0: 10}, end, {1: 40}, fail_on_data_loss=True) == [FetchRange(1, 40, 45)]


def test_fetch_ranges_skip_empty_partitions() -> None:
    ranges = fetch_ranges({0: 4, 1: 20}, {0: 10, 1: 20}, STARTS, fail_on_data_loss=True)
    assert ranges == [FetchRange(0, 4, 10)]


def test_a_position_below_the_log_start_offset_is_data_loss() -> None:
    with pytest.raises(DataLossError, match=r"position 2 lies below the log start offset 5"):
        fetch_ranges({1: 2}, {1: 20}, STARTS, fail_on_data_loss=True, log_path="lake/users")
    ranges = fetch_ranges({1: 2}, {1: 20}, STARTS, fail_on_data_loss=False)
    assert ranges == [FetchRange(1, 5, 20)]


def test_offsets_round_trip_as_spark_json_and_lag() -> None:
    assert to_offset({1: 5, 0: 3}) == {"0": 3, "1": 5}
    assert from_offset({"0": 3, "1": 5}) == {0: 3, 1: 5}
    assert lag({0: 3}, {0: 10, 1: 4}) == {0: 7, 1: 4}
