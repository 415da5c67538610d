"""The sink's S3 options from Hadoop's ``fs.s3a.*`` settings: the translation, the choice of
source, and the error a refused credential gives; pure (no store), but for the last test,
which reads a classic and a Connect session's settings. The end to end
runs, against moto with a session configured for S3A, are in
``tests/delta_spark/test_session_s3_credentials.py``."""

from __future__ import annotations

import logging

import pytest

from sinks.log.s3a_options import (
    CredentialsRefusedError,
    credential_setting_names,
    credentials_checked,
    resolve_storage_options,
    s3a_storage_options,
)
from sinks.spark_session import hadoop_settings, is_connect

SECRET = "s3cr3t-value"


def test_keys_endpoint_region_and_path_style_translate_to_delta_rs_names():
    translated = s3a_storage_options(
        "lake",
        {
            "fs.s3a.access.key": "AKIA1",
            "fs.s3a.secret.key": SECRET,
            "fs.s3a.session.token": "tok",
            "fs.s3a.endpoint": "127.0.0.1:9000",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.endpoint.region": "eu-west-3",
            "fs.s3a.path.style.access": "true",
            "fs.s3a.threads.max": "64",  # S3A's own tuning: no delta-rs option
        },
    )
    assert translated.options == {
        "AWS_ACCESS_KEY_ID": "AKIA1",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": "tok",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_REGION": "eu-west-3",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
    }
    assert translated.settings["AWS_SECRET_ACCESS_KEY"] == "fs.s3a.secret.key"


def test_per_bucket_settings_win_for_their_bucket_only():
    settings = {
        "fs.s3a.access.key": "general",
        "fs.s3a.secret.key": "general-secret",
        "fs.s3a.bucket.lake.access.key": "lake-key",
        "fs.s3a.bucket.lake.secret.key": "lake-secret",
        "fs.s3a.bucket.other.endpoint": "https://other.example:9000",
    }
    lake = s3a_storage_options("lake", settings)
    assert lake.options == {"AWS_ACCESS_KEY_ID": "lake-key", "AWS_SECRET_ACCESS_KEY": "lake-secret"}
    assert lake.settings["AWS_ACCESS_KEY_ID"] == "fs.s3a.bucket.lake.access.key"
    assert s3a_storage_options("other", settings).options == {
        "AWS_ACCESS_KEY_ID": "general",
        "AWS_SECRET_ACCESS_KEY": "general-secret",
        "AWS_ENDPOINT_URL": "https://other.example:9000",
    }


def test_aws_endpoints_are_left_to_delta_rs_and_give_the_region():
    assert s3a_storage_options(
        "b", {"fs.s3a.endpoint": "s3.eu-central-1.amazonaws.com"}
    ).options == {"AWS_REGION": "eu-central-1"}
    assert s3a_storage_options("b", {"fs.s3a.endpoint": "https://s3.amazonaws.com"}).options == {}


def test_a_lone_key_is_no_credential_and_the_anonymous_provider_skips_signing():
    assert s3a_storage_options("b", {"fs.s3a.access.key": "AKIA1"}).options == {}
    provider = "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
    anonymous = s3a_storage_options("b", {"fs.s3a.aws.credentials.provider": provider})
    assert anonymous.options == {"AWS_SKIP_SIGNATURE": "true"}


def test_credential_setting_names_cover_the_bucket_and_the_general_ones():
    names = credential_setting_names("lake")
    assert "fs.s3a.secret.key" in names and "fs.s3a.bucket.lake.session.token" in names


def test_given_storage_options_win_and_the_session_is_not_read():
    def session():
        raise AssertionError("the session must not be read when options are given")

    resolved = resolve_storage_options("s3://lake/log", {"AWS_REGION": "x"}, session)
    assert (resolved.source, resolved.options) == ("storage_options", {"AWS_REGION": "x"})


def test_session_settings_get_conditional_put_and_never_unsafe_rename(caplog):
    settings = {
        "fs.s3a.access.key": "AKIA1",
        "fs.s3a.secret.key": SECRET,
        "fs.s3a.endpoint": "http://127.0.0.1:9000",
    }
    with caplog.at_level(logging.INFO, logger="compacted_sink"):
        resolved = resolve_storage_options("s3://lake/log", None, lambda: settings)
    assert resolved.source == "spark_session"
    assert resolved.options["conditional_put"] == "etag"
    assert resolved.options["AWS_ALLOW_HTTP"] == "true"
    assert not any("unsafe" in k.lower() for k in resolved.options)
    [line] = [r.getMessage() for r in caplog.records]
    assert "fs.s3a.secret.key" in line and "Spark session" in line
    assert SECRET not in line and "AKIA1" not in line


def test_no_options_and_no_session_settings_leave_the_default_chain(caplog):
    with caplog.at_level(logging.INFO, logger="compacted_sink"):
        resolved = resolve_storage_options("s3://lake/log", None, lambda: {})
    assert (resolved.source, resolved.options) == ("default_chain", {})
    assert "AWS default chain" in caplog.records[-1].getMessage()
    local = resolve_storage_options("/tmp/lake/log", None, lambda: {"fs.s3a.access.key": "x"})
    assert (local.source, local.options) == ("storage_options", {})


def test_a_refused_credential_names_bucket_code_and_settings_without_the_secret():
    settings = {"fs.s3a.bucket.lake.access.key": "AKIA1", "fs.s3a.secret.key": SECRET}
    resolved = resolve_storage_options("s3://lake/log", None, lambda: settings)
    answer = (
        f"Kernel error -> 403 Forbidden <Error><Code>SignatureDoesNotMatch</Code>"
        f"<Message>secret {SECRET}</Message></Error>"
    )
    with pytest.raises(CredentialsRefusedError) as refused:
        with credentials_checked("s3://lake/log", resolved):
            raise OSError(answer)
    message = str(refused.value)
    assert refused.value.bucket == "lake" and refused.value.code == "SignatureDoesNotMatch"
    assert "'lake'" in message and "SignatureDoesNotMatch" in message
    assert "fs.s3a.bucket.lake.access.key" in message and "fs.s3a.secret.key" in message
    assert SECRET not in message and refused.value.__cause__ is None


def test_other_store_errors_pass_through():
    resolved = resolve_storage_options("s3://lake/log", None, lambda: {})
    with pytest.raises(OSError, match="connection refused"):
        with credentials_checked("s3://lake/log", resolved):
            raise OSError("connection refused")


@pytest.mark.both_sessions
def test_the_session_s3a_settings_are_read_on_classic_and_none_under_connect(spark):
    names = {"fs.s3a.endpoint": "http://127.0.0.1:9", "fs.s3a.bucket.lake.secret.key": SECRET}
    for name, value in names.items():
        spark.conf.set(name, value)
    try:
        found = hadoop_settings(spark, "fs.s3a.", credential_setting_names("lake"))
    finally:
        for name in names:
            spark.conf.unset(name)
    if is_connect(spark):  # neither kept nor readable from a Connect client
        assert found == {}
    else:
        assert {k: found.get(k) for k in names} == names
