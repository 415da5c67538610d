"""A small producer of keyed Avro records for the compose demo: user updates and deletes.

Each record's key is a user id (UTF-8); its value is Confluent's wire format
(magic byte 0, the 4-byte big-endian schema id, the Avro body) written with the
schema ``<schemas>/<id>.avsc``; about one update in ten is a delete, sent as a
tombstone (a null value), as a compacted topic expects. The run is bounded by
``--records``; at the end it flushes and prints what it sent.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import struct
import sys
import time
from pathlib import Path

import fastavro

MAGIC = 0


def encode_value(schema_id: int, parsed_schema: dict, record: dict) -> bytes:
    """One value in Confluent's wire format."""
    body = io.BytesIO()
    fastavro.schemaless_writer(body, parsed_schema, record)
    return struct.pack(">bI", MAGIC, schema_id) + body.getvalue()


def updates(users: int, seed: int, start_ms: int):
    """An endless, reproducible stream of (key, record or None) for ``users`` user ids."""
    rng = random.Random(seed)
    versions: dict[str, int] = {}
    n = 0
    while True:
        user = f"user-{rng.randrange(users):06d}"
        versions[user] = versions.get(user, 0) + 1
        if rng.random() < 0.1:
            yield user, None
        else:
            yield (
                user,
                {
                    "id": user,
                    "name": f"name {versions[user]}",
                    "email": None if rng.random() < 0.2 else f"{user}@example.com",
                    "version": versions[user],
                    "updated_ms": start_ms + n,
                },
            )
        n += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", default="kafka:9092")
    parser.add_argument("--topic", default="users")
    parser.add_argument("--schema", default="/etc/compacted-sink/schemas/1.avsc")
    parser.add_argument("--records", type=int, default=100_000, help="how many to send")
    parser.add_argument("--users", type=int, default=5_000, help="distinct keys")
    parser.add_argument("--rate", type=float, default=500.0, help="records per second")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    from confluent_kafka import Producer  # only the container has it

    schema_file = Path(args.schema)
    schema_id = int(schema_file.stem)
    parsed = fastavro.parse_schema(json.loads(schema_file.read_text()))
    producer = Producer({"bootstrap.servers": args.bootstrap_servers, "linger.ms": 50})
    started = time.monotonic()
    tombstones = 0
    stream = updates(args.users, args.seed, int(time.time() * 1000))
    for sent in range(1, args.records + 1):
        key, record = next(stream)
        value = None if record is None else encode_value(schema_id, parsed, record)
        tombstones += value is None
        producer.produce(args.topic, key=key.encode(), value=value)
        producer.poll(0)
        ahead = sent / args.rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
    producer.flush()
    print(
        f"sent {args.records} records ({tombstones} tombstones) over {args.users} keys "
        f"to {args.topic} in {time.monotonic() - started:.1f} s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
