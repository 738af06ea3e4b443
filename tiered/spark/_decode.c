/* tiered.spark._decode: whole `{varint bundle_len, bundle}` records in, Arrow column buffers out, with no Python step
 * per message. The native twin of tiered/spark/decoding.py's pure path (iter_messages + record_batches), which stays
 * the reference: the suite compares the two byte for byte and on the same bad input.
 *
 * Varints, bundle headers and messages are read by tiered/protocol/_tank_walk.h, the walker shared with
 * tiered/protocol/_bundlescan.c (TANK's record and bundle layout is there; tiered/protocol/bundle.py and varint.py
 * have the same tables).
 *
 * Raw snappy blocks are read by _decode_snappy.h, the batch under construction lives in _decode_columns.h (both
 * included once, here: one translation unit).
 *
 * Invariants. Every read is bounds-checked against the buffer it reads (records, bundle, message set); bad bytes
 * raise tiered.protocol.errors.ProtocolError with the pure path's text and position, in the pure path's order (a
 * bundle is validated whole before a message of it is refused for its seq), except that a damaged snappy block
 * names its own fault after "bad snappy message set: ". Seqs are computed in 128 bits, as Python's ints never
 * overflow; a kept message's seq must fit the int64 column. The Python buffer of the records is held (and so
 * unchanged) for the decoder's life. Decoder.fill runs without the GIL: a fault is recorded and raised once the GIL
 * is back, and a busy flag refuses a second thread on the same Decoder or Builder.
 *
 * Output, per batch (Builder.take): the Arrow buffers of SCHEMA's seq (int64), timestamp (int64 microseconds, a
 * validity bitmap where a stamp is past MAX_TIMESTAMP_MS), key and value (binary: int32 offsets and data; the key's
 * validity bitmap is clear where a message has no key). They are malloc'd and handed to Python as read-only Buffer
 * objects, which pyarrow wraps without copying; a batch ends before an offset would pass INT32_MAX.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_tank_walk.h" /* tiered/protocol/, on the include path (pyproject.toml) */

#define INT64_COLUMN_MAX ((tank_u128)INT64_MAX)
/* tiered.spark.planning.MAX_TIMESTAMP_MS: above it the microsecond timestamp does not fit an int64 (null). */
#define MAX_TIMESTAMP_MS (INT64_MAX / 1000)
/* Arrow binary offsets are int32: a batch ends before its keys or values would pass this. */
#define MAX_COLUMN_BYTES ((size_t)INT32_MAX)

static PyObject *ProtocolError; /* tiered.protocol.errors.ProtocolError */

/* -- faults ------------------------------------------------------------------------------------------------------ */

/* What went wrong while decoding is a tank_fault (_tank_walk.h), found without the GIL and raised by the caller once
 * it holds the GIL again. */

static int out_of_memory(tank_fault *f)
{
    f->kind = TANK_FAULT_MEMORY;
    return -1;
}

/* With the GIL: the fault as the Python exception; NULL. */
static PyObject *raise_fault(const tank_fault *f)
{
    if (f->kind == TANK_FAULT_MEMORY)
        return PyErr_NoMemory();
    PyObject *exc = f->position == TANK_NO_POSITION
                        ? PyObject_CallFunction(ProtocolError, "(sO)", f->what, Py_None)
                        : PyObject_CallFunction(ProtocolError, "(sn)", f->what, f->position);
    if (exc != NULL) {
        PyErr_SetObject(ProtocolError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

#include "_decode_snappy.h"
#include "_decode_columns.h"

/* -- Decoder: a cursor over whole records ----------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Py_buffer data;
    int has_data;
    int done;             /* no record left to read, the records past the wanted seqs, or an error raised */
    Py_ssize_t position;  /* the next record */
    tank_u128 next_seq;        /* seq of the next non-sparse bundle's first message */
    tank_u128 seq_first;       /* keep seqs in [seq_first, seq_end) */
    tank_u128 seq_end;
    int check_time;       /* keep timestamps (us) in [start_us, end_us), or all when 0 */
    int has_end;
    int64_t start_us, end_us;
    /* the bundle being decoded, when in_bundle */
    int in_bundle;
    const uint8_t *set;   /* its message set: inside `data`, or `owned` when it was snappy */
    uint8_t *owned;
    Py_ssize_t set_len;
    tank_header header;
    tank_cursor cursor;   /* the next message of its set */
    int busy;             /* fill is running without the GIL */
} Decoder;

static void decoder_drop_bundle(Decoder *self)
{
    free(self->owned);
    self->owned = NULL;
    self->set = NULL;
    self->in_bundle = 0;
}

static void Decoder_dealloc(Decoder *self)
{
    decoder_drop_bundle(self);
    if (self->has_data)
        PyBuffer_Release(&self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A Python int in [0, 2^128) (the caller clamps); OverflowError otherwise. */
static int to_u128(PyObject *o, tank_u128 *out)
{
    PyObject *shift = PyLong_FromLong(64);
    if (shift == NULL)
        return -1;
    PyObject *high_obj = PyNumber_Rshift(o, shift);
    Py_DECREF(shift);
    if (high_obj == NULL)
        return -1;
    unsigned long long high = PyLong_AsUnsignedLongLong(high_obj);
    Py_DECREF(high_obj);
    if (high == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    unsigned long long low = PyLong_AsUnsignedLongLongMask(o);
    if (low == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = ((tank_u128)high << 64) | low;
    return 0;
}

static int Decoder_init(Decoder *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"data", "first_seq", "seq_first", "seq_end", "start_us", "end_us", NULL};
    Py_buffer data;
    PyObject *first_seq, *seq_first, *seq_end, *start_obj, *end_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*OOOOO:Decoder", names, &data, &first_seq, &seq_first,
                                     &seq_end, &start_obj, &end_obj))
        return -1;
    if (self->busy) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_RuntimeError, "Decoder in use by fill in another thread");
        return -1;
    }
    decoder_drop_bundle(self);
    if (self->has_data)
        PyBuffer_Release(&self->data);
    self->data = data;
    self->has_data = 1;
    self->done = 0;
    self->position = 0;
    if (to_u128(first_seq, &self->next_seq) < 0 || to_u128(seq_first, &self->seq_first) < 0 ||
        to_u128(seq_end, &self->seq_end) < 0)
        return -1;
    self->check_time = start_obj != Py_None;
    self->has_end = end_obj != Py_None;
    self->start_us = self->check_time ? PyLong_AsLongLong(start_obj) : 0;
    self->end_us = self->has_end ? PyLong_AsLongLong(end_obj) : 0;
    return PyErr_Occurred() ? -1 : 0;
}

/* Decompresses the raw snappy message set `body` (at header_len in its bundle) into a malloc'd *out, with the pure
 * path's limits: a claimed length is refused before it is allocated. 0, or -1 with a fault. */
static int decompress_set(const uint8_t *body, Py_ssize_t body_len, Py_ssize_t header_len, uint8_t **out,
                          Py_ssize_t *out_len, tank_fault *f)
{
    uint32_t claimed;
    Py_ssize_t after;
    int got = tank_maybe_varint(body, body_len, 0, &claimed, &after, f);
    if (got == TANK_VARINT_ERROR)
        return -1;
    if (got == TANK_VARINT_TRUNCATED)
        return tank_fail(f, header_len, "truncated snappy message set");
    if (claimed > MAX_MESSAGE_SET_BYTES || claimed > SNAPPY_MAX_EXPANSION * (uint64_t)body_len)
        return tank_fail(f, header_len, "snappy message set of %zd bytes claims %u bytes", body_len, claimed);
    uint8_t *set = malloc(claimed ? claimed : 1);
    if (set == NULL)
        return out_of_memory(f);
    char err[160];
    if (snappy_elements(body + after, (size_t)(body_len - after), set, claimed, err, sizeof err) < 0) {
        free(set);
        return tank_fail(f, TANK_NO_POSITION, "bad snappy message set: %s", err);
    }
    *out = set;
    *out_len = claimed;
    return 0;
}

/* Reads records until one holds a bundle to decode (1: in_bundle set), or none is left or wanted (0: done). Bundles
 * wholly below the wanted seqs are skipped from their header; one wholly above ends the read, since records are in
 * seq order. -1: a fault. */
static int start_bundle(Decoder *self, tank_fault *f)
{
    const uint8_t *data = self->data.buf;
    Py_ssize_t end = self->data.len;
    char a[40], b[40], c[40];
    while (self->position < end) {
        Py_ssize_t position = self->position, start;
        uint32_t size;
        int got = tank_maybe_varint(data, end, position, &size, &start, f);
        if (got == TANK_VARINT_ERROR)
            return -1;
        if (got == TANK_VARINT_TRUNCATED)
            return tank_fail(f, position, "truncated record");
        if (size == 0)
            return tank_fail(f, position, "zero-length bundle");
        if ((uint64_t)(end - start) < size)
            return tank_fail(f, position, "truncated record");
        const uint8_t *bundle = data + start;
        tank_header h;
        if (tank_read_header(bundle, size, &h, f) < 0)
            return -1;
        tank_u128 first = h.sparse ? h.first_seq : self->next_seq;
        tank_u128 last = h.sparse ? h.last_seq : self->next_seq + h.count - 1;
        if (first < self->next_seq && position)
            return tank_fail(f, position, "bundle seqs %s..%s go back below %s", tank_u128_text(first, a),
                             tank_u128_text(last, b), tank_u128_text(self->next_seq, c));
        self->next_seq = last + 1;
        self->position = start + size;
        if (last < self->seq_first)
            continue;
        if (first >= self->seq_end)
            break;
        const uint8_t *body = bundle + h.header_len;
        Py_ssize_t body_len = size - h.header_len;
        if (h.codec == CODEC_SNAPPY) {
            if (decompress_set(body, body_len, h.header_len, &self->owned, &self->set_len, f) < 0)
                return -1;
            self->set = self->owned;
        } else {
            self->set = body;
            self->set_len = body_len;
        }
        self->in_bundle = 1;
        self->header = h;
        self->cursor = tank_cursor_at(first);
        return 1;
    }
    self->done = 1;
    return 0;
}

/* Reads message c->index of the current bundle (the shared walker's) and moves c past it; at the bundle's last
 * message, also checks that nothing follows it. 0, or -1 with a fault. */
static int parse_message(const Decoder *self, tank_cursor *c, tank_message *m, tank_fault *f)
{
    if (tank_next_message(self->set, self->set_len, &self->header, 0, c, m, f) < 0)
        return -1;
    return c->index == self->header.count ? tank_check_end(c, self->set_len, f) : 0;
}

static int wanted(const Decoder *self, tank_u128 seq, uint64_t ts_ms)
{
    if (seq < self->seq_first || seq >= self->seq_end)
        return 0;
    if (!self->check_time)
        return 1;
    if (ts_ms > (uint64_t)MAX_TIMESTAMP_MS)
        return 0;
    int64_t us = (int64_t)ts_ms * 1000;
    return us >= self->start_us && (!self->has_end || us < self->end_us);
}

/* One message of the current bundle into `b` when wanted: 1 consumed, 0 not consumed because `b` is full (its keys
 * or values would pass an int32 offset), -1 a fault. */
static int next_message(Decoder *self, Builder *b, tank_fault *f)
{
    tank_cursor c = self->cursor;
    tank_message m;
    char text[40];
    if (parse_message(self, &c, &m, f) < 0)
        return -1;
    size_t key_len = (size_t)m.key_len, value_len = (size_t)m.value_len;
    if (wanted(self, m.seq, m.ts)) {
        if (b->values.len + value_len > MAX_COLUMN_BYTES || b->keys.len + key_len > MAX_COLUMN_BYTES) {
            if (b->rows > 0)
                return 0;
            return tank_fail(f, TANK_NO_POSITION, "message of %zu bytes does not fit an Arrow binary column",
                             value_len);
        }
        if (m.seq > INT64_COLUMN_MAX) {
            /* The pure path refuses this seq only once the whole bundle is decoded: a later fault comes first. */
            tank_cursor rest = c;
            tank_message ignored;
            while (rest.index < self->header.count)
                if (parse_message(self, &rest, &ignored, f) < 0)
                    return -1;
            return tank_fail(f, TANK_NO_POSITION, "seq %s exceeds the int64 seq column", tank_u128_text(m.seq, text));
        }
        if (builder_append(b, (int64_t)m.seq, m.ts, m.key, key_len, m.value, value_len, f) < 0)
            return -1;
    }
    self->cursor = c;
    if (c.index == self->header.count)
        decoder_drop_bundle(self);
    return 1;
}

/* Appends wanted messages to `b` until it holds max_rows rows or no record is left: 1 full, 0 exhausted, -1 a fault.
 * Runs without the GIL: it touches only the decoder, the builder and the records' buffer, all held by the caller. */
static int fill_rows(Decoder *self, Builder *b, Py_ssize_t max_rows, tank_fault *f)
{
    for (;;) {
        if (b->rows >= max_rows)
            return 1;
        if (!self->in_bundle) {
            if (self->done)
                return 0;
            int got = start_bundle(self, f);
            if (got <= 0)
                return got;
        }
        int got = next_message(self, b, f);
        if (got <= 0)
            return got < 0 ? -1 : 1;
    }
}

static PyObject *Decoder_fill(Decoder *self, PyObject *args)
{
    Builder *b;
    Py_ssize_t max_rows;
    if (!PyArg_ParseTuple(args, "O!n:fill", &BuilderType, &b, &max_rows))
        return NULL;
    if (max_rows < 1) {
        PyErr_SetString(PyExc_ValueError, "max_rows must be at least 1");
        return NULL;
    }
    if (!self->has_data) {
        PyErr_SetString(PyExc_ValueError, "Decoder not initialised");
        return NULL;
    }
    if (self->busy || b->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Decoder or Builder in use by fill in another thread");
        return NULL;
    }
    tank_fault f = {TANK_FAULT_NONE};
    int got;
    self->busy = b->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    got = fill_rows(self, b, max_rows, &f);
    Py_END_ALLOW_THREADS
    self->busy = b->busy = 0;
    if (got < 0) {
        decoder_drop_bundle(self);
        self->done = 1;
        return raise_fault(&f);
    }
    return PyBool_FromLong(got);
}

static PyMethodDef Decoder_methods[] = {
    {"fill", (PyCFunction)Decoder_fill, METH_VARARGS,
     "fill(builder, max_rows) -> bool: appends the next wanted messages to builder. True when builder is full "
     "(max_rows rows, or its keys or values at the int32 offset limit), False when no record is left; raises "
     "ProtocolError on bad bytes, after which the decoder is done."},
    {NULL}};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tiered.spark._decode.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decoder(data, first_seq, seq_first, seq_end, start_us, end_us): whole records `data`, the first "
              "holding seq first_seq; keeps seqs in [seq_first, seq_end) and, unless start_us is None, timestamps "
              "(microseconds) in [start_us, end_us) (end_us None: unbounded).",
    .tp_methods = Decoder_methods,
    .tp_init = (initproc)Decoder_init,
    .tp_new = PyType_GenericNew,
};

/* -- module ------------------------------------------------------------------------------------------------------ */

static PyObject *snappy_message_set(PyObject *module, PyObject *args)
{
    Py_buffer body;
    if (!PyArg_ParseTuple(args, "y*:snappy_message_set", &body))
        return NULL;
    uint8_t *set;
    Py_ssize_t set_len;
    tank_fault f = {TANK_FAULT_NONE};
    PyObject *out = NULL;
    if (decompress_set(body.buf, body.len, 0, &set, &set_len, &f) == 0) {
        out = PyBytes_FromStringAndSize((const char *)set, set_len);
        free(set);
    } else {
        raise_fault(&f);
    }
    PyBuffer_Release(&body);
    return out;
}

static PyMethodDef module_methods[] = {
    {"snappy_message_set", snappy_message_set, METH_VARARGS,
     "snappy_message_set(body) -> bytes: a raw snappy message set decompressed with the decoder's own code and "
     "limits (for tests against python-snappy)."},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tiered.spark._decode",
    "Native decoding of whole TANK records into Arrow column buffers (see tiered/spark/decoding.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__decode(void)
{
    if (PyType_Ready(&BufferType) < 0 || PyType_Ready(&BuilderType) < 0 || PyType_Ready(&DecoderType) < 0)
        return NULL;
    PyObject *errors = PyImport_ImportModule("tiered.protocol.errors");
    if (errors == NULL)
        return NULL;
    ProtocolError = PyObject_GetAttrString(errors, "ProtocolError");
    Py_DECREF(errors);
    if (ProtocolError == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Builder", (PyObject *)&BuilderType) < 0 ||
        PyModule_AddObjectRef(m, "Decoder", (PyObject *)&DecoderType) < 0 ||
        PyModule_AddObjectRef(m, "Buffer", (PyObject *)&BufferType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
