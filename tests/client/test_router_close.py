"""A connection being opened (to a broker that accepts and never answers the TLS handshake) and its callers: one
cancelled caller leaves the open to the others; closing the client ends the open before close() returns (nothing
joins the pool after it), and the callers waiting for it learn that the client closed (NotSent), not a cancellation
that was never theirs."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from tiered.client.connection import NotSent
from tiered.client.routing import Router
from tiered.protocol.codes import Endpoint

from tests.support.polling import eventually


@pytest.fixture
async def opening():
    """A router opening a connection to a silent broker, and a caller waiting for it."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    endpoint = Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])
    router = Router([endpoint], connect_timeout_s=60, leader_wait_s=0, ssl_context=ssl.create_default_context())
    waiting = asyncio.ensure_future(router.connection(endpoint))
    await eventually(lambda: held, what="the connection accepted")
    try:
        yield router, router._opening[endpoint], waiting
    finally:
        await router.close()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_close_ends_the_open_and_its_callers_learn_the_client_closed(opening):
    router, task, waiting = opening
    await router.close()
    assert task.cancelled() and router._opening == {} and router._pool == {}
    with pytest.raises(NotSent, match="the client closed"):
        await waiting


async def test_a_caller_cancelled_leaves_the_open_to_the_others(opening):
    _, task, waiting = opening
    waiting.cancel()
    await asyncio.wait([waiting])
    assert waiting.cancelled() and not task.done()
