"""Where a log lives: one URI understood alike by Spark, pyarrow and delta-rs.

The sink names a table by one *canonical* URI and translates it for each reader:

- a local path becomes absolute, because executors resolve relative paths
  against their own working directory, which is not the driver's;
- ``s3a://`` and ``s3n://`` (Hadoop's names) become ``s3://``, the name delta-rs
  and pyarrow use, so one table has one URI and one default ``sink_id``;
- ``gs://``, ``abfs://`` and ``abfss://`` (and delta-rs's ``az://``) pass through.

Credentials and endpoints come from storage options in delta-rs's spelling
(``AWS_ENDPOINT_URL``, ``azure_storage_account_key``, ...; case-insensitive) and,
for whatever they leave out, from the environment *of the process that opens the
store*: executors read their own environment, never the driver's, so a cluster
sets them on every node (``spark.executorEnv.*`` or the container's env).

Commits on S3 are safe between concurrent writers only with a put-if-absent:
`delta_storage_options` asks delta-rs for conditional put (``If-None-Match``)
unless the caller chose a locking provider or unsafe renames.

The sink's put-if-absent keeps its own commits from overwriting anyone's, but not another
engine's from overwriting the sink's: delta-spark beside the sink is safe only with a log
store that is put-if-absent across processes (`unsafe_beside_delta_spark` names the ones that
are not, docs/operations.md, "Two engines committing at once").

Both clients retry a failed request by themselves, and one set of options tunes
both (`s3_retry_settings`): delta-rs's object_store retries 5xx answers (500, 503
SlowDown), connection errors and timeouts with exponential backoff (``max_retries``,
default 10; ``retry_timeout``, default 3 min; ``timeout``, the per-request timeout,
default 30 s; ``connect_timeout``, default 5 s); pyarrow's S3 file system is given the
AWS standard retry strategy with as many attempts (``max_retries`` + 1; pyarrow's own
default is 3) and the same connect timeout. What neither can retry is a request that
reached the store and whose answer was lost: a commit's conditional PUT then meets
its own commit (412), which `sinks.log.log_table` recognises by the commit's token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from checkpoints.table_read import read_whole_table
from sinks.errors import ConfigError, UnsupportedStoreError

Store = Literal["local", "s3", "gcs", "azure"]

_STORES: dict[str, Store] = {
    "": "local",
    "file": "local",
    "s3": "s3",
    "s3a": "s3",
    "s3n": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "abfs": "azure",
    "abfss": "azure",
    "az": "azure",
    "azure": "azure",
    "adl": "azure",
}
_CANONICAL_SCHEME = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}
# delta-rs options that already decide how S3 commits are made safe.
_S3_COMMIT_SAFETY = ("conditional_put", "s3_locking_provider", "s3_allow_unsafe_rename")
_S3_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
DEFAULT_MAX_RETRIES = 10
"""object_store's default ``max_retries``; pyarrow is given as many (its own default is 2)."""


def store_of(uri: str) -> Store:
    """Which object store (or the local file system) ``uri`` lives in."""
    scheme = _scheme(uri)
    try:
        return _STORES[scheme]
    except KeyError:
        raise UnsupportedStoreError(
            f"{uri!r}: scheme {scheme!r} is not supported "
            f"(use a local path, s3://, s3a://, gs://, abfss:// or az://)"
        ) from None


def normalize_uri(path: str | os.PathLike[str]) -> str:
    """The canonical URI: an absolute local path, or an object-store URI with one scheme name.

    Idempotent. ``s3a://b/t`` and ``s3://b/t/`` both give ``s3://b/t``.
    """
    text = os.fspath(path)
    parsed = urlparse(text)
    if _scheme(text) == "":
        local = parsed.path if parsed.scheme == "file" else text
        return os.path.abspath(os.path.expanduser(local))
    store_of(text)
    scheme = parsed.scheme.lower()
    rest = text[len(parsed.scheme) :]
    return (_CANONICAL_SCHEME.get(scheme, scheme) + rest).rstrip("/")


DELTA_SPARK_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_SPARK_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_SPARK_CONF = {  # what puts delta-spark on a session
    "spark.sql.extensions": DELTA_SPARK_EXTENSION,
    "spark.sql.catalog.spark_catalog": DELTA_SPARK_CATALOG,
}
DELTA_SPARK_LOG_STORE = "spark.delta.logStore.{}.impl"
DELTA_SPARK_LOG_STORE_CLASS = "spark.delta.logStore.class"
_DELTA_SPARK_SCHEMES: dict[Store, tuple[str, ...]] = {
    "local": ("file",),
    "s3": ("s3", "s3a", "s3n"),
    "gcs": ("gs",),
    "azure": ("abfs", "abfss", "adl", "wasb", "wasbs"),
}
# What delta-spark 4.4 uses when no log store is configured (its DelegatingLogStore).
_DELTA_SPARK_DEFAULT = {"local": "HDFSLogStore", "s3": "S3SingleDriverLogStore"}
# Log stores whose commit files another process (the sink's delta-rs) can race, and why.
_UNSAFE_LOG_STORES: dict[tuple[Store, str], str] = {
    ("s3", "S3SingleDriverLogStore"): (
        "checks that a commit file is absent and then PUTs it unconditionally, which is "
        "exclusive only among the writers of one Spark driver"
    ),
    ("s3", "S3DynamoDBLogStore"): (
        "makes a commit exclusive through a DynamoDB table that delta-rs 1.x, the sink's "
        "committer, no longer uses, and then PUTs it unconditionally"
    ),
    ("local", "HDFSLogStore"): (
        "checks that a commit file is absent and then renames over it (the local file "
        "system's rename replaces a file), which is exclusive only inside its own JVM"
    ),
    ("local", "LocalLogStore"): (
        "checks that a commit file is absent and then renames over it, which is exclusive "
        "only inside its own JVM"
    ),
}


def unsafe_beside_delta_spark(uri: str, spark_conf: Mapping[str, str | None]) -> str | None:
    """Why delta-spark, as ``spark_conf`` sets it up, and the sink committing to ``uri`` at
    the same time can overwrite one another's commits; None when the session has no
    delta-spark, or its log store for the store of ``uri`` is put-if-absent across processes
    (GCS and Azure's, a custom one). Pure.

    ``spark_conf`` holds the session's ``spark.sql.extensions``,
    ``spark.sql.catalog.spark_catalog`` and delta-spark's log store keys
    (`delta_spark_conf_keys`); the sink's own commits are put-if-absent
    (`delta_storage_options`), so only delta-spark's side decides.
    """
    if not has_delta_spark(spark_conf):
        return None
    store = store_of(uri)
    unsafe: dict[str, list[str]] = {}  # log store -> the schemes it serves
    for scheme in _DELTA_SPARK_SCHEMES[store]:
        configured = spark_conf.get(DELTA_SPARK_LOG_STORE.format(scheme)) or spark_conf.get(
            DELTA_SPARK_LOG_STORE_CLASS
        )
        log_store = (configured or _DELTA_SPARK_DEFAULT.get(store, "")).rsplit(".", 1)[-1]
        if (store, log_store) in _UNSAFE_LOG_STORES:
            unsafe.setdefault(log_store, []).append(scheme)
    if not unsafe:
        return None
    reasons = "; ".join(
        f"its log store for {_paths(store, schemes)} ({log_store}) "
        f"{_UNSAFE_LOG_STORES[(store, log_store)]}"
        for log_store, schemes in unsafe.items()
    )
    return (
        f"log {uri}: this session has delta-spark, and {reasons}. A delta-spark commit "
        "(append, OPTIMIZE, DELETE, ...) made while the sink commits to this log can overwrite "
        "the sink's commit, and a batch or a pass is then lost without an error. Reading with "
        "delta-spark is safe; let it write to this log only while no sink or cleaner commits "
        'to it (see docs/operations.md, "Two engines committing at once").'
    )


def has_delta_spark(spark_conf: Mapping[str, str | None]) -> bool:
    """Whether session settings (``DELTA_SPARK_CONF``'s keys) put delta-spark on it. Pure."""
    extensions = spark_conf.get("spark.sql.extensions") or ""
    catalog = spark_conf.get("spark.sql.catalog.spark_catalog") or ""
    return DELTA_SPARK_EXTENSION in extensions or catalog == DELTA_SPARK_CATALOG


def _paths(store: Store, schemes: Iterable[str]) -> str:
    return "a local path" if store == "local" else ", ".join(f"{s}://" for s in schemes)


def delta_spark_conf_keys(uri: str) -> list[str]:
    """The session settings `unsafe_beside_delta_spark` reads for ``uri``."""
    schemes = _DELTA_SPARK_SCHEMES[store_of(uri)]
    return [
        *DELTA_SPARK_CONF,
        DELTA_SPARK_LOG_STORE_CLASS,
        *(DELTA_SPARK_LOG_STORE.format(s) for s in schemes),
    ]


@dataclass(frozen=True)
class LogLocation:
    """Where a log lives: its Delta table's URI and the object store's options.

    What low-level helpers take instead of ``(uri, storage_options)``; options use
    delta-rs's names (see the module docstring). Built once, by `LogTable`.
    """

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    @property
    def delta_options(self) -> dict[str, str] | None:
        """The options as delta-rs takes them: None when there are none."""
        return dict(self.storage_options) or None

    def delta_table(self, version: int | None = None) -> DeltaTable:
        """The Delta table here (at ``version``, else the latest), opened by delta-rs."""
        return DeltaTable(self.uri, version=version, storage_options=self.delta_options)

    def latest_version(self) -> int:
        """The latest version of the Delta table here (one read of its log); fails as
        `delta_table` does when there is no table. Read-only."""
        return self.delta_table().version()

    def txn_version(self, app_id: str) -> int | None:
        """The version the latest ``txn`` action of ``app_id`` records in the table here; None
        when there is none, or no table. Read-only."""
        try:
            return self.delta_table().transaction_version(app_id)
        except TableNotFoundError:
            return None

    def delta_table_if_any(self) -> DeltaTable | None:
        """The table here at its latest version; None when there is no table. Read-only."""
        try:
            return self.delta_table()
        except TableNotFoundError:
            return None

    def read_arrow(self) -> pa.Table | None:
        """Every row of the table here, at its latest version; None when there is no table.
        Read-only; read on this thread, not by ``to_pyarrow_table`` (design.md §58)."""
        try:
            return read_whole_table(self.delta_table())
        except TableNotFoundError:
            return None

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow file system and the table's root path in it (`arrow_filesystem`)."""
        return arrow_filesystem(self.uri, self.storage_options)


def is_local(uri: str) -> bool:
    """True when the URI is a path on the local file system."""
    return _scheme(uri) == ""


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI with '/', whatever the platform."""
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def sibling(uri: str, name: str) -> str:
    """The URI of ``name`` in the same directory as ``uri``."""
    parent = uri.rstrip("/").rsplit("/", 1)[0]
    return join(parent, name)


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
    endpoint = _option(options, "s3", "endpoint") or _env(*_S3_ENDPOINT_ENV)
    if endpoint and endpoint.startswith("http://") and "allow_http" not in given:
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def arrow_filesystem(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system and the root path inside it for ``uri``.

    Safe to call on executors: it reads only its arguments and the environment of
    the process it runs in. Options use delta-rs's names (see the module docstring).
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


# -- per-store file systems --------------------------------------------------------------


def _s3_filesystem(options: Mapping[str, str]) -> pafs.S3FileSystem:
    endpoint = _option(options, "s3", "endpoint") or _env(*_S3_ENDPOINT_ENV)
    scheme, host = None, None
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        scheme, host = parsed.scheme, parsed.netloc
    virtual_hosted = _option(options, "s3", "virtual_hosted_style_request")
    retries = s3_retry_settings(options)
    return pafs.S3FileSystem(
        access_key=_option(options, "s3", "access_key_id"),
        secret_key=_option(options, "s3", "secret_access_key"),
        session_token=_option(options, "s3", "session_token"),
        region=_option(options, "s3", "region") or _env("AWS_REGION", "AWS_DEFAULT_REGION"),
        endpoint_override=host,
        scheme=scheme,
        force_virtual_addressing=(virtual_hosted or "").lower() == "true",
        connect_timeout=retries.connect_timeout_s,
        request_timeout=retries.timeout_s,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=retries.max_retries + 1),
    )


@dataclass(frozen=True)
class RetrySettings:
    """How a client retries a failed request: delta-rs's option names, pyarrow's units."""

    max_retries: int
    timeout_s: float | None
    connect_timeout_s: float | None


def s3_retry_settings(options: Mapping[str, str]) -> RetrySettings:
    """The retry settings ``options`` give (delta-rs's names: ``max_retries``, ``timeout``,
    ``connect_timeout``), with object_store's defaults. Raises `ConfigError` naming a bad key.

    pyarrow applies ``timeout`` only on Windows and macOS; on Linux its AWS SDK gives up
    on a request that receives nothing for 3 s and retries it.
    """
    raw = _option(options, "s3", "max_retries")
    try:
        max_retries = DEFAULT_MAX_RETRIES if raw is None else int(raw)
        if max_retries < 0:
            raise ValueError(raw)
    except ValueError:
        raise ConfigError(f"max_retries: {raw!r} is not a number of retries (0 or more)") from None
    return RetrySettings(
        max_retries=max_retries,
        timeout_s=_seconds(options, "timeout"),
        connect_timeout_s=_seconds(options, "connect_timeout"),
    )


def _seconds(options: Mapping[str, str], name: str) -> float | None:
    """A duration option as object_store writes them (``30s``, ``500ms``, ``2 min``, ``5``)."""
    raw = _option(options, "s3", name)
    if raw is None:
        return None
    match = _DURATION.fullmatch(raw.strip().lower())
    if match is None:
        raise ConfigError(f"{name}: {raw!r} is not a duration (such as 30s, 500ms or 2min)")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * _UNIT_S[unit]


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?|m|min|mins|minutes?)?")
_UNIT_S = {
    "ms": 0.001,
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
}


def _gcs_filesystem(options: Mapping[str, str]) -> pafs.GcsFileSystem:
    # pyarrow takes no key file: GOOGLE_APPLICATION_CREDENTIALS names it on every node.
    endpoint = _option(options, "gcs", "endpoint")
    scheme, host = None, None
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        scheme, host = parsed.scheme, parsed.netloc
    return pafs.GcsFileSystem(endpoint_override=host, scheme=scheme)


def _azure_filesystem(uri: str, options: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    parsed = urlparse(uri)
    container, _, host = parsed.netloc.partition("@")
    account = _option(options, "azure", "storage_account_name") or (
        host.split(".", 1)[0] if host else os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    )
    if not account:
        raise UnsupportedStoreError(
            f"{uri!r}: no Azure storage account (name it in the URI's host "
            "or in azure_storage_account_name)"
        )
    key = _option(options, "azure", "storage_account_key") or _option(
        options, "azure", "storage_access_key"
    )
    fs = pafs.AzureFileSystem(
        account,
        account_key=key or os.environ.get("AZURE_STORAGE_ACCOUNT_KEY"),
        sas_token=_option(options, "azure", "storage_sas_key"),
        client_id=_option(options, "azure", "client_id"),
        client_secret=_option(options, "azure", "client_secret"),
        tenant_id=_option(options, "azure", "tenant_id"),
    )
    return fs, f"{container}{parsed.path}".rstrip("/")


# -- option and URI helpers --------------------------------------------------------------

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


def _option(options: Mapping[str, str], store: str, name: str) -> str | None:
    """An option under delta-rs's names: ``AWS_REGION``, ``aws_region`` or ``region``."""
    wanted = set(_ALIASES.get((store, name), (name,)))
    for key, value in options.items():
        if _bare(key, _PREFIX[store]) in wanted:
            return value
    return None


def _bare(key: str, prefix: str) -> str:
    key = key.lower()
    return key[len(prefix) :] if key.startswith(prefix) else key


def _env(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def _scheme(uri: str) -> str:
    scheme = urlparse(uri).scheme.lower()
    # "C:\\lake" has a one-letter "scheme" that is a Windows drive.
    return "" if scheme in ("", "file") or len(scheme) == 1 else scheme


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
