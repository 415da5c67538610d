"""Debezium's change events into the state against the same records taken raw.

Writes ``--events`` change events (the JSON converter with schemas, as Debezium's PostgreSQL
connector writes them: a snapshot of ``--keys`` rows, then updates under Zipf keys and a few
deletes with their tombstones) as Parquet with Kafka's columns, then appends them in
``--batches`` micro-batches into two fresh logs: with ``value_format="debezium-json"``
(``debezium``) and as the raw binary key and value (``raw``). Reports events per second and
the ratios of the wall times and of the CPU seconds of the process tree (the driver JVM
and Spark's Python workers). Run: ``python -m bench.debezium_events`` (``--help``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.lookup_pass import tree_cpu
from sinks import CompactedStateSink
from streaming.jobs.session import local_session

FIELDS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "int64", "optional": True, "field": "visits"},
]


def events(n: int, keys: int, seed: int) -> pa.Table:
    """``n`` Debezium events as Kafka's columns (key, value binary, partition, offset)."""
    rng = np.random.default_rng(seed)
    row = {"type": "struct", "fields": FIELDS, "optional": True, "name": "db.public.users.Value"}
    schema = {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "struct", "fields": [{"type": "int64", "field": "lsn"}], "field": "source"},
            {"type": "string", "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }
    key_schema = {"type": "struct", "fields": [FIELDS[0]], "name": "db.public.users.Key"}
    schema_text, key_schema_text = json.dumps(schema), json.dumps(key_schema)
    ids = np.concatenate([np.arange(keys), (rng.zipf(1.3, n) - 1) % keys])[:n]
    out_keys, out_values = [], []
    lsn = 1_000
    for i, key in enumerate(ids.tolist()):
        lsn += 8
        op = "r" if i < keys else ("d" if rng.random() < 0.01 else "u")
        after = None if op == "d" else {"id": key, "name": f"user-{key}-{i}", "visits": i}
        payload = {"before": None, "after": after, "source": {"lsn": lsn}, "op": op, "ts_ms": i}
        key_bytes = f'{{"schema":{key_schema_text},"payload":{{"id":{key}}}}}'.encode()
        out_keys.append(key_bytes)
        out_values.append(f'{{"schema":{schema_text},"payload":{json.dumps(payload)}}}'.encode())
        if op == "d":
            out_keys.append(key_bytes)
            out_values.append(None)
    return pa.table(
        {
            "key": pa.array(out_keys, pa.binary()),
            "value": pa.array(out_values, pa.binary()),
            "partition": pa.array(np.zeros(len(out_keys), np.int32)),
            "offset": pa.array(np.arange(len(out_keys), dtype=np.int64)),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-debezium-"))
    try:
        table = events(args.events, args.keys, seed=63)
        step = -(-table.num_rows // args.batches)
        for b in range(args.batches):
            pq.write_table(table.slice(b * step, step), work / f"batch-{b}.parquet")
        spark = local_session("debezium-events", "local[2]", conf={"spark.ui.enabled": "false"})
        figures: dict[str, object] = {"events": table.num_rows, "batches": args.batches}
        for name, options in [
            ("raw", {"key_columns": ("key",)}),
            ("debezium", {"key_columns": ("id",), "value_format": "debezium-json"}),
        ]:
            sink = CompactedStateSink(str(work / name), **options)
            began, cpu = time.monotonic(), tree_cpu()
            for b in range(args.batches):
                sink(spark.read.parquet(str(work / f"batch-{b}.parquet")), b)
            seconds = time.monotonic() - began
            figures[f"{name}_cpu_s"] = round(tree_cpu() - cpu, 1)
            sink.close()
            figures[f"{name}_s"] = round(seconds, 2)
            figures[f"{name}_events_per_s"] = round(table.num_rows / seconds)
        figures["ratio"] = round(figures["debezium_s"] / figures["raw_s"], 2)
        figures["cpu_ratio"] = round(figures["debezium_cpu_s"] / figures["raw_cpu_s"], 2)
        print(json.dumps(figures))
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
