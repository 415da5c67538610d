"""S3 credentials set once, in Spark: the sink's delta-rs options from Hadoop's ``fs.s3a.*``.

A job whose lake is configured for Spark's S3A connector (hadoop-aws) already names its
keys, endpoint and region there; the sink reads them from the session rather than asking
for the same settings again as ``storage_options``. `s3a_storage_options`
is the pure translation, `resolve_storage_options` chooses the source:

1. ``storage_options`` given to the sink: used as they are, the session is not read;
2. else, for an ``s3://`` / ``s3a://`` log, the session's S3A settings for the log's bucket,
   ``fs.s3a.bucket.<bucket>.<name>`` winning over ``fs.s3a.<name>`` as in S3A itself;
3. else nothing: delta-rs and pyarrow use the AWS default chain (environment, profile,
   instance or container role) of each process, executors included.

The translated options get `sinks.log.store_options.delta_storage_options`'s commit safety: a
conditional put (``conditional_put=etag``), never ``AWS_S3_ALLOW_UNSAFE_RENAME``. Which
source was used is logged in one line that names settings, never their values; a store
that refuses the credentials raises `CredentialsRefusedError`, naming the bucket and the
settings to check, with every credential value scrubbed from the message.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlparse

from sinks.errors import CredentialsRefusedError
from sinks.log.store_options import delta_storage_options
from sinks.log.uris import store_of

logger = logging.getLogger("compacted_sink")

S3A_PREFIX = "fs.s3a."
# S3A setting (after ``fs.s3a.``) -> delta-rs option; the values are secrets.
CREDENTIAL_SETTINGS = {
    "access.key": "AWS_ACCESS_KEY_ID",
    "secret.key": "AWS_SECRET_ACCESS_KEY",
    "session.token": "AWS_SESSION_TOKEN",
}
ENDPOINT = "endpoint"
REGION = "endpoint.region"
PATH_STYLE_ACCESS = "path.style.access"
SSL_ENABLED = "connection.ssl.enabled"
CREDENTIALS_PROVIDER = "aws.credentials.provider"
ANONYMOUS_PROVIDER = "AnonymousAWSCredentialsProvider"
# AWS's own endpoints: delta-rs builds them from the region, as S3A does.
_AWS_ENDPOINT = re.compile(r"^s3[.-](?:(?P<region>[a-z0-9-]+)\.)?amazonaws\.com(?:\.cn)?$")

Source = Literal["storage_options", "spark_session", "default_chain"]


def credential_setting_names(bucket: str) -> tuple[str, ...]:
    """The full names of the S3A credential settings for ``bucket`` (per-bucket and general),
    which a Hadoop credential provider may hold instead of the configuration."""
    return tuple(
        f"{S3A_PREFIX}{scope}{name}"
        for scope in ("", f"bucket.{bucket}.")
        for name in CREDENTIAL_SETTINGS
    )


@dataclass(frozen=True)
class S3aStorageOptions:
    """delta-rs options for one bucket, and the ``fs.s3a.*`` setting each came from."""

    bucket: str
    options: dict[str, str] = field(repr=False)
    settings: dict[str, str] = field(default_factory=dict)  # delta-rs option -> S3A setting


def bucket_settings(bucket: str, settings: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """S3A's settings for ``bucket``: ``{name: (value, setting)}``, ``name`` without
    ``fs.s3a.``; ``fs.s3a.bucket.<bucket>.<name>`` overrides ``fs.s3a.<name>`` (as S3A's
    per-bucket configuration does). Empty values count as unset."""
    per_bucket = f"{S3A_PREFIX}bucket.{bucket}."
    found: dict[str, tuple[str, str]] = {}
    for prefix in (S3A_PREFIX, per_bucket):  # the bucket's own last: it wins
        for key, value in settings.items():
            name = key[len(prefix) :]
            if key.startswith(prefix) and value and not name.startswith("bucket."):
                found[name] = (value.strip(), key)
    return found


def s3a_storage_options(bucket: str, settings: Mapping[str, str]) -> S3aStorageOptions:
    """The delta-rs options (their spelling, ``sinks.log.store_options``) that S3A ``settings``
    (``fs.s3a.*``) give for ``bucket``. Pure. Keys count only as a pair (access and secret
    key); the anonymous provider becomes ``AWS_SKIP_SIGNATURE``; an endpoint without a
    scheme gets ``connection.ssl.enabled``'s (https unless ``false``); AWS's own endpoints
    are left to delta-rs, from the region; ``path.style.access=true`` becomes
    ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST=false`` (delta-rs's default is path style already)."""
    found = bucket_settings(bucket, settings)
    options: dict[str, str] = {}
    sources: dict[str, str] = {}

    def put(option: str, value: str, setting: str) -> None:
        options[option] = value
        sources[option] = setting

    if "access.key" in found and "secret.key" in found:
        for name, option in CREDENTIAL_SETTINGS.items():
            if name in found:
                put(option, *found[name])
    elif ANONYMOUS_PROVIDER in found.get(CREDENTIALS_PROVIDER, ("", ""))[0]:
        put("AWS_SKIP_SIGNATURE", "true", found[CREDENTIALS_PROVIDER][1])
    region = found.get(REGION)
    if ENDPOINT in found:
        endpoint, setting = found[ENDPOINT]
        if "://" not in endpoint:
            ssl = found.get(SSL_ENABLED, ("true", ""))[0].lower() != "false"
            endpoint = f"{'https' if ssl else 'http'}://{endpoint}"
        aws = _AWS_ENDPOINT.match(urlparse(endpoint).hostname or "")
        if aws is None:
            put("AWS_ENDPOINT_URL", endpoint.rstrip("/"), setting)
        elif region is None and aws.group("region"):
            put("AWS_REGION", aws.group("region"), setting)
    if region is not None:
        put("AWS_REGION", *region)
    if found.get(PATH_STYLE_ACCESS, ("", ""))[0].lower() == "true":
        put("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false", found[PATH_STYLE_ACCESS][1])
    return S3aStorageOptions(bucket, options, sources)


@dataclass(frozen=True)
class ResolvedStorageOptions:
    """The storage options a sink uses, where they came from, and the settings that gave
    its credentials (names only: what to check when the store refuses them)."""

    options: dict[str, str] = field(repr=False)
    source: Source
    settings: dict[str, str] = field(default_factory=dict)  # delta-rs option -> S3A setting

    @property
    def credential_settings(self) -> tuple[str, ...]:
        """The S3A settings that gave the keys (what to check when S3 refuses them)."""
        keys = CREDENTIAL_SETTINGS.values()
        return tuple(setting for option, setting in self.settings.items() if option in keys)

    def describe(self, uri: str) -> str:
        """One line for the log: the source and the settings, never a value."""
        if self.source == "storage_options":
            return (
                f"{uri}: storage options as given to the sink ({', '.join(sorted(self.options))})"
            )
        if self.source == "spark_session":
            return (
                f"{uri}: storage options from the Spark session's S3A settings "
                f"({', '.join(dict.fromkeys(self.settings.values()))}); "
                "commits use a conditional put"
            )
        return (
            f"{uri}: no storage_options and no fs.s3a keys in the Spark session: each process "
            "uses the AWS default chain (environment, profile, instance or container role)"
        )


def resolve_storage_options(
    uri: str,
    storage_options: Mapping[str, str] | None,
    session_settings: Callable[[], Mapping[str, str]] | None,
) -> ResolvedStorageOptions:
    """The storage options for the log at ``uri`` (canonical): the given ones when there are
    any (they win, whole); else, on S3, those the session's ``fs.s3a.*`` settings give
    (``session_settings()``, called only then; None or an empty mapping when there is no
    session), with commit safety added. Logs the choice in one line for an S3 log."""
    if storage_options or store_of(uri) != "s3":
        resolved = ResolvedStorageOptions(dict(storage_options or {}), "storage_options")
        if store_of(uri) == "s3":
            logger.info(resolved.describe(uri))
        return resolved
    bucket = urlparse(uri).netloc
    translated = s3a_storage_options(bucket, (session_settings and session_settings()) or {})
    source: Source = "spark_session" if translated.options else "default_chain"
    options = delta_storage_options(uri, translated.options) if translated.options else {}
    resolved = ResolvedStorageOptions(options, source, translated.settings)
    logger.info(resolved.describe(uri))
    return resolved


# -- a refused credential ------------------------------------------------------------------

# S3's answers to credentials it does not accept (403).
REFUSED_CODES = (
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "AccessDenied",
)
_CODE = re.compile(r"<Code>(\w+)</Code>")


@contextmanager
def credentials_checked(uri: str, resolved: ResolvedStorageOptions) -> Iterator[None]:
    """Turn a 403 from the log's bucket, inside the block, into `CredentialsRefusedError`
    naming the bucket, S3's code and the settings that gave the credentials. The message
    carries no credential value (they are scrubbed should the store echo one)."""
    try:
        yield
    except OSError as error:
        text = str(error)
        codes = [c for c in _CODE.findall(text) if c in REFUSED_CODES]
        if store_of(uri) != "s3" or not (codes or "403 Forbidden" in text):
            raise
        bucket = urlparse(uri).netloc
        code = codes[0] if codes else "403 Forbidden"
        raise CredentialsRefusedError(
            _scrubbed(
                f"{uri}: bucket {bucket!r} refused the credentials ({code}) {_checks(resolved)}",
                resolved.options,
            ),
            bucket=bucket,
            code=code,
        ) from None


def _checks(resolved: ResolvedStorageOptions) -> str:
    if resolved.source == "spark_session" and "AWS_ACCESS_KEY_ID" in resolved.options:
        return "taken from the Spark session: check " + ", ".join(resolved.credential_settings)
    if resolved.source == "storage_options":
        named = [k for k in resolved.options if k.upper() in CREDENTIAL_SETTINGS.values()]
        return "given in storage_options: check " + (", ".join(named) or "their credentials")
    return (
        "of the AWS default chain: set fs.s3a.access.key and fs.s3a.secret.key "
        "(or fs.s3a.bucket.<bucket>.*) in the session, or pass storage_options"
    )


def _scrubbed(message: str, options: Mapping[str, str]) -> str:
    for key, value in options.items():
        if key.upper() in CREDENTIAL_SETTINGS.values() and value:
            message = message.replace(value, "***")
    return message
