"""A log's URI: one canonical name understood alike by Spark, pyarrow and delta-rs.

The sink names a table by one *canonical* URI and translates it for each reader:

- a local path becomes absolute, because executors resolve relative paths
  against their own working directory, which is not the driver's;
- ``s3a://`` and ``s3n://`` (Hadoop's names) become ``s3://``, the name delta-rs
  and pyarrow use, so one table has one URI and one default ``sink_id``;
- ``gs://``, ``abfs://`` and ``abfss://`` (and delta-rs's ``az://``) pass through.

Pure: string functions, no I/O.
"""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlparse

from sinks.errors import UnsupportedStoreError

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


def _scheme(uri: str) -> str:
    scheme = urlparse(uri).scheme.lower()
    # "C:\\lake" has a one-letter "scheme" that is a Windows drive.
    return "" if scheme in ("", "file") or len(scheme) == 1 else scheme
