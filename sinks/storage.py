"""Where a log lives: one URI understood alike by Spark, pyarrow and delta-rs.

A local path is made absolute (executors resolve relative paths against their
own working directory, which is not the driver's). Object-store URIs pass
through unchanged; `arrow_filesystem` opens them for the executors' writers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlparse

import pyarrow.fs as pafs


def normalize_uri(path: str | os.PathLike[str]) -> str:
    """An absolute local path, or the URI unchanged when it has a scheme other than file."""
    text = os.fspath(path)
    parsed = urlparse(text)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # "C:" is a drive, not a scheme
        local = parsed.path if parsed.scheme == "file" else text
        return os.path.abspath(local)
    return text.rstrip("/")


def is_local(uri: str) -> bool:
    """True when the URI is a path on the local file system."""
    return urlparse(uri).scheme in ("", "file")


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI with '/', whatever the platform."""
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def sibling(uri: str, name: str) -> str:
    """The URI of ``name`` in the same directory as ``uri``."""
    parent = uri.rstrip("/").rsplit("/", 1)[0]
    return join(parent, name)


def arrow_filesystem(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system and the root path inside it for ``uri``."""
    del storage_options  # credentials come from the environment for now
    return pafs.FileSystem.from_uri(uri if not is_local(uri) else normalize_uri(uri))


def delete_files(uri: str, paths: list[str], storage_options: Mapping[str, str] | None = None) -> int:
    """Delete data files (relative to ``uri``); a file already gone is not an error."""
    fs, root = arrow_filesystem(uri, storage_options)
    deleted = 0
    for path in paths:
        try:
            fs.delete_file(f"{root}/{path}")
            deleted += 1
        except FileNotFoundError:
            pass
    return deleted
