"""The native appender of an active segment (tiered/storage/_appender.c) against the reference
(tiered/storage/appender.py's PySegmentAppender): the same appends give the same segment files, index files, in-memory indexes, positions and
attributes, byte for byte; the same bad arguments are refused alike and write nothing; real write failures (a file
size limit, a full device) are handled alike. And the whole PartitionLog, rolls included, writes the same files
through either (TIERED_PRODUCE_PATH)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.protocol.strategies import budget
from tiered.metrics import Metrics
from tiered.protocol.bundle import CODEC_NONE, CODEC_SNAPPY, BundleFacts, Message, encode_bundle
from tiered.storage.index import NEVER_INDEXED, SparseIndex
from tiered.storage.partition_log import PartitionLog
from tiered.storage.appender import (
    INDEX_WRITE_BATCH,
    MAX_SEQ,
    PRODUCE_PATH_ENV,
    AppendResult,
    NativeSegmentAppender,
    PySegmentAppender,
    appender_class,
    next_seqs,
    seqs_valid,
)
from tiered.storage.topic_config import TopicConfig
from tiered.protocol.bundle import validate_bundle
from tiered.protocol.varint import encode_varint

native_appender_module = pytest.importorskip("tiered.storage._appender")

APPENDERS = pytest.mark.parametrize("appender_type", [PySegmentAppender, NativeSegmentAppender],
                                    ids=["python", "native"])
CREATED, ROLL_AGE = 1_795_352_546, 3600
ATTRIBUTES = ("log_fd", "index_fd", "base", "size", "last", "since_last_update", "ts_bounds", "ts_complete")


def test_the_native_appender_is_built_and_the_default(monkeypatch):
    assert NativeSegmentAppender is not None, "tiered.storage._appender is not built: `pip install -e .` with gcc"
    monkeypatch.delenv(PRODUCE_PATH_ENV, raising=False)
    assert appender_class() is NativeSegmentAppender
    assert "\ntiered_native_segment_appender 1\n" in Metrics().render()  # what an operator sees
    monkeypatch.setenv(PRODUCE_PATH_ENV, "python")
    assert appender_class() is PySegmentAppender
    assert "\ntiered_native_segment_appender 0\n" in Metrics().render()
    assert appender_class("native") is NativeSegmentAppender


@contextlib.contextmanager
def opened(appender_type, directory: str, base: int = 1, size: int = 0, last: int | None = None,
           since: int = NEVER_INDEXED, log_path: str | None = None, index_path: str | None = None):
    log_path = log_path or os.path.join(directory, f"{base}_1.log")
    index_path = index_path or os.path.join(directory, f"{base}.index")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    index_fd = os.open(index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    appender = appender_type(log_path, index_path, log_fd, index_fd, base, size, last, SparseIndex(), since, CREATED,
                             ROLL_AGE)
    try:
        yield appender
    finally:
        appender.close()


def state(appender) -> tuple:
    return tuple(getattr(appender, a) for a in ATTRIBUTES) + (list(appender.index), bytes(appender.unwritten))


def files(directory: str) -> dict[str, bytes]:
    """Every file's bytes by name; a sealed segment's name without its freeze time (the .log's mtime: the two
    logs of a comparison may be written either side of a second's change)."""
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[re.sub(r"_\d+\.ilog$", ".ilog", name)] = f.read()
    return out


# An append: (record, seq step before it, messages, interval, ts bounds or None, None or the limits of an
# append_in_place: (sparse, seconds since the segment's creation, segment bytes, index bytes)); or "flush".
appends = st.lists(
    st.one_of(
        st.tuples(st.binary(min_size=1, max_size=300), st.integers(0, 3), st.integers(1, 5), st.integers(0, 600),
                  st.one_of(st.none(), st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))),
                  st.one_of(st.none(), st.tuples(st.booleans(), st.floats(0, 2 * ROLL_AGE), st.integers(0, 5000),
                                                 st.integers(0, 80)))),
        st.just("flush"),
    ),
    max_size=60,
)


@budget(150)
@given(ops=appends, base=st.integers(1, 2**40), since=st.sampled_from([NEVER_INDEXED, 0, 17]))
def test_the_same_appends_write_the_same_bytes(ops, base, since):
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        with (opened(PySegmentAppender, a, base, since=since) as ref,
              opened(NativeSegmentAppender, b, base, since=since) as nat):
            seq = base
            for op in ops:
                if op == "flush":
                    ref.write_entries()
                    nat.write_entries()
                    continue
                record, step, messages, interval, ts, in_place = op
                seq += step
                low, high = (None, 0) if ts is None else (min(ts), max(ts))
                last = seq + messages - 1
                if in_place is None:
                    assert ref.append(record, seq, last, interval, low, high) == nat.append(
                        memoryview(record).toreadonly(), seq, last, interval, low, high)
                else:
                    sparse, age, segment_bytes, index_bytes = in_place
                    limits = (sparse, CREATED + age, segment_bytes, index_bytes)
                    assert ref.takes(seq, last, sparse, len(record), *limits[1:]) == nat.takes(
                        seq, last, sparse, len(record), *limits[1:])
                    assert ref.append_in_place(record, seq, last, *limits, interval, low, high) == \
                        nat.append_in_place(memoryview(record).toreadonly(), seq, last, *limits, interval, low, high)
                seq += messages
                assert state(ref)[2:] == state(nat)[2:]  # the fds differ, every other attribute is the same
            assert files(a) == files(b)
        assert files(a) == files(b)  # after close: the last batch of entries too


# An append_record: (record, seq step before it, messages, sparse, seconds since the segment's creation, segment
# bytes, index bytes, interval, ts bounds).
records = st.lists(
    st.tuples(st.binary(min_size=1, max_size=300), st.integers(0, 3), st.integers(1, 5), st.booleans(),
              st.floats(0, 2 * ROLL_AGE), st.integers(0, 5000), st.integers(0, 80), st.integers(0, 600),
              st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))),
    max_size=40,
)


@budget(100)
@given(ops=records, base=st.integers(1, 2**40))
def test_append_record_reads_the_facts_and_the_config_alike(ops, base):
    """The partition log's call: append_in_place with the sparse flag and timestamp bounds taken from the bundle's
    BundleFacts and the limits from the TopicConfig, natively by field position and interned name."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        # `last` set: the segment holds a record already, so append_record may take the first one too.
        with (opened(PySegmentAppender, a, base, last=base - 1) as ref,
              opened(NativeSegmentAppender, b, base, last=base - 1) as nat):
            seq = base
            for record, step, messages, sparse, age, segment_bytes, index_bytes, interval, ts in ops:
                seq += step
                last = seq + messages - 1
                facts = BundleFacts(CODEC_NONE, messages, sparse, seq if sparse else None, last if sparse else None,
                                    1, min(ts), max(ts))
                config = TopicConfig(log_segment_bytes=segment_bytes, log_index_size_max_bytes=index_bytes,
                                     log_index_interval_bytes=interval)
                got = ref.append_record(record, seq, last, facts, CREATED + age, config)
                assert got == nat.append_record(memoryview(record).toreadonly(), seq, last, facts, CREATED + age,
                                                config)
                if got is not None:
                    seq += messages
                assert state(ref)[2:] == state(nat)[2:]
            assert files(a) == files(b)
        assert files(a) == files(b)


def test_the_native_appender_reads_bundle_facts_by_these_positions():
    """_appender.c's FACT_* positions: BundleFacts' field order is part of the native appender's contract."""
    assert len(BundleFacts._fields) == 8
    assert [BundleFacts._fields.index(f) for f in ("messages", "sparse", "first_seq", "last_seq", "min_ts_ms",
                                                   "max_ts_ms")] == [1, 2, 3, 4, 6, 7]
    assert len(AppendResult._fields) == 7  # RESULT_FIELDS: append_next builds one by position


# Seqs near the edges the log checks: 0, 1, around MAX_SEQ and past 63 and 64 bits.
edge_seqs = st.one_of(st.integers(0, 40), st.integers(MAX_SEQ - 8, MAX_SEQ + 8), st.just(2**64 - 1),
                      st.integers(0, 2**64 - 1))
# An append_next: (record, messages, sparse first..last or None, base_seq or None, last_assigned, seconds since the
# segment's creation, segment bytes).
nexts = st.lists(
    st.tuples(st.binary(min_size=1, max_size=200), st.integers(0, 5),
              st.none() | st.tuples(edge_seqs, edge_seqs), st.none() | edge_seqs, edge_seqs,
              st.floats(0, 2 * ROLL_AGE), st.integers(0, 3000)),
    max_size=30,
)


@budget(150)
@given(ops=nexts, base=st.integers(1, 40))
def test_append_next_assigns_the_same_seqs_and_writes_the_same_bytes(ops, base):
    """PartitionLog.append's common case in one call: the seqs (sparse, 0x05 base, or after last_assigned), refused
    alike at every edge (None, nothing written), then append_record; the same AppendResult, files and state."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        with (opened(PySegmentAppender, a, base, last=base - 1) as ref,
              opened(NativeSegmentAppender, b, base, last=base - 1) as nat):
            for record, messages, sparse, base_seq, last_assigned, age, segment_bytes in ops:
                if sparse is not None:  # a sparse bundle names its seqs, a 0x05 produce names no base with it
                    base_seq = None
                facts = BundleFacts(CODEC_NONE, messages, sparse is not None, *(sparse or (None, None)), 1, 3, 9)
                config = TopicConfig(log_segment_bytes=segment_bytes, log_index_interval_bytes=50)
                last_assigned = max(last_assigned, ref.last)  # the log's: never below what its segment holds
                got = ref.append_next(record, facts, base_seq, last_assigned, CREATED + age, config)
                view = memoryview(record).toreadonly()
                assert got == nat.append_next(view, facts, base_seq, last_assigned, CREATED + age, config)
                if got is not None:
                    first, last, explicit = next_seqs(facts, base_seq, last_assigned)
                    assert got[:5] == (first, last, base, got.position, got.position + len(record))
                    assert seqs_valid(first, last, explicit, last_assigned) and got.header is facts
                assert state(ref)[2:] == state(nat)[2:]
            assert files(a) == files(b)
        assert files(a) == files(b)


@APPENDERS
def test_entries_reach_the_file_in_batches(tmp_path, appender_type):
    with opened(appender_type, str(tmp_path)) as appender:
        for seq in range(1, INDEX_WRITE_BATCH // 8 + 2):
            appender.append(b"r" * 10, seq, seq, 0, 5, 5)  # interval 0: every record is indexed
        assert len(appender.index) == INDEX_WRITE_BATCH // 8 + 1
        assert os.path.getsize(appender.index_path) == INDEX_WRITE_BATCH and len(appender.unwritten) == 8
    assert os.path.getsize(os.path.join(tmp_path, "1.index")) == INDEX_WRITE_BATCH + 8


# --- bad arguments: refused alike, nothing written ----------------------------------------------------------------

BAD_APPENDS = [
    ((b"x", 0, 0, 10, 1, 1), ValueError),  # below the base
    ((b"x", 1 + 2**32, 1 + 2**32, 10, 1, 1), ValueError),  # rel seq past u32
    ((b"x", -1, 1, 10, 1, 1), ValueError),
    ((b"x", 2**64, 2**64, 10, 1, 1), ValueError),
    ((b"x", 1, 1, -1, 1, 1), ValueError),
    ((b"x", 1, 1, 10, -5, 1), ValueError),
    ((b"x", 1, 1, 10, 2**64, 1), ValueError),
    (("text", 1, 1, 10, 1, 1), TypeError),
    ((None, 1, 1, 10, 1, 1), TypeError),
    ((b"x", "1", 1, 10, 1, 1), TypeError),
    ((b"x", 1.0, 1, 10, 1, 1), TypeError),
]


@pytest.mark.parametrize("args, error", BAD_APPENDS)
def test_bad_appends_are_refused_and_write_nothing(tmp_path, args, error):
    with opened(NativeSegmentAppender, str(tmp_path)) as appender:
        with pytest.raises(error):
            appender.append(*args)
        assert appender.size == 0 and appender.last is None and not list(appender.index)
    assert os.path.getsize(os.path.join(tmp_path, "1_1.log")) == 0


@APPENDERS
@pytest.mark.parametrize("first", [0, 1 + 2**32])
def test_a_seq_the_index_cannot_hold_is_refused_alike(tmp_path, appender_type, first):
    with opened(appender_type, str(tmp_path)) as appender, pytest.raises(ValueError, match="cannot be indexed"):
        appender.append(b"x", first, first, 10, 1, 1)
    assert os.path.getsize(os.path.join(tmp_path, "1_1.log")) == 0


@APPENDERS
def test_a_record_past_u32_bytes_is_refused_before_the_write(tmp_path, appender_type):
    with opened(appender_type, str(tmp_path), size=0xFFFF_FFF0, last=5) as appender:
        with pytest.raises(ValueError, match="cannot be indexed"):
            appender.append(b"y" * 16, 6, 6, 10, 1, 1)
        assert appender.size == 0xFFFF_FFF0 and appender.last == 5
        assert appender.append(b"y" * 15, 6, 6, 10, 1, 1) == 0xFFFF_FFF0


def test_the_native_appender_survives_misuse(tmp_path):
    blank = NativeSegmentAppender.__new__(NativeSegmentAppender)  # never initialised: no fd 0, no crash
    assert blank.log_fd == -1 and blank.index is None and blank.path is None
    with pytest.raises(ValueError):
        blank.append(b"x", 1, 1, 10, 1, 1)
    blank.write_entries()
    blank.close()
    with pytest.raises(TypeError):
        NativeSegmentAppender("p", "i", 1, 2)
    with pytest.raises(TypeError):
        NativeSegmentAppender(b"p", "i", -1, -1, 1, 0, None, SparseIndex(), 0, 0, 0)
    with pytest.raises(ValueError):
        NativeSegmentAppender("p", "i", -1, -1, -1, 0, None, SparseIndex(), 0, 0, 0)
    with pytest.raises(TypeError):
        NativeSegmentAppender("p", "i", -1, -1, 1, 0, None, 5, 0, 0, 0)  # an index without a length
    with opened(NativeSegmentAppender, str(tmp_path)) as appender:
        with pytest.raises(TypeError):
            appender.append(b"x", 1, 1)
        with pytest.raises(TypeError):
            appender.append_in_place(b"x", 1, 1, False, 0.0, 1, 1, 10, 1)
        with pytest.raises(TypeError):
            appender.takes(1, 1, False, 1, "now", 1, 1)
        with pytest.raises(TypeError):
            appender.append_in_place(5, 1, 1, False, 0.0, 1, 1, 10, 1, 1)
        facts = BundleFacts(CODEC_NONE, 1, False, None, None, 1, 5, 5)
        with pytest.raises(TypeError, match="append_record takes"):
            appender.append_record(b"x", 1, 1, facts, 0.0)
        with pytest.raises(TypeError, match="BundleFacts"):
            appender.append_record(b"x", 1, 1, (False, 5, 5), 0.0, TopicConfig())
        with pytest.raises(TypeError, match="BundleFacts"):
            appender.append_record(b"x", 1, 1, [0] * 8, 0.0, TopicConfig())
        with pytest.raises(AttributeError):
            appender.append_record(b"x", 1, 1, facts, 0.0, object())
        with pytest.raises(TypeError, match="append_next takes"):
            appender.append_next(b"x", facts, None, 0, 0.0)
        with pytest.raises(TypeError, match="BundleFacts"):
            appender.append_next(b"x", (1, 2), None, 0, 0.0, TopicConfig())
        with pytest.raises(ValueError, match="last_assigned"):
            appender.append_next(b"x", facts, None, -1, 0.0, TopicConfig())
        with pytest.raises(TypeError, match="base_seq"):
            appender.append_next(b"x", facts, "1", 0, 0.0, TopicConfig())
        with pytest.raises(TypeError):
            appender.append_next(b"x", facts, None, 0, "now", TopicConfig())
        assert appender.append_next(b"x", facts, None, 0, 0.0, TopicConfig()) is None  # empty: the log's path
        with pytest.raises(TypeError, match="tuple subclass"):
            native_appender_module.register(object)
        appender.close()
    with opened(NativeSegmentAppender, str(tmp_path), base=5, last=4) as holding:  # holds a record: would take one
        holding.close()
        with pytest.raises(ValueError, match="closed"):
            holding.append_next(b"x", facts, None, 4, 0.0, TopicConfig())
        with pytest.raises(ValueError, match="closed"):
            holding.append(b"x", 5, 5, 10, 1, 1)
        holding.close()  # again: nothing


# --- real write failures -----------------------------------------------------------------------------------------

LIMITED = r"""
import json, os, resource, signal, sys
from tiered.storage.index import NEVER_INDEXED, SparseIndex
from tiered.storage.appender import NativeSegmentAppender, PySegmentAppender
appender_type = NativeSegmentAppender if sys.argv[2] == "native" else PySegmentAppender
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write returns what fitted, then EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
path, index_path = os.path.join(sys.argv[1], "1_1.log"), os.path.join(sys.argv[1], "1.index")
log_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
index_fd = os.open(index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
appender = appender_type(path, index_path, log_fd, index_fd, 1, 0, None, SparseIndex(), NEVER_INDEXED, 0, 3600)
appender.append(b"a" * 600, 1, 1, 10, 1, 1)
try:
    appender.append(b"b" * 600, 2, 2, 10, 1, 1)
    error = None
except OSError as exc:
    error = exc.errno
seen = [error, appender.size, appender.last, os.path.getsize(path)]
print(json.dumps([*seen, appender.append(b"c" * 100, 2, 2, 10, 1, 1)]))
appender.close()
"""


@APPENDERS
def test_a_failed_write_is_cut_back(tmp_path, appender_type):
    """A record that crosses the file size limit is written in part, then refused: the file is cut back."""
    name = "native" if appender_type is NativeSegmentAppender else "python"
    out = subprocess.run([sys.executable, "-c", LIMITED, str(tmp_path), name], capture_output=True, text=True,
                         check=True)
    error, size, last, file_size, next_position = json.loads(out.stdout)
    assert (error, size, last, file_size, next_position) == (27, 600, 1, 600, 600)  # EFBIG
    with open(tmp_path / "1_1.log", "rb") as f:
        assert f.read() == b"a" * 600 + b"c" * 100


@APPENDERS
def test_a_full_device_fails_the_append_and_only_logs_an_index_failure(tmp_path, appender_type, caplog):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with opened(appender_type, str(tmp_path), log_path="/dev/full") as appender, pytest.raises(OSError) as raised:
        appender.append(b"x" * 10, 1, 1, 10, 1, 1)
    assert raised.value.errno == 28 and "could not cut /dev/full back to 0" in caplog.text
    with opened(appender_type, str(tmp_path), index_path="/dev/full") as appender:
        for seq in range(1, INDEX_WRITE_BATCH // 8 + 1):
            appender.append(b"r", seq, seq, 0, 1, 1)  # the last one fills a batch: its write fails, and is logged
        assert appender.size == INDEX_WRITE_BATCH // 8 and len(appender.index) == INDEX_WRITE_BATCH // 8
        assert not appender.unwritten
    assert "could not write 512 index entries to /dev/full" in caplog.text


# --- the whole log, both ways ----------------------------------------------------------------------------------------

log_ops = st.lists(
    st.tuples(st.lists(st.binary(max_size=200), min_size=1, max_size=8), st.sampled_from([CODEC_NONE, CODEC_SNAPPY]),
              st.integers(0, 3), st.integers(0, 2**40)),
    min_size=1, max_size=40,
)


@contextlib.contextmanager
def produce_path(name: str):
    before = os.environ.get(PRODUCE_PATH_ENV)
    os.environ[PRODUCE_PATH_ENV] = name
    try:
        yield
    finally:
        if before is None:
            del os.environ[PRODUCE_PATH_ENV]
        else:
            os.environ[PRODUCE_PATH_ENV] = before


def write_log(directory: str, path: str, ops, config: TopicConfig) -> list:
    results = []
    clock = [float(CREATED)]
    with produce_path(path):
        log = PartitionLog.open(directory, config, now_s=lambda: clock[0], rng=random.Random(7))
        try:
            for i, (values, codec, jump, ts) in enumerate(ops):
                clock[0] += 400.0  # past the segment's roll age (one hour) every few records
                bundle = encode_bundle([Message(v, ts_ms=ts + i) for i, v in enumerate(values)], codec=codec)
                base_seq = log.last_assigned + 1 + jump if jump else None  # a jump rolls, as TANK does
                if i % 2:  # as a produce request lays it out: append_next's one call when the segment takes it
                    record = memoryview(encode_varint(len(bundle)) + bundle).toreadonly()
                    a = log.append(bundle, base_seq, validate_bundle(bundle), record)
                else:
                    a = log.append(bundle, base_seq)
                results.append((a.first_seq, a.last_seq, a.segment_base, a.position, a.end_position, bytes(a.record)))
        finally:
            log.close()
    return results


@budget(60)
@given(ops=log_ops, segment_bytes=st.integers(200, 3000), interval=st.integers(0, 500),
       index_bytes=st.sampled_from([16, 64, 10 * 1024 * 1024]))
def test_the_log_writes_the_same_files_either_way(ops, segment_bytes, interval, index_bytes):
    config = TopicConfig(log_segment_bytes=segment_bytes, log_index_interval_bytes=interval,
                         log_index_size_max_bytes=index_bytes, log_roll_jitter_secs=1)  # a roll age of one hour
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        assert write_log(a, "python", ops, config) == write_log(b, "native", ops, config)
        assert files(a) == files(b)
