"""The `-P` HTTP endpoint as TANK's: GET only (405), no request bodies (413), unknown paths 404; `/healthz` while
serving; `/readyz` 200 only while both the catalog and the bucket answer, 503 naming the part that does not."""

from __future__ import annotations

import asyncio

from tiered.server.http import HttpEndpoint

from tests.ops.helpers import ahttp_get, http_request
from tests.support.polling import eventually


async def _raw(port: int, raw: bytes):
    return await asyncio.to_thread(http_request, port, raw)


async def test_get_only_no_bodies_unknown_paths_404(ops_broker):
    app = await ops_broker()
    port = app.http.port
    for method in ("POST", "PUT", "DELETE", "HEAD", "OPTIONS"):
        answer = await _raw(port, f"{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        assert answer.status == 405, method
    with_body = await _raw(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    assert with_body.status == 413
    chunked = await _raw(port, b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert chunked.status == 413
    for path in ("/", "/nope", "/health", "/readyz/x", "/v1/tiers"):
        assert (await ahttp_get(port, path)).status == 404, path
    # TANK answers `GET /metrics*`: a query string or a suffix still gets the metrics.
    for path in ("/metrics", "/metrics?name=x", "/metrics/"):
        answer = await ahttp_get(port, path)
        assert answer.status == 200 and "tanksrv_topic_produced_bytes" in answer.text, path
    garbage = await _raw(port, b"NOT-HTTP\r\n\r\n")
    assert garbage.status == 400
    assert (await ahttp_get(port, "/healthz")).text == "ok\n"


async def test_readyz_follows_the_bucket(ops_broker, s3_faults):
    s3_faults.go_away()  # before the start: the broker serves from its disk, but it is not ready
    app = await ops_broker()
    port = app.http.port
    assert (await ahttp_get(port, "/healthz")).status == 200
    answer = await ahttp_get(port, "/readyz")
    assert answer.status == 503 and answer.text.startswith("not ready: object store:"), answer.text
    s3_faults.come_back()
    assert (await ahttp_get(port, "/readyz")).status == 200
    s3_faults.go_away()
    answer = await ahttp_get(port, "/readyz")
    assert answer.status == 503 and "object store" in answer.text and "catalog" not in answer.text
    assert (await ahttp_get(port, "/healthz")).status == 200  # alive: a store outage is no reason to restart
    s3_faults.come_back()
    assert (await ahttp_get(port, "/readyz")).status == 200


async def test_readyz_follows_the_catalog(ops_broker, pg_url, pg_cluster):
    app = await ops_broker(catalog_url=pg_url)
    port = app.http.port
    assert (await ahttp_get(port, "/readyz")).status == 200
    await asyncio.to_thread(pg_cluster.stop)
    try:
        answer = await ahttp_get(port, "/readyz")
        assert answer.status == 503 and answer.text.startswith("not ready: catalog:"), answer.text
        assert (await ahttp_get(port, "/healthz")).status == 200
    finally:
        await asyncio.to_thread(pg_cluster.start)
    await eventually(lambda: _status(port, "/readyz", 200), what="/readyz to answer 200 again")


async def test_healthz_and_readyz_say_stopping_during_shutdown(ops_broker):
    app = await ops_broker(block_max_age_ms=2000)
    port = app.http.port
    from tiered.client import Client

    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("t", 1)
        producing = asyncio.ensure_future(c.produce("t", 0, [b"in flight"]))
        await asyncio.sleep(0.1)
        stopping = asyncio.ensure_future(app.broker.stop())
        await asyncio.sleep(0.1)
        assert (await ahttp_get(port, "/healthz")).status == 503
        assert (await ahttp_get(port, "/readyz")).status == 503
        await asyncio.wait_for(producing, 10)  # the open block was committed and the producer answered
        await asyncio.wait_for(stopping, 10)


async def test_a_failing_handler_answers_500_and_the_endpoint_keeps_serving():
    def broken_metrics() -> str:
        raise RuntimeError("a gauge failed")

    async def ready() -> tuple[bool, str]:
        return True, ""

    endpoint = HttpEndpoint(broken_metrics, ready)
    await endpoint.start("127.0.0.1", 0)
    try:
        answer = await ahttp_get(endpoint.port, "/metrics")
        assert answer.status == 500
        assert (await ahttp_get(endpoint.port, "/readyz")).status == 200
    finally:
        await endpoint.stop()


async def test_a_slow_readiness_check_is_answered_503_in_bounded_time(monkeypatch):
    import tiered.server.http as http

    monkeypatch.setattr(http, "READY_TIMEOUT_S", 0.2)

    async def hangs() -> tuple[bool, str]:
        await asyncio.sleep(30)
        return True, ""

    endpoint = HttpEndpoint(lambda: "", hangs)
    await endpoint.start("127.0.0.1", 0)
    try:
        answer = await asyncio.wait_for(ahttp_get(endpoint.port, "/readyz"), 5)
        assert answer.status == 503 and "timed out" in answer.text
    finally:
        await endpoint.stop()


async def test_oversized_request_heads_are_refused():
    async def ready() -> tuple[bool, str]:
        return True, ""

    endpoint = HttpEndpoint(lambda: "", ready)
    await endpoint.start("127.0.0.1", 0)
    try:
        head = b"GET /metrics HTTP/1.1\r\nX-Filler: " + b"a" * (32 * 1024) + b"\r\n\r\n"
        assert (await _raw(endpoint.port, head)).status == 400
        assert (await ahttp_get(endpoint.port, "/metrics")).status == 200
    finally:
        await endpoint.stop()


async def _status(port: int, path: str, wanted: int) -> bool:
    return (await ahttp_get(port, path)).status == wanted


async def test_readyz_names_the_reason_of_a_failing_bucket(ops_broker, s3_faults):
    app = await ops_broker()
    s3_faults.fail_next(10_000, 500, match=lambda method, path: method == "GET")
    try:
        answer = await ahttp_get(app.http.port, "/readyz")
    finally:
        s3_faults.reset()
    assert answer.status == 503, answer.text
    reason = answer.text.split("object store:", 1)[1].strip()
    assert len(reason) > 10 and ("500" in reason or "InternalError" in reason or "no answer" in reason), answer.text
