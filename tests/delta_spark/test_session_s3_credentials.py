"""Credentials once: a job whose lake is configured in Spark (S3A's ``fs.s3a.*``, hadoop-aws)
gives the sink no ``storage_options``, and the sink reaches the same bucket with them.

The store is moto's S3 server on loopback with its IAM checks on, so a wrong secret is
refused as S3 refuses it. The session's settings are S3A's per-bucket ones for the lake
(``fs.s3a.bucket.lake.*``) over general keys that S3 would refuse: both Spark's own Delta
(through hadoop-aws) and the sink (through delta-rs and pyarrow, on executors too) must
pick the bucket's. Needs the classic session with delta-spark and hadoop-aws (`make jars`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from sinks import CleanerConfig, CompactedStateSink
from sinks.log.s3a_options import CredentialsRefusedError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "storage"))
from s3_server import BUCKET, S3Account, authenticated_s3_server

pytestmark = pytest.mark.delta_spark

SCHEMA = "key string, value string, partition int"
WRONG_SECRET = "not-the-secret-0123456789"


@pytest.fixture(scope="module")
def s3_account() -> Iterator[S3Account]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    with authenticated_s3_server() as account:
        yield account


@pytest.fixture
def s3a_session(delta_spark: SparkSession, s3_account: S3Account) -> Iterator[SparkSession]:
    """The session configured for the lake as a job would be, in S3A's names only."""
    spark = delta_spark
    utils = spark._jvm.org.apache.spark.util.Utils  # Spark's class loader, with spark.jars
    if not utils.classIsLoadable("org.apache.hadoop.fs.s3a.S3AFileSystem"):
        reason = "hadoop-aws is not on this session: run `make jars` and use .venv-spark4.2"
        if os.environ.get("COMPACTED_SINK_DELTA_TESTS") == "required":
            pytest.fail(reason)
        pytest.skip(reason)
    lake = f"fs.s3a.bucket.{BUCKET}."
    settings = {
        "fs.s3a.access.key": "AKIAGENERALKEY000000",  # another bucket's: the lake's win
        "fs.s3a.secret.key": WRONG_SECRET,
        f"{lake}access.key": s3_account.access_key,
        f"{lake}secret.key": s3_account.secret_key,
        "fs.s3a.endpoint": s3_account.endpoint,
        "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.path.style.access": "true",
    }
    for name, value in settings.items():
        spark.conf.set(name, value)
    yield spark
    for name in settings:
        spark.conf.unset(name)


def test_sink_on_s3a_takes_the_session_settings_and_spark_delta_reads_it(
    s3a_session, s3_account, clock, caplog
) -> None:
    spark, path = s3a_session, f"s3a://{BUCKET}/users"
    with caplog.at_level(logging.INFO, logger="compacted_sink"):
        sink = CompactedStateSink(
            path, config=CleanerConfig(min_cleanable_dirty_ratio=1.0), clock=clock
        )
    sink(spark.createDataFrame([(f"k{i}", f"a{i}", i % 2) for i in range(8)], SCHEMA), 0)
    sink(spark.createDataFrame([("k1", "b1", 1), ("k2", None, 0), ("k3", "b3", 1)], SCHEMA), 1)
    assert sink.clean(force=True) is not None
    sink(spark.createDataFrame([("k4", "c4", 0)], SCHEMA), 2)

    expected = {f"k{i}": f"a{i}" for i in range(8)} | {"k1": "b1", "k3": "b3", "k4": "c4"}
    del expected["k2"]
    assert_df_equality(
        sink.state().select("key", "value"),
        spark.createDataFrame(sorted(expected.items()), "key string, value string"),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert_df_equality(
        spark.read.format("delta").load(path),
        sink.log(),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert sink.path == f"s3://{BUCKET}/users"
    assert sink.storage_options["conditional_put"] == "etag"
    assert not any("unsafe" in k.lower() for k in sink.storage_options)
    said = [r.getMessage() for r in caplog.records if "storage options" in r.getMessage()]
    assert said == [
        f"s3://{BUCKET}/users: storage options from the Spark session's S3A settings "
        f"(fs.s3a.bucket.{BUCKET}.access.key, fs.s3a.bucket.{BUCKET}.secret.key, "
        "fs.s3a.endpoint, fs.s3a.endpoint.region, fs.s3a.path.style.access); "
        "commits use a conditional put"
    ]
    assert s3_account.secret_key not in caplog.text


def test_a_wrong_session_secret_is_refused_naming_bucket_and_setting(
    s3a_session, s3_account, caplog
) -> None:
    s3a_session.conf.set(f"fs.s3a.bucket.{BUCKET}.secret.key", WRONG_SECRET)
    with caplog.at_level(logging.DEBUG), pytest.raises(CredentialsRefusedError) as refused:
        CompactedStateSink(f"s3a://{BUCKET}/refused")
    message = str(refused.value)
    assert message == (
        f"s3://{BUCKET}/refused: bucket '{BUCKET}' refused the credentials "
        "(SignatureDoesNotMatch) taken from the Spark session: check "
        f"fs.s3a.bucket.{BUCKET}.access.key, fs.s3a.bucket.{BUCKET}.secret.key"
    )
    for secret in (WRONG_SECRET, s3_account.secret_key):
        assert secret not in message and secret not in caplog.text
