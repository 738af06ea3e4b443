"""The broker with the native appender and block builder call (the default) and with their references
(TIERED_PRODUCE_PATH=python: PySegmentAppender, block_builder._add_to_run_py) is the same broker, byte for byte: the same produce requests over a raw connection get the same answers, leave the same
segment and index files (rolls included), and put the same records into the bucket's blocks."""

from __future__ import annotations

import os
import random
import re

import pytest

from tiered.client import Client
from tiered.protocol import requests as rq
from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, Message, encode_bundle
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.frame import MsgType, encode_frame
from tiered.protocol.responses import read_produce_response
from tiered.server.app import App, tiering_service
from tiered.storage.appender import PRODUCE_PATH_ENV
from tiered.tiering.blocks.block_format import decode_block
from tiered.tiering.objects.keys import BLOCK_SUFFIX

from tests.server.rawwire import RawConnection
from tests.support.broker import local_settings

TOPIC_CONFIG = {"produce.ack": "durable", "log.segment.bytes": "3000", "log.index.interval.bytes": "128"}


def requests_of(seed: int) -> list[tuple[int, bytes]]:
    """Produce frames: plain and 0x05, one to three partitions, plain and snappy bundles, a partition that does not
    exist, seq jumps (each rolls the segment) and a seq that does not go up (refused, 0x0a)."""
    rng = random.Random(seed)
    frames = []
    for request_id in range(1, 80):
        with_seqnum = rng.random() < 0.15
        partitions = []
        for partition in rng.sample([0, 1, 7], rng.randrange(1, 4)):
            count = rng.randrange(1, 30)
            messages = [Message(rng.randbytes(rng.choice([1, 20, 200])), None, 1_000 + request_id * 10 + i)
                        for i in range(count)]
            bundle = encode_bundle(messages, codec=rng.choice([CODEC_NONE, CODEC_SNAPPY]))
            base_seq = None
            if with_seqnum:  # far above what plain produces assigned (a jump), or below it (refused)
                base_seq = 1_000 * request_id if rng.random() < 0.85 else 1
            partitions.append(rq.ProducePartition(partition, bundle, base_seq))
        req = rq.ProduceRequest(request_id, (rq.ProduceTopic("p", tuple(partitions)),), with_seqnum=with_seqnum)
        frames.append((MsgType.PRODUCE_WITH_SEQNUM if with_seqnum else MsgType.PRODUCE,
                       encode_frame(MsgType.PRODUCE_WITH_SEQNUM if with_seqnum else MsgType.PRODUCE,
                                    rq.encode_produce_request(req))))
    return frames


async def run(data, frames) -> tuple[list[bytes], dict[str, bytes], bytes]:
    settings = local_settings(data, block_max_age_ms=100)
    app = App(settings, tier=tiering_service(ack_timeout_s=30.0))
    await app.start()
    try:
        async with await Client.connect("127.0.0.1", app.broker.port) as c:
            await c.create_topic("p", 2, TOPIC_CONFIG)
        raw = await RawConnection.open(app.broker.port)
        answers = []
        for _, frame in frames:  # one at a time: a 0x05's seq depends on what the earlier requests stored
            await raw.send_bytes(frame)
            msg_id, payload = await raw.recv(timeout_s=30.0)
            assert msg_id == MsgType.PRODUCE
            answers.append(bytes(payload))
        await raw.close()
        files = {}
        for partition in (0, 1):
            part = app.broker.registry.get("p", partition)
            part.log.flush()
            directory = part.log.directory
            for name in sorted(os.listdir(directory)):
                with open(os.path.join(directory, name), "rb") as f:
                    # A sealed segment's name ends in its freeze time (the .log's mtime): not compared.
                    files[f"{partition}/" + re.sub(r"_\d+\.(ilog|log)$", r".\1", name)] = f.read()
        runs = []
        for root, _, names in os.walk(settings.state_dir / "objects"):
            for name in names:
                if name.endswith(BLOCK_SUFFIX):
                    with open(os.path.join(root, name), "rb") as f:
                        runs += [(row.topic, row.partition, row.first_seq, bytes(data))
                                 for row, data in decode_block(f.read())]
        return answers, files, b"".join(data for *_, data in sorted(runs))
    finally:
        await app.stop()


@pytest.mark.parametrize("seed", [1, 2])
async def test_the_native_and_the_reference_appender_make_the_same_broker(tmp_path, monkeypatch, seed):
    frames = requests_of(seed)
    monkeypatch.setenv(PRODUCE_PATH_ENV, "python")
    reference = await run(tmp_path / "python", frames)
    monkeypatch.setenv(PRODUCE_PATH_ENV, "native")
    native = await run(tmp_path / "native", frames)
    assert native[0] == reference[0]  # every answer, byte for byte
    sent = [rq.read_produce_request(frame[5:], msg_id == MsgType.PRODUCE_WITH_SEQNUM) for msg_id, frame in frames]
    codes = {p.code for req, answer in zip(sent, reference[0])
             for t in read_produce_response(answer, req).topics for p in t.partitions}
    assert {ProduceStatus.OK, ProduceStatus.UNKNOWN_PARTITION, ProduceStatus.INVALID_SEQNUMS} <= codes
    assert native[1] == reference[1]
    assert len([n for n in reference[1] if n.endswith(".ilog")]) >= 2  # rolls happened
    assert native[2] == reference[2] and reference[2]
