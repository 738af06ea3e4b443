/* The one native walker of TANK's bundles: varints, bundle headers and messages, shared by the two native modules,
 * tiered/protocol/_bundlescan.c (produce validation, consume chunks) and tiered/spark/_decode.c (replay decoding),
 * so that the two cannot read a bundle differently. Header-only (static functions, one copy per module); include it
 * after Python.h. tiered/protocol/bundle.py and varint.py are the pure reference: the tests compare both modules
 * with it on arbitrary bytes, result for result and error for error (same text, same position).
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
 *
 * Invariants. Nothing here touches a Python object or needs the GIL (the decoder walks without it): a fault is
 * recorded in a tank_fault (the reference's ProtocolError text and position) and the caller raises it. Every read is
 * bounds-checked against the buffer it reads before it happens, with sizes compared as lengths, never as sums that
 * could wrap. Seqs are 128-bit, as the reference's ints never overflow: a sparse middle message's seq (prev + delta +
 * 1) is checked below its bundle's last seq without wrapping, and a non-sparse bundle's seqs continue from whatever
 * base the caller gives (the caller decides what fits its output).
 */
#ifndef TIERED_TANK_WALK_H
#define TIERED_TANK_WALK_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

typedef unsigned __int128 tank_u128;

#define TANK_NO_POSITION (-1)

/* -- faults ------------------------------------------------------------------------------------------------------ */

#define TANK_FAULT_NONE 0
#define TANK_FAULT_PROTOCOL 1 /* a ProtocolError(what, position) */
#define TANK_FAULT_MEMORY 2   /* the caller's own: an allocation failed */

typedef struct {
    int kind;
    Py_ssize_t position; /* TANK_NO_POSITION: the ProtocolError names none */
    char what[256];
} tank_fault;

/* Records a ProtocolError; -1, for `return tank_fail(...)`. */
static int tank_fail(tank_fault *f, Py_ssize_t position, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(f->what, sizeof f->what, format, args);
    va_end(args);
    f->kind = TANK_FAULT_PROTOCOL;
    f->position = position;
    return -1;
}

/* Decimal text of a 128-bit value into buf (at least 40 bytes). */
static const char *tank_u128_text(tank_u128 value, char *buf)
{
    char *p = buf + 39;
    *p = '\0';
    do {
        *--p = (char)('0' + (int)(value % 10));
        value /= 10;
    } while (value);
    return p;
}

/* -- varints and u64s -------------------------------------------------------------------------------------------- */

#define TANK_VARINT_OK 0
#define TANK_VARINT_TRUNCATED 1
#define TANK_VARINT_ERROR (-1) /* a fault was recorded */
#define TANK_VARINT_TOO_LARGE 2
#define TANK_VARINT_TOO_LONG 3

/* The varint at `position` of buf[0:end], recording nothing: TANK_VARINT_OK with *value and *after,
 * TANK_VARINT_TRUNCATED (the buffer ends first), TANK_VARINT_TOO_LARGE (above 32 bits) or TANK_VARINT_TOO_LONG (no
 * last byte within 5). */
static int tank_varint_at(const uint8_t *buf, Py_ssize_t end, Py_ssize_t position, uint32_t *value, Py_ssize_t *after)
{
    uint64_t v = 0;
    int shift = 0;
    Py_ssize_t stop = end - position < MAX_VARINT_BYTES ? end : position + MAX_VARINT_BYTES;
    for (Py_ssize_t i = position; i < stop; i++) {
        uint8_t b = buf[i];
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            if (v > MAX_VARINT)
                return TANK_VARINT_TOO_LARGE;
            *value = (uint32_t)v;
            *after = i + 1;
            return TANK_VARINT_OK;
        }
        shift += 7;
    }
    return end - position >= MAX_VARINT_BYTES ? TANK_VARINT_TOO_LONG : TANK_VARINT_TRUNCATED;
}

/* varint.py's maybe_varint: TANK_VARINT_OK, TANK_VARINT_TRUNCATED when the buffer ends first, TANK_VARINT_ERROR (a
 * fault) when it is too long or too large. */
static int tank_maybe_varint(const uint8_t *buf, Py_ssize_t end, Py_ssize_t position, uint32_t *value,
                             Py_ssize_t *after, tank_fault *f)
{
    switch (tank_varint_at(buf, end, position, value, after)) {
    case TANK_VARINT_OK:
        return TANK_VARINT_OK;
    case TANK_VARINT_TOO_LARGE:
        return tank_fail(f, position, "varint exceeds 32 bits");
    case TANK_VARINT_TOO_LONG:
        return tank_fail(f, position, "varint longer than 5 bytes");
    default:
        return TANK_VARINT_TRUNCATED;
    }
}

/* varint.py's read_varint: a truncated varint is a fault naming `what`. 0, or -1 with a fault. */
static int tank_read_varint(const uint8_t *buf, Py_ssize_t end, Py_ssize_t position, const char *what,
                            uint32_t *value, Py_ssize_t *after, tank_fault *f)
{
    int got = tank_maybe_varint(buf, end, position, value, after, f);
    if (got == TANK_VARINT_TRUNCATED)
        return tank_fail(f, position, "truncated %s", what);
    return got;
}

/* A little-endian u64. */
static uint64_t tank_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* -- the bundle header ------------------------------------------------------------------------------------------- */

typedef struct {
    int codec;
    uint32_t count;
    int sparse;
    uint64_t first_seq, last_seq; /* a sparse bundle's; 0 otherwise */
    Py_ssize_t header_len;        /* where the message set (or its snappy block) starts */
} tank_header;

/* bundle.py's read_bundle_header over the bundle b[0:len], check for check and in its order. 0, or -1 with a fault
 * (positions in the bundle). */
static int tank_read_header(const uint8_t *b, Py_ssize_t len, tank_header *h, tank_fault *f)
{
    if (len < 1)
        return tank_fail(f, TANK_NO_POSITION, "empty bundle");
    uint8_t flags = b[0];
    h->codec = flags & CODEC_MASK;
    if (h->codec > CODEC_SNAPPY)
        return tank_fail(f, 0, "unknown bundle codec %d", h->codec);
    if (flags & FLAG_RESERVED)
        return tank_fail(f, 0, "reserved bundle flag bit 7 is set");
    h->count = (flags >> COUNT_SHIFT) & COUNT_MASK;
    Py_ssize_t position = 1;
    if (h->count == 0) {
        if (tank_read_varint(b, len, position, "bundle message count", &h->count, &position, f) < 0)
            return -1;
        if (h->count == 0)
            return tank_fail(f, 1, "bundle with no messages");
    }
    h->sparse = (flags & FLAG_SPARSE) != 0;
    h->first_seq = h->last_seq = 0;
    if (h->sparse) {
        if (len - position < 8)
            return tank_fail(f, position, "truncated sparse bundle first seq");
        h->first_seq = tank_u64(b + position);
        position += 8;
        if (h->count == 1) {
            h->last_seq = h->first_seq;
        } else {
            uint32_t gap;
            if (tank_read_varint(b, len, position, "sparse bundle last seq", &gap, &position, f) < 0)
                return -1;
            /* last = first + gap + 1 must fit 64 bits */
            if ((uint64_t)gap + 1 > UINT64_MAX - h->first_seq)
                return tank_fail(f, position, "sparse bundle last seq exceeds 64 bits");
            h->last_seq = h->first_seq + gap + 1;
            /* last - first + 1 < count, without wrapping: the span is gap + 2 */
            if ((uint64_t)gap + 2 < h->count)
                return tank_fail(f, position, "sparse bundle seq range is smaller than its message count");
        }
        if (h->first_seq == 0)
            return tank_fail(f, position, "sparse bundle with first seq 0");
    }
    h->header_len = position;
    return 0;
}

/* -- messages ---------------------------------------------------------------------------------------------------- */

/* Where the next message of a message set starts, and what the message before it left. Start a walk with
 * tank_cursor_at: a non-sparse bundle's first message has seq `base`. */
typedef struct {
    Py_ssize_t position;
    uint32_t index;
    tank_u128 seq;
    uint64_t ts; /* the last timestamp read: USE_LAST_TS takes it (0 before the first) */
} tank_cursor;

static tank_cursor tank_cursor_at(tank_u128 base)
{
    tank_cursor c = {0, 0, base, 0};
    return c;
}

typedef struct {
    tank_u128 seq;
    uint64_t ts;
    const uint8_t *key; /* NULL: no key (key_len 0) */
    Py_ssize_t key_len;
    const uint8_t *value;
    Py_ssize_t value_len;
} tank_message;

/* bundle.py's _walk_messages, one message at a time: message c->index of the message set set[0:end] of the bundle
 * `h`, read whole into *m (pointers into `set`), and c moved past it (after the last one, tank_check_end). `strict`
 * also refuses SEQ_PREV_PLUS_ONE on a sparse bundle's first or last message (which TANK's readers disagree on). 0,
 * or -1 with a fault (positions in the message set). */
static int tank_next_message(const uint8_t *set, Py_ssize_t end, const tank_header *h, int strict, tank_cursor *c,
                             tank_message *m, tank_fault *f)
{
    Py_ssize_t position = c->position;
    uint32_t i = c->index, count = h->count;
    if (position >= end)
        return tank_fail(f, position, "message set ends after %u of %u messages", i, count);
    uint8_t flags = set[position++];
    if (flags & ~MESSAGE_FLAGS_KNOWN)
        return tank_fail(f, position - 1, "unknown message flags 0x%02x", flags);
    tank_u128 seq = c->seq;
    if (h->sparse) {
        if (strict && (i == 0 || i == count - 1) && (flags & SEQ_PREV_PLUS_ONE))
            return tank_fail(f, position - 1, "sparse bundle message %u sets SEQ_PREV_PLUS_ONE, which TANK's readers "
                                              "disagree on for a first or last message", i);
        if (i == 0) {
            seq = h->first_seq;
        } else if (i == count - 1) {
            seq = h->last_seq;
        } else {
            uint32_t delta = 0;
            if (!(flags & SEQ_PREV_PLUS_ONE)
                && tank_read_varint(set, end, position, "message seq delta", &delta, &position, f) < 0)
                return -1;
            seq += (tank_u128)delta + 1;
            if (seq >= h->last_seq) {
                char text[40];
                return tank_fail(f, position, "sparse bundle message %u has seq %s, not below its last seq", i,
                                 tank_u128_text(seq, text));
            }
        }
    } else if (i) {
        seq += 1;
    }
    uint64_t ts = c->ts;
    if (!(flags & USE_LAST_TS)) {
        if (end - position < 8)
            return tank_fail(f, position, "truncated message timestamp");
        ts = tank_u64(set + position);
        position += 8;
    }
    m->key = NULL;
    m->key_len = 0;
    if (flags & HAVE_KEY) {
        if (position >= end)
            return tank_fail(f, position, "truncated message key length");
        m->key_len = set[position++];
        if (end - position < m->key_len)
            return tank_fail(f, position, "truncated message key");
        m->key = set + position;
        position += m->key_len;
    }
    uint32_t size;
    if (tank_read_varint(set, end, position, "message content length", &size, &position, f) < 0)
        return -1;
    if (end - position < (Py_ssize_t)size)
        return tank_fail(f, position, "truncated message content");
    m->seq = seq;
    m->ts = ts;
    m->value = set + position;
    m->value_len = size;
    position += size;
    c->position = position;
    c->index = i + 1;
    c->seq = seq;
    c->ts = ts;
    return 0;
}

/* Once the bundle's last message was read: nothing may follow it. 0, or -1 with a fault. (Apart from
 * tank_next_message because the reference keeps the last message of such a bundle before it refuses the bundle.) */
static int tank_check_end(const tank_cursor *c, Py_ssize_t end, tank_fault *f)
{
    if (c->position != end)
        return tank_fail(f, c->position, "%zd bytes after the last message of the bundle", end - c->position);
    return 0;
}

#endif
