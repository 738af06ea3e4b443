/* The columns of one record batch under construction, for tiered/spark/_decode.c (included there once, after
 * _tank_walk.h's tank_fault): growable byte vectors (Vec), the Builder Python type that Decoder.fill appends messages
 * to, and the Buffer type that hands each finished vector to Python, read-only and without a copy, for pyarrow to wrap.
 */

/* -- Buffer: malloc'd bytes exported read-only through the buffer protocol -------------------------------------- */

typedef struct {
    PyObject_HEAD
    char *ptr;
    Py_ssize_t len;
} Buffer;

static int Buffer_getbuffer(Buffer *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, 1, flags);
}

static void Buffer_dealloc(Buffer *self)
{
    free(self->ptr);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t Buffer_length(Buffer *self) { return self->len; }

static PyBufferProcs Buffer_as_buffer = {(getbufferproc)Buffer_getbuffer, NULL};
static PySequenceMethods Buffer_as_sequence = {.sq_length = (lenfunc)Buffer_length};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tiered.spark._decode.Buffer",
    .tp_basicsize = sizeof(Buffer),
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_as_sequence = &Buffer_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes of one Arrow buffer, owned by this object (read-only buffer protocol).",
};

/* -- Vec: a growable byte vector --------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *ptr;
    size_t len, cap;
} Vec;

static int vec_reserve(Vec *v, size_t extra, tank_fault *f)
{
    if (v->cap - v->len >= extra)
        return 0;
    size_t cap = v->cap ? v->cap : (extra > 1024 ? extra : 1024);
    while (cap - v->len < extra)
        cap *= 2;
    uint8_t *p = realloc(v->ptr, cap);
    if (p == NULL)
        return out_of_memory(f);
    v->ptr = p;
    v->cap = cap;
    return 0;
}

/* The vector as a Buffer (it then owns the memory); the vector is left empty. */
static PyObject *vec_take(Vec *v)
{
    Buffer *b = PyObject_New(Buffer, &BufferType);
    if (b == NULL)
        return NULL;
    b->ptr = (char *)v->ptr;
    b->len = (Py_ssize_t)v->len;
    if (b->ptr == NULL && (b->ptr = malloc(1)) == NULL) {
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    v->ptr = NULL;
    v->len = v->cap = 0;
    return (PyObject *)b;
}

static void vec_free(Vec *v)
{
    free(v->ptr);
    v->ptr = NULL;
    v->len = v->cap = 0;
}

/* -- Builder: the columns of one record batch under construction ------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    Py_ssize_t rows;
    Py_ssize_t stamp_nulls, key_nulls;
    Vec seqs, stamps, stamp_valid, key_offsets, keys, key_valid, value_offsets, values;
    size_t last_rows, last_keys, last_values; /* the previous batch's sizes: the next one starts with room for them */
    int busy;                                 /* Decoder.fill is filling it, without the GIL */
} Builder;

static void builder_clear(Builder *b)
{
    Vec *all[] = {&b->seqs, &b->stamps, &b->stamp_valid, &b->key_offsets,
                  &b->keys, &b->key_valid, &b->value_offsets, &b->values};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        vec_free(all[i]);
    b->rows = b->stamp_nulls = b->key_nulls = 0;
}

static void Builder_dealloc(Builder *self)
{
    builder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int put_i32(Vec *v, int32_t x, tank_fault *f)
{
    if (vec_reserve(v, 4, f) < 0)
        return -1;
    memcpy(v->ptr + v->len, &x, 4);
    v->len += 4;
    return 0;
}

/* Sets validity bit `row` (bit clear = null); the bitmap grows a zeroed byte at a time. */
static int put_valid(Vec *v, Py_ssize_t row, int valid, tank_fault *f)
{
    if ((row & 7) == 0) {
        if (vec_reserve(v, 1, f) < 0)
            return -1;
        v->ptr[v->len++] = 0;
    }
    if (valid)
        v->ptr[row >> 3] |= (uint8_t)(1u << (row & 7));
    return 0;
}

/* A batch starts with room for as much as the previous one held, so its buffers rarely move while it fills. */
static int builder_start(Builder *b, tank_fault *f)
{
    size_t rows = b->last_rows;
    if (vec_reserve(&b->seqs, 8 * rows, f) < 0 || vec_reserve(&b->stamps, 8 * rows, f) < 0 ||
        vec_reserve(&b->stamp_valid, rows / 8 + 1, f) < 0 || vec_reserve(&b->key_valid, rows / 8 + 1, f) < 0 ||
        vec_reserve(&b->key_offsets, 4 * (rows + 1), f) < 0 ||
        vec_reserve(&b->value_offsets, 4 * (rows + 1), f) < 0 ||
        vec_reserve(&b->keys, b->last_keys + b->last_keys / 8, f) < 0 ||
        vec_reserve(&b->values, b->last_values + b->last_values / 8, f) < 0)
        return -1;
    return put_i32(&b->key_offsets, 0, f) < 0 || put_i32(&b->value_offsets, 0, f) < 0 ? -1 : 0;
}

static int builder_append(Builder *b, int64_t seq, uint64_t ts_ms, const uint8_t *key, size_t key_len,
                          const uint8_t *value, size_t value_len, tank_fault *f)
{
    if (b->rows == 0 && builder_start(b, f) < 0)
        return -1;
    int stamp_valid = ts_ms <= (uint64_t)MAX_TIMESTAMP_MS;
    int64_t micros = stamp_valid ? (int64_t)ts_ms * 1000 : 0;
    if (vec_reserve(&b->seqs, 8, f) < 0 || vec_reserve(&b->stamps, 8, f) < 0 ||
        vec_reserve(&b->keys, key_len, f) < 0 || vec_reserve(&b->values, value_len, f) < 0)
        return -1;
    memcpy(b->seqs.ptr + b->seqs.len, &seq, 8);
    b->seqs.len += 8;
    memcpy(b->stamps.ptr + b->stamps.len, &micros, 8);
    b->stamps.len += 8;
    if (put_valid(&b->stamp_valid, b->rows, stamp_valid, f) < 0)
        return -1;
    b->stamp_nulls += !stamp_valid;
    /* An empty key or value copies nothing: the vector may have no memory yet (NULL), and memcpy from or to NULL is
     * undefined even for 0 bytes (UBSan found it). */
    if (key_len) {
        memcpy(b->keys.ptr + b->keys.len, key, key_len);
        b->keys.len += key_len;
    }
    if (put_valid(&b->key_valid, b->rows, key != NULL, f) < 0)
        return -1;
    b->key_nulls += key == NULL;
    if (value_len) {
        memcpy(b->values.ptr + b->values.len, value, value_len);
        b->values.len += value_len;
    }
    if (put_i32(&b->key_offsets, (int32_t)b->keys.len, f) < 0 ||
        put_i32(&b->value_offsets, (int32_t)b->values.len, f) < 0)
        return -1;
    b->rows++;
    return 0;
}

static PyObject *Builder_rows(Builder *self, void *closure) { return PyLong_FromSsize_t(self->rows); }

/* The batch's buffers, ownership and all; the builder starts over empty. A validity bitmap without a null is None. */
static PyObject *Builder_take(Builder *self, PyObject *unused)
{
    tank_fault f = {TANK_FAULT_NONE};
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Builder in use by Decoder.fill in another thread");
        return NULL;
    }
    if (self->rows == 0 && (put_i32(&self->key_offsets, 0, &f) < 0 || put_i32(&self->value_offsets, 0, &f) < 0))
        return raise_fault(&f);
    self->last_rows = (size_t)self->rows;
    self->last_keys = self->keys.len;
    self->last_values = self->values.len;
    PyObject *parts[8] = {
        vec_take(&self->seqs),
        vec_take(&self->stamps),
        self->stamp_nulls ? vec_take(&self->stamp_valid) : Py_NewRef(Py_None),
        vec_take(&self->key_offsets),
        vec_take(&self->keys),
        self->key_nulls ? vec_take(&self->key_valid) : Py_NewRef(Py_None),
        vec_take(&self->value_offsets),
        vec_take(&self->values),
    };
    PyObject *out = NULL;
    int complete = 1;
    for (int i = 0; i < 8; i++)
        complete &= parts[i] != NULL;
    if (complete)
        out = Py_BuildValue("(nOOOnOOOnOO)", self->rows, parts[0], parts[1], parts[2], self->stamp_nulls, parts[3],
                            parts[4], parts[5], self->key_nulls, parts[6], parts[7]);
    for (int i = 0; i < 8; i++)
        Py_XDECREF(parts[i]);
    builder_clear(self);
    return out;
}

static PyMethodDef Builder_methods[] = {
    {"take", (PyCFunction)Builder_take, METH_NOARGS,
     "take() -> (rows, seqs, stamps, stamp_validity|None, stamp_nulls, key_offsets, keys, key_validity|None, "
     "key_nulls, value_offsets, values): the batch's Arrow buffers; the builder starts over empty."},
    {NULL}};

static PyGetSetDef Builder_getset[] = {{"rows", (getter)Builder_rows, NULL, "rows so far", NULL}, {NULL}};

static PyTypeObject BuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tiered.spark._decode.Builder",
    .tp_basicsize = sizeof(Builder),
    .tp_dealloc = (destructor)Builder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Builder(): the seq, timestamp, key and value columns of one record batch, filled by Decoder.fill.",
    .tp_methods = Builder_methods,
    .tp_getset = Builder_getset,
    .tp_new = PyType_GenericNew,
};
