"""Which of delta-spark's log stores can overwrite the sink's commits (no S3 needed).

delta-spark commits through a log store chosen by the path's scheme; the sink commits through
delta-rs with a put-if-absent. Two engines committing at once are safe only when delta-spark's
side is put-if-absent across processes too (docs/operations.md, "Two engines committing at
once"): `unsafe_beside_delta_spark` says when it is not, from the session's settings alone.
"""

from __future__ import annotations

import pytest

from sinks.log.delta_spark_policy import (
    DELTA_SPARK_CATALOG,
    DELTA_SPARK_EXTENSION,
    delta_spark_conf_keys,
    unsafe_beside_delta_spark,
)

WITH_DELTA = {
    "spark.sql.extensions": DELTA_SPARK_EXTENSION,
    "spark.sql.catalog.spark_catalog": DELTA_SPARK_CATALOG,
}


@pytest.mark.parametrize("uri", ["s3://lake/users", "s3a://lake/users"])
def test_s3_with_delta_spark_single_driver_log_store_is_unsafe(uri) -> None:
    warning = unsafe_beside_delta_spark(uri, WITH_DELTA)
    assert warning is not None
    assert "S3SingleDriverLogStore" in warning and "one Spark driver" in warning
    assert "lost without an error" in warning and "Two engines committing at once" in warning


def test_s3_with_delta_spark_dynamodb_log_store_is_unsafe_too() -> None:
    conf = {**WITH_DELTA, "spark.delta.logStore.s3a.impl": "io.delta.storage.S3DynamoDBLogStore"}
    warning = unsafe_beside_delta_spark("s3://lake/users", conf)
    assert warning is not None and "S3DynamoDBLogStore" in warning and "DynamoDB" in warning


def test_a_local_log_with_delta_spark_default_log_store_is_unsafe() -> None:
    warning = unsafe_beside_delta_spark("/lake/users", WITH_DELTA)
    assert warning is not None and "HDFSLogStore" in warning and "own JVM" in warning


@pytest.mark.parametrize(
    ("uri", "conf"),
    [
        ("s3://lake/users", {}),  # no delta-spark in the session
        ("/lake/users", {"spark.sql.extensions": "some.other.Extension"}),
        ("gs://lake/users", WITH_DELTA),  # GCSLogStore: a precondition on the object's generation
        ("abfss://c@a.dfs.core.windows.net/users", WITH_DELTA),  # AzureLogStore: rename fails
        (
            "s3://lake/users",
            {
                **WITH_DELTA,
                **{
                    f"spark.delta.logStore.{s}.impl": "com.example.PutIfAbsent"
                    for s in ("s3", "s3a", "s3n")
                },
            },
        ),
    ],
)
def test_safe_or_unknown_configurations_are_not_warned_about(uri, conf) -> None:
    assert unsafe_beside_delta_spark(uri, conf) is None


def test_the_keys_read_from_the_session_cover_every_scheme_of_the_store() -> None:
    keys = delta_spark_conf_keys("s3://lake/users")
    assert {f"spark.delta.logStore.{s}.impl" for s in ("s3", "s3a", "s3n")} <= set(keys)
    assert "spark.delta.logStore.class" in keys
