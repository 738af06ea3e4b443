"""`tiered verify` on real segment files: good files pass with exact counts, damaged ones are named and fail."""

from __future__ import annotations

from tiered.cli.main import main
from tiered.protocol.bundle import Message, encode_bundle
from tiered.protocol.varint import maybe_varint
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
    total = sum(int(line.split(" bundles, ")[1].split(" messages")[0]) for line in out.splitlines() if "bundles" in line)
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
    assert "1 bundles, 1 messages, seqs 1..1" in capsys.readouterr().out
