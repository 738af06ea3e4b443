/* TANK's bundle and varint constants, shared by the two native modules: tiered/protocol/_bundlescan.c (produce
 * validation) and tiered/spark/_decode.c (replay decoding). One definition here, so the two cannot read a bundle
 * differently. tiered/protocol/bundle.py and varint.py hold the same values for the pure paths, which stay the
 * reference.
 *
 * Record and bundle layout (docs/protocol.md section 4):
 *
 *     record         bundle_len varint, then bundle_len bytes of bundle (in a segment, a run or a chunk)
 *     bundle flags   u8: bits 0-1 codec (0 none, 1 snappy), bits 2-5 message count if 1..15, bit 6 SPARSE,
 *                    bit 7 reserved (never set)
 *     [msg_count]    varint, iff the count bits are 0 (never 0)
 *     [first_seq]    u64 little-endian, iff SPARSE (never 0)
 *     [last-first-1] varint, iff SPARSE and msg_count != 1
 *     message set    the rest; one raw snappy block iff codec == 1
 *
 *     message flags  u8: HAVE_KEY 1, USE_LAST_TS 2, SEQ_PREV_PLUS_ONE 4
 *     [seq delta]    varint, iff SPARSE, neither first nor last, and not SEQ_PREV_PLUS_ONE: seq = prev + delta + 1
 *     [ts]           u64 milliseconds, iff not USE_LAST_TS (else the previous message's; 0 before the first)
 *     [key_len, key] u8 + bytes, iff HAVE_KEY
 *     content_len    varint, then the content
 *
 * Varints are LEB128 of at most 5 bytes and 32 bits.
 */
#ifndef TIERED_TANK_BUNDLE_H
#define TIERED_TANK_BUNDLE_H

#define CODEC_MASK 0x03
#define CODEC_SNAPPY 1
#define COUNT_SHIFT 2
#define COUNT_MASK 0x0F
#define FLAG_SPARSE 0x40
#define FLAG_RESERVED 0x80
#define HAVE_KEY 0x01
#define USE_LAST_TS 0x02
#define SEQ_PREV_PLUS_ONE 0x04
#define MESSAGE_FLAGS_KNOWN (HAVE_KEY | USE_LAST_TS | SEQ_PREV_PLUS_ONE)
#define MAX_VARINT 0xFFFFFFFFULL
#define MAX_VARINT_BYTES 5
/* bundle.py's MAX_MESSAGE_SET_BYTES and SNAPPY_MAX_EXPANSION: a longer decompressed message set, or one claimed
 * beyond 32x its snappy block, is refused before it is allocated. */
#define MAX_MESSAGE_SET_BYTES (512ULL * 1024 * 1024)
#define SNAPPY_MAX_EXPANSION 32ULL

#endif
