"""A local Apache Kafka broker (KRaft) on loopback, from jars fetched with Maven.

One JVM that is broker and controller at once (``process.roles=broker,controller``),
listening on two free ports of 127.0.0.1, its data in a directory of the caller's.
The tests' session fixture and ``make demo-kafka`` both start it here; nothing in the
library needs it, nor the jars (``make jars`` copies them into ``.jars/kafka/``).

The broker's settings come from a Java properties file with ``${placeholders}``
(`string.Template`): ``port``, ``controller_port``, ``log_dir``; its logging from a
log4j2 file. Start: write the properties, format the storage with Kafka's
``kafka.tools.StorageTool``, start ``kafka.Kafka``, then wait until an admin client
answers ``describe_cluster`` (confluent-kafka). A broker that exits or does not answer
in time raises `BrokerStartError` with the last lines of its log.
"""

from __future__ import annotations

import base64
import ctypes
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from string import Template

from sinks.errors import BrokerStartError

HOST = "127.0.0.1"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"


_VERSIONED_JAR = re.compile(r"^(.+)-\d+\.[\w.]*(?:-\d+)?\.jar$")


def artifact_of(jar: str | os.PathLike) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    name = Path(jar).name
    found = _VERSIONED_JAR.match(name)
    return found.group(1) if found else Path(name).stem


def spark_jars(directory: str | os.PathLike) -> list[str]:
    """The jars of ``directory`` (a set `make jars` fetched) to put on a Spark session with
    ``spark.jars``: those whose artifact the running pyspark does not ship itself."""
    import pyspark

    shipped = {artifact_of(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(j) for j in sorted(Path(directory).glob("*.jar")) if artifact_of(j) not in shipped]


def fetched_jars(cache: str | os.PathLike, name: str) -> list[str]:
    """`spark_jars` of the set ``name`` that `make jars` fetched into ``cache`` for the running
    pyspark (``<cache>/<name>-<pyspark version>/``); none for a pyspark nothing was fetched for."""
    import pyspark

    return spark_jars(Path(cache) / f"{name}-{pyspark.__version__}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def random_cluster_id() -> str:
    """A cluster id as Kafka writes one: 16 random bytes, base64url without padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka avoids ids a command line would take for a flag
            return text


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies (Linux's PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


class LocalKafka:
    """A KRaft broker+controller on loopback: ``start()``, ``bootstrap``, ``stop()``.

    ``jars``: the directory of Kafka's jars (``kafka_2.13`` and its dependencies);
    ``work``: a directory of the caller's for the data, the rendered config and ``broker.log``;
    ``properties``/``log4j2``: the config template and the logging config;
    ``jvm_options``: extra options for the broker's JVMs (the storage format and the broker).
    """

    READY_TIMEOUT_S = 120.0

    def __init__(
        self,
        jars: str | os.PathLike,
        work: str | os.PathLike,
        properties: str | os.PathLike,
        log4j2: str | os.PathLike,
        *,
        java: str = "java",
        heap: str = "512m",
        jvm_options: Sequence[str] = (),
    ) -> None:
        self.jars = Path(jars).resolve()
        self.work = Path(work).resolve()
        self.template = Path(properties)
        self.log4j2 = Path(log4j2).resolve()
        self.java = java
        self.heap = heap
        self.jvm_options = tuple(jvm_options)
        self.port = free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.log_dir = self.work / "data"
        self.config = self.work / "server.properties"
        self.log = self.work / "broker.log"
        self.process: subprocess.Popen | None = None
        self.start_seconds: float | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _check_jars(self) -> None:
        if not any(self.jars.glob("kafka_2.13-*.jar")):
            raise BrokerStartError(
                f"no Kafka broker jars in {self.jars}: run `make jars` (Maven fetches them once)"
            )

    def _java(self, main: str, *args: str, jvm: tuple[str, ...] = ()) -> list[str]:
        return [
            self.java,
            f"-Xmx{self.heap}",
            "-Djava.awt.headless=true",
            "-Djava.net.preferIPv4Stack=true",
            f"-Dlog4j2.configurationFile={self.log4j2}",
            *self.jvm_options,
            *jvm,
            "-cp",
            f"{self.jars}/*",
            main,
            *args,
        ]

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no broker log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> None:
        self._check_jars()
        began = time.monotonic()
        self.work.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.config.write_text(
            Template(self.template.read_text()).substitute(
                host=HOST,
                port=self.port,
                controller_port=self.controller_port,
                log_dir=self.log_dir,
            )
        )
        fmt = subprocess.run(
            self._java(STORAGE_TOOL, "format", "-t", random_cluster_id(), "-c", str(self.config)),
            capture_output=True,
            text=True,
            timeout=self.READY_TIMEOUT_S,
        )
        if fmt.returncode != 0:
            raise BrokerStartError(
                f"formatting the broker's storage failed ({fmt.returncode}):\n"
                f"{fmt.stdout[-3000:]}{fmt.stderr[-3000:]}"
            )
        self._launch(began)

    def restart(self) -> None:
        """Stop the broker (a controlled shutdown) and start it again on the same ports, data
        and cluster id, as an operator's restart: its clients reconnect, its topics and
        records are kept. ``start_seconds`` is then the restart's."""
        self.stop()
        self._launch(time.monotonic())

    def _launch(self, began: float) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self._java(MAIN_CLASS, str(self.config)),
                cwd=self.work,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_ready(began)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began

    def _wait_ready(self, began: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        deadline = began + self.READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise BrokerStartError(
                    f"the Kafka broker exited ({self.process.returncode}) while starting; "
                    f"last lines of {self.log}:\n{self.tail()}"
                )
            try:
                cluster = admin.describe_cluster(request_timeout=2).result(timeout=3)
                if cluster.nodes:
                    return
            except Exception:  # not answering yet
                pass
            time.sleep(0.2)
        raise BrokerStartError(
            f"the Kafka broker did not answer describe_cluster in {self.READY_TIMEOUT_S:.0f} s; "
            f"last lines of {self.log}:\n{self.tail()}"
        )

    def stop(self) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL after 20 s; idempotent."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
