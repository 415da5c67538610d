"""A database's change events into the state: ``make demo-cdc``.

Starts a throwaway PostgreSQL 15 (``wal_level=logical``), a local Kafka broker (KRaft) and
Kafka's Connect worker with Debezium's PostgreSQL connector (``pgoutput``, the JSON converter
with schemas), all on 127.0.0.1 (`streaming.inputs.local_debezium`,
`streaming.inputs.local_kafka`). A streaming query reads the topic with Spark's Kafka source
into ``CompactedStateSink(..., value_format="debezium-json")`` while a few hundred
transactions insert, update and delete rows; the state is shown following the table, and at
the end it must equal ``SELECT * FROM users`` row for row. Needs the Kafka venv (pyspark 4.2)
and the jars of `make jars`.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sinks import CompactedStateSink, NotACompactedLogError, read_state  # noqa: E402
from streaming.inputs.local_debezium import (  # noqa: E402
    PG_BIN,
    ConnectWorker,
    LocalPostgres,
    postgres_connector,
    wait_until,
)
from streaming.inputs.local_kafka import LocalKafka, spark_jars  # noqa: E402
from streaming.jobs.demo import prepare_lake  # noqa: E402
from streaming.jobs.session import local_session  # noqa: E402

TOPIC = "dbz.public.users"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", default="lake-demo-cdc", help="lake directory (wiped first)")
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--keys", type=int, default=200)
    args = parser.parse_args()

    jars = spark_jars(ROOT / ".jars" / f"spark-kafka-{pyspark.__version__}")
    debezium = ROOT / ".jars" / "debezium"
    if not any("spark-sql-kafka" in j for j in jars) or not any(debezium.glob("debezium-*.jar")):
        print("no Spark Kafka source or Debezium jars: run `make demo-cdc` (it fetches them)")
        return 2
    if not (PG_BIN / "initdb").exists():
        print(f"no PostgreSQL 15 at {PG_BIN}")
        return 2
    try:
        prepare_lake(Path(args.lake))
    except NotACompactedLogError as e:
        print(f"debezium_demo: {e}")
        return 2
    work = Path(tempfile.mkdtemp(prefix="cdc-demo-"))
    broker = LocalKafka(
        ROOT / ".jars" / "kafka",
        work / "broker",
        ROOT / "tests" / "kafka" / "server.properties",
        ROOT / "tests" / "kafka" / "log4j2.properties",
    )
    postgres = LocalPostgres()
    worker: ConnectWorker | None = None
    try:
        postgres.start()
        print(f"PostgreSQL 15 on 127.0.0.1:{postgres.port}")
        broker.start()
        print(f"Kafka broker on {broker.bootstrap}: started in {broker.start_seconds:.1f} s")
        db = postgres.connect()
        db.execute("CREATE TABLE users (id int PRIMARY KEY, name text NOT NULL, visits int)")
        for i in range(args.keys // 2):
            db.execute("INSERT INTO users VALUES (%s, %s, 0)", (i, f"user-{i}"))
        _create_topic(broker.bootstrap)
        connector = postgres_connector(postgres, name="users", tables="public.users")
        worker = ConnectWorker(debezium, work / "connect", broker.bootstrap, connector)
        worker.start()
        print("Connect worker with Debezium's PostgreSQL connector started (snapshot first)")
        return run(args, db, broker.bootstrap, jars, worker)
    finally:
        if worker is not None:
            worker.stop()
        broker.stop()
        postgres.stop()
        shutil.rmtree(work, ignore_errors=True)
        print("stopped: Connect worker, Kafka broker, PostgreSQL")


def run(args, db, bootstrap: str, jars: list[str], worker: ConnectWorker) -> int:
    spark = local_session(
        "compacted-sink-cdc-demo", "local[2]", conf={"spark.jars": ",".join(jars)}
    )
    sink = CompactedStateSink(f"{args.lake}/users", ("id",), value_format="debezium-json")
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", f"{args.lake}/_chk/users")
        .trigger(processingTime="2 seconds")
        .start()
    )
    snapshot = args.keys // 2
    wait_until(
        lambda: _state_rows(sink) == snapshot,
        timeout_s=300,
        what="the snapshot in the state",
        alive=worker.check_alive,
    )
    print(f"the snapshot: the table has {snapshot} rows, the state {snapshot}")
    rng = random.Random(63)
    began = time.monotonic()
    for n in range(args.transactions):
        with db.transaction():
            for _ in range(rng.randint(1, 4)):
                key = rng.randrange(args.keys)
                roll = rng.random()
                if roll < 0.15:
                    db.execute("DELETE FROM users WHERE id = %s", (key,))
                else:
                    db.execute(
                        "INSERT INTO users VALUES (%s, %s, 1) ON CONFLICT (id) DO UPDATE "
                        "SET visits = users.visits + 1, name = EXCLUDED.name",
                        (key, f"user-{key}-{n}"),
                    )
        if n % 100 == 99:
            time.sleep(5)  # a few micro-batches: the state catches up with the table
            rows, state = _count(db), _state_rows(sink)
            print(f"{n + 1} transactions: the table has {rows} rows, the state {state}")
    db.execute("INSERT INTO users VALUES (%s, 'marker', 0)", (10 * args.keys,))
    took = time.monotonic() - began
    print(f"{args.transactions} transactions in {took:.1f} s; waiting for the sink")
    marker = 10 * args.keys
    wait_until(
        lambda: _has(sink, marker), timeout_s=300, what="the marker row", alive=worker.check_alive
    )
    query.stop()
    sink.close()
    state = sorted(tuple(r) for r in sink.state().select("value.*").collect())
    with db.cursor() as cursor:
        cursor.execute("SELECT * FROM users")
        table = sorted(cursor.fetchall())
    arrow = sorted(tuple(v.values()) for v in read_state(sink.path).column("value").to_pylist())
    spark.stop()
    ok = state == table == arrow
    print(
        f"state(): {len(state)} rows, read_state: {len(arrow)}, SELECT * FROM users: "
        f"{len(table)}: {'equal, row for row' if ok else 'NOT EQUAL'}"
    )
    return 0 if ok else 1


def _count(db) -> int:
    with db.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM users")
        return cursor.fetchone()[0]


def _state_rows(sink: CompactedStateSink) -> int | str:
    try:
        return read_state(sink.path).num_rows
    except FileNotFoundError:
        return "(no batch yet)"


def _has(sink: CompactedStateSink, key: int) -> bool:
    try:
        ids = read_state(sink.path).column("id").to_pylist()
    except FileNotFoundError:
        return False
    return key in ids


def _create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(
        timeout=60
    )


if __name__ == "__main__":
    sys.exit(main())
