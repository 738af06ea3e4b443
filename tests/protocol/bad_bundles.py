"""Hand-written bundles whose header is valid or nearly so but which are bad, each with the error that names it:
every way issue 16 lists (count mismatch, a corrupt or cut snappy block, a length past the end, sparse seq deltas
that do not fit first..last, trailing bytes) and their neighbours. Used by the codec tests (tests/protocol) and by
the broker tests that send them over a socket (tests/server)."""

import snappy

from tests.protocol.hexbytes import h
from tiered.protocol.bundle import CODEC_SNAPPY, Message, encode_bundle
from tiered.protocol.varint import encode_varint

TS = h("74985a03a2010000")


def _snappy_bundle(flags: str, message_set: bytes) -> bytes:
    return h(flags) + snappy.compress(message_set)


GOOD_SNAPPY = encode_bundle([Message(b"hello " * 50, None, 1)] * 3, codec=CODEC_SNAPPY)

BAD_BUNDLES = [
    # The count says 5, the set holds 1; uncompressed and inside a snappy block.
    ("count mismatch", h("14 00") + TS + h("01'a'"), "message set ends after 1 of 5 messages"),
    ("count mismatch, snappy", _snappy_bundle("15", h("00") + TS + h("01'a'")), "ends after 1 of 5"),
    ("count varint 2**32-1", h("00 ffffffff0f 00") + TS + h("01'a'"), "ends after 1 of 4294967295"),
    # A message cut short at each of its parts.
    ("truncated timestamp", h("04 00 0100"), "truncated message timestamp"),
    ("truncated key length", h("04 01") + TS, "truncated message key length"),
    ("truncated key", h("04 01") + TS + h("05'ab'"), "truncated message key"),
    ("truncated content length", h("04 00") + TS, "truncated message content length"),
    ("truncated content", h("04 00") + TS + h("05'ab'"), "truncated message content"),
    ("second message missing", h("08 00") + TS + h("01'a'"), "ends after 1 of 2"),
    # Lengths past the end of the set.
    ("content length 2**32-1", h("04 00") + TS + h("ffffffff0f 'a'"), "truncated message content"),
    ("key length 255", h("04 01") + TS + h("ff 'k' 01'a'"), "truncated message key"),
    ("content length varint of 6 bytes", h("04 00") + TS + h("8080808080 00"), "varint longer than 5 bytes"),
    ("content length over 32 bits", h("04 00") + TS + h("ffffffff7f 00"), "varint exceeds 32 bits"),
    # Snappy: a corrupt block, a cut one, absurd claimed lengths.
    ("corrupt snappy", h("05 05 ff 00 00 00"), "bad snappy message set"),
    ("cut snappy", GOOD_SNAPPY[:-3], "bad snappy message set"),
    ("snappy claims 512 MiB", h("05") + encode_varint(512 * 1024 * 1024) + h("00"), "claims 536870912 bytes"),
    ("snappy claims 2**32-1", h("05 ffffffff0f 0061"), "claims 4294967295 bytes"),
    ("no snappy length", h("05"), "truncated snappy message set"),
    # Sparse seqs that do not fit first..last (1..10), or that TANK's readers disagree on.
    ("delta onto last", h("4c 0100000000000000 08 00") + TS + h("00 02 08 00 02 00"), "not below its last seq"),
    ("delta past last", h("4c 0100000000000000 08 00") + TS + h("00 02 0a 00 02 00"), "has seq 12, not below"),
    ("delta past 2**64", h("4c f5ffffffffffffff 08 00") + TS + h("00 02 ffffffff0f 00 02 00"),
     "has seq 18446744078004518901, not below"),
    ("prev+1 onto last", h("50 0100000000000000 02 00") + TS + h("00 02 01 00 06 00 02 00"),
     "message 2 has seq 4, not below"),
    ("truncated delta", h("4c 0100000000000000 05 00") + TS + h("01'a' 00 ff"), "truncated message seq delta"),
    ("prev+1 on first", h("48 0100000000000000 00 04") + TS + h("01'a' 02 01'b'"), "message 0 sets SEQ_PREV_PLUS_ONE"),
    ("prev+1 on last", h("48 0100000000000000 00 00") + TS + h("01'a' 06 01'b'"), "message 1 sets SEQ_PREV_PLUS_ONE"),
    ("range below count", h("4c 0100000000000000 00"), "smaller than its message count"),
    # Trailing bytes, uncompressed and inside a snappy block; unknown flags.
    ("trailing byte", h("04 00") + TS + h("01'a' 00"), "1 bytes after the last message of the bundle"),
    ("trailing bytes, snappy", _snappy_bundle("05", h("00") + TS + h("01'a' 0000")), "2 bytes after the last"),
    ("unknown message flags", h("04 08") + TS + h("00"), "unknown message flags 0x08"),
    ("reserved bundle flag", h("84 00") + TS + h("00"), "reserved bundle flag bit 7"),
    ("codec 2", h("06 00") + TS + h("00"), "unknown bundle codec 2"),
    ("empty", b"", "empty bundle"),
]
