"""Range reads of block runs by their bundle index (block format version 3, tiered.tiering.reads.run_reads), against
moto's S3 server over HTTP and a real catalog: every kind of seq answered byte for byte as the local segment answers
it, bytes GET per byte answered counted by the store, version 2 blocks still read whole."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pytest
from sqlalchemy import update

from tiered.clock import SYSTEM_CLOCK
from tiered.catalog import topics as catalog_topics
from tiered.catalog.blocks import find_run
from tiered.catalog.models import BlockModel
from tiered.metrics import Metrics
from tiered.protocol.bundle import (
    CODEC_NONE,
    Message,
    bundle_seq_range,
    encode_bundle,
    encode_record,
    maybe_record,
    read_bundle_header,
)
from tiered.tier_interface import RemoteChunk
from tiered.tiering.blocks.block_format import (
    FOOTER_TRAILER_BYTES,
    INDEX_EVERY_BYTES,
    MAGIC,
    RUN_ENTRY,
    TOPIC_LEN,
    RunIndex,
    block_tail_bytes,
    read_block_indexes,
    run_index_of,
)
from tiered.tiering.reads.remote_fetch import RemoteReader
from tiered.tiering.reads.run_reads import run_window, trim_chunk

from tests.spark.history import PartitionHistory, S3Objects
from tests.tiering.test_remote_compaction import chunk_bytes
from tiered.topic_partition import TopicPartition

TOPIC = "t"
MiB = 1 << 20


def fill(history: PartitionHistory, rng: random.Random, total_bytes: int, *, sparse_every: int = 0) -> None:
    """Bundles of 1 to 6 messages of 100 to 4000 bytes up to `total_bytes`; with `sparse_every`, every that many
    bundles a sparse one whose seqs jump (the seqs between are in no bundle), the first bundle included."""
    size, i = 0, 0
    while size < total_bytes:
        n = rng.randint(1, 6)
        values = [rng.randbytes(rng.randint(100, 4000)) for _ in range(n)]
        if sparse_every and i % sparse_every == 0:
            seq = history.log.last_assigned + rng.randint(2, 50)
            messages = []
            for value in values:
                messages.append(Message(value, None, 1_700_000_000_000 + seq, seq))
                seq += rng.randint(1, 9)
            bundle = encode_bundle(messages, codec=CODEC_NONE, sparse=True)
        else:
            bundle = encode_bundle([Message(v, None, 1_700_000_000_000 + i) for v in values], codec=CODEC_NONE)
        history.append(bundle)
        size += len(bundle) + 3
        i += 1


@pytest.fixture
def history(cat, s3_admin, s3_bucket, tmp_path):
    catalog_topics.create_topic(cat, TOPIC, 1)
    # One index entry per segment: a local read then ends at the last whole bundle within the fetch size, the rule
    # of remote run answers, so the two are comparable byte for byte.
    return PartitionHistory(cat, S3Objects(s3_admin, s3_bucket, "store"), TOPIC, 0, tmp_path / "log",
                            index_interval_bytes=1 << 30)


def local_answer(history: PartitionHistory, seq: int, fetch_size: int) -> tuple[bytes, int, bool]:
    """What a consume of the local segment answers: its bytes, first bundle seq and sparseness."""
    read = history.log.read(seq, fetch_size, history.log.last_assigned)
    assert read is not None
    data = Path(read.segment.path).read_bytes()[read.start_position : read.end_position]
    return data, read.first_bundle_seq, read.first_bundle_sparse


async def remote_answer(reader: RemoteReader, seq: int, fetch_size: int) -> tuple[bytes, int, bool]:
    chunk = await reader.fetch(TopicPartition(TOPIC, 0), seq, fetch_size)
    assert isinstance(chunk, RemoteChunk), chunk
    return await chunk_bytes(chunk), chunk.first_bundle_seq, chunk.first_bundle_sparse


def bundle_starts(records: bytes, first_seq: int) -> list[tuple[int, int, int]]:
    """(position, first seq, last seq) of each record of a run."""
    out, position, next_seq = [], 0, first_seq
    while position < len(records):
        start, end = maybe_record(records, position)
        first, last = bundle_seq_range(read_bundle_header(memoryview(records)[start:end]), next_seq)
        out.append((position, first, last))
        position, next_seq = end, last + 1
    return out


async def test_every_kind_of_seq_reads_as_the_local_segment_answers(history, s3_store, acat):
    rng = random.Random(14)
    fill(history, rng, 3 * MiB // 2, sparse_every=25)
    run = history.commit_run()
    records = history.log.read_records(run.first_seq, run.last_seq)
    data = await s3_store.get(find_run(history.cat, TOPIC, 0, run.first_seq).object_key)
    [(row, index)] = read_block_indexes(data, len(data))
    assert index is not None and len(index.seqs) > 15  # version 3, an entry every 64 KiB
    bundles = bundle_starts(records, run.first_seq)
    assert any(first > prev_last + 1 for (_, first, _), (_, _, prev_last) in zip(bundles[1:], bundles))  # jumps
    assert run.from_seq < run.first_seq  # seqs in the jump before the first bundle: it answers for them
    seqs = {run.from_seq, run.first_seq - 1, run.first_seq, run.first_seq + 1, run.last_seq, run.last_seq - 1}
    for seq in index.seqs:
        seqs |= {seq - 1, seq, seq + 1}  # at an entry, and just on either side
    for (_, first, last), (_, next_first, _) in zip(bundles, bundles[1:]):
        if next_first > last + 1:
            seqs |= {last + 1, next_first - 1}  # in a jump: the next bundle answers
    for _ in range(30):
        seqs.add(rng.randint(run.first_seq, run.last_seq))  # between entries
    reader = RemoteReader(s3_store, acat, Metrics(), clock=SYSTEM_CLOCK)
    checked = 0
    for seq in sorted(s for s in seqs if run.from_seq <= s <= run.last_seq):
        for fetch_size in (1, 3000, 100_000, MiB):
            got = await remote_answer(reader, seq, fetch_size)
            assert got == local_answer(history, seq, fetch_size), (seq, fetch_size)
            assert got == trim_chunk(records, run.first_seq, seq, fetch_size)  # as a whole-run read answers
            checked += 1
    assert checked > 250
    assert reader.budget.used == 0  # every window's buffer given back


async def test_a_one_mib_fetch_from_a_big_run_gets_at_most_1_25_bytes_per_byte_answered(history, s3_store, acat):
    rng = random.Random(15)
    fill(history, rng, 6 * MiB)
    run = history.commit_run()
    assert run.last_seq - run.first_seq > 1000
    reader = RemoteReader(s3_store, acat, Metrics(), clock=SYSTEM_CLOCK)
    worst = 0.0
    answered_total = got_total = 0
    for i in range(12):
        seq = rng.randint(run.first_seq, run.last_seq - 600) if i else run.first_seq
        before = s3_store.counters.get_bytes
        answer, _, _ = await remote_answer(reader, seq, MiB)
        got = s3_store.counters.get_bytes - before  # the first fetch reads the block's footer too
        assert len(answer) > MiB - 25_000  # ends at the last whole bundle (at most 24 KB) within 1 MiB
        worst = max(worst, got / len(answer))
        answered_total += len(answer)
        got_total += got
    print(f"bytes GET per byte answered: worst {worst:.3f}, all {got_total / answered_total:.3f}")
    assert worst <= 1.25, worst
    assert got_total / answered_total <= 1.15


async def test_a_version_2_block_is_read_whole_once(history, s3_store, s3_admin, s3_bucket, acat):
    rng = random.Random(16)
    fill(history, rng, 300_000)
    run = history.commit_run()
    key = find_run(history.cat, TOPIC, 0, run.first_seq).object_key
    v3 = s3_admin.get_object(Bucket=s3_bucket, Key=f"store/{key}")["Body"].read()
    v2 = as_version_2(v3)  # as a broker before version 3 wrote it: the same runs, no index
    s3_admin.put_object(Bucket=s3_bucket, Key=f"store/{key}", Body=v2)
    with history.cat.write() as conn:
        conn.execute(update(BlockModel).where(BlockModel.object_key == key).values(size_bytes=len(v2)))
    reader = RemoteReader(s3_store, acat, Metrics(), clock=SYSTEM_CLOCK)
    records = history.log.read_records(run.first_seq, run.last_seq)
    gets = s3_store.counters.gets
    for seq in (run.first_seq, (run.first_seq + run.last_seq) // 2, run.last_seq):
        got = await remote_answer(reader, seq, 20_000)
        assert got == local_answer(history, seq, 20_000)
        assert got == trim_chunk(records, run.first_seq, seq, 20_000)
    assert s3_store.counters.gets - gets == 2  # the footer (no index), then the whole run once, cached


def as_version_2(block: bytes) -> bytes:
    """The same block with a version 2 footer: each run entry without its bundle index."""
    tail = block[-block_tail_bytes(block[-FOOTER_TRAILER_BYTES:]) :]
    runs = read_block_indexes(tail, len(block))
    footer = struct.pack("<I", len(runs))
    for row, _ in runs:
        topic = row.topic.encode()
        footer += TOPIC_LEN.pack(len(topic)) + topic + RUN_ENTRY.pack(
            row.partition, row.from_seq, row.first_seq, row.last_seq, row.position, row.length_bytes, row.messages,
            row.min_ts_ms, row.max_ts_ms, row.leader_epoch)
    records_end = sum(row.length_bytes for row, _ in runs)
    return block[:records_end] + footer + struct.pack("<IIB", len(footer), zlib.crc32(footer), 2) + MAGIC


def test_windows_hold_every_answer_and_little_more():
    """For runs with sparse bundles and jumps, at random seqs and fetch sizes: the window starts at or before the
    answer, holds all of it, and (for fetches of an index interval or more) reads at most one index interval and two
    bundles beyond it."""
    rng = random.Random(17)
    for _ in range(6):
        out, seq, position = [], 1, 0
        for i in range(rng.randint(50, 400)):
            n = rng.randint(1, 5)
            if i % 13 == 12:
                messages = [Message(rng.randbytes(rng.randint(10, 3000)), None, 1, seq + 4 * k) for k in range(n)]
                record_seqs = seq + 4 * (n - 1)
                bundle = encode_bundle(messages, codec=CODEC_NONE, sparse=True)
            else:
                bundle = encode_bundle([Message(rng.randbytes(rng.randint(10, 3000)))] * n, codec=CODEC_NONE)
                record_seqs = seq + n - 1
            out.append(encode_record(bundle))
            seq = record_seqs + 1 + (rng.randint(1, 20) if i % 17 == 16 else 0)
        records = b"".join(out)
        entries = run_index_of(records, 1)
        index = RunIndex((1, *(s for s, _ in entries)), (0, *(p for _, p in entries)), len(records))
        bundles = bundle_starts(records, 1)
        longest = max(n[0] - b[0] for b, n in zip(bundles, bundles[1:] + [(len(records), 0, 0)]))
        for _ in range(200):
            seq = rng.randint(1, bundles[-1][2])
            fetch_size = rng.choice([1, 500, 5000, 70_000, 300_000])
            window = run_window(index, seq, fetch_size)
            answer = trim_chunk(records, 1, seq, fetch_size)
            assert answer is not None
            start = next(p for p, _, last in bundles if last >= seq)
            assert window.floor <= start and start + len(answer[0]) <= window.end
            extra = window.end - window.floor - len(answer[0])
            if fetch_size >= INDEX_EVERY_BYTES:  # small fetches read pages (one or two intervals) instead
                assert extra <= INDEX_EVERY_BYTES + 2 * longest


async def test_small_fetches_in_order_get_each_page_once(history, s3_store, acat):
    """A consumer reading a big run in order in fetches smaller than an index interval: answers as the local segment
    gives them, and about one byte GET per byte of the run (each page once, from the cache after)."""
    rng = random.Random(18)
    fill(history, rng, MiB, sparse_every=40)
    run = history.commit_run()
    reader = RemoteReader(s3_store, acat, Metrics(), clock=SYSTEM_CLOCK)
    before = s3_store.counters.get_bytes
    seq, fetches = run.from_seq, 0
    while seq <= run.last_seq:
        answer, first_seq, sparse = await remote_answer(reader, seq, 6000)
        assert (answer, first_seq, sparse) == local_answer(history, seq, 6000)
        seq = bundle_starts(answer, first_seq)[-1][2] + 1
        fetches += 1
    assert fetches > 100
    assert s3_store.counters.get_bytes - before <= 1.05 * run.length_bytes + 4096  # pages once, and the footer
