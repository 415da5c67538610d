"""A log's files through pyarrow: one file system per object store, from the log's options.

Options use delta-rs's names and fall back on the environment of the process that opens
the store (`sinks.log.store_options`); S3's retries and timeouts are the ones delta-rs is
given (`sinks.log.retry_settings`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs

from sinks.errors import UnsupportedStoreError
from sinks.log.retry_settings import s3_retry_settings
from sinks.log.store_options import S3_ENDPOINT_ENV, first_env, store_option
from sinks.log.uris import normalize_uri, store_of


def arrow_filesystem(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system and the root path inside it for ``uri``.

    Safe to call on executors: it reads only its arguments and the environment of
    the process it runs in. Options use delta-rs's names (`sinks.log.store_options`).
    """
    canonical = normalize_uri(uri)
    options = dict(storage_options or {})
    store = store_of(canonical)
    if store == "local":
        return pafs.LocalFileSystem(), canonical
    parsed = urlparse(canonical)
    if store == "s3":
        return _s3_filesystem(options), f"{parsed.netloc}{parsed.path}".rstrip("/")
    if store == "gcs":
        return _gcs_filesystem(options), f"{parsed.netloc}{parsed.path}".rstrip("/")
    return _azure_filesystem(canonical, options)


def delete_files(
    uri: str, paths: list[str], storage_options: Mapping[str, str] | None = None
) -> int:
    """Delete data files (relative to ``uri``); a file already gone is not an error.

    Idempotent. Returns how many files this call deleted.
    """
    fs, root = arrow_filesystem(uri, storage_options)
    deleted = 0
    for path in paths:
        try:
            fs.delete_file(f"{root}/{path}")
            deleted += 1
        except FileNotFoundError:
            pass
    return deleted


def missing_files(
    table_uri: str, paths: Iterable[str], storage_options: Mapping[str, str] | None = None
) -> list[str]:
    """Which of ``paths`` (relative to the table) no longer exist.

    A writer checks its files just before committing them: a recovery that judged
    them orphans (the writer stalled past ``file.delete.delay.ms``) may have
    deleted them, and a commit naming a missing file would lose data.
    """
    fs, root = arrow_filesystem(table_uri, storage_options)
    wanted = list(paths)
    infos = fs.get_file_info([f"{root}/{unquote(p)}" for p in wanted])
    return [p for p, info in zip(wanted, infos, strict=True) if info.type == pafs.FileType.NotFound]


# -- per-store file systems --------------------------------------------------------------


def _s3_filesystem(options: Mapping[str, str]) -> pafs.S3FileSystem:
    endpoint = store_option(options, "s3", "endpoint") or first_env(*S3_ENDPOINT_ENV)
    scheme, host = None, None
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        scheme, host = parsed.scheme, parsed.netloc
    virtual_hosted = store_option(options, "s3", "virtual_hosted_style_request")
    retries = s3_retry_settings(options)
    return pafs.S3FileSystem(
        access_key=store_option(options, "s3", "access_key_id"),
        secret_key=store_option(options, "s3", "secret_access_key"),
        session_token=store_option(options, "s3", "session_token"),
        region=store_option(options, "s3", "region")
        or first_env("AWS_REGION", "AWS_DEFAULT_REGION"),
        endpoint_override=host,
        scheme=scheme,
        force_virtual_addressing=(virtual_hosted or "").lower() == "true",
        connect_timeout=retries.connect_timeout_s,
        request_timeout=retries.timeout_s,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=retries.max_retries + 1),
    )


def _gcs_filesystem(options: Mapping[str, str]) -> pafs.GcsFileSystem:
    # pyarrow takes no key file: GOOGLE_APPLICATION_CREDENTIALS names it on every node.
    endpoint = store_option(options, "gcs", "endpoint")
    scheme, host = None, None
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        scheme, host = parsed.scheme, parsed.netloc
    return pafs.GcsFileSystem(endpoint_override=host, scheme=scheme)


def _azure_filesystem(uri: str, options: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    parsed = urlparse(uri)
    container, _, host = parsed.netloc.partition("@")
    account = store_option(options, "azure", "storage_account_name") or (
        host.split(".", 1)[0] if host else os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    )
    if not account:
        raise UnsupportedStoreError(
            f"{uri!r}: no Azure storage account (name it in the URI's host "
            "or in azure_storage_account_name)"
        )
    key = store_option(options, "azure", "storage_account_key") or store_option(
        options, "azure", "storage_access_key"
    )
    fs = pafs.AzureFileSystem(
        account,
        account_key=key or os.environ.get("AZURE_STORAGE_ACCOUNT_KEY"),
        sas_token=store_option(options, "azure", "storage_sas_key"),
        client_id=store_option(options, "azure", "client_id"),
        client_secret=store_option(options, "azure", "client_secret"),
        tenant_id=store_option(options, "azure", "tenant_id"),
    )
    return fs, f"{container}{parsed.path}".rstrip("/")
