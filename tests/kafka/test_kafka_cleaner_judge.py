"""Kafka's own LogCleaner as the judge of a pass, record for record.

Each workload (random key count, tombstone rate, partitions; its seed printed and taken
from ``KAFKA_JUDGE_SEEDS=1,2,3`` when set) is produced twice, identically and to the same
partitions: to a plain topic that Spark's Kafka source streams into the sink, and to a
``cleanup.policy=compact`` topic that Kafka's cleaner compacts within seconds (segments
roll every 100 ms; one more record per partition after that rolls the last one, and is
the only record of the active segment, which Kafka never cleans). Both topics thus hold
the same records at the same offsets. Once the broker's ``cleaner-offset-checkpoint``
shows that Kafka cleaned up to that active segment, the compacted topic is read whole and
compared with the sink's log after a forced pass:

- the same latest value for every key;
- every record the sink keeps is a record Kafka keeps (partition, offset, key, value);
- where Kafka keeps more, each such record is superseded by one in Kafka's active segment
  (the sink's pass ends at the log end offset, Kafka's at its active segment): named, and
  checked to be the only difference.

Tombstones: the first round is compared while its tombstones are within
``delete.retention.ms`` of the passes that stamped them (both keep them), the second after
(both dropped them); the sink's clock is moved by the same retention.
"""

from __future__ import annotations

import os
import random
import time
import zlib
from dataclasses import dataclass

import pytest
from kafka_kit import SUMMARY, Produced, kafka_options, run_available, sink_records

from sinks import CleanerConfig, CompactedStateSink

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

RETENTION_MS = 4_000  # delete.retention.ms, on Kafka's topic and in the sink's config
SEEDS = [int(s) for s in os.environ.get("KAFKA_JUDGE_SEEDS", "").split(",") if s.strip()] or [
    random.SystemRandom().randrange(1_000_000) for _ in range(3)
]


@dataclass(frozen=True)
class Workload:
    seed: int
    partitions: int
    keys: int
    tombstone_rate: float
    records: tuple[int, int]  # per round

    @classmethod
    def of(cls, seed: int) -> Workload:
        rng = random.Random(seed)
        return cls(
            seed=seed,
            partitions=rng.randint(1, 5),
            keys=rng.choice([5, 40, 300, 1_000]),
            tombstone_rate=rng.choice([0.0, 0.05, 0.2, 0.5]),
            records=(rng.randint(300, 3_000), rng.randint(100, 1_500)),
        )

    def partition(self, key: bytes) -> int:
        return zlib.crc32(key) % self.partitions

    def round(self, rng: random.Random, number: int) -> list[tuple[int, bytes, bytes | None]]:
        rows = []
        for i in range(self.records[number]):
            key = f"k{rng.randrange(self.keys)}".encode()
            value = None if rng.random() < self.tombstone_rate else f"r{number}-{i}".encode()
            rows.append((self.partition(key), key, value))
        if self.tombstone_rate:  # a round with deletes ends on one: a tombstone is compared
            key = f"k{rng.randrange(self.keys)}".encode()
            rows.append((self.partition(key), key, None))
        return rows

    def rolls(
        self, rng: random.Random, number: int, deleted: set[bytes]
    ) -> list[tuple[int, bytes, bytes]]:
        """One more record per partition, after segment.ms: a key of the workload (when one
        falls in the partition), so that Kafka's active segment supersedes a cleaned record;
        never a key whose latest record is a tombstone (``deleted``), which stays compared."""
        rows = []
        for p in range(self.partitions):
            mine = [
                k
                for k in (f"k{i}".encode() for i in range(self.keys))
                if self.partition(k) == p and k not in deleted
            ]
            key = rng.choice(mine) if mine else f"roll-{p}".encode()
            rows.append((p, key, f"roll{number}-{p}".encode()))
        return rows


def fold(records: list[Produced]) -> dict[bytes, bytes | None]:
    """Key -> value of its highest offset (None: a tombstone)."""
    latest: dict[bytes, bytes | None] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        latest[r.key] = r.value
    return latest


def wait_for_kafkas_cleaner(kafka, topic: str, active: dict[int, int], timeout_s=90) -> float:
    """Until the broker's checkpoint reaches each partition's active segment.

    A partition whose active segment starts at offset 0 (no record of the round fell in
    it: only its roll) has no segment Kafka could clean, and never gets a checkpoint."""
    waited = {p: offset for p, offset in active.items() if offset > 0}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = kafka.cleaner_checkpoint(topic)
        if all(done.get(p, -1) >= offset for p, offset in waited.items()):
            return time.time()
        time.sleep(0.1)
    raise AssertionError(
        f"Kafka's cleaner did not reach the active segments {active} of {topic} in {timeout_s} s "
        f"(checkpoint: {kafka.cleaner_checkpoint(topic)})\n{kafka.broker.tail(20)}"
    )


def judge(label: str, kafka_kept, sink_kept, active: dict[int, int]) -> list[str]:
    """The comparison; returns the named differences."""
    assert fold(sink_kept) == fold(kafka_kept), f"{label}: latest value per key differs"
    not_in_kafka = set(sink_kept) - set(kafka_kept)
    assert not not_in_kafka, f"{label}: the sink keeps records Kafka does not: {not_in_kafka}"
    differences = []
    for r in sorted(set(kafka_kept) - set(sink_kept), key=lambda r: (r.partition, r.offset)):
        newer = [
            s.offset
            for s in kafka_kept
            if s.partition == r.partition and s.key == r.key and s.offset > r.offset
        ]
        assert newer and min(newer) >= active[r.partition], (
            f"{label}: Kafka keeps partition {r.partition} offset {r.offset} (key {r.key!r}) "
            f"and the sink does not, and no record in Kafka's active segment supersedes it"
        )
        differences.append(
            f"p{r.partition}@{r.offset} key {r.key.decode()} (superseded at {min(newer)}, in "
            f"Kafka's active segment from {active[r.partition]})"
        )
    return differences


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_a_pass_keeps_what_kafkas_log_cleaner_keeps(spark, kafka, tmp_path, clock, seed) -> None:
    w = Workload.of(seed)
    SUMMARY.append(f"judge workload seed={seed}: {w}")
    rng = random.Random(seed + 1)
    source = kafka.create_topic(kafka.topic_name(f"judge{seed}-src"), w.partitions)
    compacted = kafka.create_topic(
        kafka.topic_name(f"judge{seed}-compact"),
        w.partitions,
        {
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0",
            "min.compaction.lag.ms": "0",
            "delete.retention.ms": str(RETENTION_MS),
            "file.delete.delay.ms": "1000",
        },
    )
    sink = CompactedStateSink(
        str(tmp_path / "log"),
        key_columns=("key",),
        config=CleanerConfig(delete_retention_ms=RETENTION_MS, min_compaction_lag_ms=0),
        clock=clock,
    )
    options = kafka_options(kafka, source, maxOffsetsPerTrigger="1000")
    produced: list[Produced] = []
    tombstones_by_round = []
    for number in (0, 1):
        rows = w.round(rng, number)
        sent = kafka.produce(source, rows)
        assert kafka.produce(compacted, rows) == sent  # same partitions, same offsets
        time.sleep(0.5)  # past segment.ms: the next record rolls each partition's segment
        rolls = w.rolls(rng, number, {k for k, v in fold(sent).items() if v is None})
        rolled = kafka.produce(source, rolls)
        assert kafka.produce(compacted, rolls) == rolled
        active = {r.partition: r.offset for r in rolled}
        produced += sent + rolled
        cleaned_at = wait_for_kafkas_cleaner(kafka, compacted, active)
        kafka_kept = kafka.consume_all(compacted)  # read at once: within delete.retention.ms

        if number == 1:  # the sink's passes start after the first round's horizons
            clock.advance(RETENTION_MS + 1)
        run_available(spark, options, sink, tmp_path / "chk")
        sink.clean(force=True)
        sink_kept = sink_records(sink)

        label = f"seed {seed} round {number}"
        differences = judge(label, kafka_kept, sink_kept, active)
        tombstones = {r for r in sink_kept if r.value is None}
        tombstones_by_round.append(tombstones)
        SUMMARY.append(
            f"{label}: produced {len(produced)} (tombstones "
            f"{sum(r.value is None for r in produced)}), kept by Kafka {len(kafka_kept)}, "
            f"kept by the sink {len(sink_kept)} (tombstones {len(tombstones)}); "
            f"Kafka keeps {len(differences)} more: {'; '.join(differences) or '-'}"
        )
        if number == 0:
            # Round 1's tombstones, stamped by both now, are dropped by both in round 2: the
            # second round starts once delete.retention.ms has passed since Kafka's pass.
            time.sleep(max(0.0, cleaned_at + RETENTION_MS / 1000 + 1 - time.time()))

    first_round = {r for r in tombstones_by_round[0]}
    assert not first_round & set(kafka_kept), "Kafka kept a tombstone past its horizon"
    assert not first_round & set(sink_kept), "the sink kept a tombstone past its horizon"
    if w.tombstone_rate:
        assert tombstones_by_round[0] or tombstones_by_round[1], "no tombstone was compared"
