"""The append path writes a plain produce's `{varint length, bundle}` straight from the request payload (a read-only
view, ProducePartition.record): segment files and block objects must hold exactly the bytes the joined path wrote,
after the connection received many later frames into its buffers, for small frames (cut from the receive buffer) and
big ones (received into a buffer of their own), beside 0x05 produces and non-minimal lengths, which are joined."""

from __future__ import annotations

import os
import random
import struct

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.bundle import CODEC_NONE, Message, encode_bundle
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.frame import MsgType, encode_frame
from tiered.protocol.responses import read_produce_response
from tiered.protocol.varint import encode_varint
from tiered.server.app import App, tiering_service
from tiered.server.connection import BIG_FRAME_BYTES
from tiered.tiering.blocks.block_format import decode_block
from tiered.tiering.objects.keys import BLOCK_SUFFIX

from tests.server.rawwire import RawConnection
from tests.support.broker import local_settings


def bundle_of(rng: random.Random, count: int, size: int) -> bytes:
    return encode_bundle([Message(rng.randbytes(size), None, 1_000 + i) for i in range(count)], codec=CODEC_NONE)


def produce(request_id: int, bundle: bytes, base_seq: int | None = None) -> rq.ProduceRequest:
    return rq.ProduceRequest(request_id, (rq.ProduceTopic("v", (rq.ProducePartition(0, bundle, base_seq),)),),
                             with_seqnum=base_seq is not None)


def non_minimal_payload(request_id: int, bundle: bytes) -> bytes:
    """A plain produce whose bundle length takes one byte more than it needs (TANK's reader takes it)."""
    size = encode_varint(len(bundle))
    longer = bytes([b | 0x80 for b in size]) + b"\x00"
    head = struct.pack("<HI", 2, request_id) + b"\x03c++" + struct.pack("<BI", 0, 0) + b"\x01\x01v\x01"
    return head + struct.pack("<H", 0) + longer + bundle


async def test_segment_and_block_bytes_are_the_joined_records(tmp_path):
    rng = random.Random(13)
    settings = local_settings(tmp_path / "data", block_max_age_ms=300)
    app = App(settings, tier=tiering_service(ack_timeout_s=30.0))
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("v", 1, {"produce.ack": "durable"})
        frames, requests, bundles = [], [], []

        def add(req: rq.ProduceRequest, payload: bytes | None = None) -> None:
            requests.append(req)
            bundles.append(req.topics[0].partitions[0].bundle)
            msg = MsgType.PRODUCE_WITH_SEQNUM if req.with_seqnum else MsgType.PRODUCE
            frames.append(encode_frame(msg, payload or rq.encode_produce_request(req)))

        add(produce(1, bundle_of(rng, 100, 100)))  # a small frame
        add(produce(2, bundle_of(rng, 3, BIG_FRAME_BYTES)))  # a big frame, received in place
        add(produce(3, bundle_of(rng, 1, 20)))  # a one-byte length
        small = bundle_of(rng, 2, 30)
        add(produce(4, small), non_minimal_payload(4, small))  # joined: the segment holds the minimal length
        add(produce(5, bundle_of(rng, 5, 50), base_seq=500))  # 0x05: a base seq between length and bundle
        big = bundle_of(rng, 2, BIG_FRAME_BYTES)
        add(produce(6, big), non_minimal_payload(6, big))  # a big frame with a non-minimal length
        raw = await RawConnection.open(app.broker.port)
        await raw.send_bytes(b"".join(frames))
        # Later frames, in writes of their own, through the same receive buffers, before the first block closes.
        for request_id in range(7, 60):
            before = len(frames)
            add(produce(request_id, bundle_of(rng, rng.randrange(1, 40), rng.choice([10, 100, 1000, 30_000]))))
            await raw.send_bytes(b"".join(frames[before:]))
        for req in requests:
            msg_id, payload = await raw.recv(timeout_s=30.0)
            assert msg_id == MsgType.PRODUCE
            answer = read_produce_response(payload, req)
            assert answer.request_id == req.request_id
            assert [p.code for p in answer.topics[0].partitions] == [ProduceStatus.OK]  # durable: committed
        await raw.close()
        expected = b"".join(encode_varint(len(b)) + b for b in bundles)

        part = app.broker.registry.get("v", 0)
        part.log.flush()
        paths = [s.path for s in part.log.segments] + [part.log.active.path]
        on_disk = b"".join(open(p, "rb").read() for p in paths)
        assert on_disk == expected

        runs = []
        for root, _, files in os.walk(settings.state_dir / "objects"):
            for name in files:
                if name.endswith(BLOCK_SUFFIX):
                    with open(os.path.join(root, name), "rb") as f:
                        runs += [(row.first_seq, bytes(data)) for row, data in decode_block(f.read())]
        assert len(runs) >= 2
        assert b"".join(data for _, data in sorted(runs)) == expected
    finally:
        await app.stop()
