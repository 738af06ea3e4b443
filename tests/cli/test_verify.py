"""`tiered verify` on real segment files: good files pass with exact counts, damaged ones are named and fail."""

from __future__ import annotations

import re

import snappy

from tiered.cli.main import main
from tiered.protocol.bundle import Message, encode_bundle, read_bundle_header
from tiered.protocol.varint import encode_varint, maybe_varint
from tiered.storage.partition_log import PartitionLog
from tiered.storage.topic_config import TopicConfig


def _segment_dir(tmp_path, rolls: bool = True):
    config = TopicConfig.from_layers({"log.segment.bytes": "256", "log.index.interval.bytes": "128",
                                      "produce.ack": "local"})
    plog = PartitionLog.open(str(tmp_path / "p"), config)
    for i in range(12):
        plog.append(encode_bundle([Message(b"m%02d-" % i + b"x" * 40, None, 1000 + i)] * 3, codec=0))
    plog.append(encode_bundle([Message(b"s1", None, 5, 100), Message(b"s2", None, 5, 104)], sparse=True))
    plog.close()
    return tmp_path / "p"


def test_good_segments_and_indexes_pass_with_exact_counts(tmp_path, capsys):
    d = _segment_dir(tmp_path)
    files = sorted(d.glob("*.ilog")) + sorted(d.glob("*.log")) + sorted(d.glob("*.index"))
    assert main(["verify", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok:") == len(files)
    total = sum(int(m) for m in re.findall(r"(\d+) messages", out))
    assert total == 12 * 3 + 2  # every message counted once, the sparse bundle included


def test_a_damaged_log_and_a_wrong_index_are_reported(tmp_path, capsys):
    d = _segment_dir(tmp_path)
    ilog = sorted(d.glob("*.ilog"))[0]
    data = bytearray(ilog.read_bytes())
    _, flags_at = maybe_varint(data, 0)
    data[flags_at] = 0x03  # the first bundle's codec becomes 3, which does not exist
    ilog.write_bytes(bytes(data))
    index = d / f"{ilog.name.split('-')[0]}.index"
    index.write_bytes(index.read_bytes()[:8] + (5).to_bytes(4, "little") + (7).to_bytes(4, "little"))
    assert main(["verify", str(ilog), str(index)]) == 1
    out = capsys.readouterr().out
    assert "BAD" in out and "codec" in out


def test_unknown_file_names_fail(tmp_path, capsys):
    other = tmp_path / "notes.txt"
    other.write_text("x")
    assert main(["verify", str(other), str(tmp_path / "missing.ilog")]) == 1
    out = capsys.readouterr().out
    assert "not a segment or index file name" in out and "no such file" in out


def _snappy_segment(tmp_path):
    """One partition whose bundles are snappy-compressed (600 messages each, as TANK's client compresses them)."""
    config = TopicConfig.from_layers({"produce.ack": "local"})
    plog = PartitionLog.open(str(tmp_path / "z"), config)
    for b in range(2):
        plog.append(encode_bundle([Message(b"message %d of bundle %d" % (i, b), None, 1000 + i) for i in range(600)]))
    plog.close()
    return tmp_path / "z"


def test_a_directory_stands_for_its_segment_and_index_files(tmp_path, capsys):
    d = _segment_dir(tmp_path)
    (d / "config").write_text("log.segment.bytes=1m\n")  # a partition config file is not a segment: skipped
    assert main(["verify", str(d)]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok:") == len(list(d.glob("*.*log"))) + len(list(d.glob("*.index"))) > 2


def test_every_snappy_payload_is_decompressed_and_a_flip_that_breaks_it_is_reported(tmp_path, capsys):
    d = _snappy_segment(tmp_path)
    (log,) = d.glob("*.log")
    good = log.read_bytes()
    assert main(["verify", str(log)]) == 0
    assert "2 bundles (2 snappy), 1,200 messages, seqs 1..1200" in capsys.readouterr().out
    length, start = maybe_varint(good, 0)
    payload = range(start + 3, start + length, 5)  # every 5th byte of the first bundle's snappy payload
    reported = 0
    for position in payload:
        damaged = bytearray(good)
        damaged[position] ^= 0x40
        log.write_bytes(bytes(damaged))
        status = main(["verify", str(log)])
        out = capsys.readouterr().out
        if status:
            assert "BAD" in out and "bundle at file position" in out
            reported += 1
    # A flip that only changes a snappy literal (a message's content or timestamp bytes) decodes to another valid
    # message set: without a checksum in TANK's format no reader can tell. Every other flip is found.
    assert reported > len(payload) // 2


def test_a_compressed_message_set_is_checked_after_decompression(tmp_path, capsys):
    """A snappy payload that decompresses cleanly but holds a broken message set: only decoding it finds it."""
    d = _snappy_segment(tmp_path)
    (log,) = d.glob("*.log")
    good = log.read_bytes()
    length, start = maybe_varint(good, 0)
    bundle = good[start : start + length]
    header = read_bundle_header(bundle)
    data = snappy.uncompress(bundle[header.header_len :]) + b"\x00"  # one byte after the last message
    bad = bundle[: header.header_len] + snappy.compress(data)
    log.write_bytes(encode_varint(len(bad)) + bad + good[start + length :])
    assert main(["verify", str(log)]) == 1
    out = capsys.readouterr().out
    assert "its decompressed message set: 1 bytes after the last message" in out
def test_a_compacted_segment_whose_last_messages_are_gone_passes(tmp_path, capsys):
    from tiered.storage.compaction import compact_partition

    config = TopicConfig.from_layers({"log.cleanup.policy": "cleanup", "log.cleaner.delete.retention.secs": "0",
                                      "produce.ack": "local"})
    plog = PartitionLog.open(str(tmp_path / "p"), config)
    plog.append(encode_bundle([Message(b"v", b"a", 1), Message(b"v", b"b", 1), Message(b"", b"b", 1)]))
    plog.seal_active()
    compact_partition(plog, 1_800_000_000, force=True)
    plog.close()
    [ilog] = (tmp_path / "p").glob("*.ilog")
    assert ilog.name.startswith("1-3_")
    assert main(["verify", str(ilog), str(tmp_path / "p" / "1.index")]) == 0
    assert "1 bundle (0 snappy), 1 message, seqs 1..1" in capsys.readouterr().out


def test_the_active_segments_index_may_lag_a_running_broker_but_a_sealed_one_may_not(tmp_path, capsys):
    """A running broker writes the active segment's index entries in batches: verify of a live directory passes with
    the entries not written yet, while a sealed segment's empty index is still reported."""
    d = _segment_dir(tmp_path)
    active = sorted(d.glob("*.log"))[-1]
    active_index = d / f"{active.name.split('_')[0]}.index"
    active_index.write_bytes(b"")  # as seen while the broker runs, before its first batch of entries
    assert main(["verify", str(active), str(active_index)]) == 0
    ilog = sorted(d.glob("*.ilog"))[0]
    sealed_index = d / f"{ilog.name.split('-')[0]}.index"
    sealed_index.write_bytes(b"")
    assert main(["verify", str(ilog), str(sealed_index)]) == 1
    assert "empty index for a non-empty log" in capsys.readouterr().out
