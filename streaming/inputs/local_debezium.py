"""A throwaway PostgreSQL 15 and a Kafka Connect worker running Debezium, on loopback.

What the Debezium pipeline test (tests/kafka/test_debezium_pipeline.py) and ``make demo-cdc``
(examples/debezium_demo.py) start, as `streaming.inputs.local_kafka` is the broker's.

`LocalPostgres`: ``initdb`` and ``pg_ctl`` on loopback (``wal_level=logical``), as the
``postgres`` user when the tests run as root (PostgreSQL refuses root). `ConnectWorker`:
Kafka's own Connect worker (``ConnectStandalone``) with Debezium's PostgreSQL connector
(``pgoutput``) from ``.jars/debezium/`` (`make jars`), the JSON converter with schemas.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from streaming.inputs.local_kafka import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
BACKSLASH = "\\"


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class LocalPostgres:
    """One PostgreSQL cluster in a temporary directory, on 127.0.0.1, user ``postgres``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="compacted-sink-pg-"))
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.dir, account.pw_uid, account.pw_gid)
        self.data = self.dir / "data"
        self.port = free_port()

    def start(self) -> None:
        """``initdb`` and ``pg_ctl start``: logical decoding on, no fsync (throwaway data)."""
        run = {"check": True, "capture_output": True, "timeout": 120}
        subprocess.run(
            _as_postgres(
                [
                    str(PG_BIN / "initdb"),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-N",
                    "-D",
                    str(self.data),
                ]
            ),
            **run,
        )
        settings = (
            f"-c wal_level=logical -c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} "
            "-c fsync=off -c max_wal_senders=4 -c max_replication_slots=4 -c shared_buffers=32MB"
        )
        subprocess.run(
            _as_postgres(
                [
                    str(PG_BIN / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.dir / "log"),
                    "-w",
                    "-o",
                    settings,
                    "start",
                ]
            ),
            **run,
        )

    def connect(self):
        """An autocommit psycopg connection to the ``postgres`` database."""
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        )

    def stop(self) -> None:
        """Stop the cluster at once and remove its directory."""
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


class ConnectWorker:
    """Kafka Connect in standalone mode with one Debezium PostgreSQL connector."""

    def __init__(self, jars: Path, work: Path, bootstrap: str, connector: dict[str, str]) -> None:
        self.jars, self.work, self.bootstrap, self.connector = jars, work, bootstrap, connector
        self.process: subprocess.Popen | None = None
        self.log = work / "connect.log"

    def start(self) -> None:
        """Start ``ConnectStandalone`` with the connector (its offsets file kept in ``work``)."""
        self.work.mkdir(parents=True, exist_ok=True)
        worker = {
            "bootstrap.servers": self.bootstrap,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "offset.storage.file.filename": str(self.work / "offsets"),
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://127.0.0.1:{free_port()}",
        }
        (self.work / "worker.properties").write_text(_properties(worker))
        (self.work / "connector.properties").write_text(_properties(self.connector))
        (self.work / "log4j2.properties").write_text(
            "rootLogger.level=WARN\nrootLogger.appenderRef.out.ref=out\n"
            "appender.out.type=Console\nappender.out.name=out\n"
            "appender.out.layout.type=PatternLayout\nappender.out.layout.pattern=%d %p %c{1} %m%n\n"
            "logger.dbz.name=io.debezium\nlogger.dbz.level=INFO\n"
        )
        command = [
            "java",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={self.work / 'log4j2.properties'}",
            "-cp",
            f"{self.jars}/*",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(self.work / "worker.properties"),
            str(self.work / "connector.properties"),
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"the Connect worker exited: {self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """kill -9: what Connect had not flushed of its offsets it sends again on restart."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self.process = None


def postgres_connector(
    postgres: LocalPostgres,
    *,
    name: str,
    tables: str,
    publication: str = "filtered",
    prefix: str = "dbz",
) -> dict[str, str]:
    """Debezium's PostgreSQL connector (``pgoutput``, a snapshot first) over ``tables``
    (``table.include.list``: regular expressions, comma-separated), its slot named ``name``.

    ``publication`` is ``publication.autocreate.mode``: ``"filtered"`` publishes the tables
    that match when the connector starts; ``"all_tables"`` every table, so a table created
    later is streamed too (its changes only: the snapshot saw no rows of it).
    """
    return {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": "127.0.0.1",
        "database.port": str(postgres.port),
        "database.user": "postgres",
        "database.password": "postgres",
        "database.dbname": "postgres",
        "topic.prefix": prefix,
        "table.include.list": tables,
        "slot.name": name,
        "publication.name": f"{name}_publication",
        "publication.autocreate.mode": publication,
        "snapshot.mode": "initial",
    }


def _properties(settings: dict[str, str]) -> str:
    """A Java properties file's text; a backslash (a regular expression's) kept as one."""
    return "".join(f"{k}={v.replace(BACKSLASH, BACKSLASH * 2)}\n" for k, v in settings.items())


def wait_until(check, *, timeout_s: float, what: str, alive=None) -> None:
    """Poll ``check`` until true (``alive`` raising stops early); AssertionError at the end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None:
            alive()
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
