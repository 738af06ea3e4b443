"""A store that accepts connections and never answers (not even "100 Continue"): durable produces are answered at
their deadline, readiness and metrics say what is wrong, and acks resume within seconds of the store answering."""

from __future__ import annotations

import time

import pytest

from tiered import metrics as m
from tiered.client import Client, TankError
from tiered.protocol.codes import ProduceStatus

from tests.ops.helpers import ahttp_get
from tests.support.polling import eventually


async def test_a_black_holed_store_stalls_nothing_for_long(brokers, tmp_path, s3_faults):
    app = await brokers.start("disk", f"sqlite:///{tmp_path}/c.db", produce_ack_timeout_ms=1500,
                              http_listen="127.0.0.1:0")
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("t", 1)
        await c.produce("t", 0, [b"before"])
        s3_faults.black_hole()
        started = time.monotonic()
        with pytest.raises(TankError) as caught:
            await c.produce("t", 0, [b"during"])
        assert caught.value.code == ProduceStatus.ACK_TIMEOUT  # not confirmed: it may still be committed
        assert time.monotonic() - started < 5

        async def not_ready() -> bool:
            answer = await ahttp_get(app.http.port, "/readyz")
            return answer.status == 503 and "object store" in answer.text

        await eventually(not_ready, what="/readyz names the store")
        await eventually(lambda: app.metrics.count(m.PUT_ERRORS) >= 1, what="a failed PUT counted", timeout_s=20)
        s3_faults.come_back()
        recovered = time.monotonic()
        await c.produce("t", 0, [b"after"])
        assert time.monotonic() - recovered < 15  # the hung request was abandoned, the retry went through
        values = [m.value async for m in c.drain("t", 0, 0)]
    assert values == [b"before", b"during", b"after"]
    brokers.check(f"sqlite:///{tmp_path}/c.db")
