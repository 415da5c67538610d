"""A fault-injecting HTTP proxy on loopback, between S3 clients and an S3 server.

Both of the sink's S3 clients talk to it as if it were the server: delta-rs
(object_store: commits, log reads and listings) and pyarrow's S3FileSystem (segment
writes, reads and deletes, on the driver and on executors). Each request is sorted
into a kind, and for each kind a rate says how often it fails, and how:

- ``500``: ``InternalError``; ``503``: ``SlowDown`` (S3's throttling answer);
- ``timeout``: the request is held past the client's timeout, then dropped;
- ``reset``: the connection is reset (TCP RST) without an answer;
- ``500-after`` / ``reset-after``: the request *reaches the server*, then the client
  gets a 500 or a reset. The object exists, the client believes it failed: on the
  commit's conditional PUT (``If-None-Match`` on ``_delta_log/*.json``) its retry gets
  412 for its own commit.

Faults are drawn from a seeded generator, so a run can be repeated; ``injected``
counts them by (kind, fault) and ``requests`` counts every request by kind.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PUT, CONDITIONAL_PUT, GET, HEAD, LIST, DELETE = (
    "PUT",
    "conditional PUT",
    "GET",
    "HEAD",
    "LIST",
    "DELETE",
)
KINDS = (PUT, CONDITIONAL_PUT, GET, HEAD, LIST, DELETE)
FAULTS_BEFORE = ("500", "503", "timeout", "reset")
FAULTS_AFTER = ("500-after", "reset-after")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te"}


def request_kind(method: str, target: str, headers: Mapping[str, str]) -> str:
    """The kind of an S3 request (path-style addressing: ``/bucket/key?query``)."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    key = parts.path.lstrip("/").partition("/")[2]
    if method == "DELETE" or (method == "POST" and "delete" in query):
        return DELETE
    if method in ("PUT", "POST"):
        conditional = headers.get("If-None-Match") is not None
        return CONDITIONAL_PUT if conditional and "_delta_log/" in key else PUT
    if method == "HEAD":
        return HEAD
    if not key or "list-type" in query:
        return LIST
    return GET


class FaultProxy:
    """The proxy: ``endpoint`` is what clients use; ``rates`` maps a kind to its fault rate.

    ``faults`` lists the faults drawn from (per kind, those that apply: the ``-after``
    ones only for PUTs). ``hold_s`` is how long a ``timeout`` holds a request.
    """

    def __init__(
        self,
        upstream: str,
        *,
        seed: int = 21,
        hold_s: float = 3.0,
        faults: Sequence[str] = (*FAULTS_BEFORE, *FAULTS_AFTER),
    ) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rates: dict[str, float] = {}
        self.faults = tuple(faults)
        self.hold_s = hold_s
        self.injected: Counter[tuple[str, str]] = Counter()
        self.requests: Counter[str] = Counter()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def set_rates(self, rates: Mapping[str, float] | float) -> None:
        """Fault rates per kind (a number: the same for every kind); 0 heals."""
        with self._lock:
            if isinstance(rates, int | float):
                self.rates = dict.fromkeys(KINDS, float(rates))
            else:
                self.rates = dict(rates)

    def injected_by_kind(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for (kind, _), n in self.injected.items():
            counts[kind] += n
        return dict(counts)

    def draw(self, kind: str) -> str | None:
        """The fault for one request of ``kind``, or None; counted when drawn."""
        with self._lock:
            self.requests[kind] += 1
            if self._random.random() >= self.rates.get(kind, 0.0):
                return None
            allowed = [f for f in self.faults if kind in (PUT, CONDITIONAL_PUT) or "after" not in f]
            if not allowed:
                return None
            fault = self._random.choice(allowed)
            self.injected[(kind, fault)] += 1
            return fault


class _QuietServer(ThreadingHTTPServer):
    """Clients that time out or are reset drop connections: not worth a traceback."""

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        try:
            self._proxy()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up on this request (its timeout)

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _proxy(self) -> None:
        body = self._read_body()
        kind = request_kind(self.command, self.path, self.headers)
        fault = self.owner.draw(kind)
        if fault in ("500", "503"):
            self._error(int(fault))
            return
        if fault == "timeout":
            time.sleep(self.owner.hold_s)
            self._reset()
            return
        if fault == "reset":
            self._reset()
            return
        status, headers, payload = self._forward(body)
        if fault == "500-after":
            self._error(500)
        elif fault == "reset-after":
            self._reset()
        else:
            self._respond(status, headers, payload)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            return response.status, response.getheaders(), payload
        finally:
            connection.close()

    def _respond(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
        self.send_response(status)
        sent_length = False
        for key, value in headers:
            if key.lower() in _HOP_BY_HOP or key.lower() in ("server", "date"):
                continue
            sent_length |= key.lower() == "content-length"
            self.send_header(key, value)
        if not sent_length:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _error(self, status: int) -> None:
        code, message = (
            ("SlowDown", "Please reduce your request rate.")
            if status == 503
            else ("InternalError", "We encountered an internal error. Please try again.")
        )
        payload = (
            f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _reset(self) -> None:
        """Close the connection with a TCP RST (SO_LINGER 0), no answer."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass
