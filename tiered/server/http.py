"""The HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (liveness), `/readyz` (readiness), read-only
JSON views such as `/v1/tier` (what `tiered tier status` prints), and a few actions (`POST /v1/compact`).

Like TANK's `-P` listener it answers GET only (405 otherwise; POST on an action's path), refuses request bodies
(413; an action's arguments are its query string) and unknown paths (404).
Readiness is true only once the broker serves and the catalog and object store have answered (`ready_check`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Awaitable, Callable
from urllib.parse import parse_qsl

from tiered.cancellation import within

# An action: the query's arguments -> (HTTP status, JSON answer).
Action = Callable[[dict[str, str]], tuple[int, object]]

log = logging.getLogger("tiered.server")

MAX_HEADER_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0
# Below the chart's probe timeout (3 s), so a hung catalog or store gets a 503 with a reason, not a probe timeout.
READY_TIMEOUT_S = 2.5


class HttpEndpoint:
    def __init__(self, metrics_text: Callable[[], str], ready_check: Callable[[], Awaitable[tuple[bool, str]]],
                 alive_check: Callable[[], bool] = lambda: True,
                 json_routes: dict[str, Callable[[], object]] | None = None,
                 actions: dict[str, Action] | None = None):
        self.metrics_text = metrics_text
        self.ready_check = ready_check
        self.alive_check = alive_check
        self.json_routes = json_routes or {}
        self.actions = actions or {}
        self.server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port, reuse_address=True, limit=MAX_HEADER_BYTES)

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await within(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            status, body, ctype = await self.respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            status, body, ctype = 400, "bad request\n", "text/plain"
        except Exception:  # a failing view (a gauge, a JSON route) answers 500; the endpoint keeps serving
            log.exception("HTTP request failed")
            status, body, ctype = 500, "internal error\n", "text/plain"
        try:
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def respond(self, head: bytes) -> tuple[int, str, str]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return 400, "bad request\n", "text/plain"
        method, target, _ = parts
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        path, _, query = target.partition("?")
        if method != ("POST" if path in self.actions else "GET"):
            return 405, "method not allowed\n", "text/plain"
        if headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers:
            return 413, "request bodies are not accepted\n", "text/plain"
        if path in self.actions:
            status, answer = self.actions[path](dict(parse_qsl(query)))
            return status, json.dumps(answer) + "\n", "application/json"
        if path.startswith("/metrics"):
            return 200, self.metrics_text(), "text/plain; version=0.0.4; charset=utf-8"
        if path == "/healthz":
            return (200, "ok\n", "text/plain") if self.alive_check() else (503, "stopping\n", "text/plain")
        if path in self.json_routes:
            return 200, json.dumps(self.json_routes[path]()) + "\n", "application/json"
        if path == "/readyz":
            try:
                ok, why = await within(self.ready_check(), READY_TIMEOUT_S)
            except TimeoutError:
                ok, why = False, f"the readiness check timed out after {READY_TIMEOUT_S} s"
            if ok:  # ready, and what it serves without (a partition that could not be opened), line by line
                return 200, "ready\n" + (f"{why}\n" if why else ""), "text/plain"
            return 503, f"not ready: {why}\n", "text/plain"
        return 404, "not found\n", "text/plain"


_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
