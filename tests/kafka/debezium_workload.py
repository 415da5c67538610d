"""What the Debezium tests do to a table, and the judge: the state against ``SELECT * FROM``.

`Workload` makes seeded random changes to one table as an application would: inserts,
updates that leave a TOASTed text as it was, updates of it, deletes, primary-key changes, a
key deleted and inserted again, transactions of a few statements, ``ALTER TABLE ... ADD
COLUMN``. `Workload.settle` ends a round with a marker row inserted and deleted, whose
tombstone (the topic's last record) says Debezium has sent the round. `judge` compares the
sink's ``state()`` and ``read_state`` with the table, row for row and column for column.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from chispa import assert_df_equality
from kafka_kit import KafkaKit
from pyspark.sql import DataFrame, SparkSession

from sinks import CompactedStateSink, read_state


def big_text(rng: random.Random) -> str:
    """A text large enough to be TOASTed out of line (the column's storage is EXTERNAL)."""
    return "".join(rng.choice("abcdefghij") for _ in range(6_000))


def _key_id(record_key: bytes | None) -> int | None:
    if record_key is None:
        return None
    return json.loads(record_key)["payload"]["id"]


def marked(kafka: KafkaKit, topic: str, marker: int) -> bool:
    """True once the topic holds a row change whose ``after`` has id ``marker``."""
    for record in kafka.consume_all(topic):
        if record.value is None:
            continue
        after = json.loads(record.value)["payload"]["after"]
        if after is not None and after["id"] == marker:
            return True
    return False


def tombstoned(kafka: KafkaKit, topic: str, marker: int) -> bool:
    """True once the topic holds the tombstone of key ``marker``."""
    return any(r.value is None and _key_id(r.key) == marker for r in kafka.consume_all(topic))


def table_rows(spark: SparkSession, db, table: str, like: DataFrame) -> DataFrame:
    """``SELECT * FROM table`` as a DataFrame of ``like``'s schema."""
    with db.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table}")
        rows = cursor.fetchall()
    return spark.createDataFrame(rows, like.schema)


def judge(spark: SparkSession, sink: CompactedStateSink, db, table: str) -> int:
    """``state()`` and ``read_state`` against ``SELECT * FROM table``; the rows compared."""
    state = sink.state().select("value.*")
    expected = table_rows(spark, db, table, state)
    assert_df_equality(state, expected, ignore_row_order=True, ignore_nullable=True)
    values = read_state(sink.path).column("value").to_pylist()
    assert sorted(values, key=lambda r: r["id"]) == [
        r.asDict() for r in expected.orderBy("id").collect()
    ]
    return len(values)


class Workload:
    """Seeded random changes to ``table`` (id int primary key, name, big text, n, and the
    columns `add_column` adds); ``ids`` mirrors the table's keys so changes pick live ones."""

    def __init__(self, db, table: str, seed: int) -> None:
        self.db, self.table = db, table
        self.rng = random.Random(seed)
        self.ids: set[int] = set()
        self.next_id = 1
        self.added: list[str] = []
        self.markers = 0
        self.counts: dict[str, int] = {}

    def create(self) -> None:
        self.db.execute(
            f"CREATE TABLE {self.table} (id int PRIMARY KEY, name text NOT NULL, big text, n int)"
        )
        self.db.execute(f"ALTER TABLE {self.table} ALTER COLUMN big SET STORAGE EXTERNAL")

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _pick(self) -> int:
        return self.rng.choice(sorted(self.ids))

    def _extras(self) -> dict[str, object]:
        return {c: self.rng.choice([None, f"{c}-{self.rng.randrange(100)}"]) for c in self.added}

    def _insert(self, id_: int) -> None:
        row = {
            "id": id_,
            "name": f"name-{self.rng.randrange(1000)}",
            "big": big_text(self.rng) if self.rng.random() < 0.4 else None,
            "n": self.rng.choice([None, self.rng.randrange(10_000)]),
            **self._extras(),
        }
        columns = ", ".join(row)
        marks = ", ".join(["%s"] * len(row))
        self.db.execute(
            f"INSERT INTO {self.table} ({columns}) VALUES ({marks})", list(row.values())
        )
        self.ids.add(id_)

    def _change(self) -> None:
        """One statement, chosen by weight among those the table's keys allow."""
        kinds: list[tuple[str, float, Callable[[], None]]] = [("insert", 3.0, self._inserted)]
        if self.ids:
            kinds += [
                ("update, big unchanged", 3.0, self._updated),
                ("update of big", 1.0, self._big_updated),
                ("delete", 1.5, self._deleted),
                ("primary-key change", 1.0, self._rekeyed),
                ("delete and insert again", 0.5, self._reinserted),
            ]
        name, _, change = self.rng.choices(kinds, weights=[k[1] for k in kinds])[0]
        change()
        self.counts[name] = self.counts.get(name, 0) + 1

    def _inserted(self) -> None:
        self._insert(self._new_id())

    def _updated(self) -> None:
        sets = {"name": f"name-{self.rng.randrange(1000)}", **self._extras()}
        if self.rng.random() < 0.5:
            sets["n"] = self.rng.randrange(10_000)
        assignments = ", ".join(f"{c} = %s" for c in sets)
        self.db.execute(
            f"UPDATE {self.table} SET {assignments} WHERE id = %s", [*sets.values(), self._pick()]
        )

    def _big_updated(self) -> None:
        big = big_text(self.rng) if self.rng.random() < 0.7 else None
        self.db.execute(f"UPDATE {self.table} SET big = %s WHERE id = %s", (big, self._pick()))

    def _deleted(self) -> None:
        id_ = self._pick()
        self.db.execute(f"DELETE FROM {self.table} WHERE id = %s", (id_,))
        self.ids.discard(id_)

    def _rekeyed(self) -> None:
        old, new = self._pick(), self._new_id()
        self.db.execute(f"UPDATE {self.table} SET id = %s WHERE id = %s", (new, old))
        self.ids.discard(old)
        self.ids.add(new)

    def _reinserted(self) -> None:
        id_ = self._pick()
        self.db.execute(f"DELETE FROM {self.table} WHERE id = %s", (id_,))
        self.ids.discard(id_)
        self._insert(id_)

    def round(self, changes: int) -> None:
        """``changes`` statements, some of them grouped in transactions of two to four."""
        done = 0
        while done < changes:
            if self.rng.random() < 0.3:
                size = min(self.rng.randint(2, 4), changes - done)
                with self.db.transaction():
                    for _ in range(size):
                        self._change()
                done += size
            else:
                self._change()
                done += 1

    def add_column(self) -> None:
        """``ALTER TABLE ... ADD COLUMN`` (text, null in the rows already there)."""
        name = f"extra_{len(self.added) + 1}"
        self.db.execute(f"ALTER TABLE {self.table} ADD COLUMN {name} text")
        self.added.append(name)
        self.counts["add column"] = self.counts.get("add column", 0) + 1

    def settle(self) -> int:
        """A marker row inserted and deleted: its tombstone is the round's last record."""
        self.markers += 1
        marker = -self.markers
        self.db.execute(f"INSERT INTO {self.table} (id, name) VALUES (%s, 'marker')", (marker,))
        self.db.execute(f"DELETE FROM {self.table} WHERE id = %s", (marker,))
        return marker
