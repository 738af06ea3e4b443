"""PartitionLog.append's common case in one native call (_appender.log_append, on the log's fields in C: LogCore)
against the method itself, its reference: the same appends (records laid out or not, plain and 0x05 seqs, seqs
refused, rolls, flushes by count and by time, a closed log) give the same answers, refusals, seqs and files. Hostile
arguments raise, never crash (the ASan build runs this file: tests/test_native_asan.py)."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiered.protocol import requests as rq
from tiered.protocol.bundle import Message, encode_bundle
from tiered.storage.partition_log import InvalidSeqnums, PartitionLog, log_append_for
from tiered.storage.topic_config import TopicConfig

from tests.protocol.strategies import budget

appender = pytest.importorskip("tiered.storage._appender")

CONFIGS = {
    "plain": {},
    "flush by count": {"flush.messages": "3"},
    "flush by time": {"flush.secs": "1"},
}
# One step: ("append", messages, value size, base seq kind, layout), ("tick",) or ("close",); layout: the bundle
# alone, the record laid out in the request with it, or the record alone (the bundle None, as the native produce
# call hands it over).
steps = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 8), st.sampled_from([1, 40, 300]),
              st.sampled_from([None, None, None, "jump", "old"]),
              st.sampled_from(["bundle", "record", "record alone"])),
    st.tuples(st.just("tick")), st.tuples(st.just("close"))), max_size=40)


def _run(root, append, config_name: str, ops) -> list:
    now = [1_700_000_000.0]
    config = TopicConfig.from_layers({"log.segment.bytes": "900", "log.index.interval.bytes": "128",
                                      **CONFIGS[config_name]})
    log = PartitionLog.open(str(root), config, now_s=lambda: now[0])
    seen: list = []
    for i, op in enumerate(ops):
        if op[0] == "tick":
            now[0] += 0.7
            continue
        if op[0] == "close":
            log.close()
            continue
        _, messages, size, base_kind, layout = op
        bundle = encode_bundle([Message(bytes([i % 251]) * size, None, 1_000 + i) for _ in range(messages)])
        base = None if base_kind is None else (log.last_assigned + 5 if base_kind == "jump" else 1)
        req = rq.ProduceRequest(i, (rq.ProduceTopic("t", (rq.ProducePartition(0, bundle, base),)),),
                                with_seqnum=base is not None)
        scanned, facts = rq.read_checked_produce(rq.encode_produce_request(req), base is not None)
        p = scanned.topics[0].partitions[0]
        try:
            record = None if layout == "bundle" else p.record
            got = append(log, None if layout == "record alone" and record is not None else p.bundle, base, facts[0],
                         record)
            seen.append((tuple(got[:5]), bytes(got.record), got.header, log.last_assigned))
        except (InvalidSeqnums, ValueError) as exc:
            seen.append((type(exc).__name__, log.last_assigned))
    if not log._closed:
        log.flush()
        log.close()
    files = {}
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name), "rb") as f:
            files[re.sub(r"_\d+\.(ilog|log)$", r".\1", name)] = f.read()  # a sealed name holds its freeze time
    return [seen, files]


@budget(60)
@given(st.sampled_from(sorted(CONFIGS)), steps)
def test_the_native_log_append_is_the_method_s(tmp_path_factory, config_name, ops):
    root = tmp_path_factory.mktemp("log")
    native = _run(root / "native", log_append_for("native"), config_name, ops)
    assert native == _run(root / "reference", PartitionLog.append, config_name, ops)


def test_the_python_path_chooses_the_method():
    assert log_append_for("python") is PartitionLog.append
    assert log_append_for("native") is appender.log_append


def test_hostile_arguments_raise_and_never_crash(tmp_path):
    log = PartitionLog.open(str(tmp_path / "log"), TopicConfig.from_layers({}), now_s=lambda: 1.0)
    bundle = encode_bundle([Message(b"v", None, 1)])
    facts = rq.read_checked_produce(rq.encode_produce_request(rq.ProduceRequest(
        1, (rq.ProduceTopic("t", (rq.ProducePartition(0, bundle),)),))), False)[1][0]
    for args in [(), (log,), (object(), bundle, None, facts, None), (log, bundle, None, (1, 2), b"x"),
                 (log, bundle, None, facts, 5), (log, 7, None, facts, None)]:
        with pytest.raises((TypeError, ValueError, AttributeError)):
            appender.log_append(*args)
    bare = appender.LogCore()  # no fields set: the method's path, which this base lacks
    with pytest.raises(AttributeError):
        appender.log_append(bare, bundle, None, facts, b"x")
    assert log.last_assigned == 0
    log.close()
