"""URIs: one canonical name per table, translated for Spark, pyarrow and delta-rs."""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import pytest

from sinks.errors import CompactedSinkError, ConfigError, UnsupportedStoreError
from sinks.log.filesystems import arrow_filesystem, delete_files
from sinks.log.store_options import delta_storage_options
from sinks.log.uris import is_local, join, normalize_uri, sibling, store_of


@pytest.fixture
def clean_env(monkeypatch):
    """No AWS/Azure/Google settings from the machine leak into a test."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "AZURE_", "GOOGLE_")):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("s3://bucket/lake/users", "s3://bucket/lake/users"),
        ("s3a://bucket/lake/users/", "s3://bucket/lake/users"),
        ("s3n://bucket/lake/users", "s3://bucket/lake/users"),
        ("S3A://bucket/lake", "s3://bucket/lake"),
        ("gs://bucket/lake/users", "gs://bucket/lake/users"),
        ("gcs://bucket/lake", "gs://bucket/lake"),
        (
            "abfss://lake@account.dfs.core.windows.net/users/",
            "abfss://lake@account.dfs.core.windows.net/users",
        ),
        ("az://lake/users", "az://lake/users"),
    ],
)
def test_object_store_uris_get_one_canonical_name(given, canonical):
    assert normalize_uri(given) == canonical
    assert normalize_uri(canonical) == canonical  # idempotent
    assert not is_local(canonical)


def test_local_paths_become_absolute_against_this_process_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert normalize_uri("lake/users") == str(tmp_path / "lake" / "users")
    assert normalize_uri(f"file://{tmp_path}/lake") == str(tmp_path / "lake")
    assert normalize_uri(tmp_path / "lake") == str(tmp_path / "lake")
    assert is_local(normalize_uri("lake")) and is_local(f"file://{tmp_path}")


def spark_uri(uri: str) -> str:
    """The URI as Spark's Hadoop file systems name it (``s3://`` becomes ``s3a://``)."""
    canonical = normalize_uri(uri)
    return "s3a" + canonical[len("s3") :] if canonical.startswith("s3://") else canonical


def test_spark_names_s3_with_hadoops_s3a_and_leaves_others():
    assert spark_uri("s3://bucket/t") == "s3a://bucket/t"
    assert spark_uri("s3a://bucket/t/") == "s3a://bucket/t"
    assert spark_uri("gs://bucket/t") == "gs://bucket/t"
    assert spark_uri("abfss://c@a.dfs.core.windows.net/t") == "abfss://c@a.dfs.core.windows.net/t"
    assert spark_uri("/tmp/lake") == "/tmp/lake"


def test_unknown_scheme_is_a_config_error_that_names_the_uri():
    with pytest.raises(UnsupportedStoreError, match="hdfs://nn/lake") as raised:
        normalize_uri("hdfs://nn/lake")
    assert isinstance(raised.value, ConfigError) and isinstance(raised.value, CompactedSinkError)


def test_store_of_each_scheme():
    assert [store_of(u) for u in ("/x", "s3a://b/x", "gs://b/x", "abfss://c@a/x")] == [
        "local",
        "s3",
        "gcs",
        "azure",
    ]


def test_join_and_sibling_keep_the_scheme():
    assert join("s3://b/lake/", "partition-0", "/f.parquet") == "s3://b/lake/partition-0/f.parquet"
    assert sibling("s3://b/lake/users", "_cleaner-offset-checkpoint") == (
        "s3://b/lake/_cleaner-offset-checkpoint"
    )
    assert sibling("/data/lake/users/", "x") == "/data/lake/x"


def test_delta_options_ask_for_conditional_put_on_s3(clean_env):
    assert delta_storage_options("s3://b/t") == {"conditional_put": "etag"}
    assert delta_storage_options("s3a://b/t", {"AWS_REGION": "eu-west-1"}) == {
        "AWS_REGION": "eu-west-1",
        "conditional_put": "etag",
    }


@pytest.mark.parametrize(
    "choice",
    [
        {"conditional_put": "dynamo:locks"},
        {"AWS_S3_LOCKING_PROVIDER": "dynamodb"},
        {"aws_s3_allow_unsafe_rename": "true"},
    ],
)
def test_delta_options_keep_the_callers_commit_safety_choice(clean_env, choice):
    assert delta_storage_options("s3://b/t", choice) == choice


def test_delta_options_respect_a_choice_made_in_the_environment(clean_env):
    clean_env.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    assert delta_storage_options("s3://b/t") == {}


def test_delta_options_allow_http_for_an_http_endpoint(clean_env):
    options = delta_storage_options("s3://b/t", {"AWS_ENDPOINT_URL": "http://store:8333"})
    assert options["AWS_ALLOW_HTTP"] == "true"
    options = delta_storage_options(
        "s3://b/t", {"endpoint": "https://s3.example", "allow_http": "false"}
    )
    assert "AWS_ALLOW_HTTP" not in options


def test_delta_options_leave_other_stores_alone(clean_env):
    assert delta_storage_options("/tmp/lake") == {}
    assert delta_storage_options("gs://b/t", {"google_service_account": "/k.json"}) == {
        "google_service_account": "/k.json"
    }


def test_arrow_s3_filesystem_from_delta_rs_option_names(clean_env):
    fs, root = arrow_filesystem(
        "s3a://bucket/lake/users",
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
            "AWS_ACCESS_KEY_ID": "key",
            "aws_secret_access_key": "secret",
            "region": "eu-west-1",
        },
    )
    assert isinstance(fs, pafs.S3FileSystem)
    assert root == "bucket/lake/users"
    assert fs.region == "eu-west-1"
    assert "127.0.0.1:8333" in repr(fs.__reduce__())  # the endpoint travels when pickled


def test_arrow_s3_filesystem_reads_endpoint_and_region_from_its_own_environment(clean_env):
    clean_env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9999")
    clean_env.setenv("AWS_REGION", "us-west-2")
    fs, _ = arrow_filesystem("s3://bucket/t")
    assert fs.region == "us-west-2"
    assert "127.0.0.1:9999" in repr(fs.__reduce__())


def test_arrow_azure_filesystem_takes_the_account_from_the_uri(clean_env):
    fs, root = arrow_filesystem(
        "abfss://lake@acct.dfs.core.windows.net/users", {"azure_storage_account_key": "a2V5"}
    )
    assert isinstance(fs, pafs.AzureFileSystem)
    assert root == "lake/users"


def test_arrow_azure_filesystem_without_an_account_says_so(clean_env):
    with pytest.raises(UnsupportedStoreError, match="account"):
        arrow_filesystem("az://lake/users")


def test_arrow_gcs_filesystem_root_is_bucket_and_path(clean_env):
    fs, root = arrow_filesystem(
        "gs://bucket/lake/users", {"google_endpoint": "http://127.0.0.1:4443"}
    )
    assert isinstance(fs, pafs.GcsFileSystem)
    assert root == "bucket/lake/users"


def test_arrow_local_filesystem_and_delete_files_is_idempotent(tmp_path):
    (tmp_path / "partition-0").mkdir()
    (tmp_path / "partition-0" / "a.parquet").write_bytes(b"x")
    fs, root = arrow_filesystem(f"file://{tmp_path}")
    assert isinstance(fs, pafs.LocalFileSystem) and root == str(tmp_path)
    assert delete_files(str(tmp_path), ["partition-0/a.parquet", "partition-0/gone.parquet"]) == 1
    assert delete_files(str(tmp_path), ["partition-0/a.parquet"]) == 0
    assert not (tmp_path / "partition-0" / "a.parquet").exists()
