"""A consumer's position in a log: Kafka's fetch positions, as pure functions over offsets.

A Kafka consumer holds, per partition, its *position*: the offset of the next record
it reads. A streaming read of the log (`streaming.consumers.consumer_source`) holds the same:
its Spark offset is ``{"0": 42, "1": 17}``, the position per partition, and a
micro-batch reads the half-open range ``[start[p], end[p])`` of every partition.
Everything here works on plain numbers taken from a log snapshot; nothing does I/O.

- `starting_positions`: where a new reader starts (``startingOffsets`` /
  ``startingTimestamp``, or a registered consumer's committed offsets);
- `next_positions`: the end of the next micro-batch, bounded by ``maxOffsetsPerTrigger``
  the way Spark's Kafka source bounds it (shared between partitions by their lag);
- `fetch_ranges`: the ranges a batch reads, with Kafka's data-loss check: a position
  below the partition's log start offset means records were deleted (retention,
  ``delete_records``) before this reader read them. A position whose record was
  *cleaned* away is not a loss: the read resumes at the next surviving offset.

A partition the start offsets do not name (created after the reader started) is
read from its log start offset, as Spark's Kafka source reads new partitions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from sinks.errors import ConfigError, DataLossError

EARLIEST = -2  # Kafka's sentinels in a JSON map of starting offsets
LATEST = -1

Positions = dict[int, int]


def parse_starting_offsets(text: str) -> str | Positions:
    """``earliest``, ``latest`` or a JSON map ``{"0": 42, "1": -2}`` (-2 earliest, -1 latest)."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower()
    try:
        parsed = json.loads(value)
        if not isinstance(parsed, dict):
            raise ValueError("not an object")
        positions = {int(p): int(o) for p, o in parsed.items()}
    except (ValueError, TypeError) as e:
        raise ConfigError(
            f"option 'startingOffsets' must be earliest, latest or a JSON object of "
            f'partition -> offset such as {{"0": 42}}; got {text!r} ({e})'
        ) from e
    bad = {p: o for p, o in positions.items() if p < 0 or o < EARLIEST}
    if bad:
        raise ConfigError(f"option 'startingOffsets': invalid partition or offset in {bad}")
    return positions


def starting_positions(
    spec: str | Positions,
    *,
    log_start_offsets: Mapping[int, int],
    log_end_offsets: Mapping[int, int],
) -> Positions:
    """Positions for a new reader over the partitions the log has. Pure.

    ``earliest`` is each partition's log start offset (the compacted log, then the
    tail); ``latest`` its log end offset; a JSON map gives offsets per partition,
    -2 and -1 standing for earliest and latest, and an unnamed partition is read
    from its log start offset.
    """
    positions: Positions = {}
    for partition in sorted(set(log_start_offsets) | set(log_end_offsets)):
        start = log_start_offsets.get(partition, 0)
        end = log_end_offsets.get(partition, start)
        if spec == "earliest":
            wanted = EARLIEST
        elif spec == "latest":
            wanted = LATEST
        else:
            assert isinstance(spec, dict)
            wanted = spec.get(partition, EARLIEST)
        positions[partition] = start if wanted == EARLIEST else end if wanted == LATEST else wanted
    if isinstance(spec, dict):
        for partition, offset in spec.items():
            positions.setdefault(partition, max(offset, 0))
    return positions


def first_offsets_at(
    timestamps: Mapping[int, tuple[list[int], list[int]]],
    target_ms: int,
    log_end_offsets: Mapping[int, int],
) -> Positions:
    """Kafka's ``offsetsForTimes``: per partition, the first offset whose timestamp is at or
    after ``target_ms``; the log end offset where none is. ``timestamps`` maps a partition
    to (offsets, timestamps in epoch ms) of the records that may qualify. Pure."""
    positions: Positions = {}
    for partition, end in log_end_offsets.items():
        offsets, times = timestamps.get(partition, ([], []))
        found = [o for o, t in zip(offsets, times, strict=True) if t is not None and t >= target_ms]
        positions[partition] = min(found) if found else end
    return positions


def next_positions(
    start: Mapping[int, int],
    log_end_offsets: Mapping[int, int],
    *,
    max_offsets: int | None = None,
    log_start_offsets: Mapping[int, int] | None = None,
) -> Positions:
    """The end of the next micro-batch: every partition's log end offset, or, with
    ``max_offsets``, at most that many offsets in all, shared between partitions in
    proportion to their lag (Spark's Kafka source's ``rateLimit``). Pure.

    A position never moves back; a partition with lag gets at least one offset
    when the budget allows it, so a small budget still makes progress everywhere.
    A partition ``start`` does not name begins at its log start offset.
    """
    floors = log_start_offsets or {}
    positions = {p: start.get(p, floors.get(p, 0)) for p in _all(start, log_end_offsets)}
    ends = {p: max(log_end_offsets.get(p, 0), positions[p]) for p in positions}
    if max_offsets is None:
        return ends
    lags = {p: ends[p] - positions[p] for p in ends if ends[p] > positions[p]}
    total = sum(lags.values())
    if total <= max_offsets:
        return ends
    budget = max_offsets
    shares = {p: max(1, lag * max_offsets // total) for p, lag in lags.items()}
    for p in sorted(lags, key=lambda q: (-lags[q], q)):
        take = min(shares[p], lags[p], budget)
        positions[p] += take
        budget -= take
    return positions


@dataclass(frozen=True, order=True)
class FetchRange:
    """The half-open offset range ``[from_offset, until_offset)`` of one partition."""

    partition: int
    from_offset: int
    until_offset: int

    @property
    def empty(self) -> bool:
        return self.until_offset <= self.from_offset


def fetch_ranges(
    start: Mapping[int, int],
    end: Mapping[int, int],
    log_start_offsets: Mapping[int, int],
    *,
    fail_on_data_loss: bool,
    log_path: str = "",
) -> list[FetchRange]:
    """The non-empty ranges a micro-batch from ``start`` to ``end`` reads. Pure.

    A range begins at the larger of the position and the log start offset. With
    ``fail_on_data_loss`` a position below the log start offset raises `DataLossError`
    (what was deleted below it was never read); without it the read goes on from
    the log start offset, as Spark's Kafka source does with ``failOnDataLoss=false``.
    A partition ``start`` does not name starts at its log start offset: not a loss.
    """
    ranges = []
    for partition in sorted(end):
        log_start = log_start_offsets.get(partition, 0)
        position = start.get(partition)
        if position is not None and position < log_start and fail_on_data_loss:
            if end[partition] > position:
                raise DataLossError(
                    f"log {log_path} partition {partition}: position {position} lies below "
                    f"the log start offset {log_start}; records [{position}, {log_start}) were "
                    "deleted (retention or delete_records) before this reader read them. "
                    "Restart from a new checkpoint, or set failOnDataLoss=false to go on "
                    "from the log start offset"
                )
        begin = max(position if position is not None else log_start, log_start)
        fetch = FetchRange(partition, begin, end[partition])
        if not fetch.empty:
            ranges.append(fetch)
    return ranges


def to_offset(positions: Mapping[int, int]) -> dict[str, int]:
    """Positions as a Spark offset: ``{"0": 42, ...}`` (JSON keys are strings)."""
    return {str(p): int(o) for p, o in sorted(positions.items())}


def from_offset(offset: Mapping[str, int]) -> Positions:
    """A Spark offset back into positions."""
    return {int(p): int(o) for p, o in offset.items()}


def lag(positions: Mapping[int, int], log_end_offsets: Mapping[int, int]) -> Positions:
    """Kafka's consumer lag per partition: log end offset minus position (never negative)."""
    return {
        p: max(0, log_end_offsets.get(p, 0) - positions.get(p, 0))
        for p in _all(positions, log_end_offsets)
    }


def _all(*maps: Mapping[int, int]) -> list[int]:
    return sorted(set().union(*maps))
