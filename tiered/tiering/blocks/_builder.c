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
    if (PyType_Ready(&RunType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Run", (PyObject *)&RunType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
