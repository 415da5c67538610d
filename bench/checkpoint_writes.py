"""``python -m bench.checkpoint_writes``: what a cleaner-state transition costs, written as the
sink writes it (the checkpoint table rewritten whole against the version read, design.md §47)
and as a delta-rs MERGE on the key columns with the compare-and-set's conditions (how the sink
wrote it before, and how a user keeps such a table with delta-rs).

One checkpoint table of ``rows`` rows (logs x partitions sharing it: 6 is one log of six
partitions, 10,000 a thousand logs of ten), on local disk. Each round reads one log's rows,
moves two of them while still as read (a pass's claim) and reads them again (as the next
transition does): the reads are the sink's in both ways, the write differs. The two ways
alternate, each on a table of its own, and the MERGE table is compacted every 50 versions as
the sink compacted it. No Spark. CPU is this process's (delta-rs's threads included). Writes
``--out`` (default ``bench/checkpoint_writes.json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from bench.measure import load_average, machine_description
from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint
from checkpoints.checkpoint_table import CHECKPOINT_SCHEMA

SIZES = (6, 100, 1_000, 10_000)
PARTITIONS = 10


def entries(rows: int) -> list[CheckpointEntry]:
    return [
        CheckpointEntry(
            log_path=f"lake/log-{i // PARTITIONS}", partition=i % PARTITIONS, first_dirty_offset=0
        )
        for i in range(rows)
    ]


Changes = list[tuple[CheckpointEntry, CheckpointEntry]]


def rewrite(table: CleanerOffsetCheckpoint, changes: Changes) -> int:
    """The sink's compare-and-set; returns the rows written."""
    return len(table.compare_and_set_many(changes))


def merge(table: CleanerOffsetCheckpoint, changes: Changes) -> int:
    """The same through a delta-rs MERGE: keyed, updating only rows still as read (as the
    sink wrote it before, compacting the table every 50 versions)."""
    rows = pa.Table.from_pylist([asdict(new) for _, new in changes], schema=CHECKPOINT_SCHEMA)
    still = " OR ".join(
        f"(t.partition = {e.partition} AND t.first_dirty_offset = {e.first_dirty_offset})"
        for e, _ in changes
    )
    delta = DeltaTable(table.uri)
    metrics = (
        delta.merge(
            rows,
            predicate="t.log_path = s.log_path AND t.partition = s.partition",
            source_alias="s",
            target_alias="t",
        )
        .when_matched_update_all(predicate=still)
        .execute()
    )
    if delta.version() % 50 == 0:
        delta.optimize.compact()
    return int(metrics["num_target_rows_updated"])


WAYS: dict[str, Callable[[CleanerOffsetCheckpoint, Changes], int]] = {
    "rewrite (the sink)": rewrite,
    "delta-rs MERGE": merge,
}


def transition(
    table: CleanerOffsetCheckpoint, write: Callable[..., int], offset: int
) -> dict[str, float]:
    """One transition: read the log's rows, write two of them, read them again. Returns the
    wall and CPU seconds of the write and of the whole."""
    wall, cpu = time.perf_counter(), time.process_time()
    read = list(table.read("lake/log-0").values())[:2]
    changes = [(e, e.with_changes(first_dirty_offset=offset)) for e in read]
    write_wall, write_cpu = time.perf_counter(), time.process_time()
    written = write(table, changes)
    write_wall, write_cpu = time.perf_counter() - write_wall, time.process_time() - write_cpu
    assert written == 2, written
    table.read("lake/log-0")
    return {
        "write_wall": write_wall,
        "write_cpu": write_cpu,
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
    }


def run(sizes: tuple[int, ...], rounds: int) -> list[dict[str, Any]]:
    results = []
    for size in sizes:
        root = tempfile.mkdtemp(prefix=f"checkpoint-writes-{size}-")
        tables = {name: CleanerOffsetCheckpoint(f"{root}/{i}") for i, name in enumerate(WAYS)}
        for table in tables.values():
            table.write(entries(size))
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in WAYS}
        for offset in range(1, rounds + 1):
            for name in list(WAYS) if offset % 2 else list(reversed(WAYS)):
                samples[name].append(transition(tables[name], WAYS[name], offset))
        for name, runs in samples.items():
            result: dict[str, Any] = {"rows": size, "way": name, "rounds": rounds}
            for measure in ("write_wall", "write_cpu", "wall", "cpu"):
                ms = statistics.median(r[measure] for r in runs) * 1000
                result[f"{measure}_ms"] = round(ms, 1)
            result["files_after"] = len(DeltaTable(tables[name].uri).file_uris())
            results.append(result)
            print(
                f"{size:>6} rows  {name:<20} write: wall {result['write_wall_ms']:>6} ms, "
                f"CPU {result['write_cpu_ms']:>6} ms; with the reads: wall "
                f"{result['wall_ms']:>6} ms, CPU {result['cpu_ms']:>6} ms; "
                f"files {result['files_after']}",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--out", default="bench/checkpoint_writes.json")
    args = parser.parse_args()
    started = load_average()
    results = run(tuple(args.sizes), args.rounds)
    report = {
        "machine": machine_description(),
        "load_at_start": started,
        "load_at_end": load_average(),
        "deltalake": __import__("deltalake").__version__,
        "pyarrow": pa.__version__,
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
