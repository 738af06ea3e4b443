/* tiered.protocol._bundlescan: one native pass over a bundle that validates it completely and returns its facts.
 *
 * The native twin of tiered/protocol/bundle.py's `_validate_bundle_py` (read_bundle_header, message_set and the
 * walk of `_walk_messages`, strict or not), which stays the reference: tests compare the two on arbitrary bytes,
 * result for result and error for error (same ProtocolError text and position). `scan_produce` reads a whole
 * produce payload as tiered/protocol/requests.py's read_produce_request does and validates each of its bundles, so
 * the broker reads a produce request in one native call; on a framing fault it answers None and the reference
 * reader names the fault.
 *
 * Varints, bundle headers and messages are read by _tank_walk.h, the walker shared with tiered/spark/_decode.c
 * (docs/protocol.md section 4 has the layout; bundle.py the same table).
 *
 * Invariants. Every read is bounds-checked against the buffer it reads (bundle or message set) before it happens,
 * with sizes compared as lengths, never as sums that could wrap. Seqs are u64 and compared without overflow
 * (`delta < last - seq - 1`); an error that must print a seq beyond 64 bits computes it as a Python int. A snappy
 * message set is decompressed by python-snappy's `uncompress`, as in the reference, once its claimed length passed
 * the reference's checks. The buffers are held for the duration of the call only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "_produce_scan.h"
#include "_tank_walk.h"

#define NO_POSITION TANK_NO_POSITION

static PyObject *ProtocolError; /* tiered.protocol.errors.ProtocolError */
static PyObject *uncompress;    /* snappy.uncompress */

/* -- errors ------------------------------------------------------------------------------------------------------ */

static void raise_what(PyObject *what, Py_ssize_t position)
{
    PyObject *exc = position == NO_POSITION ? PyObject_CallFunction(ProtocolError, "(OO)", what, Py_None)
                                            : PyObject_CallFunction(ProtocolError, "(On)", what, position);
    if (exc != NULL) {
        PyErr_SetObject(ProtocolError, exc);
        Py_DECREF(exc);
    }
}

/* Raises ProtocolError(what, position); `format` as PyUnicode_FromFormat. Returns -1 for `return raise(...)`. */
static int raise_protocol(Py_ssize_t position, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    PyObject *what = PyUnicode_FromFormatV(format, args);
    va_end(args);
    if (what != NULL) {
        raise_what(what, position);
        Py_DECREF(what);
    }
    return -1;
}

/* -- readers: _tank_walk.h's, raising --------------------------------------------------------------------------- */

/* A fault of the walker as the ProtocolError it stands for; -1. */
static int raise_fault(const tank_fault *f)
{
    PyObject *what = PyUnicode_FromString(f->what);
    if (what != NULL) {
        raise_what(what, f->position);
        Py_DECREF(what);
    }
    return -1;
}

typedef struct {
    const uint8_t *data;
    Py_ssize_t end;
} span;

/* varint.py's maybe_varint: TANK_VARINT_TRUNCATED when the buffer ends first, TANK_VARINT_ERROR (raised) when it is
 * too long or too large. */
static int maybe_varint(span s, Py_ssize_t position, uint32_t *value, Py_ssize_t *after)
{
    tank_fault f;
    int got = tank_maybe_varint(s.data, s.end, position, value, after, &f);
    return got == TANK_VARINT_ERROR ? raise_fault(&f) : got;
}

/* bundle.py's read_bundle_header. 0, or -1 raised. */
static int read_header(span b, tank_header *h)
{
    tank_fault f;
    return tank_read_header(b.data, b.end, h, &f) < 0 ? raise_fault(&f) : 0;
}

/* -- the message set --------------------------------------------------------------------------------------------- */

/* What a chunk reader keeps of a walked message set (chunk.py's `_keep`): each message from `requested` on, up to
 * the first above `hwmark`, appended to `out` as a Message, or (when `out` is NULL) only counted: how many, the
 * first and last seq, the value bytes, and whether each kept seq is above the one kept before it. */
typedef struct {
    uint64_t requested, hwmark;
    int above; /* a message above hwmark was met: none after it in this bundle is kept */
    PyObject *out;
    uint64_t kept, first, last, value_bytes;
    int ascending;
} keeper;

static int keep_message(keeper *k, uint64_t seq, uint64_t ts, const uint8_t *key, int key_len, const uint8_t *value,
                        Py_ssize_t value_len);

/* bundle.py's _walk_messages: min and max timestamp, and each message to `keep` when it is not NULL. `strict` as
 * there; `base` is the first seq of a non-sparse bundle (the walk of a sparse one takes its header's). A message
 * is handed to `keep` once it was read whole, so a walk cut short by a fault has kept the messages before it, as
 * the reference's list holds them. */
static int walk_messages(span d, const tank_header *h, uint64_t base, int strict, uint64_t *low, uint64_t *high,
                         keeper *keep)
{
    tank_fault f;
    tank_cursor c = tank_cursor_at(base);
    tank_message m;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t i = 0; i < h->count; i++) {
        if (tank_next_message(d.data, d.end, h, strict, &c, &m, &f) < 0)
            return raise_fault(&f);
        if (m.ts < lo)
            lo = m.ts;
        if (m.ts > hi)
            hi = m.ts;
        /* a seq fits 64 bits here: a sparse one is below its header's last, and the caller checked that a
         * non-sparse bundle's base + count - 1 does */
        if (keep != NULL && keep_message(keep, (uint64_t)m.seq, m.ts, m.key, m.key == NULL ? -1 : (int)m.key_len,
                                         m.value, m.value_len) < 0)
            return -1;
    }
    if (tank_check_end(&c, d.end, &f) < 0)
        return raise_fault(&f);
    *low = lo;
    *high = hi;
    return 0;
}

/* bundle.py's message_set for a snappy bundle: the claimed length checked, then snappy.uncompress(body). `b` is the
 * bundle, which starts `offset` bytes into the buffer of `bundle_obj`. Returns a new reference to the decompressed
 * object, or NULL with ProtocolError raised. */
static PyObject *uncompress_body(PyObject *bundle_obj, span b, Py_ssize_t offset, Py_ssize_t header_len)
{
    span body = {b.data + header_len, b.end - header_len};
    uint32_t claimed;
    Py_ssize_t after;
    int got = maybe_varint(body, 0, &claimed, &after);
    if (got == TANK_VARINT_ERROR)
        return NULL;
    if (got == TANK_VARINT_TRUNCATED) {
        raise_protocol(header_len, "truncated snappy message set");
        return NULL;
    }
    if (claimed > MAX_MESSAGE_SET_BYTES || (uint64_t)claimed > SNAPPY_MAX_EXPANSION * (uint64_t)body.end) {
        raise_protocol(header_len, "snappy message set of %zd bytes claims %u bytes", body.end, claimed);
        return NULL;
    }
    PyObject *view = PyMemoryView_FromObject(bundle_obj);
    if (view == NULL)
        return NULL;
    PyObject *body_view = PySequence_GetSlice(view, offset + header_len, offset + b.end);
    Py_DECREF(view);
    if (body_view == NULL)
        return NULL;
    PyObject *data = PyObject_CallOneArg(uncompress, body_view);
    Py_DECREF(body_view);
    if (data == NULL) {
        /* as the reference: any failure is "bad snappy message set: <text of its cause, or of itself>" */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *cause = value == NULL ? NULL : PyException_GetCause(value);
        PyObject *text = cause != NULL ? PyObject_Str(cause) : value != NULL ? PyObject_Str(value) : NULL;
        Py_XDECREF(cause);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (text == NULL)
            return NULL;
        raise_protocol(NO_POSITION, "bad snappy message set: %U", text);
        Py_DECREF(text);
        return NULL;
    }
    return data;
}

/* -- facts ----------------------------------------------------------------------------------------------------- */

/* The result types, registered once from Python (tiered.protocol.bundle and .requests): NamedTuple classes, built
 * here as tuple.__new__ builds them. */
static PyTypeObject *FactsType, *RequestType, *TopicType, *PartitionType;
static PyObject *toreadonly_name; /* "toreadonly", interned */

/* A new instance of a tuple subclass holding `n` new references (stolen; NULL ones make it fail). */
static PyObject *new_named(PyTypeObject *type, Py_ssize_t n, ...)
{
    va_list args;
    va_start(args, n);
    PyObject *items[16];
    int missing = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        items[i] = va_arg(args, PyObject *);
        missing |= items[i] == NULL;
    }
    va_end(args);
    PyObject *t = missing ? NULL : type->tp_alloc(type, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (t != NULL)
            PyTuple_SET_ITEM(t, i, items[i]);
        else
            Py_XDECREF(items[i]);
    }
    return t;
}

static PyObject *py_bool(int v)
{
    return Py_NewRef(v ? Py_True : Py_False);
}

/* The BundleFacts of the bundle `b`, which starts `offset` bytes into the buffer of `bundle_obj`, or NULL with
 * ProtocolError raised. */
static PyObject *facts_of(PyObject *bundle_obj, span b, Py_ssize_t offset, int strict)
{
    tank_header h;
    PyObject *result = NULL, *decompressed = NULL;
    Py_buffer dbuf = {0};
    uint64_t low, high;
    if (read_header(b, &h) < 0)
        return NULL;
    span d = {b.data + h.header_len, b.end - h.header_len};
    if (h.codec == CODEC_SNAPPY) {
        decompressed = uncompress_body(bundle_obj, b, offset, h.header_len);
        if (decompressed == NULL || PyObject_GetBuffer(decompressed, &dbuf, PyBUF_SIMPLE) < 0)
            goto done;
        d.data = dbuf.buf;
        d.end = dbuf.len;
    }
    if (walk_messages(d, &h, 0, strict, &low, &high, NULL) < 0)
        goto done;
    result = new_named(FactsType, 8, PyLong_FromLong(h.codec), PyLong_FromUnsignedLong(h.count), py_bool(h.sparse),
                       h.sparse ? PyLong_FromUnsignedLongLong(h.first_seq) : Py_NewRef(Py_None),
                       h.sparse ? PyLong_FromUnsignedLongLong(h.last_seq) : Py_NewRef(Py_None),
                       PyLong_FromSsize_t(h.header_len), PyLong_FromUnsignedLongLong(low),
                       PyLong_FromUnsignedLongLong(high));
done:
    if (dbuf.obj != NULL)
        PyBuffer_Release(&dbuf);
    Py_XDECREF(decompressed);
    return result;
}

/* -- produce requests ------------------------------------------------------------------------------------------ */

/* The framing of a produce payload (_produce_scan.h and tiered/protocol/requests.py have the table), read once by
 * read_framing, for scan_produce here and, through the capsule `_produce_scan`, for tiered/server/_produce.c. A
 * framing fault makes the scan answer None: requests.py then reads the payload with its reference reader, which
 * raises the ProtocolError that names it. */

typedef struct {
    span p;
    Py_ssize_t position;
} cursor;

/* The bytes of `value` as LEB128 with no needless continuation bytes (varint.py's varint_size). */
static Py_ssize_t minimal_varint_size(uint32_t value)
{
    Py_ssize_t size = 1;
    while (value >= 0x80) {
        value >>= 7;
        size++;
    }
    return size;
}

static int take(cursor *c, Py_ssize_t size, const uint8_t **out)
{
    if (size < 0 || c->p.end - c->position < size)
        return -1;
    *out = c->p.data + c->position;
    c->position += size;
    return 0;
}

static int take_u8(cursor *c, unsigned *v)
{
    const uint8_t *at;
    if (take(c, 1, &at) < 0)
        return -1;
    *v = at[0];
    return 0;
}

static int take_le(cursor *c, int size, uint64_t *v)
{
    const uint8_t *at;
    if (take(c, size, &at) < 0)
        return -1;
    *v = 0;
    for (int i = size - 1; i >= 0; i--)
        *v = (*v << 8) | at[i];
    return 0;
}

static void release_framing(produce_framing *f)
{
    PyMem_Free(f->parts);
    f->parts = NULL;
    f->part_count = 0;
}

/* _produce_scan.h's read_framing: the framing of a produce payload into `f`. */
static int read_framing(const uint8_t *data, Py_ssize_t len, int with_seqnum, produce_framing *f)
{
    cursor c = {{data, len}, 0};
    Py_ssize_t capacity = 0;
    const uint8_t *at;
    unsigned size8, topic_count;
    f->topic_count = f->part_count = 0;
    f->parts = NULL;
    if (take_le(&c, 2, &f->client_version) < 0 || take_le(&c, 4, &f->request_id) < 0 || take_u8(&c, &size8) < 0)
        return 0;
    f->client_id_at = c.position;
    f->client_id_len = size8;
    if (take(&c, size8, &at) < 0 || take_le(&c, 1, &f->required_acks) < 0 || take_le(&c, 4, &f->ack_timeout_ms) < 0
        || take_u8(&c, &topic_count) < 0)
        return 0;
    for (unsigned t = 0; t < topic_count; t++) {
        produce_topic_at *topic = &f->topics[t];
        unsigned partition_count;
        if (take_u8(&c, &size8) < 0)
            return 0;
        topic->name_at = c.position;
        topic->name_len = size8;
        if (take(&c, size8, &at) < 0 || take_u8(&c, &partition_count) < 0)
            return 0;
        topic->first = f->part_count;
        topic->count = partition_count;
        f->topic_count = t + 1;
        for (unsigned i = 0; i < partition_count; i++) {
            produce_part_at p = {0};
            uint32_t bundle_len;
            Py_ssize_t after;
            if (take_le(&c, 2, &p.partition) < 0)
                return 0;
            p.length_at = c.position;
            if (tank_varint_at(c.p.data, c.p.end, p.length_at, &bundle_len, &after) != TANK_VARINT_OK)
                return 0;
            c.position = after;
            if (with_seqnum && take_le(&c, 8, &p.base_seq) < 0)
                return 0;
            p.start = c.position;
            if (take(&c, bundle_len, &at) < 0)
                return 0;
            p.end = c.position;
            Py_ssize_t record_len = p.end - p.length_at;
            p.record = !with_seqnum && p.start - p.length_at == minimal_varint_size(bundle_len)
                       && record_len >= c.p.end - record_len;
            if (f->part_count == capacity) {
                capacity = capacity ? 2 * capacity : 8;
                produce_part_at *grown = PyMem_Realloc(f->parts, (size_t)capacity * sizeof *grown);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    return -1;
                }
                f->parts = grown;
            }
            f->parts[f->part_count++] = p;
        }
    }
    return c.position == c.p.end;
}

/* The topics of a request read by read_framing as ProduceTopic tuples; NULL with an exception set. */
static PyObject *framed_topics(const produce_framing *f, const uint8_t *data, PyObject *view, int with_seqnum)
{
    PyObject *topics = PyTuple_New(f->topic_count);
    if (topics == NULL)
        return NULL;
    for (Py_ssize_t t = 0; t < f->topic_count; t++) {
        const produce_topic_at *topic = &f->topics[t];
        PyObject *name = PyUnicode_DecodeLatin1((const char *)data + topic->name_at, topic->name_len, NULL);
        PyObject *partitions = name == NULL ? NULL : PyTuple_New(topic->count);
        if (partitions == NULL) {
            Py_XDECREF(name);
            Py_DECREF(topics);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < topic->count; i++) {
            const produce_part_at *at = &f->parts[topic->first + i];
            PyObject *p = new_named(PartitionType, 4, PyLong_FromUnsignedLong((unsigned long)at->partition),
                                    PySequence_GetSlice(view, at->start, at->end),
                                    with_seqnum ? PyLong_FromUnsignedLongLong(at->base_seq) : Py_NewRef(Py_None),
                                    at->record ? PySequence_GetSlice(view, at->length_at, at->end)
                                               : Py_NewRef(Py_None));
            if (p == NULL) {
                Py_DECREF(name);
                Py_DECREF(partitions);
                Py_DECREF(topics);
                return NULL;
            }
            PyTuple_SET_ITEM(partitions, i, p);
        }
        PyObject *named = new_named(TopicType, 2, name, partitions);
        if (named == NULL) {
            Py_DECREF(topics);
            return NULL;
        }
        PyTuple_SET_ITEM(topics, t, named);
    }
    return topics;
}

PyDoc_STRVAR(scan_produce_doc,
"scan_produce($module, payload, with_seqnum, /)\n--\n\n"
"Reads a produce payload and validates every bundle completely, in request order: (ProduceRequest,\n"
"[BundleFacts, ...]), or None when the framing does not parse (the reference reader then names the fault).\n"
"Raises ProtocolError for a bad bundle.");

static PyObject *scan_produce(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan_produce takes (payload, with_seqnum)");
        return NULL;
    }
    if (RequestType == NULL || FactsType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the produce request types are not registered");
        return NULL;
    }
    int with_seqnum = PyObject_IsTrue(args[1]);
    if (with_seqnum < 0)
        return NULL;
    /* Read-only, so that no bundle or record view handed out can write into the payload. A view of bytes is read-only
     * already; a writable one is made read-only through the interned method name (PyObject_CallMethod would build
     * the name and a bound method per request). */
    PyObject *view = PyMemoryView_FromObject(args[0]);
    if (view == NULL)
        return NULL;
    if (!PyMemoryView_GET_BUFFER(view)->readonly) {
        PyObject *readonly = PyObject_CallMethodNoArgs(view, toreadonly_name);
        Py_SETREF(view, readonly);
        if (view == NULL)
            return NULL;
    }
    Py_buffer *buf = PyMemoryView_GET_BUFFER(view);
    if (!PyBuffer_IsContiguous(buf, 'C') || buf->itemsize != 1 || buf->ndim != 1) {
        Py_DECREF(view);
        Py_RETURN_NONE; /* not a plain byte buffer: the reference copes */
    }
    const uint8_t *data = buf->buf;
    produce_framing f;
    PyObject *result = NULL, *request = NULL, *facts = NULL;
    int framed = read_framing(data, buf->len, with_seqnum, &f);
    if (framed <= 0) {
        result = framed < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    PyObject *topics = framed_topics(&f, data, view, with_seqnum);
    request = new_named(RequestType, 7, PyLong_FromUnsignedLongLong(f.request_id), topics, py_bool(with_seqnum),
                        PyLong_FromUnsignedLongLong(f.client_version),
                        PyUnicode_DecodeLatin1((const char *)data + f.client_id_at, f.client_id_len, NULL),
                        PyLong_FromUnsignedLongLong(f.required_acks), PyLong_FromUnsignedLongLong(f.ack_timeout_ms));
    if (request == NULL || (facts = PyList_New(f.part_count)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < f.part_count; i++) {
        const produce_part_at *at = &f.parts[i];
        PyObject *one = facts_of(view, (span){data + at->start, at->end - at->start}, at->start, 1);
        if (one == NULL)
            goto done;
        PyList_SET_ITEM(facts, i, one);
    }
    result = PyTuple_Pack(2, request, facts);
done:
    Py_XDECREF(request);
    Py_XDECREF(facts);
    release_framing(&f);
    Py_DECREF(view);
    return result;
}

/* _produce_scan.h's bundle_facts: facts_of on a bundle within a payload. */
static PyObject *bundle_facts(PyObject *payload, const uint8_t *data, Py_ssize_t start, Py_ssize_t end)
{
    if (FactsType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the produce request types are not registered");
        return NULL;
    }
    return facts_of(payload, (span){data + start, end - start}, start, 1);
}

/* -- consume chunks ---------------------------------------------------------------------------------------------- */

/* chunk.py's read_chunk, natively: the same walk of `{bundle_len varint, bundle}` records, the same messages kept and
 * the same ProtocolError for the same fault. Every message is built as a tiered.protocol.bundle.Message (registered
 * once by chunk.py): allocated by its type and its four slots set through the type's own member descriptors, which
 * is what Message(value, key, ts_ms, seq) stores, without the frozen dataclass's __init__. An uncompressed message
 * set is read in place in the chunk's buffer (the reference copies it first); values and keys are copied out, so the
 * messages never hold the chunk. Seqs are u64 here; where the reference's would pass 64 bits (a base or a run of
 * bundles ending at 2**64 - 1), or an argument is not a u64, the reader answers None and chunk.py reads the chunk
 * with the reference. */

#define PARTIAL_SLACK_BYTES 256 /* chunk.py's PARTIAL_SLACK_BYTES and INITIAL_NEED_BYTES */
#define INITIAL_NEED_BYTES 1024

static PyTypeObject *MessageType;
static PyObject *MessageSlots[4]; /* the member descriptors of Message's value, key, ts_ms and seq */

/* Sets slot `i` of `m` to `value` (a new reference, stolen; NULL fails). */
static int set_slot(PyObject *m, int i, PyObject *value)
{
    if (value == NULL)
        return -1;
    int failed = Py_TYPE(MessageSlots[i])->tp_descr_set(MessageSlots[i], m, value);
    Py_DECREF(value);
    return failed;
}

static int keep_message(keeper *k, uint64_t seq, uint64_t ts, const uint8_t *key, int key_len, const uint8_t *value,
                        Py_ssize_t value_len)
{
    if (k->above || seq < k->requested)
        return 0;
    if (seq > k->hwmark) {
        k->above = 1;
        return 0;
    }
    if (k->kept && seq <= k->last)
        k->ascending = 0;
    if (!k->kept++)
        k->first = seq;
    k->last = seq;
    k->value_bytes += (uint64_t)value_len;
    if (k->out == NULL)
        return 0;
    PyObject *m = MessageType->tp_alloc(MessageType, 0);
    if (m == NULL)
        return -1;
    if (set_slot(m, 0, PyBytes_FromStringAndSize((const char *)value, value_len)) < 0
        || set_slot(m, 1, key_len < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)key, key_len)) < 0
        || set_slot(m, 2, PyLong_FromUnsignedLongLong(ts)) < 0 || set_slot(m, 3, PyLong_FromUnsignedLongLong(seq)) < 0
        || PyList_Append(k->out, m) < 0) {
        Py_DECREF(m);
        return -1;
    }
    Py_DECREF(m);
    return 0;
}

/* An argument as a u64; 0 with `*fits` cleared (and no exception) when it is an int outside 0..2**64 - 1. */
static int u64_arg(PyObject *obj, uint64_t *value, int *fits)
{
    *value = PyLong_AsUnsignedLongLong(obj);
    if (*value == (uint64_t)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        *fits = 0;
    }
    return 0;
}

enum { CHUNK_OK = 0, CHUNK_FAILED = -1, CHUNK_TOO_WIDE = 1 };

/* The loop of chunk.py's read_chunk over the chunk `c` (the buffer of `obj`). CHUNK_TOO_WIDE: a seq would pass 64
 * bits; the reference reads the chunk. */
static int read_records(PyObject *obj, span c, int have_base, uint64_t base, keeper *keep, uint64_t *first_out,
                        Py_ssize_t *need_out)
{
    Py_ssize_t position = 0, end = c.end, need = 0;
    uint64_t next_seq = have_base ? base : 0, first_seq = 0;
    int next_wide = 0; /* next_seq is 2**64: the bundle before ended at the last u64 */
    while (position < end) {
        uint32_t size;
        Py_ssize_t start;
        int got = maybe_varint(c, position, &size, &start);
        if (got == TANK_VARINT_ERROR)
            return CHUNK_FAILED;
        if (got == TANK_VARINT_TRUNCATED) {
            if (end - position + INITIAL_NEED_BYTES > need)
                need = end - position + INITIAL_NEED_BYTES;
            break;
        }
        if (size == 0)
            return raise_protocol(position, "zero-length bundle in chunk");
        Py_ssize_t stop = start + (Py_ssize_t)size;
        span b = {c.data + start, (stop <= end ? stop : end) - start};
        tank_header h;
        if (read_header(b, &h) < 0)
            return CHUNK_FAILED;
        if (!h.sparse && !have_base && next_seq == 0 && !next_wide)
            return raise_protocol(position, "a non-sparse bundle with no base seq to start from");
        uint64_t first, last;
        if (h.sparse) {
            first = h.first_seq;
            last = h.last_seq;
        } else {
            if (next_wide || h.count - 1 > UINT64_MAX - next_seq)
                return CHUNK_TOO_WIDE;
            first = next_seq;
            last = next_seq + (h.count - 1);
        }
        next_wide = last == UINT64_MAX;
        next_seq = last + 1;
        if (first_seq == 0)
            first_seq = first;
        if (first > keep->hwmark)
            break;
        keep->above = 0;
        uint64_t low, high;
        if (stop <= end) {
            if (last >= keep->requested) {
                PyObject *decompressed = NULL;
                Py_buffer dbuf = {0};
                span d = {b.data + h.header_len, b.end - h.header_len};
                if (h.codec == CODEC_SNAPPY) {
                    decompressed = uncompress_body(obj, b, start, h.header_len);
                    if (decompressed == NULL || PyObject_GetBuffer(decompressed, &dbuf, PyBUF_SIMPLE) < 0) {
                        Py_XDECREF(decompressed);
                        return CHUNK_FAILED;
                    }
                    d.data = dbuf.buf;
                    d.end = dbuf.len;
                }
                int walked = walk_messages(d, &h, first, 0, &low, &high, keep);
                if (dbuf.obj != NULL)
                    PyBuffer_Release(&dbuf);
                Py_XDECREF(decompressed);
                if (walked < 0)
                    return CHUNK_FAILED;
            }
        } else if (h.codec != CODEC_SNAPPY) {
            /* A partial uncompressed bundle: its whole messages are kept, the fault that cuts it short is not one;
             * ask for enough to finish it. */
            span d = {b.data + h.header_len, b.end - h.header_len};
            if (walk_messages(d, &h, first, 0, &low, &high, keep) < 0) {
                if (!PyErr_ExceptionMatches(ProtocolError))
                    return CHUNK_FAILED;
                PyErr_Clear();
            }
            need = stop - position + PARTIAL_SLACK_BYTES;
        } else {
            need = stop - position;
        }
        position = stop;
    }
    *first_out = first_seq;
    *need_out = need;
    return CHUNK_OK;
}

/* read_chunk and scan_chunk, one pass: the arguments (chunk, base_seq, requested_seq, hwmark), the chunk's buffer
 * and read_records. `build` makes read_chunk's Message list and result; else the messages are only counted, for
 * scan_chunk's. None when a seq or an argument is not a u64 (the reference reads that chunk). */
static PyObject *chunk_pass(PyObject *const *args, Py_ssize_t nargs, int build)
{
    const char *name = build ? "read_chunk" : "scan_chunk";
    if (build && MessageType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Message is not registered");
        return NULL;
    }
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s takes (chunk, base_seq, requested_seq, hwmark)", name);
        return NULL;
    }
    keeper keep = {0};
    keep.ascending = 1;
    int fits = 1, have_base = args[1] != Py_None;
    uint64_t base = 0;
    if ((have_base && u64_arg(args[1], &base, &fits) < 0) || u64_arg(args[2], &keep.requested, &fits) < 0
        || u64_arg(args[3], &keep.hwmark, &fits) < 0)
        return NULL;
    if (!fits)
        return Py_NewRef(Py_None);
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    uint64_t first_seq = 0;
    Py_ssize_t need = 0;
    if (!build || (keep.out = PyList_New(0)) != NULL) {
        switch (read_records(args[0], (span){buf.buf, buf.len}, have_base, base, &keep, &first_seq, &need)) {
        case CHUNK_OK:
            if (build)
                result = Py_BuildValue("(OKn)", keep.out, (unsigned long long)first_seq, need);
            else
                result = Py_BuildValue("(KnKKKKO)", (unsigned long long)first_seq, need, (unsigned long long)keep.kept,
                                       (unsigned long long)keep.first, (unsigned long long)keep.last,
                                       (unsigned long long)keep.value_bytes, keep.ascending ? Py_True : Py_False);
            break;
        case CHUNK_TOO_WIDE:
            result = Py_NewRef(Py_None);
            break;
        }
        Py_XDECREF(keep.out);
    }
    PyBuffer_Release(&buf);
    return result;
}

PyDoc_STRVAR(read_chunk_doc,
"read_chunk($module, chunk, base_seq, requested_seq, hwmark, /)\n--\n\n"
"chunk.py's read_chunk: (messages, first_seq, need_bytes) of a consume chunk, or None when a seq or an argument\n"
"passes 64 bits (the reference then reads it). `base_seq` is None when the first bundle is sparse. Raises\n"
"ProtocolError as the reference does.");

static PyObject *read_chunk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return chunk_pass(args, nargs, 1);
}

PyDoc_STRVAR(scan_chunk_doc,
"scan_chunk($module, chunk, base_seq, requested_seq, hwmark, /)\n--\n\n"
"read_chunk without building the messages: (first_seq, need_bytes, messages, first, last, value_bytes, ascending)\n"
"of the messages read_chunk would return (first and last 0 when there are none; ascending: each seq above the one\n"
"before), or None as read_chunk. Every message is read and checked as read_chunk reads it; same ProtocolError.");

static PyObject *scan_chunk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return chunk_pass(args, nargs, 0);
}

PyDoc_STRVAR(register_message_doc, "register_message(message): the Message class read_chunk builds.");

static PyObject *register_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *names[4] = {"value", "key", "ts_ms", "seq"};
    if (nargs != 1 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "register_message takes (Message)");
        return NULL;
    }
    PyObject *slots[4] = {NULL};
    for (int i = 0; i < 4; i++) {
        /* a member descriptor: what a __slots__ field is, and what stores it without the class's __setattr__ */
        PyObject *d = PyObject_GetAttrString(args[0], names[i]);
        slots[i] = d;
        if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type) {
            if (d != NULL)
                PyErr_Format(PyExc_TypeError, "Message.%s is not a slot", names[i]);
            for (int j = 0; j <= i; j++)
                Py_XDECREF(slots[j]);
            return NULL;
        }
    }
    for (int i = 0; i < 4; i++)
        Py_XSETREF(MessageSlots[i], slots[i]);
    Py_XSETREF(MessageType, (PyTypeObject *)Py_NewRef(args[0]));
    Py_RETURN_NONE;
}

/* -- the module -------------------------------------------------------------------------------------------------- */

PyDoc_STRVAR(scan_bundle_doc,
"scan_bundle($module, bundle, strict=True, /)\n--\n\n"
"Validates one bundle completely (header, snappy block, every message, count, no trailing bytes) and returns its\n"
"BundleFacts; first_seq and last_seq are None unless the bundle is sparse. `strict` also refuses\n"
"SEQ_PREV_PLUS_ONE on a sparse bundle's first or last message. Raises ProtocolError.");

static PyObject *scan_bundle(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "scan_bundle takes (bundle, strict=True)");
        return NULL;
    }
    if (FactsType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "BundleFacts is not registered");
        return NULL;
    }
    int strict = nargs < 2 ? 1 : PyObject_IsTrue(args[1]);
    if (strict < 0)
        return NULL;
    PyObject *bundle = args[0];
    Py_buffer buf;
    if (PyObject_GetBuffer(bundle, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = facts_of(bundle, (span){buf.buf, buf.len}, 0, strict);
    PyBuffer_Release(&buf);
    return result;
}

static int set_type(PyObject *obj, PyTypeObject **slot)
{
    if (!PyType_Check(obj) || !PyType_IsSubtype((PyTypeObject *)obj, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "the result types must be tuple subclasses");
        return -1;
    }
    Py_XSETREF(*slot, (PyTypeObject *)Py_NewRef(obj));
    return 0;
}

PyDoc_STRVAR(register_doc,
"register(facts) or register(facts, request, topic, partition): the NamedTuple classes the scans return.");

static PyObject *register_types(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "register takes (facts) or (facts, request, topic, partition)");
        return NULL;
    }
    if (set_type(args[0], &FactsType) < 0)
        return NULL;
    if (nargs == 4 && (set_type(args[1], &RequestType) < 0 || set_type(args[2], &TopicType) < 0
                       || set_type(args[3], &PartitionType) < 0))
        return NULL;
    Py_RETURN_NONE;
}

/* -- receive buffers ------------------------------------------------------------------------------------------- */

PyDoc_STRVAR(receive_buffer_doc,
"receive_buffer($module, size, /)\n--\n\n"
"A bytearray of `size` bytes whose contents are not set (bytearray(size) zeroes them): for a buffer every byte of\n"
"which is received into before any is read (tiered.server.connection). Zeroing it cost a pass over every byte of a\n"
"big frame, in memory not yet in the cache.");

static PyObject *receive_buffer(PyObject *module, PyObject *arg)
{
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "a buffer size must not be negative");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, size); /* with NULL, the bytes are allocated and left as they are */
}

/* -- frames ------------------------------------------------------------------------------------------------------ */

#define FRAME_HEADER_BYTES 5              /* msg_id u8, payload length u32 (little-endian) */
#define MAX_FRAME_BYTES (256 * 1024 * 1024) /* tiered/protocol/frame.py's MAX_FRAME_BYTES */

PyDoc_STRVAR(cut_payloads_doc,
"cut_payloads($module, buf, start, end, big_bytes, /)\n--\n\n"
"frame.py's `_cut_payloads_py`, natively: the whole frames of buf[start:end] as (frames, rest, payload_bytes, big,\n"
"error), each frame a (msg_id, payload bytes) tuple, in one pass.");

static PyObject *cut_payloads(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "cut_payloads takes buf, start, end and big_bytes");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = start == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[2]);
    Py_ssize_t big_bytes = end == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[3]);
    if (big_bytes == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *frames = NULL, *big = Py_None, *error = Py_None, *result = NULL;
    Py_INCREF(big);
    Py_INCREF(error);
    if (start < 0 || end < start || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "cut_payloads: start and end must lie within the buffer, start <= end");
        goto done;
    }
    if ((frames = PyList_New(0)) == NULL)
        goto done;
    const uint8_t *b = view.buf;
    Py_ssize_t payload_bytes = 0;
    /* Lengths compared as lengths: `end - start` never wraps (0 <= start <= end <= len). */
    while (end - start >= FRAME_HEADER_BYTES) {
        unsigned msg_id = b[start];
        uint32_t length = (uint32_t)b[start + 1] | (uint32_t)b[start + 2] << 8 | (uint32_t)b[start + 3] << 16
                          | (uint32_t)b[start + 4] << 24;
        if (length > MAX_FRAME_BYTES) {
            Py_DECREF(error);
            error = PyObject_CallFunction(ProtocolError, "(Nn)",
                                          PyUnicode_FromFormat("frame length %u exceeds %d bytes", (unsigned)length,
                                                               MAX_FRAME_BYTES),
                                          start + 1);
            if (error == NULL)
                goto done;
            break;
        }
        if ((Py_ssize_t)length > end - start - FRAME_HEADER_BYTES) {
            if ((Py_ssize_t)length >= big_bytes) {
                Py_DECREF(big);
                if ((big = Py_BuildValue("(Ik)", msg_id, (unsigned long)length)) == NULL)
                    goto done;
            }
            break;
        }
        PyObject *payload = PyBytes_FromStringAndSize((const char *)b + start + FRAME_HEADER_BYTES, length);
        PyObject *frame = payload == NULL ? NULL : Py_BuildValue("(IN)", msg_id, payload);
        if (frame == NULL || PyList_Append(frames, frame) != 0) {
            Py_XDECREF(frame);
            goto done;
        }
        Py_DECREF(frame);
        payload_bytes += length;
        start += FRAME_HEADER_BYTES + length;
    }
    result = Py_BuildValue("(OnnOO)", frames, start, payload_bytes, big, error);
done:
    Py_XDECREF(frames);
    Py_DECREF(big);
    Py_XDECREF(error);
    PyBuffer_Release(&view);
    return result;
}

/* -- the produce answer ----------------------------------------------------------------------------------------- */

/* Partition-level produce statuses that carry nothing more (responses.py's _PLAIN_PARTITION_STATUSES: every one
 * but OTHER_LEADER, which an endpoint follows; tests/protocol/test_encoders.py tries every byte against it). */
static const uint8_t plain_statuses[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x0a, 0xfd};
#define PRODUCE_MSG_ID 0x01

static int plain_status(uint8_t code)
{
    for (size_t i = 0; i < sizeof plain_statuses; i++)
        if (plain_statuses[i] == code)
            return 1;
    return 0;
}

/* _produce_scan.h's codes_frame. */
static PyObject *codes_frame(uint32_t request_id, const uint8_t *c, Py_ssize_t count)
{
    /* A partition count is at most 255 per topic (u8), so the frame's length cannot overflow its u32. */
    if (count > 255)
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < count; i++)
        if (!plain_status(c[i]))
            Py_RETURN_NONE;
    PyObject *frame = PyBytes_FromStringAndSize(NULL, FRAME_HEADER_BYTES + 4 + count);
    if (frame != NULL) {
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(frame);
        uint32_t length = (uint32_t)(4 + count);
        out[0] = PRODUCE_MSG_ID;
        for (int i = 0; i < 4; i++) {
            out[1 + i] = (uint8_t)(length >> (8 * i));
            out[5 + i] = (uint8_t)(request_id >> (8 * i));
        }
        memcpy(out + 9, c, (size_t)count);
    }
    return frame;
}

PyDoc_STRVAR(produce_codes_frame_doc,
"produce_codes_frame($module, request_id, codes, /)\n--\n\n"
"responses.py's `_produce_codes_frame_py`, natively: the whole frame of a one-topic produce answer, or None.");

static PyObject *produce_codes_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "produce_codes_frame takes request_id and codes");
        return NULL;
    }
    if (!PyLong_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "request_id must be an int");
        return NULL;
    }
    int overflow;
    long long request_id = PyLong_AsLongLongAndOverflow(args[0], &overflow);
    if (request_id == -1 && PyErr_Occurred())
        return NULL;
    if (overflow != 0 || request_id < 0 || request_id > 0xFFFFFFFFLL)
        Py_RETURN_NONE; /* refused by the reference encoder, which names it */
    Py_buffer codes;
    if (PyObject_GetBuffer(args[1], &codes, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *frame = codes_frame((uint32_t)request_id, codes.buf, codes.len);
    PyBuffer_Release(&codes);
    return frame;
}

static const produce_scan_api scan_api = {read_framing, release_framing, bundle_facts, codes_frame};

static PyMethodDef methods[] = {
    {"receive_buffer", receive_buffer, METH_O, receive_buffer_doc},
    {"cut_payloads", (PyCFunction)(void (*)(void))cut_payloads, METH_FASTCALL, cut_payloads_doc},
    {"produce_codes_frame", (PyCFunction)(void (*)(void))produce_codes_frame, METH_FASTCALL,
     produce_codes_frame_doc},
    {"scan_bundle", (PyCFunction)(void (*)(void))scan_bundle, METH_FASTCALL, scan_bundle_doc},
    {"scan_produce", (PyCFunction)(void (*)(void))scan_produce, METH_FASTCALL, scan_produce_doc},
    {"register", (PyCFunction)(void (*)(void))register_types, METH_FASTCALL, register_doc},
    {"read_chunk", (PyCFunction)(void (*)(void))read_chunk, METH_FASTCALL, read_chunk_doc},
    {"scan_chunk", (PyCFunction)(void (*)(void))scan_chunk, METH_FASTCALL, scan_chunk_doc},
    {"register_message", (PyCFunction)(void (*)(void))register_message, METH_FASTCALL, register_message_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tiered.protocol._bundlescan",
    "The native passes of tiered.protocol.bundle.validate_bundle and tiered.protocol.requests.read_checked_produce "
    "(see _bundlescan.c).", -1, methods,
};

/* A new reference to `module`.`name`, or NULL. */
static PyObject *import_attr(const char *module, const char *name)
{
    PyObject *m = PyImport_ImportModule(module);
    if (m == NULL)
        return NULL;
    PyObject *attr = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    return attr;
}

PyMODINIT_FUNC PyInit__bundlescan(void)
{
    if ((ProtocolError = import_attr("tiered.protocol.errors", "ProtocolError")) == NULL
        || (uncompress = import_attr("snappy", "uncompress")) == NULL
        || (toreadonly_name = PyUnicode_InternFromString("toreadonly")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    PyObject *api = PyCapsule_New((void *)&scan_api, PRODUCE_SCAN_CAPSULE, NULL);
    int added = api == NULL ? -1 : PyModule_AddObjectRef(m, "_produce_scan", api);
    Py_XDECREF(api);
    if (added < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
