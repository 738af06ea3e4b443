"""S3 for tests: a moto server on 127.0.0.1, reached through a fault-injecting HTTP proxy.

Fixtures:
    s3_server     (session) the moto server and the proxy in front of it.
    s3_faults     the FaultProxy: fail_next(n, status), stall_next(n, seconds), drop_next(n), go_away()/come_back(),
                  hold_body_next(n, after_bytes)/release_bodies() (an answer's head and first bytes, the rest later),
                  black_hole()/come_back() (connections accepted, nothing ever answered, not even "100 Continue").
                  Faults are cleared after each test, and botocore's retry backoff is capped at 50 ms during it.
    s3_endpoint   the proxy's URL, with dummy AWS credentials and region us-east-1 in the environment (and the AWS
                  config files pointed away) for the test.
    s3_bucket     a fresh, empty bucket for the test.
    s3_admin      a boto3 client that talks to moto directly (no faults), for setup and inspection.
    s3_store      an S3ObjectStore on s3_bucket under prefix "store" through the proxy, with short timeouts and 3
                  attempts, a 30 s request deadline (not 5 s: see the fixture), closed after the test.

moto's server mode has no fault API, so faults are injected by the proxy, which parses each HTTP/1.1 request and
either forwards it to moto or, while a fault is queued, answers it itself. A stalled or dropped request is never
forwarded: a request the client gave up on is not applied behind its back, so tests stay deterministic.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
import pytest_asyncio
from botocore.retries.standard import ExponentialBackoff
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "expect"}
)
_ERROR_CODES = {500: "InternalError", 502: "BadGateway", 503: "SlowDown", 504: "GatewayTimeout"}


@dataclass(frozen=True)
class _Fault:
    kind: str  # "fail", "stall", "drop" or "hold" (the body after `after_bytes` waits for release_bodies())
    status: int = 0
    after_bytes: int = 0
    seconds: float = 0.0
    match: Callable[[str, str], bool] | None = None  # (method, path) -> whether this fault hits that request


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of moto. Faults queued with the methods below hit the next requests, in
    order; go_away() drops every request until come_back(). `match(method, path)` limits a fault to the requests it
    accepts (path includes the query string, e.g. "?partNumber=2&uploadId=...")."""

    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._queue: deque[_Fault] = deque()
        self._away = False
        self._black_hole = threading.Event()  # set while every request is held unanswered
        self._released = threading.Event()
        self._bodies_released = threading.Event()  # cleared while "hold" answers wait for release_bodies()
        self._bodies_released.set()
        self._wake = threading.Event()  # set to cut stalls short (reset)
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request received
        self.faults_served = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _ProxyHandler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def fail_next(self, n: int, status: int = 503, *, match: Callable[[str, str], bool] | None = None) -> None:
        """Answer the next n requests with `status` and an S3 error body."""
        self._enqueue(n, _Fault("fail", status=status, match=match))

    def stall_next(self, n: int, seconds: float, *, match: Callable[[str, str], bool] | None = None) -> None:
        """Hold the next n requests for `seconds` (past the client's read timeout), then drop them."""
        self._enqueue(n, _Fault("stall", seconds=seconds, match=match))

    def drop_next(self, n: int, *, match: Callable[[str, str], bool] | None = None) -> None:
        """Close the connection of the next n requests without answering."""
        self._enqueue(n, _Fault("drop", match=match))

    def hold_body_next(self, n: int, after_bytes: int, *, match: Callable[[str, str], bool] | None = None) -> None:
        """Answer the next n requests with their head and first `after_bytes` body bytes, and the rest of the body
        only once release_bodies() is called (at most two minutes later)."""
        self._bodies_released.clear()
        self._enqueue(n, _Fault("hold", after_bytes=after_bytes, match=match))

    def release_bodies(self) -> None:
        self._bodies_released.set()

    def pending(self) -> int:
        """Faults queued and not served yet."""
        with self._lock:
            return len(self._queue)

    def go_away(self) -> None:
        with self._lock:
            self._away = True

    def black_hole(self) -> None:
        """Accept every connection and answer nothing, until come_back(): the store that hangs."""
        self._released.clear()
        self._black_hole.set()

    def come_back(self) -> None:
        with self._lock:
            self._away = False
        self._black_hole.clear()
        self._released.set()

    def held(self) -> bool:
        """Inside the black hole: holds the calling request until come_back() (at most two minutes). True if it
        was held: its connection is then closed unanswered."""
        if not self._black_hole.is_set():
            return False
        with self._lock:
            self.requests.append(("HELD", ""))
            self.faults_served += 1
        self._released.wait(120)
        return True

    def reset(self) -> None:
        self._black_hole.clear()
        self._released.set()
        self._bodies_released.set()
        with self._lock:
            self._queue.clear()
            self._away = False
            self.requests.clear()
            self.faults_served = 0
        self._wake.set()
        self._wake = threading.Event()

    def close(self) -> None:
        self.reset()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _enqueue(self, n: int, fault: _Fault) -> None:
        with self._lock:
            self._queue.extend([fault] * n)

    def _next_fault(self, method: str, path: str) -> tuple[_Fault | None, threading.Event]:
        with self._lock:
            self.requests.append((method, path))
            fault = _Fault("drop") if self._away else None
            if fault is None:
                for i, queued in enumerate(self._queue):
                    if queued.match is None or queued.match(method, path):
                        fault = queued
                        del self._queue[i]
                        break
            if fault is not None:
                self.faults_served += 1
            return fault, self._wake


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and "Expect: 100-continue" answered as a server would
    # Headers and body leave in separate writes: with Nagle on, the body would wait for the client's delayed ACK
    # (tens of ms per request on loopback).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return None

    def handle_expect_100(self) -> bool:
        if self.server.proxy.held():  # type: ignore[attr-defined]
            self._hang_up()
            return False
        return super().handle_expect_100()

    def _hang_up(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _proxy(self) -> None:
        proxy: FaultProxy = self.server.proxy  # type: ignore[attr-defined]
        if proxy.held():
            self._hang_up()
            return
        body = self._read_body()
        fault, wake = proxy._next_fault(self.command, self.path)
        if fault is not None and fault.kind == "stall":
            wake.wait(fault.seconds)
        if fault is not None and fault.kind in ("stall", "drop"):
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault is not None and fault.kind != "hold":
            code = _ERROR_CODES.get(fault.status, "InternalError")
            payload = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>injected by the test proxy</Message><RequestId>fault</RequestId></Error>"
            ).encode()
            self._respond(fault.status, [("Content-Type", "application/xml")], payload)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            response_headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        finally:
            upstream.close()
        if self.command != "HEAD":  # a HEAD answer keeps moto's Content-Length: the object's size
            response_headers = [(k, v) for k, v in response_headers if k.lower() != "content-length"]
            response_headers.append(("Content-Length", str(len(data))))
        if fault is not None:  # "hold": the head and the first bytes now, the rest once released
            self._respond(response.status, response_headers, data, hold_after=fault.after_bytes,
                          release=proxy._bodies_released)
            return
        self._respond(response.status, response_headers, data)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _respond(self, status: int, headers: list[tuple[str, str]], data: bytes, hold_after: int | None = None,
                 release: threading.Event | None = None) -> None:
        self.send_response(status)
        has_length = False
        for k, v in headers:
            has_length |= k.lower() == "content-length"
            self.send_header(k, v)
        if not has_length:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            if hold_after is not None and release is not None:
                self.wfile.write(data[:hold_after])
                self.wfile.flush()
                release.wait(120)
                data = data[hold_after:]
            self.wfile.write(data)


@dataclass
class S3Server:
    moto_url: str
    proxy: FaultProxy


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    proxy = FaultProxy(host, port)
    try:
        yield S3Server(f"http://{host}:{port}", proxy)
    finally:
        proxy.close()
        moto.stop()


@pytest.fixture(scope="session")
def s3_admin(s3_server: S3Server):
    return boto3.client(
        "s3",
        endpoint_url=s3_server.moto_url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def s3_faults(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    # botocore backs off up to 1 s, 2 s, 4 s... on throttling (503 SlowDown); cap it so retry tests stay fast. The
    # number of attempts, which is what the tests check, is unchanged.
    delay_amount = ExponentialBackoff.delay_amount
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, ctx: min(delay_amount(self, ctx), 0.05))
    s3_server.proxy.reset()
    yield s3_server.proxy
    s3_server.proxy.reset()


@pytest.fixture
def s3_endpoint(s3_server: S3Server, s3_faults: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3_faults.url


@pytest.fixture
def s3_bucket(s3_endpoint: str, s3_admin) -> str:
    name = f"test-{uuid.uuid4().hex[:20]}"
    s3_admin.create_bucket(Bucket=name)
    return name


@pytest_asyncio.fixture
async def s3_store(s3_endpoint: str, s3_bucket: str):
    from tiered.tiering.objects.s3_store import S3ObjectStore

    store = S3ObjectStore(
        s3_bucket,
        "store",
        endpoint_url=s3_endpoint,
        region=REGION,
        path_style=True,
        max_attempts=3,
        connect_timeout_s=1.0,
        read_timeout_s=1.0,
    )
    # A request's deadline (5 s for a small one) is for a store that hangs, and is tested on brokers
    # (tests/durability/test_black_hole.py). moto runs in the test's own process: on a loaded machine it can answer
    # a small request past 5 s, which would fail a test about something else with StoreError.
    store.deadline_base_s = 30.0
    try:
        yield store
    finally:
        await store.close()
