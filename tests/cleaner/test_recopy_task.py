"""One partition's pass run directly, without Spark, as Kafka's LogCleanerTest runs
``cleanSegments``: segments written by the log's own writer into ``tmp_path``, planned by
the pure planning functions, recopied by the executors' task (`RecopyTask`) called in
this process, and the files it wrote read back.

Each pass is held to a plain Python model of Kafka's rule: below the pass's end offset
every key keeps only its newest record (highest offset, or highest (sequence, offset)),
then KIP-534 (a tombstone is stamped ``pass_start_ms + delete_retention_ms``, and dropped
by a pass that starts after that horizon unless a consumer still holds it); records at
or above the end offset are not read; offsets and every column are kept as written.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sinks.cleaner.log_to_clean import LogToClean, group_segments_by_size
from sinks.cleaner.offset_map import BYTES_PER_MAPPED_RECORD
from sinks.cleaner.pass_planning import PartitionPlan, plan_partition
from sinks.cleaner.recopy_task import RecopyTask, packed, partitions_to_clean
from sinks.log.log_keys import LogKeys
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, TIMESTAMP, VALUE
from sinks.log.segment import Segment
from sinks.log.segment_writer import WRITTEN_ARROW_SCHEMA, SegmentWriterTask

RETENTION = 500
BIG_BUFFER = 1 << 30
SEGMENT_BYTES = 1 << 30
KEY = LogKeys(key_columns=("key",))

Row = dict[str, Any]


def schema_of(*key_fields: pa.Field) -> pa.Schema:
    """A log's Arrow schema: its key (and sequence) columns, then the value and metadata."""
    return pa.schema(
        [
            *key_fields,
            pa.field(VALUE, pa.string()),
            pa.field(PARTITION, pa.int32()),
            pa.field(OFFSET, pa.int64()),
            pa.field(TIMESTAMP, pa.timestamp("us", tz="UTC")),
            pa.field(DELETE_HORIZON_MS, pa.int64()),
        ]
    )


STRING_KEY = schema_of(pa.field("key", pa.string()))


def records(partition: int, start: int, keys: Sequence[Any], **columns: Sequence[Any]) -> list[Row]:
    """One record per key at consecutive offsets from ``start``; value ``v<offset>``
    unless ``value`` is given (None: a tombstone)."""
    rows = []
    for i, key in enumerate(keys):
        offset = start + i
        row = {"key": key, VALUE: f"v{offset}", PARTITION: partition, OFFSET: offset}
        row.update({name: values[i] for name, values in columns.items()})
        row.setdefault(TIMESTAMP, 1_000_000 * offset)
        row.setdefault(DELETE_HORIZON_MS, None)
        rows.append(row)
    return rows


@dataclass
class Log:
    """A log of one schema in a directory: its segments by partition, written with the log's
    own segment writer, and the passes run over it."""

    root: str
    schema: pa.Schema
    keys: LogKeys
    segments: dict[int, list[Segment]]

    @classmethod
    def create(cls, tmp_path: Any, schema: pa.Schema = STRING_KEY, keys: LogKeys = KEY) -> Log:
        return cls(str(tmp_path), schema, keys, {})

    def writer(self) -> SegmentWriterTask:
        return SegmentWriterTask(
            table_uri=self.root,
            schema=self.schema,
            stats_columns=(PARTITION, OFFSET),
            max_file_bytes=SEGMENT_BYTES,
            group_column=None,
            storage_options={},
            key_columns=tuple(k for k in self.keys.key_columns if k != PARTITION),
        )

    def append(self, rows: Sequence[Row]) -> Segment:
        """``rows`` (one partition's, in offset order) as one new segment."""
        [segment] = self.segments_of(self.writer()(iter(self.table(rows).to_batches())))
        self.segments.setdefault(segment.partition, []).append(segment)
        return segment

    def table(self, rows: Sequence[Row]) -> pa.Table:
        columns = {f.name: [r.get(f.name) for r in rows] for f in self.schema}
        columns[TIMESTAMP] = pa.array(columns[TIMESTAMP], pa.int64()).cast(
            self.schema.field(TIMESTAMP).type
        )
        return pa.table(columns, schema=self.schema)

    @staticmethod
    def segments_of(batches: Any) -> list[Segment]:
        written = pa.Table.from_batches(list(batches), schema=WRITTEN_ARROW_SCHEMA).to_pylist()
        return [
            Segment(
                partition=w["partition"],
                base_offset=w["base_offset"],
                last_offset=w["last_offset"],
                path=w["path"],
                size_bytes=w["size_bytes"],
                num_records=w["num_records"],
            )
            for w in written
        ]

    def plan(
        self,
        partition: int,
        *,
        first_dirty: int,
        end: int,
        cleaner_offset: int | None = None,
        dedupe_buffer_size: int = BIG_BUFFER,
    ) -> PartitionPlan:
        """The partition's share of a pass ending at most at ``end`` (its first uncleanable
        offset), from the segments' numbers only."""
        log = LogToClean(
            log_path=self.root,
            partition=partition,
            first_dirty_offset=first_dirty,
            first_uncleanable_offset=end,
            clean_bytes=0,
            cleanable_bytes=0,
        )
        return plan_partition(
            log,
            self.segments[partition],
            cleaner_offset=cleaner_offset,
            keys=self.keys,
            dedupe_buffer_size=dedupe_buffer_size,
        )

    def clean(
        self,
        plans: Sequence[PartitionPlan],
        *,
        pass_start_ms: int,
        held_below: Mapping[int, int] | None = None,
        log_start_offsets: Mapping[int, int] | None = None,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> list[Segment]:
        """Run the planned pass as one executor task and swap the inputs for what it wrote,
        as ``replaceSegments`` does; the segments written."""
        groups = {p.partition: group_segments_by_size(p.inputs, segment_bytes) for p in plans}
        tasks = partitions_to_clean(
            {p.partition: p.mapped for p in plans},
            groups,
            buckets={p.partition: p.buckets for p in plans},
        )
        task = RecopyTask(
            table_uri=self.root,
            storage_options={},
            schema=self.schema,
            key_columns=self.keys.key_columns,
            sequence_column=self.keys.sequence_column,
            tasks=tuple(tasks),
            bins=tuple(tuple(b) for b in packed(tasks, 1)),
            log_start_offsets=dict(log_start_offsets or {}),
            pass_start_ms=pass_start_ms,
            delete_retention_ms=RETENTION,
            stats_columns=(PARTITION, OFFSET),
            max_file_bytes=segment_bytes,
            held_below=dict(held_below or {}),
        )
        written = self.segments_of(task(iter([pa.record_batch({"bin": [0]})])))
        for plan in plans:
            inputs = set(plan.inputs)
            kept = [s for s in self.segments[plan.partition] if s not in inputs]
            mine = [w for w in written if w.partition == plan.partition]
            self.segments[plan.partition] = sorted(kept + mine)
        return written

    def read(self, partition: int) -> list[Row]:
        """Every record of the partition, in offset order."""
        rows: list[Row] = []
        for segment in self.segments[partition]:
            table = pq.read_table(f"{self.root}/{segment.path}")
            table = table.set_column(
                table.schema.get_field_index(TIMESTAMP),
                TIMESTAMP,
                table.column(TIMESTAMP).cast(pa.int64()),
            )
            rows.extend(table.to_pylist())
        assert [r[OFFSET] for r in rows] == sorted(r[OFFSET] for r in rows)
        return rows


def expected(
    rows: Sequence[Row],
    *,
    end: int,
    pass_start_ms: int,
    keys: Sequence[str] = ("key",),
    sequence: str | None = None,
    held_below: int | None = None,
) -> list[Row]:
    """Kafka's rule over ``rows`` (one partition's) in plain Python: below ``end`` each
    key's newest record, then KIP-534; at or above ``end``, every record as it was."""
    below = [r for r in rows if r[OFFSET] < end]

    def order(r: Row) -> tuple:
        return ((r[sequence] is not None, r[sequence]) if sequence else ()) + (r[OFFSET],)

    newest: dict[tuple, Row] = {}
    for r in below:
        key = tuple(r[k] for k in keys)
        if key not in newest or order(r) > order(newest[key]):
            newest[key] = r
    kept = []
    for r in sorted(newest.values(), key=lambda r: r[OFFSET]):
        horizon = r[DELETE_HORIZON_MS]
        if r[VALUE] is None:
            held = held_below is not None and r[OFFSET] >= held_below
            if horizon is not None and horizon < pass_start_ms and not held:
                continue
            if horizon is None:
                r = {**r, DELETE_HORIZON_MS: pass_start_ms + RETENTION}
        kept.append(r)
    return kept + [r for r in rows if r[OFFSET] >= end]


# -- the latest record per key --------------------------------------------------------------


def test_each_key_keeps_only_its_latest_record_below_the_end_offset(tmp_path):
    log = Log.create(tmp_path)
    written = [
        records(0, 0, ["a", "b", "c", "a"]),
        records(0, 4, ["b", "a", "d", "c"]),
        records(0, 8, ["a", "b", "e", "a"]),  # at the first uncleanable offset: not read
    ]
    untouched = [log.append(rows) for rows in written][2]
    everything = [r for rows in written for r in rows]

    plan = log.plan(0, first_dirty=0, end=8)
    assert [s.next_offset for s in plan.inputs] == [4, 8] and not plan.cut
    out = log.clean([plan], pass_start_ms=10_000)

    assert log.read(0) == expected(everything, end=8, pass_start_ms=10_000)
    assert [r[OFFSET] for r in log.read(0)] == [4, 5, 6, 7, 8, 9, 10, 11]
    assert untouched in log.segments[0]  # the same file, never rewritten
    assert [(s.base_offset, s.last_offset, s.num_records) for s in out] == [(4, 7, 4)]


def test_a_clean_record_goes_when_the_dirty_section_holds_its_key(tmp_path):
    """The second pass maps only the dirty segment and probes the clean one by key."""
    log = Log.create(tmp_path)
    first = records(0, 0, ["a", "b", "a", "c"])
    log.append(first)
    log.clean([log.plan(0, first_dirty=0, end=4)], pass_start_ms=10_000)
    clean = log.read(0)
    dirty = records(0, 4, ["b", "d", "b"])
    log.append(dirty)

    plan = log.plan(0, first_dirty=4, end=7, cleaner_offset=4)
    assert [s.base_offset for s in plan.mapped] == [4] and len(plan.inputs) == 2
    log.clean([plan], pass_start_ms=10_000)

    assert log.read(0) == expected(clean + dirty, end=7, pass_start_ms=10_000)
    assert [(r["key"], r[OFFSET]) for r in log.read(0)] == [("a", 2), ("c", 3), ("d", 5), ("b", 6)]


def test_records_below_the_log_start_offset_are_not_copied(tmp_path):
    log = Log.create(tmp_path)
    log.append(records(0, 0, ["a", "b", "c", "d", "a"]))
    log.clean([log.plan(0, first_dirty=0, end=5)], pass_start_ms=0, log_start_offsets={0: 2})
    assert [(r["key"], r[OFFSET]) for r in log.read(0)] == [("c", 2), ("d", 3), ("a", 4)]


def test_partitions_in_one_task_are_cleaned_apart(tmp_path):
    """Two partitions packed into one executor task: the same key is kept in each."""
    log = Log.create(tmp_path)
    zero, one = records(0, 0, ["a", "a", "b"]), records(1, 0, ["a", "b", "b", "c"])
    log.append(zero)
    log.append(one)
    plans = [log.plan(0, first_dirty=0, end=3), log.plan(1, first_dirty=0, end=4)]
    log.clean(plans, pass_start_ms=0)
    assert log.read(0) == expected(zero, end=3, pass_start_ms=0)
    assert log.read(1) == expected(one, end=4, pass_start_ms=0)


def test_groups_of_segments_are_written_as_one_file_each(tmp_path):
    """Kafka's groupSegmentsBySize: consecutive inputs within segment.bytes become one file."""
    log = Log.create(tmp_path)
    batches = [records(0, 4 * i, ["a", "b", f"k{i}", "a"]) for i in range(4)]
    for rows in batches:
        log.append(rows)
    two_per_group = 2 * max(s.size_bytes for s in log.segments[0])
    out = log.clean(
        [log.plan(0, first_dirty=0, end=16)], pass_start_ms=0, segment_bytes=two_per_group
    )
    assert len(out) == 2
    everything = [r for rows in batches for r in rows]
    assert log.read(0) == expected(everything, end=16, pass_start_ms=0)


# -- tombstones (KIP-534) -------------------------------------------------------------------


def test_a_tombstone_is_stamped_then_dropped_after_its_delete_horizon(tmp_path):
    log = Log.create(tmp_path)
    rows = records(0, 0, ["a", "b", "a", "c"], value=["x", "y", None, "z"])
    log.append(rows)

    log.clean([log.plan(0, first_dirty=0, end=4)], pass_start_ms=1_000)
    assert log.read(0) == expected(rows, end=4, pass_start_ms=1_000)
    [tombstone] = [r for r in log.read(0) if r[VALUE] is None]
    assert (tombstone["key"], tombstone[OFFSET]) == ("a", 2)
    assert tombstone[DELETE_HORIZON_MS] == 1_000 + RETENTION

    def pass_over_the_clean_section(start_ms: int, held_below: Mapping[int, int] | None = None):
        plan = log.plan(0, first_dirty=4, end=4, cleaner_offset=4)
        assert plan.mapped == () and plan.inputs  # Kafka's pass for tombstones only
        log.clean([plan], pass_start_ms=start_ms, held_below=held_below)
        return [r["key"] for r in log.read(0)]

    assert pass_over_the_clean_section(1_400) == ["b", "a", "c"]  # before the horizon
    assert pass_over_the_clean_section(1_600, held_below={0: 2}) == ["b", "a", "c"]  # held
    assert pass_over_the_clean_section(1_600, held_below={0: 3}) == ["b", "c"]  # read past it


def test_a_tombstone_goes_with_the_records_it_deletes_and_a_later_record_revives_the_key(
    tmp_path,
):
    log = Log.create(tmp_path)
    rows = records(0, 0, ["a", "a", "b", "a"], value=["x", None, None, "w"])
    rows[2][DELETE_HORIZON_MS] = 100  # stamped by an earlier pass, expired by now
    log.append(rows)
    log.clean([log.plan(0, first_dirty=0, end=4)], pass_start_ms=1_000)
    assert log.read(0) == expected(rows, end=4, pass_start_ms=1_000)
    assert [(r["key"], r[VALUE]) for r in log.read(0)] == [("a", "w")]


# -- the offset map's bound -----------------------------------------------------------------


def test_a_dirty_section_larger_than_the_map_is_cleaned_up_to_where_it_filled(tmp_path):
    """Kafka's bound (KAFKA-3894): the pass ends at the first segment the map cannot take;
    the rest stays dirty for the next pass, which finishes the log."""
    log = Log.create(tmp_path)
    batches = [records(0, 10 * i, [f"k{j % 4}" for j in range(10)]) for i in range(3)]
    for rows in batches:
        log.append(rows)
    everything = [r for rows in batches for r in rows]

    cut = log.plan(0, first_dirty=0, end=30, dedupe_buffer_size=BYTES_PER_MAPPED_RECORD)
    assert cut.cut and cut.end_offset == 10 and [s.base_offset for s in cut.inputs] == [0]
    log.clean([cut], pass_start_ms=0)
    assert log.read(0) == expected(everything, end=10, pass_start_ms=0)

    rest = log.plan(0, first_dirty=10, end=30, cleaner_offset=10)
    assert not rest.cut
    log.clean([rest], pass_start_ms=0)
    assert log.read(0) == expected(everything, end=30, pass_start_ms=0)
    assert [r[OFFSET] for r in log.read(0)] == [26, 27, 28, 29]


def test_a_map_built_in_buckets_keeps_what_a_map_built_at_once_keeps(tmp_path):
    log = Log.create(tmp_path)
    batches = [records(0, 10 * i, [f"key-{(7 * j + i) % 9}" for j in range(10)]) for i in range(3)]
    for rows in batches:
        log.append(rows)
    everything = [r for rows in batches for r in rows]

    plan = log.plan(0, first_dirty=0, end=30, dedupe_buffer_size=20 * BYTES_PER_MAPPED_RECORD)
    assert plan.buckets > 1 and not plan.cut and len(plan.mapped) == 3
    log.clean([plan], pass_start_ms=0)
    assert log.read(0) == expected(everything, end=30, pass_start_ms=0)


# -- keys --------------------------------------------------------------------------------------


def test_multi_column_keys_with_nulls_group_as_spark_groups_them(tmp_path):
    schema = schema_of(pa.field("k1", pa.string()), pa.field("k2", pa.int32()))
    keys = LogKeys(key_columns=("k1", "k2"))
    log = Log.create(tmp_path, schema, keys)
    pairs = [("a", 1), ("a", 2), ("b", 1), ("a", None), ("a", 1), (None, None), ("a", None)]
    rows = records(0, 0, pairs, k1=[p[0] for p in pairs], k2=[p[1] for p in pairs])
    for r in rows:
        del r["key"]
    log.append(rows[:4])
    log.append(rows[4:])
    log.clean([log.plan(0, first_dirty=0, end=7)], pass_start_ms=0)
    kept = log.read(0)
    assert kept == expected(rows, end=7, pass_start_ms=0, keys=("k1", "k2"))
    assert [(r["k1"], r["k2"], r[OFFSET]) for r in kept] == [
        ("a", 2, 1),
        ("b", 1, 2),
        ("a", 1, 4),
        (None, None, 5),
        ("a", None, 6),
    ]


def test_the_sequence_column_orders_records_before_the_offset(tmp_path):
    """With a sequence column the clean section is mapped too: a clean record with a higher
    sequence beats a dirty one, and a null sequence is the lowest."""
    schema = schema_of(pa.field("key", pa.string()), pa.field("seq", pa.int64()))
    keys = LogKeys(key_columns=("key",), sequence_column="seq")
    log = Log.create(tmp_path, schema, keys)
    first = records(0, 0, ["a", "b", "a", "c"], seq=[5, 1, 3, 2])
    log.append(first)
    log.clean([log.plan(0, first_dirty=0, end=4)], pass_start_ms=0)
    assert [(r["key"], r["seq"]) for r in log.read(0)] == [("a", 5), ("b", 1), ("c", 2)]
    clean = log.read(0)

    dirty = records(0, 4, ["a", "b", "c", "c"], seq=[4, 1, None, 2])
    log.append(dirty)
    plan = log.plan(0, first_dirty=4, end=8, cleaner_offset=4)
    assert len(plan.mapped) == 2  # the clean segment too
    log.clean([plan], pass_start_ms=0)
    kept = log.read(0)
    assert kept == expected(clean + dirty, end=8, pass_start_ms=0, sequence="seq")
    # a: the clean sequence 5 beats 4; b: a tie, the later offset; c: equal sequence, later
    assert [(r["key"], r[OFFSET]) for r in kept] == [("a", 0), ("b", 5), ("c", 7)]


# -- the rule over many random logs -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_passes_over_random_logs_keep_what_the_rule_keeps(tmp_path, seed):
    """Random keys, tombstones and segment sizes, cleaned in successive passes with a
    small map (some cut, some bucketed): after each pass the log is what the rule leaves."""
    rng = random.Random(seed)
    log = Log.create(tmp_path)
    offset, everything, cleaned_to = 0, [], 0
    for step in range(4):
        for _ in range(rng.randint(1, 3)):
            n = rng.randint(1, 12)
            keys = [f"k{rng.randint(0, 6)}" for _ in range(n)]
            values = [None if rng.random() < 0.2 else f"v{offset + i}" for i in range(n)]
            rows = records(0, offset, keys, value=values)
            log.append(rows)
            everything += rows
            offset += n
        # a pass ends at a segment boundary (Kafka's first uncleanable offset rounds to one)
        bounds = [s.base_offset for s in log.segments[0] if s.base_offset >= cleaned_to]
        end = rng.choice([*bounds, offset])
        buffer = rng.choice([BIG_BUFFER, 12 * BYTES_PER_MAPPED_RECORD, BYTES_PER_MAPPED_RECORD])
        plan = log.plan(
            0,
            first_dirty=cleaned_to,
            end=end,
            cleaner_offset=cleaned_to if cleaned_to else None,
            dedupe_buffer_size=buffer,
        )
        start_ms = 1_000 * (step + 1)
        before = log.read(0)
        if plan.inputs:
            log.clean([plan], pass_start_ms=start_ms)
            cleaned_to = plan.end_offset
            assert log.read(0) == expected(before, end=plan.end_offset, pass_start_ms=start_ms)
