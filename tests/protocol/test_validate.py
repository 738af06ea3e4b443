"""validate_bundle: the complete check every produced bundle passes before anything of its request is appended,
and read_checked_produce, which reads a whole produce request that way.

The native passes (`_bundlescan.c`) are held to their pure-Python references (`_validate_bundle_py`;
read_produce_request then each bundle validated): the same facts and requests for valid input and the same
ProtocolError (text and position) for bad input, on hand-broken, mutated, truncated, padded and random bytes.
"""

import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.bad_bundles import BAD_BUNDLES, TS
from tests.protocol.hexbytes import h
from tests.protocol.strategies import budget, bundles, message_lists, mutations, sparse_seqs
from tiered.protocol import bundle as bundle_module
from tiered.protocol.bundle import (
    CODEC_NONE,
    CODEC_SNAPPY,
    BundleFacts,
    Message,
    _validate_bundle_py,
    bundle_facts,
    decode_bundle,
    encode_bundle,
    read_bundle_header,
    timestamp_bounds,
    validate_bundle,
)
from tiered.protocol import requests as rq
from tiered.protocol.errors import ProtocolError
from tiered.protocol.requests import read_checked_produce, read_produce_request
from tiered.protocol.varint import encode_varint

TS_VALUE = int.from_bytes(TS, "little")


def native_scan(raw, strict: bool = True):
    from tiered.protocol._bundlescan import scan_bundle

    return scan_bundle(raw, strict)


SCANS = pytest.mark.parametrize("scan", [native_scan, _validate_bundle_py], ids=["native", "reference"])


def outcome(scan, raw) -> tuple:
    """What a scan makes of `raw`: its facts, or the text and position of its ProtocolError."""
    try:
        return ("facts", *scan(raw))
    except ProtocolError as exc:
        return ("error", exc.what, exc.position)


def assert_same(raw) -> tuple:
    """Native and reference agree on `raw`, strict and not; the lenient scan accepts what the decoder decodes.
    Returns the strict outcome."""
    lenient = outcome(lambda r: native_scan(r, False), raw)
    assert lenient == outcome(lambda r: _validate_bundle_py(r, False), raw), raw.hex()
    try:
        decode_bundle(raw, 1)
        assert lenient[0] == "facts"
    except ProtocolError as exc:
        assert lenient == ("error", exc.what, exc.position)
    native = outcome(native_scan, raw)
    assert native == outcome(_validate_bundle_py, raw), raw.hex()
    return native


def test_the_native_scan_is_built_and_used():
    from tiered.protocol import _bundlescan
    from tiered.metrics import Metrics

    assert bundle_module._scan_bundle is _bundlescan.scan_bundle and rq._scan_produce is _bundlescan.scan_produce
    assert "\ntiered_native_bundle_scan 1\n" in Metrics().render()  # what an operator sees


# --- valid bundles: the facts ---------------------------------------------------------------------------------------


@budget(200)
@given(st.data(), st.sampled_from([CODEC_NONE, CODEC_SNAPPY]), st.booleans())
def test_facts_of_valid_bundles(data, codec, sparse):
    messages = data.draw(message_lists())
    seqs = data.draw(sparse_seqs(len(messages))) if sparse else [0] * len(messages)
    messages = [Message(m.value, m.key, m.ts_ms, s) for m, s in zip(messages, seqs)]
    bundle = encode_bundle(messages, codec=codec, sparse=sparse)
    facts = validate_bundle(bundle)
    assert isinstance(facts, BundleFacts)
    stamps = [m.ts_ms for m in messages]
    header_len = read_bundle_header(bundle).header_len
    assert facts == BundleFacts(codec, len(messages), sparse, seqs[0] if sparse else None,
                                seqs[-1] if sparse else None, header_len, min(stamps), max(stamps))
    assert tuple(facts) == _validate_bundle_py(bundle) == native_scan(memoryview(bundle))
    assert timestamp_bounds(bundle) == (min(stamps), max(stamps))


def test_facts_by_hand():
    # Sparse 5..15: the first message is stamped 9, the middle one (5 + 3 + 1 = 9) reuses it, the last is stamped 2.
    bundle = h("4c 0500000000000000 09 00") + (9).to_bytes(8, "little") + h("01'a' 02 03 01'b' 00") + (
        2).to_bytes(8, "little") + h("01'c'")
    assert validate_bundle(bundle) == BundleFacts(CODEC_NONE, 3, True, 5, 15, 10, 2, 9)
    assert [m.seq for m in decode_bundle(bundle)] == [5, 9, 15]


# --- bad bundles ----------------------------------------------------------------------------------------------------


@SCANS
@pytest.mark.parametrize("name, raw, error", BAD_BUNDLES, ids=[b[0] for b in BAD_BUNDLES])
def test_bad_bundles_are_refused(scan, name, raw, error):
    with pytest.raises(ProtocolError, match=error):
        scan(raw)
    assert_same(raw)


def test_only_the_gate_refuses_what_tanks_readers_disagree_on():
    # Stored bundles are read as TANK's broker reads them (first and last take the header's seqs) ...
    bundle = h("48 0a00000000000000 04 04") + TS + h("01'a' 06 01'b'")
    assert [m.seq for m in decode_bundle(bundle)] == [10, 15]
    # ... but no such bundle gets in: TANK's client tests flag 4 first and would give them other seqs.
    with pytest.raises(ProtocolError, match="sets SEQ_PREV_PLUS_ONE"):
        validate_bundle(bundle)
    # One already stored (by TANK, or before the gate) is still read, copied and indexed.
    assert bundle_facts(bundle) == BundleFacts(CODEC_NONE, 2, True, 10, 15, 10, TS_VALUE, TS_VALUE)
    assert timestamp_bounds(bundle) == (TS_VALUE, TS_VALUE)


# --- native against reference ---------------------------------------------------------------------------------------


@budget(300)
@given(bundles())
def test_valid_bundles_alike(bundle):
    assert assert_same(bundle)[0] == "facts"


@budget(300)
@given(st.data())
def test_mutated_bundles_alike(data):
    assert_same(data.draw(mutations(data.draw(bundles()))))


@budget(300)
@given(st.binary(max_size=120))
def test_random_bytes_alike(raw):
    assert_same(raw)


@budget(60)
@given(bundles(), st.binary(min_size=1, max_size=9))
def test_every_truncation_and_padding_is_refused_alike(bundle, padding):
    for end in range(len(bundle)):
        assert assert_same(bundle[:end])[0] == "error"
    if not bundle[0] & CODEC_SNAPPY:  # padding a snappy block breaks the block, which the codec reports its own way
        assert assert_same(bundle + padding)[0] == "error"


def test_native_scan_survives_a_storm_of_mutations():
    """A seeded volume run on top of hypothesis: 20,000 byte-level mutations of valid bundles, plain and snappy,
    every result compared with the reference. The native code must never crash, read out of bounds or differ."""
    rng = random.Random(20261123)
    seeds = []
    for i in range(40):
        count = rng.choice([1, 2, 3, 15, 16, 100])
        messages = [Message(rng.randbytes(rng.randrange(0, 200)), rng.choice([None, b"", rng.randbytes(9)]),
                            rng.choice([0, 1, 2**63, 2**64 - 1, rng.getrandbits(64)]), 1 + i * 1000 + j * 3)
                    for j in range(count)]
        seeds.append(encode_bundle(messages, codec=CODEC_SNAPPY if i % 4 == 0 else CODEC_NONE, sparse=i % 2 == 1))
    kinds = 0
    for _ in range(20_000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            position = rng.randrange(len(data) + 1)
            what = rng.randrange(4)
            if what == 0 and position < len(data):
                data[position] = rng.choice([0x00, 0xFF, 0x80, 0x7F, rng.randrange(256)])
            elif what == 1:
                data.insert(position, rng.randrange(256))
            elif what == 2 and position < len(data):
                del data[position]
            else:
                del data[position:]
        kinds += assert_same(bytes(data))[0] == "facts"
    assert 0 < kinds < 20_000  # both outcomes were exercised


# --- whole produce requests -----------------------------------------------------------------------------------------


def reference_checked(payload, with_seqnum: bool):
    req = read_produce_request(payload, with_seqnum, records=True)
    return req, [_validate_bundle_py(p.bundle) for t in req.topics for p in t.partitions]


def _record_of(p: rq.ProducePartition) -> bytes | None:
    """The partition's record view as bytes, after checking what every view handed out must be: read-only."""
    if p.record is None:
        return None
    assert p.record.readonly and p.bundle.readonly
    return bytes(p.record)


def request_outcome(read, payload, with_seqnum: bool) -> tuple:
    try:
        req, facts = read(payload, with_seqnum)
    except ProtocolError as exc:
        return ("error", exc.what, exc.position)
    topics = [(t.name, [(p.partition, bytes(p.bundle), p.base_seq, _record_of(p)) for p in t.partitions])
              for t in req.topics]
    return ("request", req.request_id, topics, req.with_seqnum, req.client_version, req.client_id,
            req.required_acks, req.ack_timeout_ms, [tuple(f) for f in facts])


def assert_same_request(payload, with_seqnum: bool) -> tuple:
    native = request_outcome(read_checked_produce, payload, with_seqnum)
    assert native == request_outcome(reference_checked, payload, with_seqnum), bytes(payload).hex()
    from tiered.protocol._bundlescan import scan_produce

    try:  # the native scan leaves exactly the framing faults to the reference reader
        left_to_the_reference = scan_produce(payload, with_seqnum) is None
    except ProtocolError:
        left_to_the_reference = False
    try:
        read_produce_request(payload, with_seqnum)
        framing_fault = False
    except ProtocolError:
        framing_fault = True
    assert left_to_the_reference == framing_fault
    return native


@st.composite
def checked_requests(draw) -> tuple[bytes, bool]:
    """Produce payloads whose bundles are valid, broken, or random, sometimes mutated as a whole."""
    with_seqnum = draw(st.booleans())
    bundle = st.one_of(bundles(), bundles().flatmap(mutations), st.sampled_from([b[1] for b in BAD_BUNDLES]))
    partition = st.builds(rq.ProducePartition, st.integers(0, 0xFFFF), bundle,
                          st.integers(0, 2**64 - 1) if with_seqnum else st.none(), record=st.none())
    topic = st.builds(rq.ProduceTopic, st.text(st.characters(max_codepoint=0xFF), max_size=8),
                      st.lists(partition, max_size=3).map(tuple))
    req = rq.ProduceRequest(draw(st.integers(0, 2**32 - 1)), tuple(draw(st.lists(topic, max_size=3))), with_seqnum,
                            draw(st.integers(0, 0xFFFF)), draw(st.text(st.characters(max_codepoint=0xFF), max_size=5)),
                            draw(st.integers(0, 0xFF)), draw(st.integers(0, 2**32 - 1)))
    payload = rq.encode_produce_request(req)
    if draw(st.booleans()):
        payload = draw(mutations(payload))
    return payload, with_seqnum


@budget(400)
@given(checked_requests())
def test_checked_produce_requests_alike(case):
    payload, with_seqnum = case
    assert_same_request(payload, with_seqnum)
    assert_same_request(bytearray(payload), with_seqnum)  # the broker hands over bytearray payloads


@budget(300)
@given(st.binary(max_size=100), st.booleans())
def test_random_produce_payloads_alike(raw, with_seqnum):
    assert_same_request(raw, with_seqnum)


@budget(60)
@given(checked_requests())
def test_every_truncation_of_a_produce_request_alike(case):
    """Truncated anywhere (a frame cut short by a bad client): the native scan and the reference agree, every time."""
    payload, with_seqnum = case
    for cut in sorted(set(range(min(len(payload), 40))) | set(range(0, len(payload), 7))):
        assert_same_request(payload[:cut], with_seqnum)


def test_oversized_produce_lengths_alike():
    """Lengths and counts that claim far more than the payload holds, or more than a varint may say."""
    head = struct.pack("<HI", 2, 7) + b"\x03c++" + struct.pack("<BI", 0, 0)
    bundle = encode_bundle([Message(b"v" * 20, None, 5)])
    for with_seqnum in (False, True):
        seq = b"\x01" * 8 if with_seqnum else b""
        cases = [
            head + b"\xff",  # 255 topics, none there
            head + b"\x01\xfft",  # a topic name of 255 bytes
            head + b"\x01\x01t\xff",  # 255 partitions, none there
            head + b"\x01\x01t\x01\x00\x00\xff\xff\xff\xff\x0f" + seq + bundle,  # a bundle of 2^32 - 1 bytes
            head + b"\x01\x01t\x01\x00\x00\xff\xff\xff\xff\x1f" + seq + bundle,  # a length past 32 bits
            head + b"\x01\x01t\x01\x00\x00\x80\x80\x80\x80\x80\x01" + seq + bundle,  # a varint of 6 bytes
            head + b"\x01\x01t\x01\x00\x00" + encode_varint(len(bundle) + 1) + seq + bundle,  # one byte short
            head + b"\x01\x01t\x01\x00\x00" + encode_varint(len(bundle)) + seq + bundle + b"\x00" * 9,  # trailing
        ]
        for payload in cases:
            assert assert_same_request(payload, with_seqnum)[0] == "error", payload.hex()


def test_a_framing_fault_is_named_before_any_bad_bundle():
    bad = BAD_BUNDLES[0][1]
    req = rq.ProduceRequest(1, (rq.ProduceTopic("t", (rq.ProducePartition(0, bad),)),))
    payload = rq.encode_produce_request(req)
    with pytest.raises(ProtocolError, match="ends after 1 of 5"):
        read_checked_produce(payload, False)
    with pytest.raises(ProtocolError, match="1 trailing bytes"):
        read_checked_produce(payload + b"\x00", False)
    assert assert_same_request(payload + b"\x00", False)[0] == "error"


def test_a_record_view_only_where_the_payload_holds_the_segment_bytes():
    """`record` is the payload's `{varint length, bundle}` when the length is minimally encoded (what a segment
    holds: TANK's encoding) and the record is at least half of the payload (which it keeps alive); a non-minimal
    length, a base seq between length and bundle (0x05), or a record that is the smaller part of its payload leave
    it None, so the append builds the record. Native scan and reference reader agree; every view is read-only."""
    small = encode_bundle([Message(b"v" * 20, None, 5)])
    big = encode_bundle([Message(b"w" * 300, None, 6)])  # a two-byte length
    assert len(small) < 0x80 <= len(big)

    def payload(*partitions: bytes) -> bytes:
        head = struct.pack("<HI", 2, 7) + b"\x03c++" + struct.pack("<BI", 0, 0) + b"\x01\x01t"
        return head + bytes([len(partitions)]) + b"".join(
            struct.pack("<H", i) + p for i, p in enumerate(partitions))

    def minimal(bundle: bytes) -> bytes:
        return encode_varint(len(bundle)) + bundle

    cases = [
        (payload(minimal(small)), [minimal(small)]),
        (payload(minimal(big)), [minimal(big)]),
        (payload(bytes([0x80 | len(small), 0x00]) + small), [None]),  # the same length in two bytes
        (payload(bytes([0x80 | (len(big) & 0x7F), 0x80 | (len(big) >> 7), 0x00]) + big), [None]),  # three
        (payload(minimal(big), minimal(small)), [minimal(big), None]),  # the small one is not half the payload
        (payload(minimal(small), minimal(small)), [None, None]),
    ]
    for raw, records in cases:
        for read in (read_checked_produce, reference_checked):
            for buffer in (raw, bytearray(raw)):
                req, facts = read(buffer, False)
                assert [_record_of(p) for p in req.topics[0].partitions] == records
                assert [f.messages for f in facts] == [1] * len(records)
        assert assert_same_request(raw, False)[0] == "request"
    with_seqnum = rq.encode_produce_request(rq.ProduceRequest(
        1, (rq.ProduceTopic("t", (rq.ProducePartition(0, big, 10),)),), with_seqnum=True))
    for read in (read_checked_produce, reference_checked):
        req, _ = read(with_seqnum, True)
        assert req.topics[0].partitions[0].record is None and bytes(req.topics[0].partitions[0].bundle) == big
