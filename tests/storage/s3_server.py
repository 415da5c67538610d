"""moto's S3 server on loopback with one bucket, for the object-store tests.

Credentials travel in storage options, never through the environment: local Spark's
Python workers were forked before any test could set one.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs

BUCKET = "lake"


@contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """Start a moto S3 server with bucket `BUCKET`; yields the storage options that reach it."""
    from moto import server as moto_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test-key",
        "AWS_SECRET_ACCESS_KEY": "test-secret",
        "AWS_REGION": "us-east-1",
    }
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    try:
        pafs.S3FileSystem(
            access_key="test-key",
            secret_key="test-secret",
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            allow_bucket_creation=True,
        ).create_dir(BUCKET)
        yield options
    finally:
        server.stop()
        os.environ.update(saved)
