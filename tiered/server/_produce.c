/* tiered.server._produce: the produce handler's appends of a whole request in one native call.
 *
 * `append_request` is the common case of ProduceHandler.handle's loop (tiered/server/produce.py), which stays the
 * reference: every topic of the request known here and every partition named led by this broker. It walks the
 * request as scan_produce read it and, per partition in request order, does what the loop does: the log's append
 * (natively, _appender.log_append), the topic's produced bytes and messages counted (Metrics.produced's dicts), the
 * tier's `appended` (natively, _builder.Appended), and on a topic that is not durable `visible` for a partition a
 * long-poll waits on (Waiters.waiting); it returns the answers and durable acks the loop would have built. Its
 * callees are native where it matters: a call from C into a Python function costs ~1.5k instructions more than a
 * call between Python functions (benchmarks.md, "The produce path in native code (issue 26, fourth step ...").
 * Anything else (an unknown topic or partition, a partition led
 * elsewhere or not yet) answers None before anything is appended, and the loop decides: the redirects, the unknown
 * names and their codes are the loop's alone.
 *
 * State: none. The call holds what it reads only for its own length; each piece of state stays its owner's (the
 * registry's partitions, the log's seqs and segment, the tier's builder), and it is changed through the owner's own
 * calls. The event loop's thread is the only one that changes the registry, and it is this one, so what the first
 * pass found (every partition known and led) holds for the second; the partitions are held by reference all the
 * same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The positions of the NamedTuple fields read here (tiered.protocol.requests, .bundle, tiered.storage.appender); the
 * tests check them against the classes' _fields. */
#define TOPIC_NAME 0
#define TOPIC_PARTITIONS 1
#define PARTITION_ID 0
#define PARTITION_BUNDLE 1
#define PARTITION_BASE_SEQ 2
#define PARTITION_RECORD 3
#define FACTS_MESSAGES 1
#define RESULT_FIRST_SEQ 0
#define RESULT_RECORD 5
#define OK_CODE 0x00

static PyObject *partitions_name, *role_name, *log_name, *tp_name, *lower_tier_name, *config_name,
    *produce_ack_name, *durable_text; /* interned */

static int is_tuple_of(PyObject *obj, Py_ssize_t n)
{
    return PyTuple_Check(obj) && PyTuple_GET_SIZE(obj) == n;
}

/* The request's partitions, resolved: new references, in request order. */
typedef struct {
    PyObject **parts;
    Py_ssize_t count;
} resolved;

static void resolved_clear(resolved *r)
{
    for (Py_ssize_t i = 0; i < r->count; i++)
        Py_DECREF(r->parts[i]);
    PyMem_Free(r->parts);
    r->parts = NULL;
    r->count = 0;
}

/* The first pass: 1 and every partition of the request in `out` when each topic is known and each partition led
 * here; 0 (the loop decides) otherwise; -1 with an exception set. Nothing is changed. */
static int resolve(PyObject *topics, PyObject *registry, PyObject *leader, Py_ssize_t bundles, resolved *out)
{
    out->parts = PyMem_Calloc(bundles > 0 ? (size_t)bundles : 1, sizeof(PyObject *));
    out->count = 0;
    if (out->parts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t topic_count = PyTuple_GET_SIZE(topics);
    for (Py_ssize_t t = 0; t < topic_count; t++) {
        PyObject *topic = PyTuple_GET_ITEM(topics, t);
        if (!is_tuple_of(topic, 2) || !PyTuple_Check(PyTuple_GET_ITEM(topic, TOPIC_PARTITIONS))) {
            PyErr_SetString(PyExc_TypeError, "a request topic must be a ProduceTopic");
            return -1;
        }
        PyObject *local = PyDict_GetItemWithError(registry, PyTuple_GET_ITEM(topic, TOPIC_NAME)); /* borrowed */
        if (local == NULL)
            return PyErr_Occurred() ? -1 : 0;
        PyObject *parts = PyObject_GetAttr(local, partitions_name);
        if (parts == NULL)
            return -1;
        if (!PyList_Check(parts)) {
            Py_DECREF(parts);
            PyErr_SetString(PyExc_TypeError, "a topic's partitions must be a list");
            return -1;
        }
        PyObject *wanted = PyTuple_GET_ITEM(topic, TOPIC_PARTITIONS);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(wanted); i++) {
            PyObject *p = PyTuple_GET_ITEM(wanted, i);
            if (!is_tuple_of(p, 4) || !PyLong_Check(PyTuple_GET_ITEM(p, PARTITION_ID))) {
                Py_DECREF(parts);
                PyErr_SetString(PyExc_TypeError, "a request partition must be a ProducePartition");
                return -1;
            }
            int overflow;
            long long index = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(p, PARTITION_ID), &overflow);
            if (overflow || index < 0 || index >= PyList_GET_SIZE(parts) || out->count >= bundles) {
                Py_DECREF(parts);
                return out->count >= bundles ? (PyErr_SetString(PyExc_ValueError, "more partitions than facts"), -1)
                                             : 0;
            }
            PyObject *part = PyList_GET_ITEM(parts, index);
            if (part == Py_None) {
                Py_DECREF(parts);
                return 0;
            }
            PyObject *role = PyObject_GetAttr(part, role_name);
            if (role == NULL) {
                Py_DECREF(parts);
                return -1;
            }
            Py_DECREF(role); /* compared by identity only: the registry holds the member */
            if (role != leader) {
                Py_DECREF(parts);
                return 0;
            }
            out->parts[out->count++] = Py_NewRef(part);
        }
        Py_DECREF(parts);
    }
    if (out->count != bundles) {
        PyErr_SetString(PyExc_ValueError, "fewer partitions than facts");
        return -1;
    }
    return 1;
}

/* The calls and handles of the loop the appends use: the log's append as a function of (log, bundle, base_seq, facts,
 * record) (partition_log.log_append_for: natively, or PartitionLog.append itself), the tier's `appended`, the waiters' `visible` and the dict of
 * partitions with waiters (Waiters.waiting: `visible` has nothing to do for a partition without any), the metrics'
 * produced bytes and messages per topic (Metrics.produced's two dicts), and `failed` for a refused append. */
typedef struct {
    PyObject *tier_appended, *visible, *waiting, *produced_bytes, *produced_msgs, *failed, *log_append;
} calls;

/* counter[name] += by, on a mapping (a defaultdict: a missing name starts at 0), as Metrics.produced counts. */
static int count(PyObject *counter, PyObject *name, PyObject *by)
{
    PyObject *value = PyObject_GetItem(counter, name);
    if (value == NULL)
        return -1;
    PyObject *sum = PyNumber_Add(value, by);
    Py_DECREF(value);
    if (sum == NULL)
        return -1;
    int set = PyObject_SetItem(counter, name, sum);
    Py_DECREF(sum);
    return set;
}

/* registry.Partition.durable, read from its fields: a tier below the disk, and the topic's produce.ack "durable"
 * (visibility follows durability). 1, 0, or -1 with an exception set. */
static int is_durable(PyObject *part)
{
    PyObject *lower = PyObject_GetAttr(part, lower_tier_name);
    if (lower == NULL)
        return -1;
    int below = PyObject_IsTrue(lower);
    Py_DECREF(lower);
    if (below <= 0)
        return below;
    PyObject *config = PyObject_GetAttr(part, config_name);
    if (config == NULL)
        return -1;
    PyObject *ack = PyObject_GetAttr(config, produce_ack_name);
    Py_DECREF(config);
    if (ack == NULL)
        return -1;
    int durable = PyObject_RichCompareBool(ack, durable_text, Py_EQ);
    Py_DECREF(ack);
    return durable;
}

/* One led partition's append, as the loop makes it; its code in `code`, and its durable ack (a new reference, or
 * NULL) in `ack`. 0, or -1 with an exception set. */
static int append_one(PyObject *part, PyObject *name, PyObject *p, PyObject *facts, int with_seqnum, const calls *c,
                      int *code, PyObject **ack)
{
    *ack = NULL;
    PyObject *log = PyObject_GetAttr(part, log_name);
    if (log == NULL)
        return -1;
    PyObject *argv[5] = {log, PyTuple_GET_ITEM(p, PARTITION_BUNDLE),
                         with_seqnum ? PyTuple_GET_ITEM(p, PARTITION_BASE_SEQ) : Py_None, facts,
                         PyTuple_GET_ITEM(p, PARTITION_RECORD)};
    PyObject *appended = PyObject_Vectorcall(c->log_append, argv, 5, NULL);
    Py_DECREF(log);
    if (appended == NULL) {
        /* The loop's except clause: `failed` logs the refusal and answers its code, or raises what it does not
         * answer. */
        PyObject *type, *exc, *traceback;
        PyErr_Fetch(&type, &exc, &traceback);
        PyErr_NormalizeException(&type, &exc, &traceback);
        if (exc == NULL) { /* nothing to hand over: restored as it was raised */
            PyErr_Restore(type, exc, traceback);
            return -1;
        }
        if (traceback != NULL)
            PyException_SetTraceback(exc, traceback);
        Py_XDECREF(type);
        Py_XDECREF(traceback);
        PyObject *got = PyObject_CallFunctionObjArgs(c->failed, name, PyTuple_GET_ITEM(p, PARTITION_ID), exc, NULL);
        Py_DECREF(exc);
        if (got == NULL)
            return -1;
        long value = PyLong_AsLong(got);
        Py_DECREF(got);
        if (value == -1 && PyErr_Occurred())
            return -1;
        *code = (int)value;
        return 0;
    }
    PyObject *tp = NULL, *got = NULL, *record_len = NULL;
    int result = -1;
    if (!is_tuple_of(appended, 7) || !is_tuple_of(facts, 8)) {
        PyErr_SetString(PyExc_TypeError, "an append must answer an AppendResult of the bundle's BundleFacts");
        goto done;
    }
    Py_ssize_t len = PyObject_Length(PyTuple_GET_ITEM(appended, RESULT_RECORD));
    if (len < 0 || (record_len = PyLong_FromSsize_t(len)) == NULL)
        goto done;
    if (count(c->produced_bytes, name, record_len) < 0
        || count(c->produced_msgs, name, PyTuple_GET_ITEM(facts, FACTS_MESSAGES)) < 0)
        goto done;
    /* The tier takes the record (its block, and on a durable topic the ack's future). A topic that is not durable
     * shows it at once (visibility follows durability). */
    int durable = is_durable(part);
    if (durable < 0 || (tp = PyObject_GetAttr(part, tp_name)) == NULL)
        goto done;
    got = PyObject_CallFunctionObjArgs(c->tier_appended, tp, appended, durable ? Py_True : Py_False, NULL);
    if (got == NULL)
        goto done;
    if (!durable) {
        PyObject *bucket = PyDict_GetItemWithError(c->waiting, tp); /* borrowed */
        int wakes = bucket == NULL ? (PyErr_Occurred() ? -1 : 0) : PyObject_IsTrue(bucket);
        if (wakes < 0)
            goto done;
        if (wakes) {
            PyObject *shown = PyObject_CallFunctionObjArgs(c->visible, tp,
                                                          PyTuple_GET_ITEM(appended, RESULT_FIRST_SEQ), record_len,
                                                          NULL);
            if (shown == NULL)
                goto done;
            Py_DECREF(shown);
        }
    }
    if (got != Py_None)
        *ack = Py_NewRef(got);
    *code = OK_CODE;
    result = 0;
done:
    Py_XDECREF(got);
    Py_XDECREF(tp);
    Py_XDECREF(record_len);
    Py_DECREF(appended);
    return result;
}

PyDoc_STRVAR(append_request_doc,
"append_request(topics, facts, with_seqnum, registry_topics, leader, tier_appended, visible, waiting,\n"
"               produced_bytes, produced_msgs, failed, log_append, /)\n"
"--\n\n"
"ProduceHandler.handle's loop over a request whose every topic is known and every partition led here: appends\n"
"each partition's bundle in request order and answers (answers, pending) as the loop builds them; None, with\n"
"nothing appended, for any other request. `waiting`: the waiters' partitions (Waiters.waiting); `produced_*`:\n"
"Metrics.produced's counters; `failed(name, partition, exc)` answers the code of a refused append;\n"
"`log_append(log, bundle, base_seq, facts, record)` appends (partition_log.log_append_for).");

static PyObject *append_request(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "append_request takes (topics, facts, with_seqnum, registry_topics, leader, "
                                         "tier_appended, visible, waiting, produced_bytes, produced_msgs, failed, "
                                         "log_append)");
        return NULL;
    }
    PyObject *topics = args[0], *facts = args[1], *registry = args[3], *leader = args[4];
    if (!PyTuple_Check(topics) || !PyList_Check(facts) || !PyDict_Check(registry) || !PyDict_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "append_request takes a tuple of topics, a list of facts and two dicts");
        return NULL;
    }
    calls c = {args[5], args[6], args[7], args[8], args[9], args[10], args[11]};
    int with_seqnum = PyObject_IsTrue(args[2]);
    if (with_seqnum < 0)
        return NULL;
    resolved r;
    int found = resolve(topics, registry, leader, PyList_GET_SIZE(facts), &r);
    if (found <= 0) {
        resolved_clear(&r);
        if (found < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *answers = PyList_New(0), *pending = PyList_New(0), *result = NULL;
    if (answers == NULL || pending == NULL)
        goto done;
    Py_ssize_t i = 0; /* the next bundle's index in `facts` and in r.parts */
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(topics); t++) {
        PyObject *topic = PyTuple_GET_ITEM(topics, t), *name = PyTuple_GET_ITEM(topic, TOPIC_NAME);
        PyObject *wanted = PyTuple_GET_ITEM(topic, TOPIC_PARTITIONS);
        PyObject *codes = PyByteArray_FromStringAndSize(NULL, PyTuple_GET_SIZE(wanted));
        if (codes == NULL)
            goto done;
        PyObject *answer = PyTuple_Pack(3, name, Py_None, codes);
        Py_DECREF(codes); /* held by the answer */
        if (answer == NULL)
            goto done;
        int added = PyList_Append(answers, answer);
        Py_DECREF(answer);
        if (added < 0)
            goto done;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(wanted); j++, i++) {
            int code;
            PyObject *ack;
            /* The facts list may change under a callback; it is read by index, checked each time. */
            if (i >= PyList_GET_SIZE(facts)) {
                PyErr_SetString(PyExc_ValueError, "the facts list changed during the appends");
                goto done;
            }
            PyObject *bundle_facts = Py_NewRef(PyList_GET_ITEM(facts, i));
            int bad = append_one(r.parts[i], name, PyTuple_GET_ITEM(wanted, j), bundle_facts, with_seqnum, &c, &code,
                                 &ack);
            Py_DECREF(bundle_facts);
            if (bad < 0)
                goto done;
            PyByteArray_AS_STRING(codes)[j] = (char)code;
            if (ack != NULL) {
                PyObject *entry = Py_BuildValue("(nnN)", t, j, ack);
                if (entry == NULL || PyList_Append(pending, entry) < 0) {
                    Py_XDECREF(entry);
                    goto done;
                }
                Py_DECREF(entry);
            }
        }
    }
    result = PyTuple_Pack(2, answers, pending);
done:
    resolved_clear(&r);
    Py_XDECREF(answers);
    Py_XDECREF(pending);
    return result;
}

static PyMethodDef methods[] = {
    {"append_request", (PyCFunction)(void (*)(void))append_request, METH_FASTCALL, append_request_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tiered.server._produce",
    "The produce handler's appends of a whole request in one native call (see _produce.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__produce(void)
{
    PyObject **names[] = {&partitions_name, &role_name, &log_name, &tp_name, &lower_tier_name, &config_name,
                          &produce_ack_name, &durable_text};
    const char *texts[] = {"partitions", "role", "log", "tp", "lower_tier", "config", "produce_ack", "durable"};
    for (int i = 0; i < 8; i++)
        if ((*names[i] = PyUnicode_InternFromString(texts[i])) == NULL)
            return NULL;
    return PyModule_Create(&module_def);
}
