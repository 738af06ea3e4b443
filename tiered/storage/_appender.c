/* tiered.storage._appender: the native appender of an active segment, one call per appended record.
 *
 * The native twin of tiered/storage/appender.py's PySegmentAppender, which stays the reference: tests write the same
 * records through both and compare the segment files, the index files, the in-memory indexes and every attribute
 * (tests/storage/test_appender.py); the invariants are stated once, in appender.py's docstring.
 *
 * What one `append` does: check that the record can be indexed (nothing written otherwise), write it whole at the
 * file's end with the GIL released (a failed write cuts the file back), keep the timestamp bounds, apply TANK's
 * index rule (an entry goes to the in-memory SparseIndex at once, through its `append`, and to the index file in
 * batches of INDEX_WRITE_BATCH bytes). The record's buffer is held for the call only; the appender keeps no Python
 * object but the index and the two names it reports failures with.
 *
 * Memory: the only buffer the appender owns is `unwritten`, INDEX_WRITE_BATCH bytes, written out whenever it is full,
 * so an entry always fits. Lengths are compared, never summed past 64 bits: a record's length is at most
 * PY_SSIZE_T_MAX and `size` at most 2^32 - 1 (the check before the write).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "structmember.h"

#define INDEX_WRITE_BATCH 4096
#define ENTRY_BYTES 8
#define MAX_U32 0xFFFFFFFFULL
#define MAX_REL_SEQ 0x7FFFFFFFULL /* tiered.storage.segment.MAX_REL_SEQ: TANK's seq span within one segment */

static PyObject *logger; /* logging.getLogger("tiered.storage") */

typedef struct {
    PyObject_HEAD
    PyObject *path, *index_path; /* str: named in what is logged */
    PyObject *index;             /* the segment's SparseIndex */
    int log_fd, index_fd;        /* -1 once closed */
    uint64_t base, size, last, since_last_update;
    int has_last;
    double created_ts, roll_age_s; /* when the segment was created, and the age past which it rolls */
    uint64_t entries;              /* in the in-memory index: it grows by this appender's appends only */
    uint64_t ts_low, ts_high;
    int has_ts, ts_complete;
    Py_ssize_t unwritten_len;
    uint8_t unwritten[INDEX_WRITE_BATCH];
} Appender;

/* -- arguments --------------------------------------------------------------------------------------------------- */

/* A u64 from a Python int; ValueError (as the reference's range checks raise) when it is not one. */
static int u64_of(PyObject *obj, const char *what, uint64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    /* Most values fit a signed 64-bit integer, which CPython reads without its byte-array conversion (what
     * PyLong_AsUnsignedLongLong always takes): that one only for the values past it. */
    int overflow;
    long long small = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow == 0 && small >= 0) {
        *out = (uint64_t)small;
        return 0;
    }
    unsigned long long v = overflow > 0 ? PyLong_AsUnsignedLongLong(obj) : (unsigned long long)-1;
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || overflow < 0 || (overflow == 0 && small < 0)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s %R is not a u64", what, obj);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* -- I/O ---------------------------------------------------------------------------------------------------------- */

/* Writes all of data[0:len] to fd, the GIL released; 0, or -1 with errno set. */
static int write_all(int fd, const uint8_t *data, Py_ssize_t len)
{
    int failed = 0, err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (len > 0) {
        ssize_t n = write(fd, data, (size_t)len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            failed = 1;
            err = errno;
            break;
        }
        data += n;
        len -= n;
    }
    Py_END_ALLOW_THREADS
    if (failed)
        errno = err;
    return failed ? -1 : 0;
}

/* logger.error(format, *args) without letting a failure of logging escape: the caller is already failing, or must
 * not fail (an index write). */
static void log_error(const char *format, PyObject *args)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (args != NULL) {
        PyObject *fmt = PyUnicode_FromString(format);
        if (fmt != NULL) {
            PyObject *call = PyTuple_New(PyTuple_GET_SIZE(args) + 1);
            if (call != NULL) {
                PyTuple_SET_ITEM(call, 0, fmt);
                fmt = NULL;
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++)
                    PyTuple_SET_ITEM(call, i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
                PyObject *error = PyObject_GetAttrString(logger, "error");
                if (error != NULL) {
                    Py_XDECREF(PyObject_Call(error, call, NULL));
                    Py_DECREF(error);
                }
                Py_DECREF(call);
            }
            Py_XDECREF(fmt);
        }
        Py_DECREF(args);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}

/* The strerror of errno `err` as a str (a new reference), for log_error's arguments. */
static PyObject *error_text(int err)
{
    return PyUnicode_FromFormat("[Errno %d] %s", err, strerror(err));
}

/* Writes the pending index entries; a failure is logged, never raised (see appender.py). */
static void write_entries(Appender *t)
{
    /* Taken out first: the write releases the GIL, and another append may then start the next batch. */
    uint8_t entries[INDEX_WRITE_BATCH];
    Py_ssize_t pending = t->unwritten_len;
    memcpy(entries, t->unwritten, (size_t)pending);
    t->unwritten_len = 0;
    if (pending == 0 || t->index_fd < 0)
        return;
    struct stat st;
    if (fstat(t->index_fd, &st) < 0) {
        int err = errno;
        log_error("could not write %d index entries to %s: %s",
                  Py_BuildValue("(nON)", pending / ENTRY_BYTES, t->index_path, error_text(err)));
        return;
    }
    if (write_all(t->index_fd, entries, pending) == 0)
        return;
    int err = errno;
    log_error("could not write %d index entries to %s: %s",
              Py_BuildValue("(nON)", pending / ENTRY_BYTES, t->index_path, error_text(err)));
    if (ftruncate(t->index_fd, st.st_size - st.st_size % ENTRY_BYTES) < 0) {
        err = errno;
        log_error("could not cut %s back to whole entries: %s", Py_BuildValue("(ON)", t->index_path, error_text(err)));
    }
}

static void put_u32(uint8_t *out, uint64_t v)
{
    out[0] = (uint8_t)v;
    out[1] = (uint8_t)(v >> 8);
    out[2] = (uint8_t)(v >> 16);
    out[3] = (uint8_t)(v >> 24);
}

/* -- the type ----------------------------------------------------------------------------------------------------- */

static int appender_init(Appender *t, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"path", "index_path", "log_fd", "index_fd", "base", "size", "last", "index",
                            "since_last_update", "created_ts", "roll_age_s", NULL};
    PyObject *path, *index_path, *base, *size, *last, *index, *since;
    int log_fd, index_fd;
    double created_ts, roll_age_s;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UUiiOOOOOdd", names, &path, &index_path, &log_fd, &index_fd,
                                     &base, &size, &last, &index, &since, &created_ts, &roll_age_s))
        return -1;
    Py_ssize_t entries = PyObject_Length(index);
    if (entries < 0)
        return -1;
    uint64_t base_v, size_v, last_v = 0, since_v;
    if (u64_of(base, "base", &base_v) < 0 || u64_of(size, "size", &size_v) < 0
        || (last != Py_None && u64_of(last, "last", &last_v) < 0) || u64_of(since, "since_last_update", &since_v) < 0)
        return -1;
    Py_XSETREF(t->path, Py_NewRef(path));
    Py_XSETREF(t->index_path, Py_NewRef(index_path));
    Py_XSETREF(t->index, Py_NewRef(index));
    t->log_fd = log_fd;
    t->index_fd = index_fd;
    t->base = base_v;
    t->size = size_v;
    t->has_last = last != Py_None;
    t->last = last_v;
    t->since_last_update = since_v;
    t->created_ts = created_ts;
    t->roll_age_s = roll_age_s;
    t->entries = (uint64_t)entries;
    t->has_ts = 0;
    t->ts_complete = size_v == 0;
    t->unwritten_len = 0;
    return 0;
}

static PyObject *appender_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Appender *t = (Appender *)type->tp_alloc(type, 0);
    if (t != NULL)
        t->log_fd = t->index_fd = -1; /* not 0: a appender never initialised must not write to stdin */
    return (PyObject *)t;
}

static void appender_dealloc(Appender *t)
{
    Py_XDECREF(t->path);
    Py_XDECREF(t->index_path);
    Py_XDECREF(t->index);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static int write_record(Appender *t, const Py_buffer *record_buf, uint64_t first, uint64_t last, uint64_t interval,
                        int has_ts, uint64_t min_ts, uint64_t max_ts, uint64_t *position_out);

PyDoc_STRVAR(append_doc,
"append(record, first_seq, last_seq, interval, min_ts, max_ts=0, /)\n--\n\n"
"Writes one record at the segment's end and returns its position; `min_ts` None: its timestamp bounds are not\n"
"known. As tiered.storage.appender.PySegmentAppender.append.");

static PyObject *appender_append(Appender *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 5 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "append takes (record, first_seq, last_seq, interval, min_ts, max_ts=0)");
        return NULL;
    }
    uint64_t first, last, interval, min_ts = 0, max_ts = 0;
    int has_ts = args[4] != Py_None;
    if (u64_of(args[1], "first_seq", &first) < 0 || u64_of(args[2], "last_seq", &last) < 0
        || u64_of(args[3], "interval", &interval) < 0 || (has_ts && u64_of(args[4], "min_ts", &min_ts) < 0)
        || (nargs == 6 && u64_of(args[5], "max_ts", &max_ts) < 0))
        return NULL;
    if (t->log_fd < 0 || t->index == NULL) {
        PyErr_SetString(PyExc_ValueError, "append to a closed segment appender");
        return NULL;
    }
    Py_buffer record;
    if (PyObject_GetBuffer(args[0], &record, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t position;
    int failed = write_record(t, &record, first, last, interval, has_ts, min_ts, max_ts, &position);
    PyBuffer_Release(&record);
    return failed ? NULL : PyLong_FromUnsignedLongLong(position);
}

/* `append` on C values: writes record[0:len] (held by the caller) and sets *position_out; 0, or -1 with an exception
 * set and nothing changed (but the index entries a failed index write could not write, as in the reference). */
static int write_record(Appender *t, const Py_buffer *record_buf, uint64_t first, uint64_t last, uint64_t interval,
                        int has_ts, uint64_t min_ts, uint64_t max_ts, uint64_t *position_out)
{
    const Py_buffer record = *record_buf;
    uint64_t position = t->size;
    /* position <= MAX_U32 (an earlier append checked it), so MAX_U32 - position does not wrap. */
    if (first < t->base || first - t->base > MAX_U32 || position > MAX_U32
        || (uint64_t)record.len > MAX_U32 - position) {
        PyErr_Format(PyExc_ValueError, "record %llu..%llu at %llu cannot be indexed in the segment based at %llu",
                     (unsigned long long)first, (unsigned long long)last, (unsigned long long)position,
                     (unsigned long long)t->base);
        return -1;
    }
    uint64_t rel_seq = first - t->base;
    if (write_all(t->log_fd, record.buf, record.len) < 0) {
        int err = errno;
        if (ftruncate(t->log_fd, (off_t)position) < 0) {
            int cut = errno;
            log_error("could not cut %s back to %d after a failed append: %s",
                      Py_BuildValue("(OKN)", t->path, (unsigned long long)position, error_text(cut)));
        }
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    uint64_t len = (uint64_t)record.len;
    t->size = position + len;
    t->last = last;
    t->has_last = 1;
    if (!has_ts)
        t->ts_complete = 0;
    else if (!t->has_ts) {
        t->ts_low = min_ts;
        t->ts_high = max_ts;
        t->has_ts = 1;
    } else {
        if (min_ts < t->ts_low)
            t->ts_low = min_ts;
        if (max_ts > t->ts_high)
            t->ts_high = max_ts;
    }
    if (t->since_last_update > interval) { /* TANK's rule: tiered.storage.index.should_index */
        PyObject *r = PyObject_CallMethod(t->index, "append", "KK", (unsigned long long)rel_seq,
                                          (unsigned long long)position);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        t->entries++;
        t->since_last_update = 0;
        put_u32(t->unwritten + t->unwritten_len, rel_seq);
        put_u32(t->unwritten + t->unwritten_len + 4, position);
        t->unwritten_len += ENTRY_BYTES;
        if (t->unwritten_len >= INDEX_WRITE_BATCH)
            write_entries(t);
    }
    t->since_last_update += len;
    *position_out = position;
    return 0;
}

/* appender.py's `takes`: whether the record first..last of record_len bytes goes into this segment, or into a new one
 * (TANK's should_roll, evaluated before an append, a seq that does not follow on in a plain bundle, and the u32
 * columns of the index). */
static int takes(const Appender *t, uint64_t first, uint64_t last, int sparse, uint64_t record_len, double now_s,
                 uint64_t segment_bytes, uint64_t index_max_bytes)
{
    if (t->has_last) {
        if (!sparse && first != t->last + 1)
            return 0;
        if (t->size != 0 && (t->size > segment_bytes || t->entries * ENTRY_BYTES > index_max_bytes
                             || now_s - t->created_ts > t->roll_age_s))
            return 0;
    }
    if (last >= t->base && last - t->base > MAX_REL_SEQ)
        return 0;
    return t->size <= MAX_U32 && record_len <= MAX_U32 - t->size;
}

/* The arguments of `takes` from args[0:7]: first, last, sparse, record_len, now_s, segment_bytes, index_max_bytes. */
static int takes_args(PyObject *const *args, uint64_t *first, uint64_t *last, int *sparse, uint64_t *record_len,
                      double *now_s, uint64_t *segment_bytes, uint64_t *index_max_bytes)
{
    if (u64_of(args[0], "first_seq", first) < 0 || u64_of(args[1], "last_seq", last) < 0
        || (*sparse = PyObject_IsTrue(args[2])) < 0 || u64_of(args[3], "record_len", record_len) < 0)
        return -1;
    *now_s = PyFloat_AsDouble(args[4]);
    if (*now_s == -1.0 && PyErr_Occurred())
        return -1;
    return u64_of(args[5], "segment_bytes", segment_bytes) < 0
                   || u64_of(args[6], "index_max_bytes", index_max_bytes) < 0
               ? -1 : 0;
}

PyDoc_STRVAR(takes_doc,
"takes(first_seq, last_seq, sparse, record_len, now_s, segment_bytes, index_max_bytes, /)\n--\n\n"
"Whether the record goes into this segment (False: the log rolls first). As PySegmentAppender.takes.");

static PyObject *appender_takes(Appender *t, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t first, last, record_len, segment_bytes, index_max_bytes;
    int sparse;
    double now_s;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "takes takes 7 arguments");
        return NULL;
    }
    if (takes_args(args, &first, &last, &sparse, &record_len, &now_s, &segment_bytes, &index_max_bytes) < 0)
        return NULL;
    return PyBool_FromLong(takes(t, first, last, sparse, record_len, now_s, segment_bytes, index_max_bytes));
}

PyDoc_STRVAR(append_in_place_doc,
"append_in_place(record, first_seq, last_seq, sparse, now_s, segment_bytes, index_max_bytes, interval, min_ts,\n"
"                max_ts, /)\n--\n\n"
"`append` when the segment holds a record and `takes` this one; else None, and nothing is written. As\n"
"PySegmentAppender.append_in_place: the produce path's one call per record.");

static PyObject *appender_append_in_place(Appender *t, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t first, last, record_len, segment_bytes, index_max_bytes;
    int sparse;
    double now_s;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "append_in_place takes 10 arguments");
        return NULL;
    }
    Py_ssize_t len = PyObject_Length(args[0]);
    if (len < 0)
        return NULL;
    PyObject *record_len_obj = PyLong_FromSsize_t(len);
    if (record_len_obj == NULL)
        return NULL;
    PyObject *takes_argv[7] = {args[1], args[2], args[3], record_len_obj, args[4], args[5], args[6]};
    int bad = takes_args(takes_argv, &first, &last, &sparse, &record_len, &now_s, &segment_bytes, &index_max_bytes);
    Py_DECREF(record_len_obj);
    if (bad < 0)
        return NULL;
    if (!t->has_last || !takes(t, first, last, sparse, record_len, now_s, segment_bytes, index_max_bytes))
        Py_RETURN_NONE;
    PyObject *append_argv[6] = {args[0], args[1], args[2], args[7], args[8], args[9]};
    return appender_append(t, append_argv, 6);
}

/* BundleFacts (tiered.protocol.bundle), a NamedTuple: the positions of the fields append_record reads. The bundle
 * scanner builds it by position too (_bundlescan.c); tests/storage/test_appender.py checks these against its _fields. */
#define FACTS_FIELDS 8
#define FACT_MESSAGES 1
#define FACT_SPARSE 2
#define FACT_FIRST_SEQ 3
#define FACT_LAST_SEQ 4
#define FACT_MIN_TS 6
#define FACT_MAX_TS 7

static PyObject *segment_bytes_name, *index_max_bytes_name, *interval_name; /* TopicConfig's fields, interned */

PyDoc_STRVAR(append_record_doc,
"append_record(record, first_seq, last_seq, facts, now_s, config, /)\n--\n\n"
"append_in_place with the bundle's BundleFacts (sparse, timestamp bounds) and the topic's TopicConfig (segment,\n"
"index and interval limits) read here: the partition log's one call per produced record. As\n"
"PySegmentAppender.append_record.");

static PyObject *appender_append_record(Appender *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "append_record takes (record, first_seq, last_seq, facts, now_s, config)");
        return NULL;
    }
    PyObject *facts = args[3], *config = args[5];
    if (!PyTuple_Check(facts) || PyTuple_GET_SIZE(facts) != FACTS_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "facts must be a BundleFacts");
        return NULL;
    }
    PyObject *limits[3] = {NULL, NULL, NULL};
    PyObject *names[3] = {segment_bytes_name, index_max_bytes_name, interval_name};
    PyObject *result = NULL;
    int have_limits = 1;
    for (int i = 0; i < 3 && have_limits; i++)
        have_limits = (limits[i] = PyObject_GetAttr(config, names[i])) != NULL;
    if (have_limits) {
        PyObject *argv[10] = {args[0], args[1], args[2], PyTuple_GET_ITEM(facts, FACT_SPARSE), args[4],
                              limits[0], limits[1], limits[2], PyTuple_GET_ITEM(facts, FACT_MIN_TS),
                              PyTuple_GET_ITEM(facts, FACT_MAX_TS)};
        result = appender_append_in_place(t, argv, 10);
    }
    for (int i = 0; i < 3; i++)
        Py_XDECREF(limits[i]);
    return result;
}

/* AppendResult (tiered.storage.appender), a NamedTuple of 7 fields, registered by appender.py at import: append_next
 * builds one by position, as appender.py's append_result does. */
#define RESULT_FIELDS 7
static PyTypeObject *ResultType;
#define MAX_SEQ 0x7FFFFFFFFFFFFFFFULL /* tiered.storage.appender.MAX_SEQ */

PyDoc_STRVAR(register_doc,
"register(append_result, /)\n--\n\n"
"The AppendResult class (a tuple subclass of 7 fields) append_next builds.");

static PyObject *register_result(PyObject *module, PyObject *cls)
{
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "register takes the AppendResult class, a tuple subclass");
        return NULL;
    }
    Py_XSETREF(ResultType, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* appender.py's next_seqs and seqs_valid: 1 and the seqs of a valid record, 0 when the log's own path must decide
 * (it refuses them), -1 with an exception set. Sums cannot wrap: `first` is at most MAX_SEQ + 1 before the checks
 * below it, and `messages - 1` is compared with MAX_SEQ - first before it is added. */
static int next_seqs(PyObject *facts, PyObject *base_seq, uint64_t last_assigned, uint64_t *first, uint64_t *last)
{
    PyObject *fs = PyTuple_GET_ITEM(facts, FACT_FIRST_SEQ), *ls = PyTuple_GET_ITEM(facts, FACT_LAST_SEQ);
    int is_explicit = 1;
    if (fs != Py_None && ls != Py_None) {
        if (u64_of(fs, "first_seq", first) < 0 || u64_of(ls, "last_seq", last) < 0)
            return -1;
    } else {
        uint64_t messages;
        if (u64_of(PyTuple_GET_ITEM(facts, FACT_MESSAGES), "messages", &messages) < 0)
            return -1;
        if (base_seq != Py_None) {
            if (!PyLong_Check(base_seq)) {
                PyErr_SetString(PyExc_TypeError, "base_seq must be an int or None");
                return -1;
            }
            int overflow;
            long long base = PyLong_AsLongLongAndOverflow(base_seq, &overflow);
            if (base == -1 && PyErr_Occurred())
                return -1;
            if (overflow != 0 || base < 1)
                return 0; /* past 63 bits, or not a seq: refused by the log's path */
            *first = (uint64_t)base;
        } else {
            is_explicit = 0;
            if (last_assigned >= MAX_SEQ)
                return 0;
            *first = last_assigned + 1;
        }
        if (messages == 0 || messages - 1 > MAX_SEQ - *first)
            return 0; /* last < first, or past MAX_SEQ */
        *last = *first + messages - 1;
    }
    if ((is_explicit && *first <= last_assigned) || *first < 1 || *last < *first || *last > MAX_SEQ)
        return 0;
    return 1;
}

PyDoc_STRVAR(append_next_doc,
"append_next(record, facts, base_seq, last_assigned, now_s, config, /)\n--\n\n"
"The seqs assigned after `last_assigned` and append_record, in one call: the AppendResult, or None (nothing\n"
"written; the partition log's own path decides). As PySegmentAppender.append_next.");

static PyObject *appender_append_next(Appender *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "append_next takes (record, facts, base_seq, last_assigned, now_s, config)");
        return NULL;
    }
    if (ResultType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "append_next before AppendResult is registered");
        return NULL;
    }
    PyObject *record_obj = args[0], *facts = args[1], *config = args[5];
    if (!PyTuple_Check(facts) || PyTuple_GET_SIZE(facts) != FACTS_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "facts must be a BundleFacts");
        return NULL;
    }
    uint64_t last_assigned, first = 0, last = 0;
    if (u64_of(args[3], "last_assigned", &last_assigned) < 0)
        return NULL;
    double now_s = PyFloat_AsDouble(args[4]);
    if (now_s == -1.0 && PyErr_Occurred())
        return NULL;
    int valid = next_seqs(facts, args[2], last_assigned, &first, &last);
    if (valid < 0)
        return NULL;
    if (!valid || !t->has_last)
        Py_RETURN_NONE;
    uint64_t limit[3]; /* segment bytes, index bytes, index interval */
    PyObject *names[3] = {segment_bytes_name, index_max_bytes_name, interval_name};
    for (int i = 0; i < 3; i++) {
        PyObject *value = PyObject_GetAttr(config, names[i]);
        int bad = value == NULL || u64_of(value, "a config limit", &limit[i]) < 0;
        Py_XDECREF(value);
        if (bad)
            return NULL;
    }
    int sparse = PyObject_IsTrue(PyTuple_GET_ITEM(facts, FACT_SPARSE));
    if (sparse < 0)
        return NULL;
    PyObject *min_obj = PyTuple_GET_ITEM(facts, FACT_MIN_TS), *max_obj = PyTuple_GET_ITEM(facts, FACT_MAX_TS);
    uint64_t min_ts = 0, max_ts = 0;
    int has_ts = min_obj != Py_None;
    if ((has_ts && u64_of(min_obj, "min_ts", &min_ts) < 0) || u64_of(max_obj, "max_ts", &max_ts) < 0)
        return NULL;
    if (t->log_fd < 0 || t->index == NULL) {
        PyErr_SetString(PyExc_ValueError, "append to a closed segment appender");
        return NULL;
    }
    Py_buffer record;
    if (PyObject_GetBuffer(record_obj, &record, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t position;
    if (!takes(t, first, last, sparse, (uint64_t)record.len, now_s, limit[0], limit[1])) {
        PyBuffer_Release(&record);
        Py_RETURN_NONE;
    }
    int failed = write_record(t, &record, first, last, limit[2], has_ts, min_ts, max_ts, &position);
    uint64_t end = position + (uint64_t)record.len;
    PyBuffer_Release(&record);
    if (failed)
        return NULL;
    PyObject *result = ResultType->tp_alloc(ResultType, RESULT_FIELDS);
    if (result == NULL)
        return NULL;
    PyObject *items[RESULT_FIELDS] = {PyLong_FromUnsignedLongLong(first), PyLong_FromUnsignedLongLong(last),
                                      PyLong_FromUnsignedLongLong(t->base), PyLong_FromUnsignedLongLong(position),
                                      PyLong_FromUnsignedLongLong(end), Py_NewRef(record_obj), Py_NewRef(facts)};
    int missing = 0;
    for (int i = 0; i < RESULT_FIELDS; i++) {
        missing |= items[i] == NULL;
        PyTuple_SET_ITEM(result, i, items[i]); /* a NULL item is left NULL: tuple dealloc skips it */
    }
    if (missing) {
        Py_DECREF(result);
        return NULL; /* the record is written and indexed, as after a failed AppendResult in the reference */
    }
    return result;
}

/* -- the partition log's append ----------------------------------------------------------------------------------- */

/* The base of partition_log.py's PartitionLog when this module is built: the fields its append reads and writes,
 * held in C so that log_append reaches them without a lookup each. The log owns every one (Python reads and writes
 * them as attributes, under the same names); log_append keeps nothing. */
typedef struct {
    PyObject_HEAD
    PyObject *lock, *closed, *now_s, *config, *active, *last_assigned, *next_flush_s;
} LogCore;

static int core_traverse(LogCore *l, visitproc visit, void *arg)
{
    Py_VISIT(l->lock);
    Py_VISIT(l->closed);
    Py_VISIT(l->now_s);
    Py_VISIT(l->config);
    Py_VISIT(l->active);
    Py_VISIT(l->last_assigned);
    Py_VISIT(l->next_flush_s);
    return 0;
}

static int core_clear(LogCore *l)
{
    Py_CLEAR(l->lock);
    Py_CLEAR(l->closed);
    Py_CLEAR(l->now_s);
    Py_CLEAR(l->config);
    Py_CLEAR(l->active);
    Py_CLEAR(l->last_assigned);
    Py_CLEAR(l->next_flush_s);
    return 0;
}

static void core_dealloc(LogCore *l)
{
    PyObject_GC_UnTrack(l);
    core_clear(l);
    Py_TYPE(l)->tp_free((PyObject *)l);
}

#define CORE_MEMBER(name, field) {name, T_OBJECT_EX, offsetof(LogCore, field), 0, NULL}
static PyMemberDef core_members[] = {
    CORE_MEMBER("_lock", lock), CORE_MEMBER("_closed", closed), CORE_MEMBER("_now_s", now_s),
    CORE_MEMBER("config", config), CORE_MEMBER("_active", active), CORE_MEMBER("_last_assigned", last_assigned),
    CORE_MEMBER("_next_flush_s", next_flush_s),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LogCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tiered.storage._appender.LogCore",
    .tp_basicsize = sizeof(LogCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields of a partition log its append reads and writes (partition_log.PartitionLog's base).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_members = core_members,
};

static PyObject *append_next_name, *flush_messages_name, *count_for_flush_name, *log_append_name, *acquire_name,
    *release_name; /* interned */

/* lock.release(), keeping the exception being raised, if any; -1 when the release itself failed. */
static int release_lock(PyObject *lock)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *got = PyObject_CallMethodNoArgs(lock, release_name);
    if (got == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return -1;
    }
    Py_DECREF(got);
    PyErr_Restore(type, value, traceback);
    return 0;
}

/* PartitionLog.append's common case under the log's lock: the AppendResult, None when the log's own path must decide
 * (nothing written), or NULL with an exception set. */
static PyObject *append_locked(LogCore *l, PyObject *record, PyObject *facts, PyObject *base_seq)
{
    if (l->closed == NULL || l->now_s == NULL || l->config == NULL || l->active == NULL || l->last_assigned == NULL
        || l->next_flush_s == NULL)
        return Py_NewRef(Py_None); /* not set up as __init__ sets it up: the log's path */
    int is_closed = PyObject_IsTrue(l->closed);
    if (is_closed != 0 || l->active == Py_None)
        return is_closed < 0 ? NULL : Py_NewRef(Py_None); /* closed (the log's path raises), or no segment yet */
    PyObject *now = PyObject_CallNoArgs(l->now_s), *config = Py_NewRef(l->config), *active = Py_NewRef(l->active);
    PyObject *append_next = NULL, *appended = NULL, *flush = NULL;
    if (now == NULL || (append_next = PyObject_GetAttr(active, append_next_name)) == NULL)
        goto done;
    PyObject *argv[6] = {record, facts, base_seq, l->last_assigned, now, config};
    appended = PyObject_Vectorcall(append_next, argv, 6, NULL);
    if (appended == NULL || appended == Py_None)
        goto done;
    if (!PyTuple_Check(appended) || PyTuple_GET_SIZE(appended) != RESULT_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "append_next must answer an AppendResult");
        Py_CLEAR(appended);
        goto done;
    }
    /* Written: the log keeps the last seq assigned (its one owner), then counts the record for a flush when the topic
     * asks for one. */
    Py_XSETREF(l->last_assigned, Py_NewRef(PyTuple_GET_ITEM(appended, 1)));
    int by_count = -1;
    if ((flush = PyObject_GetAttr(config, flush_messages_name)) == NULL || (by_count = PyObject_IsTrue(flush)) < 0) {
        Py_CLEAR(appended);
        goto done;
    }
    if (by_count || (l->next_flush_s != NULL && l->next_flush_s != Py_None)) {
        PyObject *counted = PyObject_CallMethodObjArgs((PyObject *)l, count_for_flush_name,
                                                       PyTuple_GET_ITEM(facts, FACT_MESSAGES), now, NULL);
        if (counted == NULL)
            Py_CLEAR(appended);
        Py_XDECREF(counted);
    }
done:
    Py_XDECREF(now);
    Py_DECREF(config);
    Py_DECREF(active);
    Py_XDECREF(append_next);
    Py_XDECREF(flush);
    return appended;
}

PyDoc_STRVAR(log_append_doc,
"log_append(log, bundle, base_seq, facts, record, /)\n--\n\n"
"PartitionLog.append(bundle, base_seq, facts, record) in one native call for its common case (a record laid out in\n"
"the request, an open log whose active segment takes it: the seqs assigned after the log's last_assigned by\n"
"append_next, which the log then keeps), on the fields of its LogCore; the rest, and the reference, is the method.");

static PyObject *log_append(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "log_append takes (log, bundle, base_seq, facts, record)");
        return NULL;
    }
    PyObject *log = args[0], *base_seq = args[2], *facts = args[3], *record = args[4];
    PyObject *appended = Py_NewRef(Py_None);
    if (PyObject_TypeCheck(log, &LogCoreType) && record != Py_None && PyTuple_Check(facts)
        && PyTuple_GET_SIZE(facts) == FACTS_FIELDS && ((LogCore *)log)->lock != NULL) {
        LogCore *l = (LogCore *)log;
        PyObject *lock = Py_NewRef(l->lock);
        Py_INCREF(log); /* held: append_next and the flush run Python code */
        PyObject *got = PyObject_CallMethodNoArgs(lock, acquire_name);
        if (got != NULL) {
            Py_DECREF(got);
            Py_SETREF(appended, append_locked(l, record, facts, base_seq));
            if (release_lock(lock) < 0)
                Py_CLEAR(appended);
        } else
            Py_CLEAR(appended);
        Py_DECREF(lock);
        Py_DECREF(log);
        if (appended == NULL)
            return NULL;
    }
    if (appended != Py_None)
        return appended;
    Py_DECREF(appended);
    /* Not the common case (nothing was written): the log's own path, the reference, decides. */
    PyObject *argv[5] = {log, args[1], base_seq, facts, record};
    return PyObject_VectorcallMethod(log_append_name, argv, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyObject *appender_write_entries(Appender *t, PyObject *unused)
{
    write_entries(t);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *appender_close(Appender *t, PyObject *unused)
{
    write_entries(t);
    int fds[2] = {t->log_fd, t->index_fd};
    t->log_fd = t->index_fd = -1;
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0 && close(fds[i]) < 0 && errno != EINTR)
            return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *get_last(Appender *t, void *unused)
{
    if (!t->has_last)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(t->last);
}

static PyObject *get_ts_bounds(Appender *t, void *unused)
{
    if (!t->ts_complete || !t->has_ts)
        Py_RETURN_NONE;
    return Py_BuildValue("(KK)", (unsigned long long)t->ts_low, (unsigned long long)t->ts_high);
}

static PyObject *get_unwritten(Appender *t, void *unused)
{
    return PyByteArray_FromStringAndSize((const char *)t->unwritten, t->unwritten_len);
}

#define U64_GETTER(field)                                                                                        \
    static PyObject *get_##field(Appender *t, void *unused) { return PyLong_FromUnsignedLongLong(t->field); }
U64_GETTER(base)
U64_GETTER(size)
U64_GETTER(since_last_update)

static PyObject *get_log_fd(Appender *t, void *unused) { return PyLong_FromLong(t->log_fd); }
static PyObject *get_index_fd(Appender *t, void *unused) { return PyLong_FromLong(t->index_fd); }
static PyObject *get_ts_complete(Appender *t, void *unused) { return PyBool_FromLong(t->ts_complete); }
static PyObject *or_none(PyObject *obj) { return Py_NewRef(obj != NULL ? obj : Py_None); }
static PyObject *get_index(Appender *t, void *unused) { return or_none(t->index); }
static PyObject *get_path(Appender *t, void *unused) { return or_none(t->path); }
static PyObject *get_index_path(Appender *t, void *unused) { return or_none(t->index_path); }

static PyGetSetDef appender_getset[] = {
    {"path", (getter)get_path, NULL, "the segment file's path", NULL},
    {"index_path", (getter)get_index_path, NULL, "the index file's path", NULL},
    {"log_fd", (getter)get_log_fd, NULL, "the segment file, open for appends (-1: closed)", NULL},
    {"index_fd", (getter)get_index_fd, NULL, "the index file, open for appends (-1: closed)", NULL},
    {"base", (getter)get_base, NULL, "the segment's base seq", NULL},
    {"size", (getter)get_size, NULL, "bytes in the segment file", NULL},
    {"last", (getter)get_last, NULL, "the last seq written, or None", NULL},
    {"index", (getter)get_index, NULL, "the in-memory SparseIndex", NULL},
    {"since_last_update", (getter)get_since_last_update, NULL, "TANK's bytes since the last indexed record", NULL},
    {"ts_bounds", (getter)get_ts_bounds, NULL, "(min, max) timestamp of every record, or None", NULL},
    {"ts_complete", (getter)get_ts_complete, NULL, "whether every record's bounds are known", NULL},
    {"unwritten", (getter)get_unwritten, NULL, "a copy of the index entries not yet in the index file", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef appender_methods[] = {
    {"append", (PyCFunction)(void (*)(void))appender_append, METH_FASTCALL, append_doc},
    {"takes", (PyCFunction)(void (*)(void))appender_takes, METH_FASTCALL, takes_doc},
    {"append_in_place", (PyCFunction)(void (*)(void))appender_append_in_place, METH_FASTCALL, append_in_place_doc},
    {"append_record", (PyCFunction)(void (*)(void))appender_append_record, METH_FASTCALL, append_record_doc},
    {"append_next", (PyCFunction)(void (*)(void))appender_append_next, METH_FASTCALL, append_next_doc},
    {"write_entries", (PyCFunction)appender_write_entries, METH_NOARGS, "writes the index entries the file lacks"},
    {"close", (PyCFunction)appender_close, METH_NOARGS, "writes the pending entries and closes both files"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TailType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tiered.storage._appender.SegmentAppender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SegmentAppender(path, index_path, log_fd, index_fd, base, size, last, index, since_last_update, "
              "created_ts, roll_age_s): the native appender of an active segment (tiered/storage/appender.py).",
    .tp_new = appender_new,
    .tp_init = (initproc)appender_init,
    .tp_dealloc = (destructor)appender_dealloc,
    .tp_methods = appender_methods,
    .tp_getset = appender_getset,
};

static PyMethodDef module_methods[] = {
    {"register", register_result, METH_O, register_doc},
    {"log_append", (PyCFunction)(void (*)(void))log_append, METH_FASTCALL, log_append_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tiered.storage._appender", "The native appender of an active segment (see _appender.c).",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__appender(void)
{
    if (PyType_Ready(&TailType) < 0)
        return NULL;
    if ((segment_bytes_name = PyUnicode_InternFromString("log_segment_bytes")) == NULL
        || (index_max_bytes_name = PyUnicode_InternFromString("log_index_size_max_bytes")) == NULL
        || (interval_name = PyUnicode_InternFromString("log_index_interval_bytes")) == NULL)
        return NULL;
    if (PyType_Ready(&LogCoreType) < 0)
        return NULL;
    PyObject **names[] = {&append_next_name, &flush_messages_name, &count_for_flush_name, &log_append_name,
                          &acquire_name, &release_name};
    const char *texts[] = {"append_next", "flush_messages", "_count_for_flush", "append", "acquire", "release"};
    for (int i = 0; i < 6; i++)
        if ((*names[i] = PyUnicode_InternFromString(texts[i])) == NULL)
            return NULL;
    PyObject *logging = PyImport_ImportModule("logging");
    if (logging == NULL)
        return NULL;
    logger = PyObject_CallMethod(logging, "getLogger", "s", "tiered.storage");
    Py_DECREF(logging);
    if (logger == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "SegmentAppender", (PyObject *)&TailType) < 0
        || PyModule_AddObjectRef(m, "LogCore", (PyObject *)&LogCoreType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
