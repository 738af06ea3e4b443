"""Objects at rest: a broker asked for SSE-KMS writes every object of the bucket with it, whatever wrote it (block
PUTs, segment and index uploads, a multipart one among them, topic and start objects, `tiered topic config`)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys

import boto3

from tiered.client import Client
from tiered.protocol.bundle import Message
from tiered.tiering.objects import keys

from tests.ops.helpers import child_env
from tests.support.polling import eventually
from tests.support.s3 import REGION

SMALL_SEGMENTS = {"log.segment.bytes": "2k", "log.index.interval.bytes": "128"}


async def test_every_object_a_broker_writes_is_encrypted_with_the_kms_key(ops_broker, s3_server, s3_admin, s3_faults,
                                                                          monkeypatch):
    kms = boto3.client("kms", region_name=REGION, endpoint_url=s3_server.moto_url)
    key_arn = kms.create_key(Description="tiered objects")["KeyMetadata"]["Arn"]
    app = await ops_broker(s3_sse="kms", s3_sse_kms_key_id=key_arn)
    copier = app.tier.remote.copier
    copier.multipart_threshold_bytes = 1  # every segment goes up as a multipart upload (one part: segments are small)
    async with await Client.connect("127.0.0.1", app.broker.port) as c:
        await c.create_topic("hist", 1, SMALL_SEGMENTS)
        for i in range(0, 60, 10):
            await c.produce("hist", 0, [Message(b"%03d" % j + random.Random(j).randbytes(200), None,
                                                1_700_000_000_000 + j) for j in range(i, i + 10)])
    sealed = list(app.broker.registry.get("hist", 0).log.segments)
    assert sealed
    await eventually(lambda: copier.pending == 0 and app.tier.state.highest_copied_seq(("hist", 0)) == sealed[-1].last,
                     what="the sealed segments to be copied")

    # `tiered topic config` writes the topic object from outside the broker, with the same settings.
    proc = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "tiered.cli.main", "topic", "config", "hist", "-o", "retention.segments.count=5",
        "--catalog", ops_broker.catalog_url, "--store", f"s3://{ops_broker.bucket}/tiered", "--s3-path-style",
        "--s3-sse", "kms", "--s3-sse-kms-key-id", key_arn,
    ], capture_output=True, text=True, timeout=60, env=child_env(AWS_ENDPOINT_URL=s3_faults.url))
    assert proc.returncode == 0, proc.stderr

    listed = s3_admin.list_objects_v2(Bucket=ops_broker.bucket, Prefix="tiered/")["Contents"]
    object_keys = [o["Key"].removeprefix("tiered/") for o in listed]
    kinds = {"block": keys.parse_block_key, "segment": keys.parse_segment_key,
             "index": keys.parse_segment_index_key, "topic": keys.parse_topic_key}
    found = {kind for kind, parse in kinds.items() for k in object_keys if parse(k) is not None}
    assert found == set(kinds), object_keys
    assert any(method == "POST" and path.endswith("?uploads") for method, path in s3_faults.requests), \
        "a segment went up as a multipart upload"
    for object_key in object_keys:
        head = s3_admin.head_object(Bucket=ops_broker.bucket, Key=f"tiered/{object_key}")
        assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == ("aws:kms", key_arn), object_key
