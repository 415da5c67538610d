"""Fixtures of the object-store tests; the S3 server and the fault proxy live beside this file."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from s3_server import s3_server


@pytest.fixture(scope="module")
def s3_options() -> Iterator[dict[str, str]]:
    """An S3 server on loopback with one bucket; the storage options that reach it."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    with s3_server() as options:
        yield options
