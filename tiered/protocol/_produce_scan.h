/* The produce request's framing, read in C: what tiered/protocol/_bundlescan.c hands to tiered/server/_produce.c
 * through a capsule, so that the produce handler's native call reads a request from its payload's bytes without
 * building the request's Python objects (requests.py's ProduceRequest, its topics and partitions).
 *
 * The layout is requests.py's table (docs/protocol.md section 3.1):
 *
 *     client_version u16, request_id u32, client_id str8, required_acks u8, ack_timeout_ms u32
 *     topics u8 x { name str8, partitions u8 x { partition u16, bundle_len varint, [base_seq u64], bundle } }
 *
 * Offsets are into the payload, and every one was checked against its length before it was stored. The framing is
 * read in one place (_bundlescan.c's read_framing); scan_produce builds its Python objects from the same struct.
 */
#ifndef TIERED_PRODUCE_SCAN_H
#define TIERED_PRODUCE_SCAN_H

#include <Python.h>
#include <stdint.h>

#define PRODUCE_SCAN_CAPSULE "tiered.protocol._bundlescan._produce_scan"
#define PRODUCE_MAX_TOPICS 255 /* a u8 count */

typedef struct {
    Py_ssize_t name_at, name_len; /* the name's latin-1 bytes */
    Py_ssize_t first, count;      /* its partitions: parts[first : first + count] */
} produce_topic_at;

typedef struct {
    uint64_t partition;              /* a u16 */
    uint64_t base_seq;               /* a 0x05 produce's only */
    Py_ssize_t length_at, start, end; /* the record {bundle_len, bundle} is [length_at, end), the bundle [start, end) */
    /* requests.py's ProducePartition.record rule: the record is handed out as a view of the payload (the payload
     * holds it contiguously, no base seq between, the length minimally encoded, and it is at least half of the
     * payload, which the view keeps alive) */
    int record;
} produce_part_at;

typedef struct {
    uint64_t client_version, request_id, required_acks, ack_timeout_ms;
    Py_ssize_t client_id_at, client_id_len;
    Py_ssize_t topic_count, part_count;
    produce_topic_at topics[PRODUCE_MAX_TOPICS];
    produce_part_at *parts; /* PyMem: release_framing frees it */
} produce_framing;

typedef struct {
    /* 1: read whole to the payload's end; 0: a framing fault (nothing raised: the reference reader names it); -1 with
     * an exception set (memory). `out` is to be released whatever the answer. */
    int (*read_framing)(const uint8_t *data, Py_ssize_t len, int with_seqnum, produce_framing *out);
    void (*release_framing)(produce_framing *f);
    /* The BundleFacts of the bundle data[start:end] validated completely (strict), or NULL with ProtocolError set;
     * `payload` is the object whose buffer `data` is (a snappy body is handed to snappy as a view of it). */
    PyObject *(*bundle_facts)(PyObject *payload, const uint8_t *data, Py_ssize_t start, Py_ssize_t end);
    /* The whole frame of a one-topic produce answer (responses.py's _produce_codes_frame_py), or None when a code is
     * not a plain one or there are more than 255; NULL with an exception set. */
    PyObject *(*codes_frame)(uint32_t request_id, const uint8_t *codes, Py_ssize_t count);
} produce_scan_api;

#endif
