"""Create the lake's bucket on the S3-compatible store, waiting for the store to come up.

Reads the endpoint and credentials from the environment (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), like every other container. Idempotent.
"""

from __future__ import annotations

import os
import sys
import time
from urllib.parse import urlparse

import pyarrow.fs as pafs


def main(bucket: str, timeout_s: float = 120.0) -> int:
    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    fs = pafs.S3FileSystem(
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme,
        region=os.environ.get("AWS_REGION", "us-east-1"),
        allow_bucket_creation=True,
    )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fs.create_dir(bucket)
            print(f"bucket {bucket} ready at {endpoint.geturl()}", flush=True)
            return 0
        except OSError as e:
            if time.monotonic() > deadline:
                print(f"could not create bucket {bucket}: {e}", file=sys.stderr)
                return 1
            time.sleep(2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "lake"))
