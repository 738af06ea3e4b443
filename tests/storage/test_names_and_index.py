import struct

import pytest

from tiered.storage.index import NEVER_INDEXED, IndexBuilder, SparseIndex
from tiered.storage.names import (
    CheckpointName,
    ConfigName,
    Ignored,
    IlogName,
    IndexName,
    LogName,
    SwapLeftover,
    format_ilog_name,
    format_index_name,
    format_log_name,
    parse_name,
)


@pytest.mark.parametrize(
    "name, parsed",
    [
        ("1_1795352546.log", LogName(1, 1795352546)),
        ("1000.log", LogName(1000, None)),
        ("81-90_1795352634.ilog", IlogName(81, 90, 1795352634)),
        ("81-90.ilog", IlogName(81, 90, None)),
        ("5-5_1.ilog", IlogName(5, 5, 1)),
        ("81.index", IndexName(81)),
        ("config", ConfigName()),
    ],
)
def test_parse_and_format_names(name, parsed):
    assert parse_name(name) == parsed
    if not isinstance(parsed, ConfigName):
        assert str(parsed) == name


@pytest.mark.parametrize(
    "name, reason_word",
    [
        ("1_64.index", "wide"),
        ("10-9_1.ilog", "below"),
        ("notes.txt", "not a segment"),
        ("1_abc.log", "not a segment"),
        ("-1.log", "not a segment"),
        ("1.log.tmp", "not a segment"),
    ],
)
def test_other_names_are_ignored_with_a_reason(name, reason_word):
    parsed = parse_name(name)
    assert isinstance(parsed, Ignored) and parsed.name == name
    assert reason_word in parsed.reason


@pytest.mark.parametrize(
    "name, leftover",
    [
        ("1-10_5.ilog.cleaned", SwapLeftover("1-10_5.ilog.cleaned", "cleaned", IlogName(1, 10, 5))),
        ("7.ilog.cleaned", SwapLeftover("7.ilog.cleaned", "cleaned", parse_name("7.ilog"))),
        ("1.index.swap", SwapLeftover("1.index.swap", "swap", IndexName(1))),
        ("1-10.ilog.old", SwapLeftover("1-10.ilog.old", "old", IlogName(1, 10, None))),
    ],
)
def test_compaction_files_are_named_with_what_they_become(name, leftover):
    assert parse_name(name) == leftover
    assert leftover.final_name == name.rsplit(".", 1)[0]


def test_checkpoint_names():
    assert parse_name(".cleanup.checkpoint") == parse_name(".cleanup.checkpoint.tmp") == CheckpointName()


def test_formatters():
    assert format_log_name(91, 1795352634) == "91_1795352634.log"
    assert format_log_name(91, None) == "91.log"
    assert format_ilog_name(81, 90, 1795352634) == "81-90_1795352634.ilog"
    assert format_ilog_name(81, 90, None) == "81-90.ilog"
    assert format_index_name(81) == "81.index"


OBSERVED_ENTRIES = [(0, 0), (2, 214), (4, 428), (6, 642), (8, 856)]


def test_indexing_rule_matches_the_observed_example():
    # docs/protocol.md §7: interval 128 with 107-byte records, one message each, gives these entries.
    builder = IndexBuilder(128)
    for i in range(10):
        builder.add(i, i * 107, 107)
    assert list(builder.index) == OBSERVED_ENTRIES
    assert builder.index.to_bytes() == b"".join(struct.pack("<II", r, p) for r, p in OBSERVED_ENTRIES)


def test_first_record_always_indexed_and_rule_is_strictly_greater():
    builder = IndexBuilder(128)
    assert builder.since_last_update == NEVER_INDEXED
    assert builder.add(0, 0, 64) == (0, 0)
    assert builder.add(1, 64, 64) is None  # since 64
    assert builder.add(2, 128, 64) is None  # since 128: not > 128
    assert builder.add(3, 192, 64) == (3, 192)  # since 192 > 128
    assert builder.since_last_update == 64


def test_one_bundle_segment_index_bytes():
    builder = IndexBuilder(4096)
    builder.add(0, 0, 30)
    assert builder.index.to_bytes() == bytes.fromhex("00000000 00000000")


def test_floor_and_ceiling_lookups():
    index = SparseIndex(OBSERVED_ENTRIES)
    assert index.floor(0) == (0, 0)
    assert index.floor(1) == (0, 0)
    assert index.floor(5) == (4, 428)
    assert index.floor(100) == (8, 856)
    assert SparseIndex([(3, 0)]).floor(2) is None
    # largest position in (after, max_position] whose rel_seq <= max_rel_seq
    assert index.ceiling_position(0, 700, 100) == 642
    assert index.ceiling_position(0, 642, 100) == 642
    assert index.ceiling_position(0, 641, 100) == 428
    assert index.ceiling_position(0, 1000, 5) == 428
    assert index.ceiling_position(428, 500, 100) is None
    assert index.ceiling_position(0, 1000, -1) is None
    assert SparseIndex().ceiling_position(0, 1000, 10) is None


def test_from_bytes_cuts_a_partial_entry_and_rejects_disorder():
    data = SparseIndex(OBSERVED_ENTRIES).to_bytes()
    for cut in range(1, 8):
        index, partial = SparseIndex.from_bytes(data[:-cut])
        assert list(index) == OBSERVED_ENTRIES[:-1] and partial == 8 - cut
    index, partial = SparseIndex.from_bytes(data)
    assert list(index) == OBSERVED_ENTRIES and partial == 0
    with pytest.raises(ValueError):
        SparseIndex.from_bytes(struct.pack("<IIII", 2, 214, 0, 0))
    with pytest.raises(ValueError):
        SparseIndex([(0, 0)]).append(1, 0)
