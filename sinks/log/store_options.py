"""A log's storage options: read under delta-rs's names, and completed for delta-rs.

Credentials and endpoints come from storage options in delta-rs's spelling
(``AWS_ENDPOINT_URL``, ``azure_storage_account_key``, ...; case-insensitive) and,
for whatever they leave out, from the environment *of the process that opens the
store*: executors read their own environment, never the driver's, so a cluster
sets them on every node (``spark.executorEnv.*`` or the container's env).

Commits on S3 are safe between concurrent writers only with a put-if-absent:
`delta_storage_options` asks delta-rs for conditional put (``If-None-Match``)
unless the caller chose a locking provider or unsafe renames.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sinks.log.uris import store_of

# delta-rs options that already decide how S3 commits are made safe.
_S3_COMMIT_SAFETY = ("conditional_put", "s3_locking_provider", "s3_allow_unsafe_rename")
S3_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
"""The environment variables that name an S3 endpoint, the first set one wins."""

_PREFIX = {"s3": "aws_", "gcs": "google_", "azure": "azure_"}
_ALIASES = {
    ("s3", "endpoint"): ("endpoint", "endpoint_url"),
    ("s3", "region"): ("region", "default_region"),
    ("s3", "session_token"): ("session_token", "token"),
    ("azure", "storage_account_name"): ("storage_account_name", "account_name"),
    ("azure", "storage_account_key"): ("storage_account_key", "account_key"),
    ("azure", "storage_sas_key"): ("storage_sas_key", "storage_sas_token", "sas_token"),
    ("gcs", "endpoint"): ("endpoint", "service_endpoint"),
}


def delta_storage_options(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The storage options to hand delta-rs for ``uri``: the caller's, plus commit safety.

    On S3 (and S3-compatible servers) adds ``conditional_put=etag`` unless the
    caller set ``conditional_put``, ``AWS_S3_LOCKING_PROVIDER`` or
    ``AWS_S3_ALLOW_UNSAFE_RENAME`` (in the options or the environment), so that
    two writers committing the same Delta version cannot both succeed. An
    ``http://`` endpoint (in the options or ``AWS_ENDPOINT_URL``) also gets
    ``AWS_ALLOW_HTTP=true`` unless ``AWS_ALLOW_HTTP`` is set. Credentials are not
    copied from the environment: delta-rs reads it itself.
    """
    options = dict(storage_options or {})
    if store_of(uri) != "s3":
        return options
    given = {_bare(k, "aws_") for k in options} | {
        _bare(k, "aws_") for k in os.environ if k.upper().startswith("AWS_")
    }
    if not given & set(_S3_COMMIT_SAFETY):
        options["conditional_put"] = "etag"
    endpoint = store_option(options, "s3", "endpoint") or first_env(*S3_ENDPOINT_ENV)
    if endpoint and endpoint.startswith("http://") and "allow_http" not in given:
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def store_option(options: Mapping[str, str], store: str, name: str) -> str | None:
    """An option under delta-rs's names: ``AWS_REGION``, ``aws_region`` or ``region``."""
    wanted = set(_ALIASES.get((store, name), (name,)))
    for key, value in options.items():
        if _bare(key, _PREFIX[store]) in wanted:
            return value
    return None


def first_env(*names: str) -> str | None:
    """The value of the first of ``names`` set (non-empty) in this process's environment."""
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def _bare(key: str, prefix: str) -> str:
    key = key.lower()
    return key[len(prefix) :] if key.startswith(prefix) else key
