"""moto's S3 server on loopback with one bucket, for the object-store tests (also one that
checks credentials, `authenticated_s3_server`, and one in a process of its own,
`s3_server_process`).

Credentials travel in storage options, never through the environment: local Spark's
Python workers were forked before any test could set one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow.fs as pafs

BUCKET = "lake"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bucket_options(port: int) -> dict[str, str]:
    """Create bucket `BUCKET` on the server at ``port``; the storage options that reach it."""
    pafs.S3FileSystem(
        access_key="test-key",
        secret_key="test-secret",
        endpoint_override=f"127.0.0.1:{port}",
        scheme="http",
        allow_bucket_creation=True,
    ).create_dir(BUCKET)
    return {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test-key",
        "AWS_SECRET_ACCESS_KEY": "test-secret",
        "AWS_REGION": "us-east-1",
    }


@contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """Start a moto S3 server with bucket `BUCKET`; yields the storage options that reach it."""
    from moto import server as moto_server

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    try:
        yield _bucket_options(port)
    finally:
        server.stop()
        os.environ.update(saved)


@contextmanager
def s3_server_process() -> Iterator[dict[str, str]]:
    """`s3_server` in a process of its own. An in-process server answers from Python threads,
    which wait for the GIL while a delta-rs call that keeps it blocks on its answer:
    ``alter.set_table_properties`` (deltalake 1.6.6) then waits out every retry of its
    listing (about a minute with the default retries), as the segment deleter's alignment
    of the window's properties does. A server in its own process answers at once."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start on port {port}") from None
                time.sleep(0.05)
        yield _bucket_options(port)
    finally:
        server.terminate()
        server.wait(timeout=10)
        os.environ.update(saved)


@dataclass(frozen=True)
class S3Account:
    """A moto S3 server that checks credentials, and the keys of the one user it accepts."""

    endpoint: str  # http://127.0.0.1:<port>
    access_key: str
    secret_key: str


@contextmanager
def authenticated_s3_server() -> Iterator[S3Account]:
    """Start a moto S3 server with bucket `BUCKET` that refuses wrong credentials (moto's IAM
    checks on: a signature made with another secret gets ``SignatureDoesNotMatch``, an
    unknown key ``InvalidAccessKeyId``); yields the endpoint and the keys of a user allowed
    ``s3:*``. The in-process server shares moto's settings: IAM checks are off again after."""
    import boto3
    from moto import server as moto_server
    from moto.core.authorization import enable_iam_authentication

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    admin = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "admin",
        "aws_secret_access_key": "admin",
    }
    try:
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="job")
        allow_s3 = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
        iam.put_user_policy(
            UserName="job",
            PolicyName="lake",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [allow_s3]}),
        )
        key = iam.create_access_key(UserName="job")["AccessKey"]
        boto3.client("s3", **admin).create_bucket(Bucket=BUCKET)
        with enable_iam_authentication():
            yield S3Account(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        server.stop()
