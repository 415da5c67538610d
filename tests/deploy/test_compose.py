"""docker-compose.yml, checked without Docker: it parses, and it matches the docs and the CLI.

No Docker engine runs where the tests run, so these tests hold the file to what
docs/deployment.md says (services, images, commands, mounted files), to the
Dockerfile (one Spark version everywhere), to the Kafka topic and Avro schema
the producer and the job share, and to what `compacted-sink run` accepts.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import struct
import tomllib
from pathlib import Path

import fastavro
import pytest

from streaming.cli import _parser
from streaming.jobs.job import parse_job

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to parse docker-compose.yml")

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCS = ROOT / "docs" / "deployment.md"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
SPARK_SERVICES = ("spark-master", "spark-worker", "job")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def command(service: dict) -> list[str]:
    cmd = service.get("command", [])
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def docs_table(header: str) -> list[list[str]]:
    """The rows of the docs' Markdown table whose header row starts with ``header``."""
    lines = DOCS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.replace("`", "").strip() for cell in line.strip("|").split("|")])
    return rows


def bind_mounts(service: dict) -> list[tuple[str, str]]:
    """(host path, container path) of each bind mount (host paths start with ./)."""
    mounts = []
    for volume in service.get("volumes", []):
        host, container, *_ = volume.split(":")
        if host.startswith("./"):
            mounts.append((host[2:], container))
    return mounts


def env(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def spark_version() -> str:
    match = re.search(r"^ARG SPARK_VERSION=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, "docker/Dockerfile must declare ARG SPARK_VERSION=<version>"
    return match.group(1)


def test_the_services_and_images_are_the_ones_the_docs_list(services):
    documented = {row[0]: row[1] for row in docs_table("service")}
    assert set(services) == set(documented)
    for name, service in services.items():
        assert service["image"] == documented[name], name


def test_each_documented_command_is_the_services_command(services):
    for name, _image, described in docs_table("service"):
        actual = " ".join(command(services[name]))
        if described.startswith("the image's default"):
            assert "command" not in services[name], name
            continue
        if "(2 replicas)" in described:
            assert services[name]["deploy"]["replicas"] == 2
        for word in described.replace("...", " ").replace("(2 replicas)", " ").split():
            assert word in actual, f"{name}: {word!r} not in {actual!r}"


def test_every_mounted_file_exists_and_is_documented(services):
    documented = {
        (row[0].rstrip("/"), row[1]): set(row[2].split(", ")) for row in docs_table("file")
    }
    mounted: dict[tuple[str, str], set[str]] = {}
    for name, service in services.items():
        for host, container in bind_mounts(service):
            assert (ROOT / host).exists(), f"{name} mounts missing {host}"
            mounted.setdefault((host.rstrip("/"), container), set()).add(name)
    assert mounted == documented


def test_spark_runs_on_the_official_image_with_one_version_everywhere(services, compose):
    version = spark_version()
    dockerfile = DOCKERFILE.read_text()
    assert re.search(r"^FROM apache/spark:\$\{SPARK_VERSION\}-", dockerfile, re.MULTILINE)
    assert '"pyspark==${SPARK_VERSION}"' in dockerfile  # the driver's pyspark = cluster's Spark
    for name in SPARK_SERVICES:
        service = services[name]
        assert service["build"]["dockerfile"] == "docker/Dockerfile", name
        assert service["build"]["args"]["SPARK_VERSION"] == version, name
        assert service["image"].endswith(f":{version}"), name
    kafka_package = re.search(
        r"spark-sql-kafka-0-10_2\.13:(\S+)", env(services["job"])["PYSPARK_SUBMIT_ARGS"]
    )
    assert kafka_package and kafka_package.group(1) == version
    assert "PYSPARK_PYTHON=/opt/venv/bin/python" in dockerfile


def test_kafka_runs_in_kraft_mode_with_the_compacted_topic(services):
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in env(kafka)["KAFKA_PROCESS_ROLES"]
    assert not any("zookeeper" in name for name in services)
    topic = command(services["create-topic"])
    assert topic[topic.index("--topic") + 1] == "users"
    assert "cleanup.policy=compact" in topic
    assert env(kafka)["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"


def test_kafka_runs_the_major_version_of_the_broker_the_kafka_tests_run(services):
    """The tests' broker is jvm/kafka/pom.xml's kafka_2.13 (tests/kafka): the same major."""
    tested = re.search(r"<kafka\.version>(\d+)\.", (ROOT / "jvm" / "kafka" / "pom.xml").read_text())
    assert tested, "jvm/kafka/pom.xml must declare <kafka.version>"
    for name in ("kafka", "create-topic"):
        image = services[name]["image"]
        assert image.split(":")[1].split(".")[0] == tested.group(1), (name, image)


def test_the_job_command_is_accepted_by_the_cli_and_its_file_by_the_job_parser(services):
    job = services["job"]
    cmd = command(job)
    assert cmd[:2] == ["compacted-sink", "run"]
    args = _parser().parse_args(cmd[1:])
    assert args.command == "run"
    host = dict((c, h) for h, c in bind_mounts(job))[args.job]
    document = tomllib.loads((ROOT / host).read_text())
    parsed = parse_job(document, Path(args.job))  # checks every key, Kafka names
    assert parsed.source["format"] == "kafka"
    options = parsed.source["options"]
    assert options["kafka.bootstrap.servers"] == "kafka:9092"
    assert options["subscribe"] == "users"
    (log,) = parsed.logs
    assert log.path.startswith("s3://lake/")
    checkpoint_volume = [v for v in job["volumes"] if not v.startswith("./")]
    assert any(log.checkpoint_location.startswith(v.split(":")[1]) for v in checkpoint_volume)


def test_the_lake_store_is_reachable_and_creatable_from_every_spark_container(services):
    store = services["seaweedfs"]
    assert store["image"].startswith("chrislusf/seaweedfs:")
    s3_port = re.search(r"-s3\.port=(\d+)", " ".join(command(store))).group(1)
    bucket = command(services["create-bucket"])[-1]
    for name in ("spark-worker", "job", "create-bucket"):
        variables = env(services[name])
        assert variables["AWS_ENDPOINT_URL"] == f"http://seaweedfs:{s3_port}", name
        assert variables["AWS_ALLOW_HTTP"] == "true", name
        assert variables["AWS_ACCESS_KEY_ID"] and variables["AWS_SECRET_ACCESS_KEY"], name
    assert (
        parse_job(tomllib.loads((ROOT / "docker" / "job.toml").read_text()), Path("/j.toml"))
        .logs[0]
        .path.startswith(f"s3://{bucket}/")
    )
    assert '"accessKey": "compacted-sink"' in (ROOT / "docker/seaweedfs/s3.json").read_text()


def test_the_job_connects_to_the_master_the_compose_file_starts(services):
    master = command(services["spark-master"])
    url = f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"
    assert env(services["job"])["SPARK_MASTER"] == url
    assert url in command(services["spark-worker"])
    assert "spark.driver.host=job" in env(services["job"])["PYSPARK_SUBMIT_ARGS"]
    assert services["job"]["hostname"] == "job"


def test_producer_writes_confluent_avro_the_jobs_schemas_decode():
    spec = importlib.util.spec_from_file_location("producer", ROOT / "docker" / "producer.py")
    producer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(producer)
    schema_file = ROOT / "docker" / "schemas" / "1.avsc"
    parsed = fastavro.parse_schema(json.loads(schema_file.read_text()))
    stream = producer.updates(users=10, seed=1, start_ms=0)
    records = [next(stream) for _ in range(200)]
    assert any(r is None for _, r in records) and any(r is not None for _, r in records)
    key, record = next((k, r) for k, r in records if r is not None)
    value = producer.encode_value(int(schema_file.stem), parsed, record)
    magic, schema_id = struct.unpack(">bI", value[:5])
    assert (magic, schema_id) == (0, 1)
    assert fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed, parsed) == record
    assert record["id"] == key
