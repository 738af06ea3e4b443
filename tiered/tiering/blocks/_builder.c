/* tiered.tiering.blocks._builder: a pending run's fields in a C struct, and the block builder's one call per record.
 *
 * `Run` is the base of block_builder.py's PendingRun when this module is built: the same fields (Python reads and
 * writes them as attributes), held as C values, so that `add_to_run`, the common case of BlockBuilder.add, updates
 * them without an attribute lookup each. `add_to_run` is the native twin of block_builder.py's `_add_to_run_py`,
 * which stays the reference: tests add the same records through both and compare every run and the builder's next
 * seqs (tests/tiering/test_block_builder.py). It takes a record of a partition led by the builder that follows its
 * last, with the append path's facts in range, into the partition's open run (same segment); anything else answers
 * None and changes nothing, and the Python path decides (refuses, opens a run, reads the record's facts itself).
 *
 * State: a Run's fields, owned by the builder that made the run. `add_to_run` keeps nothing: it changes the builder's
 * own objects (the partition's next seq in `next_from`, the open run). Sizes, counts and seqs are u64 and every sum
 * is checked against SUM_LIMIT (or the u64 range) before it is made.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include "structmember.h"

/* BundleFacts (tiered.protocol.bundle), a NamedTuple: the positions of the fields read here (the tests check them). */
#define FACTS_FIELDS 8
#define FACT_MESSAGES 1
#define FACT_MIN_TS 6
#define FACT_MAX_TS 7
#define MAX_RECORDED_TS_MS 0x7FFFFFFFFFFFFFFFULL /* block_builder.MAX_RECORDED_TS_MS */
#define SUM_LIMIT (1ULL << 62) /* sizes and counts below this are summed here: two of them cannot wrap */

/* -- Run ----------------------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *topic;   /* str */
    PyObject *records; /* list: the records, as AppendResult.record (bytes or read-only views) */
    PyObject *index;   /* list of (first seq, position in the run) */
    long long partition, leader_epoch;
    unsigned long long segment_base, from_seq, first_seq, last_seq, messages, min_ts_ms, max_ts_ms, size_bytes,
        indexed_at;
} Run;

static int run_init(Run *r, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"topic", "partition", "leader_epoch", "segment_base", "from_seq", "first_seq", "last_seq",
                            "records", "messages", "min_ts_ms", "max_ts_ms", "size_bytes", "index", "indexed_at",
                            NULL};
    PyObject *topic, *records = NULL, *index = NULL;
    long long partition, epoch;
    PyObject *u[9] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL}; /* the u64 fields, in `names` order */
    unsigned long long v[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ULLO!O!O!O!|O!O!O!O!O!O!O!", names, &topic, &partition, &epoch,
                                     &PyLong_Type, &u[0], &PyLong_Type, &u[1], &PyLong_Type, &u[2], &PyLong_Type,
                                     &u[3], &PyList_Type, &records, &PyLong_Type, &u[4], &PyLong_Type, &u[5],
                                     &PyLong_Type, &u[6], &PyLong_Type, &u[7], &PyList_Type, &index, &PyLong_Type,
                                     &u[8]))
        return -1;
    for (int i = 0; i < 9; i++)
        if (u[i] != NULL && (v[i] = PyLong_AsUnsignedLongLong(u[i])) == (unsigned long long)-1 && PyErr_Occurred())
            return -1; /* negative, or past 64 bits: OverflowError */
    unsigned long long base = v[0], from_seq = v[1], first = v[2], last = v[3], messages = v[4], low = v[5],
                       high = v[6], size = v[7], indexed_at = v[8];
    PyObject *new_records = records != NULL ? Py_NewRef(records) : PyList_New(0);
    PyObject *new_index = new_records == NULL ? NULL : index != NULL ? Py_NewRef(index) : PyList_New(0);
    if (new_index == NULL) {
        Py_XDECREF(new_records);
        return -1;
    }
    Py_XSETREF(r->topic, Py_NewRef(topic));
    Py_XSETREF(r->records, new_records);
    Py_XSETREF(r->index, new_index);
    r->partition = partition;
    r->leader_epoch = epoch;
    r->segment_base = base;
    r->from_seq = from_seq;
    r->first_seq = first;
    r->last_seq = last;
    r->messages = messages;
    r->min_ts_ms = low;
    r->max_ts_ms = high;
    r->size_bytes = size;
    r->indexed_at = indexed_at;
    return 0;
}

static int run_traverse(Run *r, visitproc visit, void *arg)
{
    Py_VISIT(r->topic);
    Py_VISIT(r->records);
    Py_VISIT(r->index);
    return 0;
}

static int run_clear(Run *r)
{
    Py_CLEAR(r->topic);
    Py_CLEAR(r->records);
    Py_CLEAR(r->index);
    return 0;
}

static void run_dealloc(Run *r)
{
    PyObject_GC_UnTrack(r);
    run_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

#define U64_MEMBER(name) {#name, T_ULONGLONG, offsetof(Run, name), 0, NULL}
static PyMemberDef run_members[] = {
    {"topic", T_OBJECT_EX, offsetof(Run, topic), 0, NULL},
    {"records", T_OBJECT_EX, offsetof(Run, records), 0, NULL},
    {"index", T_OBJECT_EX, offsetof(Run, index), 0, NULL},
    {"partition", T_LONGLONG, offsetof(Run, partition), 0, NULL},
    {"leader_epoch", T_LONGLONG, offsetof(Run, leader_epoch), 0, NULL},
    U64_MEMBER(segment_base), U64_MEMBER(from_seq), U64_MEMBER(first_seq), U64_MEMBER(last_seq),
    U64_MEMBER(messages), U64_MEMBER(min_ts_ms), U64_MEMBER(max_ts_ms), U64_MEMBER(size_bytes),
    U64_MEMBER(indexed_at),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RunType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tiered.tiering.blocks._builder.Run",
    .tp_basicsize = sizeof(Run),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Run(topic, partition, leader_epoch, segment_base, from_seq, first_seq, last_seq, records=[], "
              "messages=0, min_ts_ms=0, max_ts_ms=0, size_bytes=0, index=[], indexed_at=0): the fields of a "
              "pending run (block_builder.PendingRun).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)run_init,
    .tp_dealloc = (destructor)run_dealloc,
    .tp_traverse = (traverseproc)run_traverse,
    .tp_clear = (inquiry)run_clear,
    .tp_members = run_members,
};

/* -- add_to_run ---------------------------------------------------------------------------------------------------- */

/* A u64 from an int: 1, 0 when `obj` is not an int that fits (the caller answers None), -1 with an exception set. */
static int u64_of(PyObject *obj, uint64_t *out)
{
    if (!PyLong_Check(obj))
        return 0;
    /* Most values fit a signed 64-bit integer, which CPython reads without its byte-array conversion (what
     * PyLong_AsUnsignedLongLong always takes): that one only for the values past it, or below 0 (its error). */
    int overflow;
    long long small = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (small == -1 && overflow == 0 && PyErr_Occurred())
        return -1;
    if (overflow == 0 && small >= 0) {
        *out = (uint64_t)small;
        return 1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

PyDoc_STRVAR(add_to_run_doc,
"add_to_run(runs, next_from, key, first_seq, last_seq, record, segment_base, facts, index_every, /)\n--\n\n"
"block_builder.py's `_add_to_run_py`, natively: the record added to the partition's open run, and the record's size;\n"
"None when this is not the common case (nothing changed).");

static PyObject *add_to_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "add_to_run takes (runs, next_from, key, first_seq, last_seq, record, "
                                         "segment_base, facts, index_every)");
        return NULL;
    }
    PyObject *runs = args[0], *next_from = args[1], *key = args[2], *record = args[5], *facts = args[7];
    if (!PyDict_Check(runs) || !PyDict_Check(next_from)) {
        PyErr_SetString(PyExc_TypeError, "runs and next_from must be dicts");
        return NULL;
    }
    uint64_t first, last, base, index_every, next, messages, low, high;
    int got = 1;
    if ((got = u64_of(args[3], &first)) <= 0 || (got = u64_of(args[4], &last)) <= 0
        || (got = u64_of(args[6], &base)) <= 0 || (got = u64_of(args[8], &index_every)) <= 0)
        goto not_common;
    if (!PyTuple_Check(facts) || PyTuple_GET_SIZE(facts) != FACTS_FIELDS)
        Py_RETURN_NONE; /* no facts (a record read back from disk): the Python path reads them */
    if ((got = u64_of(PyTuple_GET_ITEM(facts, FACT_MESSAGES), &messages)) <= 0
        || (got = u64_of(PyTuple_GET_ITEM(facts, FACT_MIN_TS), &low)) <= 0
        || (got = u64_of(PyTuple_GET_ITEM(facts, FACT_MAX_TS), &high)) <= 0)
        goto not_common;
    if (high > MAX_RECORDED_TS_MS || last == UINT64_MAX || messages >= SUM_LIMIT)
        Py_RETURN_NONE; /* recorded bounds clamped, a next seq past 64 bits, a count out of range: the Python path */
    PyObject *next_obj = PyDict_GetItemWithError(next_from, key); /* borrowed */
    if (next_obj == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE; /* not led by the builder: the Python path refuses it */
    }
    if ((got = u64_of(next_obj, &next)) <= 0)
        goto not_common;
    if (first < next)
        Py_RETURN_NONE; /* does not follow: refused there */
    PyObject *partition_runs = PyDict_GetItemWithError(runs, key); /* borrowed */
    if (partition_runs == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE; /* the partition's first record of this block: the Python path opens its run */
    }
    if (!PyList_Check(partition_runs) || PyList_GET_SIZE(partition_runs) == 0)
        Py_RETURN_NONE;
    PyObject *last_run = PyList_GET_ITEM(partition_runs, PyList_GET_SIZE(partition_runs) - 1); /* borrowed */
    if (!PyObject_TypeCheck(last_run, &RunType))
        Py_RETURN_NONE;
    Run *run = (Run *)last_run;
    if (run->segment_base != base || !PyList_Check(run->records) || !PyList_Check(run->index)
        || run->indexed_at > run->size_bytes || run->size_bytes >= SUM_LIMIT || run->messages >= SUM_LIMIT)
        Py_RETURN_NONE; /* another segment (a new run), or fields not as a run holds them */
    Py_ssize_t size = PyObject_Length(record);
    if (size < 0)
        return NULL;
    if ((uint64_t)size >= SUM_LIMIT)
        Py_RETURN_NONE;
    /* The objects to store are made before anything changes; the list and dict growth below fails only out of
     * memory, as the reference's `append` would. */
    PyObject *following = PyLong_FromUnsignedLongLong(last + 1), *entry = NULL, *result = PyLong_FromSsize_t(size);
    int indexed = run->size_bytes - run->indexed_at >= index_every;
    if (following == NULL || result == NULL
        || (indexed && (entry = Py_BuildValue("(KK)", (unsigned long long)first, run->size_bytes)) == NULL))
        goto failed;
    Py_INCREF(run); /* held: the list and dict operations below may run Python code (a key's __eq__) */
    if (PyList_Append(run->records, record) < 0 || (indexed && PyList_Append(run->index, entry) < 0)
        || PyDict_SetItem(next_from, key, following) < 0) {
        Py_DECREF(run);
        goto failed;
    }
    if (indexed)
        run->indexed_at = run->size_bytes;
    run->last_seq = last;
    run->messages += messages;
    if (low < run->min_ts_ms)
        run->min_ts_ms = low;
    if (high > run->max_ts_ms)
        run->max_ts_ms = high;
    run->size_bytes += (uint64_t)size;
    Py_DECREF(run);
    Py_XDECREF(entry);
    Py_DECREF(following);
    return result;
failed:
    Py_XDECREF(following);
    Py_XDECREF(entry);
    Py_XDECREF(result);
    return NULL;
not_common:
    if (got < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* -- Builder ------------------------------------------------------------------------------------------------------- */

/* The base of block_builder.py's BlockBuilder when this module is built: the builder's state the produce path changes
 * per record, held in C so that `add` reaches it without a lookup each. The builder owns every field (Python reads
 * and writes them as attributes, under the same names as before). */
typedef struct {
    PyObject_HEAD
    PyObject *state;       /* the TierState: whether, and under which epoch, a partition is led here */
    PyObject *led;         /* _led_epochs: the state's own dict of them (TierState.led_epochs_held), read per record */
    PyObject *runs;        /* _runs: dict, partition -> its pending runs (list) */
    PyObject *next_from;   /* _next_from: dict, partition -> its next run's from_seq */
    PyObject *acks;        /* _acks: list of (partition, future) */
    PyObject *opened_ms;   /* _opened_ms: when the oldest pending record arrived, or None */
    PyObject *add_to_run;  /* _add_to_run: the implementation of add's common case (add_to_run_for) */
    long long pending_bytes, max_bytes, index_every; /* bytes pending and the block's size limit; the index step */
} Builder;

static PyObject *add_py_name, *add_name; /* interned */
static PyObject *add_to_run_function; /* this module's add_to_run: `add` takes its common case itself when chosen */

static int builder_traverse(Builder *b, visitproc visit, void *arg)
{
    Py_VISIT(b->state);
    Py_VISIT(b->led);
    Py_VISIT(b->runs);
    Py_VISIT(b->next_from);
    Py_VISIT(b->acks);
    Py_VISIT(b->opened_ms);
    Py_VISIT(b->add_to_run);
    return 0;
}

static int builder_clear(Builder *b)
{
    Py_CLEAR(b->state);
    Py_CLEAR(b->led);
    Py_CLEAR(b->runs);
    Py_CLEAR(b->next_from);
    Py_CLEAR(b->acks);
    Py_CLEAR(b->opened_ms);
    Py_CLEAR(b->add_to_run);
    return 0;
}

static void builder_dealloc(Builder *b)
{
    PyObject_GC_UnTrack(b);
    builder_clear(b);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

/* BlockBuilder.add on C values: `now_ms` the time, or NULL and `now_fn()` called for it only when the record opens
 * the pending block (the time is read for nothing else). True when it opened the block, or NULL with an exception. */
static PyObject *add_core(Builder *b, PyObject *key, PyObject *first_seq, PyObject *last_seq, PyObject *record,
                          PyObject *segment_base, PyObject *now_ms, PyObject *now_fn, PyObject *ack, PyObject *facts)
{
    if (b->add_to_run != add_to_run_function || b->led == NULL || !PyDict_Check(b->led) || b->runs == NULL
        || b->next_from == NULL || b->acks == NULL || !PyList_Check(b->acks)) {
        /* The reference add (TIERED_PRODUCE_PATH=python, or a builder not set up as __init__ sets it up). */
        PyObject *now = now_ms != NULL ? Py_NewRef(now_ms) : PyObject_CallNoArgs(now_fn);
        if (now == NULL)
            return NULL;
        PyObject *argv[9] = {(PyObject *)b, key, first_seq, last_seq, record, segment_base, now, ack, facts};
        PyObject *got = PyObject_VectorcallMethod(add_py_name, argv, 9 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(now);
        return got;
    }
    /* TierState.epoch_of(key), read from the state's own dict (a call into Python from here would cost more than
     * all of the rest). */
    PyObject *epoch = PyDict_GetItemWithError(b->led, key);
    if (epoch == NULL && PyErr_Occurred())
        return NULL;
    epoch = Py_NewRef(epoch != NULL ? epoch : Py_None);
    PyObject *size_obj = Py_NewRef(Py_None);
    Py_INCREF(b); /* held: the calls below may run Python code */
    if (epoch != Py_None) {
        PyObject *index_every = PyLong_FromLongLong(b->index_every);
        if (index_every == NULL)
            goto failed;
        PyObject *argv[9] = {b->runs, b->next_from, key, first_seq, last_seq, record, segment_base, facts,
                             index_every};
        Py_SETREF(size_obj, add_to_run(NULL, argv, 9));
        Py_DECREF(index_every);
        if (size_obj == NULL)
            goto failed;
    }
    if (size_obj == Py_None) { /* the first record of a run, a refusal, facts to read: the Python path */
        PyObject *argv[8] = {(PyObject *)b, key, first_seq, last_seq, record, segment_base, epoch, facts};
        Py_SETREF(size_obj, PyObject_VectorcallMethod(add_name, argv, 8 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL));
        if (size_obj == NULL)
            goto failed;
    }
    long long size = PyLong_AsLongLong(size_obj);
    if (size == -1 && PyErr_Occurred())
        goto failed;
    if (size < 0 || size > (1LL << 62) || b->pending_bytes > (1LL << 62)) {
        PyErr_SetString(PyExc_ValueError, "a record's size out of range");
        goto failed;
    }
    PyObject *opened = Py_False;
    if (b->opened_ms == NULL || b->opened_ms == Py_None) {
        PyObject *now = now_ms != NULL ? Py_NewRef(now_ms) : PyObject_CallNoArgs(now_fn);
        if (now == NULL)
            goto failed; /* nothing changed yet but the run (as a failed clock read after the reference's add) */
        Py_XSETREF(b->opened_ms, now);
        opened = Py_True;
    }
    b->pending_bytes += size;
    if (ack != Py_None) {
        PyObject *entry = PyTuple_Pack(2, key, ack);
        if (entry == NULL || PyList_Append(b->acks, entry) < 0) {
            Py_XDECREF(entry);
            goto failed;
        }
        Py_DECREF(entry);
    }
    Py_DECREF(size_obj);
    Py_DECREF(epoch);
    Py_DECREF(b);
    return Py_NewRef(opened);
failed:
    Py_XDECREF(size_obj);
    Py_DECREF(epoch);
    Py_DECREF(b);
    return NULL;
}

PyDoc_STRVAR(builder_add_doc,
"add(key, first_seq, last_seq, record, segment_base, now_ms, ack=None, facts=None, /)\n--\n\n"
"BlockBuilder.add natively (block_builder.py's `add_py` is the reference, and serves when `_add_to_run` is not\n"
"this module's add_to_run): the record added; True when it opened the pending block.");

static const char *const add_params[] = {"key", "first_seq", "last_seq", "record", "segment_base", "now_ms", "ack",
                                         "facts"};

static PyObject *builder_add(Builder *b, PyObject *const *given, Py_ssize_t nargs_f, PyObject *kwnames)
{
    /* The arguments by position, keywords placed by name (as the reference's signature takes them). */
    PyObject *args[8] = {NULL, NULL, NULL, NULL, NULL, NULL, Py_None, Py_None};
    Py_ssize_t nargs = PyVectorcall_NARGS(nargs_f), nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs > 8)
        goto usage;
    for (Py_ssize_t i = 0; i < nargs; i++)
        args[i] = given[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        int placed = 0;
        for (int i = (int)nargs; i < 8 && !placed; i++)
            if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, k), add_params[i]) == 0) {
                args[i] = given[nargs + k];
                placed = 1;
            }
        if (!placed)
            goto usage;
    }
    for (int i = 0; i < 6; i++)
        if (args[i] == NULL)
            goto usage;
    return add_core(b, args[0], args[1], args[2], args[3], args[4], args[5], NULL, args[6], args[7]);
usage:
    PyErr_SetString(PyExc_TypeError,
                    "add takes (key, first_seq, last_seq, record, segment_base, now_ms, ack=None, facts=None)");
    return NULL;
}

static PyMethodDef builder_methods[] = {
    {"add", (PyCFunction)(void (*)(void))builder_add, METH_FASTCALL | METH_KEYWORDS, builder_add_doc},
    {NULL, NULL, 0, NULL},
};

#define LL_MEMBER(name, field) {name, T_LONGLONG, offsetof(Builder, field), 0, NULL}
#define OBJ_MEMBER(name, field) {name, T_OBJECT, offsetof(Builder, field), 0, NULL}
static PyMemberDef builder_members[] = {
    OBJ_MEMBER("state", state), OBJ_MEMBER("_led_epochs", led), OBJ_MEMBER("_runs", runs), OBJ_MEMBER("_next_from", next_from),
    OBJ_MEMBER("_acks", acks), OBJ_MEMBER("_opened_ms", opened_ms), OBJ_MEMBER("_add_to_run", add_to_run),
    LL_MEMBER("pending_bytes", pending_bytes), LL_MEMBER("max_bytes", max_bytes),
    LL_MEMBER("index_every", index_every),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tiered.tiering.blocks._builder.Builder",
    .tp_basicsize = sizeof(Builder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The block builder's per-record state (block_builder.BlockBuilder's base) and its native `add`.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)builder_dealloc,
    .tp_traverse = (traverseproc)builder_traverse,
    .tp_clear = (inquiry)builder_clear,
    .tp_members = builder_members,
    .tp_methods = builder_methods,
};

/* -- Appended ------------------------------------------------------------------------------------------------------ */

/* durable.py's DurablePath.appended natively, for a DurablePath whose builder takes the native add: one call per
 * appended record that hands it to the builder (the ack's future made first on a durable topic), closes the block at
 * once when it is full, and wakes the block timer when the record opened the block. It holds the builder and the
 * path's calls; every piece of state stays the builder's or the path's. */
typedef struct {
    PyObject_HEAD
    PyObject *builder;     /* a Builder */
    PyObject *now_ms;      /* the clock's now_ms: read only when a record opens the block */
    PyObject *close_block; /* DurablePath._close_block */
    PyObject *kick;        /* the block timer's event's set */
} Appended;

static PyObject *get_running_loop, *create_future_name; /* asyncio.get_running_loop (C), "create_future" */

/* AppendResult's fields read here (tiered.storage.appender; the tests check them against its _fields). */
#define RESULT_FIELDS 7
#define RESULT_FIRST_SEQ 0
#define RESULT_LAST_SEQ 1
#define RESULT_SEGMENT_BASE 2
#define RESULT_RECORD 5
#define RESULT_HEADER 6

static int appended_init(Appended *a, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"builder", "now_ms", "close_block", "kick", NULL};
    PyObject *builder, *now_ms, *close_block, *kick;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOO", names, &BuilderType, &builder, &now_ms, &close_block,
                                     &kick))
        return -1;
    Py_XSETREF(a->builder, Py_NewRef(builder));
    Py_XSETREF(a->now_ms, Py_NewRef(now_ms));
    Py_XSETREF(a->close_block, Py_NewRef(close_block));
    Py_XSETREF(a->kick, Py_NewRef(kick));
    return 0;
}

static int appended_traverse(Appended *a, visitproc visit, void *arg)
{
    Py_VISIT(a->builder);
    Py_VISIT(a->now_ms);
    Py_VISIT(a->close_block);
    Py_VISIT(a->kick);
    return 0;
}

static int appended_clear(Appended *a)
{
    Py_CLEAR(a->builder);
    Py_CLEAR(a->now_ms);
    Py_CLEAR(a->close_block);
    Py_CLEAR(a->kick);
    return 0;
}

static void appended_dealloc(Appended *a)
{
    PyObject_GC_UnTrack(a);
    appended_clear(a);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static PyObject *appended_call(Appended *a, PyObject *args, PyObject *kwargs)
{
    PyObject *tp, *result, *durable_obj;
    if (a->builder == NULL) {
        PyErr_SetString(PyExc_ValueError, "an Appended not initialised");
        return NULL;
    }
    static char *names[] = {"tp", "appended", "durable", NULL};
    if (kwargs == NULL ? !PyArg_UnpackTuple(args, "appended", 3, 3, &tp, &result, &durable_obj)
                       : !PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:appended", names, &tp, &result, &durable_obj))
        return NULL;
    if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != RESULT_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "appended takes an AppendResult");
        return NULL;
    }
    int durable = PyObject_IsTrue(durable_obj);
    if (durable < 0)
        return NULL;
    PyObject *ack = Py_NewRef(Py_None);
    if (durable) {
        PyObject *loop = PyObject_CallNoArgs(get_running_loop);
        if (loop == NULL)
            goto failed;
        Py_SETREF(ack, PyObject_CallMethodNoArgs(loop, create_future_name));
        Py_DECREF(loop);
        if (ack == NULL)
            return NULL;
    }
    Builder *b = (Builder *)a->builder;
    Py_INCREF(a); /* held: the calls below may run Python code */
    PyObject *opened = add_core(b, tp, PyTuple_GET_ITEM(result, RESULT_FIRST_SEQ),
                                PyTuple_GET_ITEM(result, RESULT_LAST_SEQ), PyTuple_GET_ITEM(result, RESULT_RECORD),
                                PyTuple_GET_ITEM(result, RESULT_SEGMENT_BASE), NULL, a->now_ms, ack,
                                PyTuple_GET_ITEM(result, RESULT_HEADER));
    if (opened == NULL) {
        Py_DECREF(a);
        goto failed;
    }
    PyObject *then = NULL; /* at once: the timer task may only run after many more appends */
    if (b->pending_bytes >= b->max_bytes)
        then = PyObject_CallNoArgs(a->close_block);
    else if (opened == Py_True)
        then = PyObject_CallNoArgs(a->kick);
    else
        then = Py_NewRef(Py_None);
    Py_DECREF(opened);
    Py_DECREF(a);
    if (then == NULL)
        goto failed;
    Py_DECREF(then);
    return ack;
failed:
    Py_XDECREF(ack);
    return NULL;
}

static PyTypeObject AppendedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tiered.tiering.blocks._builder.Appended",
    .tp_basicsize = sizeof(Appended),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Appended(builder, now_ms, close_block, kick): DurablePath.appended natively (see _builder.c); called "
              "as appended(tp, append_result, durable) -> the ack's future or None.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)appended_init,
    .tp_call = (ternaryfunc)appended_call,
    .tp_dealloc = (destructor)appended_dealloc,
    .tp_traverse = (traverseproc)appended_traverse,
    .tp_clear = (inquiry)appended_clear,
};

static PyMethodDef methods[] = {
    {"add_to_run", (PyCFunction)(void (*)(void))add_to_run, METH_FASTCALL, add_to_run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tiered.tiering.blocks._builder",
    "A pending run's fields and the block builder's one call per appended record (see _builder.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__builder(void)
{
    if (PyType_Ready(&RunType) < 0 || PyType_Ready(&BuilderType) < 0 || PyType_Ready(&AppendedType) < 0)
        return NULL;
    PyObject *asyncio = PyImport_ImportModule("asyncio");
    if (asyncio == NULL)
        return NULL;
    get_running_loop = PyObject_GetAttrString(asyncio, "get_running_loop");
    Py_DECREF(asyncio);
    if (get_running_loop == NULL || (create_future_name = PyUnicode_InternFromString("create_future")) == NULL)
        return NULL;
    if ((add_py_name = PyUnicode_InternFromString("add_py")) == NULL
        || (add_name = PyUnicode_InternFromString("_add")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Run", (PyObject *)&RunType) < 0
        || PyModule_AddObjectRef(m, "Builder", (PyObject *)&BuilderType) < 0
        || PyModule_AddObjectRef(m, "Appended", (PyObject *)&AppendedType) < 0
        || (add_to_run_function = PyObject_GetAttrString(m, "add_to_run")) == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
