"""The native appends of a whole request (tiered/server/_produce.c, `append_request`) against their reference, the
produce handler's own loop (ProduceHandler._append_each): the same requests on two copies of the same partitions
give the same answers, the same calls to the tier, the metrics and the waiters in the same order, and the same
segment and index files. A request the native call does not take (an unknown topic or partition, a partition not
led here) answers None with nothing appended. `produce_payload` (the same from the frame's payload, and the answer's
frame) against read_checked_produce, the loop and the handler's frame, on valid, truncated, padded, mutated and
random payloads: the same answers, frames, ProtocolErrors, calls, metrics and files. Hostile arguments raise, never
crash (the ASan build runs this file: tests/test_native_asan.py)."""

from __future__ import annotations

import math
import os
import re
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiered.metrics import LATENCY_BUCKETS_S, Histogram, Metrics
from tiered.protocol import requests as rq
from tiered.protocol.bundle import BundleFacts, Message, encode_bundle
from tiered.protocol.codes import ProduceStatus
from tiered.protocol.errors import ProtocolError
from tiered.server.produce import NativeContext, ProduceHandler
from tiered.server.registry import Partition, Role, Topic
from tiered.storage.appender import AppendResult
from tiered.storage.partition_log import InvalidSeqnums, PartitionLog, log_append_for
from tiered.storage.topic_config import TopicConfig
from tiered.tier_interface import Leader

from tests.protocol.strategies import budget

_produce = pytest.importorskip("tiered.server._produce")

CONFIG = TopicConfig.from_layers({"log.segment.bytes": "600", "log.index.interval.bytes": "128",
                                  "produce.ack": "local"})
DURABLE = TopicConfig.from_layers({"log.segment.bytes": "600", "log.index.interval.bytes": "128",
                                    "produce.ack": "durable"})
NOW = 1_700_000_000.0


def test_the_native_call_reads_the_fields_it_was_built_for():
    assert NativeContext._fields[1:] == ("registry_topics", "leader", "tier_appended", "visible", "waiting",
                                         "produced_bytes", "produced_msgs", "failed", "log_append", "monotonic",
                                         "latency", "latency_bounds")
    assert Histogram.__slots__ == ("counts", "total", "count")
    assert rq.ProduceTopic._fields[:2] == ("name", "partitions")
    assert rq.ProducePartition._fields == ("partition", "bundle", "base_seq", "record")
    assert BundleFacts._fields[1] == "messages"
    assert (AppendResult._fields[0], AppendResult._fields[5]) == ("first_seq", "record")


class World:
    """Two topics' partitions on disk, as the registry holds them, and a record of every call the appends make."""

    def __init__(self, root):
        self.calls: list[tuple] = []
        self.topics: dict[str, Topic] = {}
        for name, config, count in (("a", CONFIG, 3), ("d", DURABLE, 2)):
            topic = Topic(name, "", config)
            for i in range(count):
                log = PartitionLog.open(os.path.join(root, f"{name}-{i}"), config, now_s=lambda: NOW)
                part = Partition(name, i, log, config, lower_tier=True, role=Role.LEADER)
                topic.partitions.append(part)
            self.topics[name] = topic
        self.topics["a"].partitions[2].role = Role.FOLLOWER  # led elsewhere
        self.topics["a"].partitions[2].leader = Leader(7, "10.0.0.7:11011", "")
        self.metrics = Metrics()
        # Partitions a long-poll waits on: `visible` is called for these (on a topic that is not durable) only.
        self.waiting = {self.topics["a"].partitions[1].tp: {"a waiter"}}
        self.broker = SimpleNamespace(metrics=self.metrics, advertised_host="127.0.0.1")
        self.handler = ProduceHandler(self.broker, path="python")

    def tier_appended(self, tp, appended, durable):
        self.calls.append(("appended", tp, tuple(appended[:5]), bytes(appended.record), appended.header, durable))
        return f"ack-{len(self.calls)}" if durable else None

    def visible(self, tp, first_seq, size):
        if tp in self.waiting:  # as Waiters.visible: nothing happens for a partition without waiters
            self.calls.append(("visible", tp, first_seq, size))

    def produced(self, name, size, messages):
        self.metrics.produced(name, size, messages)

    def args(self, req, facts):
        return (req.topics, facts, req.with_seqnum, self.topics, Role.LEADER, self.tier_appended, self.visible,
                self.waiting, self.metrics.produced_bytes, self.metrics.produced_msgs, ProduceHandler._append_failed,
                log_append_for())

    def native(self, req, facts):
        return _produce.append_request(*self.args(req, facts))

    def reference(self, req, facts):
        redirects: dict = {}
        conn = SimpleNamespace(plaintext=True)
        answers, pending = self.handler._append_each(conn, req, facts, self.topics, self.tier_appended, self.visible,
                                                     self.produced, False, None, redirects)
        return answers, pending

    def files(self) -> dict[str, bytes]:
        out = {}
        for topic in self.topics.values():
            for part in topic.partitions:
                part.log.flush()
                for name in sorted(os.listdir(part.log.directory)):
                    with open(os.path.join(part.log.directory, name), "rb") as f:
                        # A sealed segment's name ends in its freeze time (the .log's mtime): not compared.
                        out[f"{topic.name}/{part.partition}/" + re.sub(r"_\d+\.(ilog|log)$", r".\1", name)] = f.read()
        return out

    def close(self):
        for topic in self.topics.values():
            for part in topic.partitions:
                part.log.close()


def scanned(request: rq.ProduceRequest):
    return rq.read_checked_produce(rq.encode_produce_request(request), request.with_seqnum)


TAKEN: list[int] = []  # topics of each request the native call took (looked at by hand: -s)
partition_ids = st.sampled_from([("a", 0), ("a", 1), ("d", 0), ("d", 1), ("a", 2), ("a", 9), ("x", 0)])


@st.composite
def requests(draw, request_id: int) -> rq.ProduceRequest:
    with_seqnum = draw(st.booleans()) and draw(st.booleans())
    chosen = draw(st.lists(partition_ids, min_size=1, max_size=4))
    topics: dict[str, list] = {}
    for name, partition in chosen:
        count = draw(st.integers(1, 12))
        size = draw(st.sampled_from([1, 30, 120]))
        bundle = encode_bundle([Message(bytes([i % 251]) * size, None, 1_000 + i) for i in range(count)])
        base = draw(st.sampled_from([1, 500, 10_000 + request_id * 100])) if with_seqnum else None
        topics.setdefault(name, []).append(rq.ProducePartition(partition, bundle, base))
    return rq.ProduceRequest(request_id, tuple(rq.ProduceTopic(n, tuple(ps)) for n, ps in topics.items()),
                             with_seqnum=with_seqnum)


@budget(40)
@given(st.data())
def test_the_native_appends_are_the_loop_s(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("twin")
    native, reference = World(root / "native"), World(root / "reference")
    took = 0
    try:
        for request_id in range(1, data.draw(st.integers(1, 25))):
            req, facts = scanned(data.draw(requests(request_id)))
            got = native.native(req, facts)
            if got is None:
                # Not taken: nothing was appended, and the loop serves both copies.
                assert native.calls == reference.calls
                got = native.reference(req, facts)
            else:
                took += 1
                TAKEN.append(len(req.topics))
            assert got == reference.reference(req, facts)
            assert native.calls == reference.calls
            assert (native.metrics.produced_bytes, native.metrics.produced_msgs) == (
                reference.metrics.produced_bytes, reference.metrics.produced_msgs)
        assert native.files() == reference.files()
        # What the native call took, it took whole: every one of its appends is in the calls compared above.
        assert took == 0 or any(call[0] == "appended" for call in native.calls)
    finally:
        native.close()
        reference.close()


def test_a_request_the_native_call_does_not_take_changes_nothing(tmp_path):
    world = World(tmp_path)
    try:
        before = world.files()
        bundle = encode_bundle([Message(b"v", None, 1)])
        for names in ([("a", 0), ("a", 2)], [("a", 0), ("a", 9)], [("d", 0), ("x", 0)]):
            topics: dict[str, list] = {}
            for name, partition in names:
                topics.setdefault(name, []).append(rq.ProducePartition(partition, bundle))
            req, facts = scanned(rq.ProduceRequest(1, tuple(rq.ProduceTopic(n, tuple(p)) for n, p in topics.items())))
            assert world.native(req, facts) is None
        assert world.calls == [] and world.files() == before
    finally:
        world.close()


def test_refused_appends_answer_their_codes_and_other_failures_raise(tmp_path):
    world = World(tmp_path)
    try:
        bundle = encode_bundle([Message(b"v", None, 1)])
        first = rq.ProduceRequest(1, (rq.ProduceTopic("a", (rq.ProducePartition(0, bundle, 50),)),),
                                  with_seqnum=True)
        answers, pending = world.native(*scanned(first))
        assert answers == [("a", None, bytearray([ProduceStatus.OK]))] and pending == []
        again = first._replace(request_id=2)  # the same first seq: not above the last assigned
        answers, _ = world.native(*scanned(again))
        assert answers == [("a", None, bytearray([ProduceStatus.INVALID_SEQNUMS]))]

        def failing(name, partition, exc):
            raise RuntimeError(f"not answered: {exc}")

        args = list(world.args(*scanned(again._replace(request_id=3))))
        args[10] = failing
        with pytest.raises(RuntimeError, match="not answered"):
            _produce.append_request(*args)
        with pytest.raises(ZeroDivisionError):
            ProduceHandler._append_failed("a", 0, ZeroDivisionError())
        assert ProduceHandler._append_failed("a", 0, InvalidSeqnums("x")) == ProduceStatus.INVALID_SEQNUMS
        assert ProduceHandler._append_failed("a", 0, OSError("disk")) == ProduceStatus.SYSTEM
    finally:
        world.close()


junk = st.one_of(st.none(), st.integers(-2, 2**70), st.binary(max_size=8), st.text(max_size=4),
                 st.tuples(), st.lists(st.integers(), max_size=3))


@budget(100)
@given(data=st.data())
def test_hostile_arguments_raise_and_never_crash(tmp_path_factory, data):
    world = World(tmp_path_factory.mktemp("hostile"))
    try:
        req, facts = scanned(data.draw(requests(1)))
        args = list(world.args(req, facts))
        spoil = data.draw(st.sampled_from(["topics", "facts", "partition", "short", "registry", "counters", "none"]))
        if spoil == "topics":
            args[0] = data.draw(st.one_of(junk, st.tuples(junk), st.tuples(st.tuples(junk, junk))))
        elif spoil == "facts":
            args[1] = data.draw(st.one_of(junk, st.lists(junk, max_size=6)))
        elif spoil == "partition":
            topic = req.topics[0]
            bad = data.draw(st.one_of(junk, st.tuples(junk, junk, junk, junk)))
            args[0] = ((topic.name, (bad, *topic.partitions[1:])), *req.topics[1:])
        elif spoil == "short":
            args[1] = facts[:-1]
        elif spoil == "registry":
            args[3] = data.draw(st.one_of(junk, st.dictionaries(st.sampled_from(["a", "d"]), junk, max_size=2)))
        elif spoil == "counters":
            args[data.draw(st.sampled_from([7, 8, 9, 11]))] = data.draw(junk)
        try:
            _produce.append_request(*args[: data.draw(st.integers(0, 12))] if spoil == "none" else args)
        except (TypeError, ValueError, AttributeError, OverflowError, IndexError):
            pass
    finally:
        world.close()


def read_or_error(payload, with_seqnum: bool):
    """read_checked_produce's answer, or the ProtocolError it raises as (message, position)."""
    try:
        return rq.read_checked_produce(payload, with_seqnum)
    except ProtocolError as exc:
        return (str(exc), exc.position)


@st.composite
def payloads(draw, request_id: int) -> tuple[bytes, bool]:
    """A request's payload and the message id's with_seqnum: valid, or truncated, padded, mutated, random bytes or
    read with the other message id."""
    req = draw(requests(request_id))
    payload = rq.encode_produce_request(req)
    with_seqnum = req.with_seqnum
    spoil = draw(st.sampled_from(["none", "none", "none", "truncated", "padded", "mutated", "random", "other id"]))
    if spoil == "truncated":
        payload = payload[: draw(st.integers(0, len(payload) - 1))]
    elif spoil == "padded":
        payload += draw(st.binary(min_size=1, max_size=8))
    elif spoil == "mutated":
        at = draw(st.integers(0, len(payload) - 1))
        payload = payload[:at] + bytes([draw(st.integers(0, 255))]) + payload[at + 1:]
    elif spoil == "random":
        payload = draw(st.binary(max_size=64))
    elif spoil == "other id":
        with_seqnum = not with_seqnum
    return payload, with_seqnum


def payload_args(world: World, payload, with_seqnum: bool, started: float = 0.0, now: float = 0.0) -> list:
    """produce_payload's arguments: its ack latency is `now - started`."""
    context = NativeContext(None, *world.args(rq.ProduceRequest(0, ()), [])[3:], lambda: now,
                            world.metrics.latency, LATENCY_BUCKETS_S)
    return [payload, with_seqnum, context, started]


def latency_lines(metrics: Metrics) -> list[str]:
    """The ack latency histograms' lines of /metrics (the process's own families differ between two Metrics)."""
    return [line for line in metrics.render().splitlines() if line.startswith("tanksrv_topic_latency")]


# Latencies at every bucket's bound, just below and just above it, and past the last: the bucket edges of
# Histogram.observe's bisect_left.
EDGES = [0.0, 1e-9, 1e6, *(math.nextafter(b, d) for b in LATENCY_BUCKETS_S for d in (0.0, math.inf)),
         *LATENCY_BUCKETS_S]


@budget(60)
@given(st.data())
def test_the_native_payload_path_is_the_scan_the_loop_and_the_frame(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("payloads")
    native, reference = World(root / "native"), World(root / "reference")
    try:
        for request_id in range(1, data.draw(st.integers(1, 25))):
            payload, with_seqnum = data.draw(payloads(request_id))
            expected = read_or_error(payload, with_seqnum)
            started = data.draw(st.sampled_from([0.0, 1000.0]))
            latency = data.draw(st.one_of(st.sampled_from(EDGES), st.floats(0.0, 10.0)))
            try:
                got = _produce.produce_payload(*payload_args(native, payload, with_seqnum, started,
                                                             started + latency))
            except ProtocolError as exc:
                assert (str(exc), exc.position) == expected  # the reference's error, and nothing appended
                assert native.calls == reference.calls
                continue
            if isinstance(expected, tuple) and isinstance(expected[0], str):
                assert got is None  # a framing fault: the reference reader names it
                continue
            req, facts = expected
            if got is None:  # not taken: nothing appended, and the loop serves both copies
                assert native.calls == reference.calls
                got = native.reference(req, facts)
                assert got == reference.reference(req, facts)
            else:
                answers, pending = reference.reference(req, facts)
                got_answers, got_pending, frame, got_id, got_timeout = got
                assert (got_answers, got_pending) == (answers, pending)
                assert (got_id, got_timeout) == (req.request_id, req.ack_timeout_ms)
                if len(answers) == 1 and not pending:
                    assert frame == ProduceHandler._frame(req.request_id, answers, None)
                    # the call counted its latency: the reference counts the same clock reads
                    reference.metrics.ack_latency(answers[0][0], (started + latency) - started)
                else:
                    assert frame is None
            assert native.calls == reference.calls
            assert (native.metrics.produced_bytes, native.metrics.produced_msgs) == (
                reference.metrics.produced_bytes, reference.metrics.produced_msgs)
            assert latency_lines(native.metrics) == latency_lines(reference.metrics)  # /metrics, byte for byte
        assert native.files() == reference.files()
    finally:
        native.close()
        reference.close()


def test_the_call_counts_the_ack_latency_as_the_histogram_does_at_every_bucket_edge(tmp_path):
    """The latency histogram the native call raises (its bucket found in C) holds what Histogram.observe would
    hold, at each bucket's bound and on either side of it, and /metrics renders the two alike, byte for byte."""
    world, reference = World(tmp_path / "native"), Metrics()
    try:
        bundle = encode_bundle([Message(b"v", None, 1)])
        for i, latency in enumerate(EDGES * 2, start=1):
            payload = rq.encode_produce_request(rq.ProduceRequest(i, (rq.ProduceTopic("a", (rq.ProducePartition(
                0, bundle),)),)))
            got = _produce.produce_payload(*payload_args(world, payload, False, 50.0, 50.0 + latency))
            assert got is not None and got[2] is not None
            reference.ack_latency("a", (50.0 + latency) - 50.0)
        native = world.metrics.latency["a"]
        assert (native.counts, native.total, native.count) == (
            reference.latency["a"].counts, reference.latency["a"].total, reference.latency["a"].count)
        assert all(type(n) is int for n in native.counts) and type(native.total) is float
        assert latency_lines(world.metrics) and latency_lines(world.metrics) == latency_lines(reference)
    finally:
        world.close()


def test_the_payload_path_takes_the_common_request_and_frames_its_answer(tmp_path):
    world = World(tmp_path)
    try:
        bundle = encode_bundle([Message(b"v" * 100, None, 1)])
        req = rq.ProduceRequest(7, (rq.ProduceTopic("a", (rq.ProducePartition(0, bundle),)),), ack_timeout_ms=9)
        answers, pending, frame, request_id, timeout = _produce.produce_payload(
            *payload_args(world, rq.encode_produce_request(req), False))
        assert answers == [("a", None, bytearray([ProduceStatus.OK]))] and pending == []
        assert frame == ProduceHandler._frame(7, answers, None) and (request_id, timeout) == (7, 9)
        tp = world.topics["a"].partitions[0].tp
        assert [call[:2] for call in world.calls] == [("appended", tp)]
        durable = req._replace(topics=(rq.ProduceTopic("d", (rq.ProducePartition(1, bundle),)),))
        answers, pending, frame, _, _ = _produce.produce_payload(
            *payload_args(world, rq.encode_produce_request(durable), False))
        assert pending == [(0, 0, "ack-2")] and frame is None
    finally:
        world.close()


def test_the_payload_path_answers_none_for_what_it_does_not_take(tmp_path):
    world = World(tmp_path)
    try:
        before = world.files()
        bundle = encode_bundle([Message(b"v", None, 1)])
        one = rq.encode_produce_request(rq.ProduceRequest(1, (rq.ProduceTopic("a", (rq.ProducePartition(2, bundle),)),)))
        for payload in (one, bytearray(one), memoryview(one), one[:-1]):
            assert _produce.produce_payload(*payload_args(world, payload, False)) is None
        assert world.calls == [] and world.files() == before
    finally:
        world.close()


@budget(100)
@given(data=st.data())
def test_hostile_payload_arguments_raise_and_never_crash(tmp_path_factory, data):
    world = World(tmp_path_factory.mktemp("hostile-payload"))
    try:
        payload, with_seqnum = data.draw(payloads(1))
        args = payload_args(world, payload, with_seqnum)
        spoil = data.draw(st.sampled_from(["payload", "flag", "context", "registry", "counters", "calls", "latency",
                                           "started", "none"]))
        context = list(args[2])
        if spoil == "payload":
            args[0] = data.draw(junk)
        elif spoil == "flag":
            args[1] = data.draw(junk)
        elif spoil == "context":
            args[2] = data.draw(st.one_of(junk, st.tuples(junk, junk)))
        elif spoil == "registry":
            context[1] = data.draw(st.one_of(junk, st.dictionaries(st.sampled_from(["a", "d"]), junk, max_size=2)))
        elif spoil == "counters":
            context[data.draw(st.sampled_from([5, 6, 7]))] = data.draw(junk)
        elif spoil == "calls":
            context[data.draw(st.sampled_from([3, 4, 8, 9, 10]))] = data.draw(junk)
        elif spoil == "latency":
            context[data.draw(st.sampled_from([11, 12]))] = data.draw(st.one_of(
                junk, st.dictionaries(st.sampled_from(["a", "d"]), junk, max_size=2), st.tuples(junk, junk)))
        elif spoil == "started":
            args[3] = data.draw(junk)
        if spoil in ("registry", "counters", "calls", "latency"):
            args[2] = tuple(context)
        try:
            _produce.produce_payload(*args[: data.draw(st.integers(0, 4))] if spoil == "none" else args)
        except (TypeError, ValueError, AttributeError, OverflowError, IndexError, KeyError):
            pass
    finally:
        world.close()
