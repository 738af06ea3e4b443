/* tiered.server._produce: a produce request's appends, and its answer, in one native call.
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
 * `produce_payload` is the same from the frame's payload: the framing read by _bundlescan (through its capsule,
 * _produce_scan.h: one reader for both), the partitions resolved as above, every bundle validated (the facts, as
 * read_checked_produce validates them: a bad one raises its ProtocolError before anything is appended), the same
 * appends, and the answer's whole frame when it can go at once, with the request's ack latency counted (the
 * histogram's bucket found and its counts raised here, as Metrics.ack_latency and Histogram.observe do): no
 * ProduceRequest, topic or partition objects. The reference is read_checked_produce followed by the handler's loop,
 * its answer and its latency; a framing fault, or a request the call does not take, answers None and that path
 * reads the payload again.
 *
 * State: none. The call holds what it reads only for its own length; each piece of state stays its owner's (the
 * registry's partitions, the log's seqs and segment, the tier's builder), and it is changed through the owner's own
 * calls. The event loop's thread is the only one that changes the registry, and it is this one, so what the first
 * pass found (every partition known and led) holds for the second; the partitions are held by reference all the
 * same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include "structmember.h"

#include "_produce_scan.h"

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

static PyObject *partitions_name, *role_name, *log_name, *tp_name, *durable_name; /* interned */
static PyObject *one; /* the int 1 */

static const produce_scan_api *scan; /* _bundlescan's reading of a produce payload, from its capsule */

static int is_tuple_of(PyObject *obj, Py_ssize_t n)
{
    return PyTuple_Check(obj) && PyTuple_GET_SIZE(obj) == n;
}

/* One partition's append, as the request names it: new references, NULL until set. */
typedef struct {
    PyObject *part; /* the registry's Partition, led here */
    PyObject *bundle, *base_seq, *facts, *record;
    uint64_t partition;
} job;

typedef struct {
    job *jobs;
    Py_ssize_t count;
} jobs;

static void jobs_clear(jobs *js)
{
    for (Py_ssize_t i = 0; i < js->count; i++) {
        job *j = &js->jobs[i];
        Py_XDECREF(j->part);
        Py_XDECREF(j->bundle);
        Py_XDECREF(j->base_seq);
        Py_XDECREF(j->facts);
        Py_XDECREF(j->record);
    }
    PyMem_Free(js->jobs);
    js->jobs = NULL;
    js->count = 0;
}

static int jobs_alloc(jobs *js, Py_ssize_t count)
{
    js->count = 0;
    js->jobs = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(job));
    if (js->jobs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The registry's partitions of topic `name` (a new reference to its list) in *out: 1; 0 for a topic not known here;
 * -1 with an exception set. */
static int topic_partitions(PyObject *registry, PyObject *name, PyObject **out)
{
    PyObject *local = PyDict_GetItemWithError(registry, name); /* borrowed */
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
    *out = parts;
    return 1;
}

/* Partition `index` of a topic's `parts` when it is led here: 1 and a new reference in *out; 0 when it is not (not
 * known, or not led here); -1 with an exception set. Nothing is changed. */
static int led_partition(PyObject *parts, long long index, PyObject *leader, PyObject **out)
{
    if (index < 0 || index >= PyList_GET_SIZE(parts))
        return 0;
    PyObject *part = PyList_GET_ITEM(parts, index);
    if (part == Py_None)
        return 0;
    PyObject *role = PyObject_GetAttr(part, role_name);
    if (role == NULL)
        return -1;
    Py_DECREF(role); /* compared by identity only: the registry holds the member */
    if (role != leader)
        return 0;
    *out = Py_NewRef(part);
    return 1;
}

/* append_request's first pass: 1 and every partition of the request in `out` when each topic is known and each
 * partition led here; 0 (the loop decides) otherwise; -1 with an exception set. Nothing is changed. */
static int resolve(PyObject *topics, PyObject *facts, int with_seqnum, PyObject *registry, PyObject *leader,
                   jobs *out)
{
    Py_ssize_t bundles = PyList_GET_SIZE(facts);
    if (jobs_alloc(out, bundles) < 0)
        return -1;
    Py_ssize_t topic_count = PyTuple_GET_SIZE(topics);
    for (Py_ssize_t t = 0; t < topic_count; t++) {
        PyObject *topic = PyTuple_GET_ITEM(topics, t);
        if (!is_tuple_of(topic, 2) || !PyTuple_Check(PyTuple_GET_ITEM(topic, TOPIC_PARTITIONS))) {
            PyErr_SetString(PyExc_TypeError, "a request topic must be a ProduceTopic");
            return -1;
        }
        PyObject *parts;
        int known = topic_partitions(registry, PyTuple_GET_ITEM(topic, TOPIC_NAME), &parts);
        if (known <= 0)
            return known;
        PyObject *wanted = PyTuple_GET_ITEM(topic, TOPIC_PARTITIONS);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(wanted); i++) {
            PyObject *p = PyTuple_GET_ITEM(wanted, i);
            if (!is_tuple_of(p, 4) || !PyLong_Check(PyTuple_GET_ITEM(p, PARTITION_ID))) {
                Py_DECREF(parts);
                PyErr_SetString(PyExc_TypeError, "a request partition must be a ProducePartition");
                return -1;
            }
            if (out->count >= bundles) {
                Py_DECREF(parts);
                PyErr_SetString(PyExc_ValueError, "more partitions than facts");
                return -1;
            }
            int overflow;
            long long index = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(p, PARTITION_ID), &overflow);
            job *j = &out->jobs[out->count];
            int found = overflow ? 0 : led_partition(parts, index, leader, &j->part);
            if (found <= 0) {
                Py_DECREF(parts);
                return found;
            }
            out->count++;
            j->partition = (uint64_t)index;
            j->bundle = Py_NewRef(PyTuple_GET_ITEM(p, PARTITION_BUNDLE));
            j->base_seq = Py_NewRef(with_seqnum ? PyTuple_GET_ITEM(p, PARTITION_BASE_SEQ) : Py_None);
            j->record = Py_NewRef(PyTuple_GET_ITEM(p, PARTITION_RECORD));
        }
        Py_DECREF(parts);
    }
    if (out->count != bundles) {
        PyErr_SetString(PyExc_ValueError, "fewer partitions than facts");
        return -1;
    }
    for (Py_ssize_t i = 0; i < bundles; i++)
        out->jobs[i].facts = Py_NewRef(PyList_GET_ITEM(facts, i));
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

/* registry.Partition.durable: the attribute its owner keeps current (the rule is there only). 1, 0, or -1 with an
 * exception set. */
static int is_durable(PyObject *part)
{
    PyObject *durable = PyObject_GetAttr(part, durable_name);
    if (durable == NULL)
        return -1;
    int is = PyObject_IsTrue(durable);
    Py_DECREF(durable);
    return is;
}

/* One led partition's append, as the loop makes it; its code in `code`, and its durable ack (a new reference, or
 * NULL) in `ack`. 0, or -1 with an exception set. */
static int append_one(const job *j, PyObject *name, const calls *c, int *code, PyObject **ack)
{
    *ack = NULL;
    PyObject *part = j->part, *facts = j->facts;
    PyObject *log = PyObject_GetAttr(part, log_name);
    if (log == NULL)
        return -1;
    PyObject *argv[5] = {log, j->bundle, j->base_seq, facts, j->record};
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
        PyObject *partition = PyLong_FromUnsignedLongLong(j->partition);
        PyObject *got = partition == NULL ? NULL
                                          : PyObject_CallFunctionObjArgs(c->failed, name, partition, exc, NULL);
        Py_XDECREF(partition);
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

/* The appends of resolved jobs in request order, topic by topic (`names[t]` has `sizes[t]` of them): the answers,
 * one (name, None, codes) per topic, and the durable acks, (topic index, partition index, ack), as the loop builds
 * them, in *answers_out and *pending_out (new references). 0, or -1 with an exception set. */
static int append_all(const jobs *js, PyObject *const *names, const Py_ssize_t *sizes, Py_ssize_t topic_count,
                      const calls *c, PyObject **answers_out, PyObject **pending_out)
{
    PyObject *answers = PyList_New(topic_count), *pending = PyList_New(0);
    if (answers == NULL || pending == NULL)
        goto fail;
    Py_ssize_t i = 0; /* the next job */
    for (Py_ssize_t t = 0; t < topic_count; t++) {
        PyObject *codes = PyByteArray_FromStringAndSize(NULL, sizes[t]);
        if (codes == NULL)
            goto fail;
        PyObject *answer = PyTuple_Pack(3, names[t], Py_None, codes);
        Py_DECREF(codes); /* held by the answer */
        if (answer == NULL)
            goto fail;
        PyList_SET_ITEM(answers, t, answer);
        for (Py_ssize_t j = 0; j < sizes[t]; j++, i++) {
            int code;
            PyObject *ack;
            if (i >= js->count) {
                PyErr_SetString(PyExc_ValueError, "fewer partitions than the topics name");
                goto fail;
            }
            if (append_one(&js->jobs[i], names[t], c, &code, &ack) < 0)
                goto fail;
            PyByteArray_AS_STRING(codes)[j] = (char)code;
            if (ack != NULL) {
                PyObject *entry = Py_BuildValue("(nnN)", t, j, ack);
                if (entry == NULL || PyList_Append(pending, entry) < 0) {
                    Py_XDECREF(entry);
                    goto fail;
                }
                Py_DECREF(entry);
            }
        }
    }
    *answers_out = answers;
    *pending_out = pending;
    return 0;
fail:
    Py_XDECREF(answers); /* a list's NULL items are skipped */
    Py_XDECREF(pending);
    return -1;
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
    jobs js;
    int found = resolve(topics, facts, with_seqnum, registry, leader, &js);
    if (found <= 0) {
        jobs_clear(&js);
        if (found < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    Py_ssize_t topic_count = PyTuple_GET_SIZE(topics);
    PyObject **names = PyMem_Calloc(topic_count > 0 ? (size_t)topic_count : 1, sizeof(PyObject *));
    Py_ssize_t *sizes = PyMem_Calloc(topic_count > 0 ? (size_t)topic_count : 1, sizeof(Py_ssize_t));
    PyObject *answers, *pending, *result = NULL;
    if (names == NULL || sizes == NULL)
        PyErr_NoMemory();
    else {
        for (Py_ssize_t t = 0; t < topic_count; t++) { /* checked by resolve */
            PyObject *topic = PyTuple_GET_ITEM(topics, t);
            names[t] = PyTuple_GET_ITEM(topic, TOPIC_NAME);
            sizes[t] = PyTuple_GET_SIZE(PyTuple_GET_ITEM(topic, TOPIC_PARTITIONS));
        }
        if (append_all(&js, names, sizes, topic_count, &c, &answers, &pending) == 0) {
            result = PyTuple_Pack(2, answers, pending);
            Py_DECREF(answers);
            Py_DECREF(pending);
        }
    }
    PyMem_Free(names);
    PyMem_Free(sizes);
    jobs_clear(&js);
    return result;
}

/* produce_payload's first pass over the framing read: the topics' names (new references in `names`) and every
 * partition of the request in `out` when each topic is known and each partition led here: 1; 0 (the handler's path
 * decides) otherwise; -1 with an exception set. Nothing is changed. */
static int resolve_framed(const produce_framing *f, const uint8_t *data, PyObject *registry, PyObject *leader,
                          PyObject **names, jobs *out)
{
    if (jobs_alloc(out, f->part_count) < 0)
        return -1;
    for (Py_ssize_t t = 0; t < f->topic_count; t++) {
        const produce_topic_at *topic = &f->topics[t];
        names[t] = PyUnicode_DecodeLatin1((const char *)data + topic->name_at, topic->name_len, NULL);
        if (names[t] == NULL)
            return -1;
        PyObject *parts;
        int known = topic_partitions(registry, names[t], &parts);
        if (known <= 0)
            return known;
        for (Py_ssize_t i = topic->first; i < topic->first + topic->count; i++) {
            job *j = &out->jobs[out->count];
            int found = led_partition(parts, (long long)f->parts[i].partition, leader, &j->part);
            if (found <= 0) {
                Py_DECREF(parts);
                return found;
            }
            j->partition = f->parts[i].partition;
            out->count++;
        }
        Py_DECREF(parts);
    }
    return 1;
}

/* The bundles of a resolved request validated in request order (the facts) and handed out as read-only views of the
 * payload (`view`), as read_checked_produce hands them out: the record where the request lays it out (then no view
 * of the bundle alone, which only the record's absence needs: PartitionLog.append takes None for it), else the
 * bundle. 0, or -1 with an exception set (ProtocolError for a bad bundle: nothing was appended). */
static int read_bundles(const produce_framing *f, const uint8_t *data, PyObject *view, int with_seqnum, jobs *js)
{
    for (Py_ssize_t i = 0; i < js->count; i++) {
        const produce_part_at *at = &f->parts[i];
        job *j = &js->jobs[i];
        if ((j->facts = scan->bundle_facts(view, data, at->start, at->end)) == NULL)
            return -1;
    }
    for (Py_ssize_t i = 0; i < js->count; i++) {
        const produce_part_at *at = &f->parts[i];
        job *j = &js->jobs[i];
        j->bundle = at->record ? Py_NewRef(Py_None) : PySequence_GetSlice(view, at->start, at->end);
        j->record = at->record ? PySequence_GetSlice(view, at->length_at, at->end) : Py_NewRef(Py_None);
        j->base_seq = with_seqnum ? PyLong_FromUnsignedLongLong(at->base_seq) : Py_NewRef(Py_None);
        if (j->bundle == NULL || j->record == NULL || j->base_seq == NULL)
            return -1;
    }
    return 0;
}

/* tiered.metrics.Histogram's slots, at the offsets its member descriptors name (read once, when this module is
 * imported): `observe` reads and writes them as those descriptors do, without a generic attribute lookup each
 * (~160 instructions a read, ~215 a write: as much as the rest of counting the latency). */
static PyTypeObject *histogram_type;
static Py_ssize_t counts_at, total_at, count_at;

static int slot_offset(PyObject *type, const char *name, Py_ssize_t *at)
{
    PyObject *descr = PyObject_GetAttrString(type, name);
    if (descr == NULL)
        return -1;
    int slot = Py_IS_TYPE(descr, &PyMemberDescr_Type)
               && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
    if (slot)
        *at = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    if (!slot) {
        PyErr_Format(PyExc_TypeError, "tiered.metrics.Histogram.%s must be a slot", name);
        return -1;
    }
    return 0;
}

static PyObject **slot_of(PyObject *obj, Py_ssize_t at)
{
    return (PyObject **)((char *)obj + at);
}

/* n + 1 for a counter (an int): a new reference, or NULL with an exception set. */
static PyObject *plus_one(PyObject *n)
{
    if (PyLong_CheckExact(n)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(n, &overflow);
        if (!overflow && v < LLONG_MAX && !(v == -1 && PyErr_Occurred()))
            return PyLong_FromLongLong(v + 1);
        PyErr_Clear();
    }
    return PyNumber_Add(n, one);
}

/* tiered.metrics.Histogram.observe(seconds), the reference, on `hist` (a Histogram): the bucket is the first of
 * `bounds` (a tuple of floats, ascending: LATENCY_BUCKETS_S) not below `seconds`, as bisect_left finds it, or the
 * last (+Inf) when every bound is below; then counts[bucket] += 1, total += seconds, count += 1, in that order. 0, or
 * -1 with an exception set. */
static int observe(PyObject *hist, PyObject *bounds, double seconds)
{
    if (!Py_IS_TYPE(hist, histogram_type)) {
        PyErr_SetString(PyExc_TypeError, "a latency histogram must be a tiered.metrics.Histogram");
        return -1;
    }
    PyObject **counts = slot_of(hist, counts_at), **total = slot_of(hist, total_at), **count = slot_of(hist, count_at);
    if (*counts == NULL || *total == NULL || *count == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a latency histogram's slots must be set");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(bounds), bucket = 0;
    for (; bucket < n; bucket++) {
        PyObject *item = PyTuple_GET_ITEM(bounds, bucket);
        double bound = PyFloat_CheckExact(item) ? PyFloat_AS_DOUBLE(item) : PyFloat_AsDouble(item);
        if (bound == -1.0 && PyErr_Occurred())
            return -1;
        if (!(bound < seconds))
            break;
    }
    PyObject *list = *counts;
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) != n + 1) {
        PyErr_SetString(PyExc_TypeError, "a histogram's counts must be a list of one more than its bounds");
        return -1;
    }
    /* Held while counting: adding to something other than an int could run code that changes them. */
    PyObject *old = Py_NewRef(PyList_GET_ITEM(list, bucket));
    Py_INCREF(list);
    PyObject *counted = plus_one(old);
    Py_DECREF(old);
    int set = -1;
    if (counted != NULL && PyList_GET_SIZE(list) == n + 1)
        set = PyList_SetItem(list, bucket, counted); /* steals it */
    else if (counted != NULL) {
        Py_DECREF(counted);
        PyErr_SetString(PyExc_RuntimeError, "a histogram's counts changed while counting");
    }
    Py_DECREF(list);
    if (set < 0)
        return -1;
    double before = PyFloat_CheckExact(*total) ? PyFloat_AS_DOUBLE(*total) : PyFloat_AsDouble(*total);
    if (before == -1.0 && PyErr_Occurred())
        return -1;
    PyObject *sum = PyFloat_FromDouble(before + seconds);
    if (sum == NULL)
        return -1;
    Py_SETREF(*total, sum);
    PyObject *counted_all = plus_one(*count);
    if (counted_all == NULL)
        return -1;
    Py_SETREF(*count, counted_all);
    return 0;
}

/* The request's ack latency, counted as Metrics.ack_latency(name, monotonic() - started) counts it: in
 * latency[name] (Metrics.latency, a defaultdict of Histograms: a topic's first makes its histogram). 0, or -1 with an
 * exception set. */
static int count_latency(PyObject *monotonic, PyObject *latency, PyObject *bounds, PyObject *name, double started)
{
    PyObject *now = PyObject_CallNoArgs(monotonic);
    if (now == NULL)
        return -1;
    double at = PyFloat_AsDouble(now);
    Py_DECREF(now);
    if (at == -1.0 && PyErr_Occurred())
        return -1;
    PyObject *hist = PyObject_GetItem(latency, name);
    if (hist == NULL)
        return -1;
    int result = observe(hist, bounds, at - started);
    Py_DECREF(hist);
    return result;
}

PyDoc_STRVAR(produce_payload_doc,
"produce_payload(payload, with_seqnum, context, started, /)\n"
"--\n\n"
"A produce request from its payload (bytes) to its answer: read as read_checked_produce reads it, every bundle\n"
"validated, then append_request's appends, without the request's Python objects. `context`: a NativeContext\n"
"(tiered.server.produce), whose fields after the first are append_request's arguments from registry_topics on,\n"
"then the clock's monotonic, the metrics' latency histograms and their bounds. `started`: the request's clock read.\n"
"Answers (answers, pending, frame, request_id, ack_timeout_ms): `frame` the whole answer frame when nothing waits\n"
"for a durable ack and it is one topic's plain codes, else None; when it is a frame, the request's ack latency\n"
"(monotonic() - started) is counted here, as Metrics.ack_latency counts it. None, with nothing appended, for a\n"
"request append_request would not take or whose framing does not parse (read_checked_produce then reads it, and\n"
"names the fault). Raises ProtocolError for a bad bundle, as read_checked_produce does, with nothing appended.");

/* NativeContext's fields (tiered/server/produce.py; the tests check them against its _fields): the tier's calls
 * it was made for (not read here), then append_request's arguments from registry_topics on, then what the ack latency
 * is counted with. */
#define CONTEXT_FIELDS 13
#define CONTEXT_REGISTRY 1
#define CONTEXT_MONOTONIC 10
#define CONTEXT_LATENCY 11
#define CONTEXT_BOUNDS 12

static PyObject *produce_payload(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !is_tuple_of(args[2], CONTEXT_FIELDS)) {
        PyErr_SetString(PyExc_TypeError, "produce_payload takes (payload, with_seqnum, a NativeContext, started)");
        return NULL;
    }
    PyObject *const *context = &PyTuple_GET_ITEM(args[2], CONTEXT_REGISTRY);
    PyObject *payload = args[0], *registry = context[0], *leader = context[1];
    PyObject *monotonic = PyTuple_GET_ITEM(args[2], CONTEXT_MONOTONIC);
    PyObject *latency = PyTuple_GET_ITEM(args[2], CONTEXT_LATENCY), *bounds = PyTuple_GET_ITEM(args[2], CONTEXT_BOUNDS);
    if (!PyDict_Check(registry) || !PyDict_Check(context[4]) || !PyDict_Check(latency) || !PyTuple_Check(bounds)) {
        PyErr_SetString(PyExc_TypeError, "produce_payload takes three dicts (the registry's topics, the waiting, the "
                                         "latency histograms) and a tuple of bounds");
        return NULL;
    }
    double started = PyFloat_AsDouble(args[3]);
    if (started == -1.0 && PyErr_Occurred())
        return NULL;
    if (!PyBytes_CheckExact(payload))
        Py_RETURN_NONE; /* a big frame's buffer: read_checked_produce makes it read-only */
    calls c = {context[2], context[3], context[4], context[5], context[6], context[7], context[8]};
    int with_seqnum = PyObject_IsTrue(args[1]);
    if (with_seqnum < 0)
        return NULL;
    const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(payload);
    produce_framing f;
    PyObject *names[PRODUCE_MAX_TOPICS] = {NULL};
    Py_ssize_t sizes[PRODUCE_MAX_TOPICS];
    jobs js = {NULL, 0};
    PyObject *view = NULL, *answers = NULL, *pending = NULL, *frame = NULL, *result = NULL;
    int found = scan->read_framing(data, PyBytes_GET_SIZE(payload), with_seqnum, &f);
    if (found > 0)
        found = resolve_framed(&f, data, registry, leader, names, &js);
    if (found <= 0) {
        result = found < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    /* A view of bytes is read-only: no bundle or record handed out can write into the payload. */
    if ((view = PyMemoryView_FromObject(payload)) == NULL || read_bundles(&f, data, view, with_seqnum, &js) < 0)
        goto done;
    for (Py_ssize_t t = 0; t < f.topic_count; t++)
        sizes[t] = f.topics[t].count;
    if (append_all(&js, names, sizes, f.topic_count, &c, &answers, &pending) < 0)
        goto done;
    if (f.topic_count == 1 && PyList_GET_SIZE(pending) == 0) {
        PyObject *codes = PyTuple_GET_ITEM(PyList_GET_ITEM(answers, 0), 2);
        frame = scan->codes_frame((uint32_t)f.request_id, (const uint8_t *)PyByteArray_AS_STRING(codes),
                                  PyByteArray_GET_SIZE(codes));
        if (frame != NULL && frame != Py_None && count_latency(monotonic, latency, bounds, names[0], started) < 0)
            Py_CLEAR(frame);
    } else
        frame = Py_NewRef(Py_None);
    if (frame != NULL) { /* a tuple built directly: Py_BuildValue's format parse cost ~600 instructions a request */
        PyObject *request_id = PyLong_FromUnsignedLongLong(f.request_id);
        PyObject *ack_timeout = PyLong_FromUnsignedLongLong(f.ack_timeout_ms);
        if (request_id != NULL && ack_timeout != NULL)
            result = PyTuple_Pack(5, answers, pending, frame, request_id, ack_timeout);
        Py_XDECREF(request_id);
        Py_XDECREF(ack_timeout);
    }
done:
    Py_XDECREF(frame);
    Py_XDECREF(answers);
    Py_XDECREF(pending);
    Py_XDECREF(view);
    jobs_clear(&js);
    for (Py_ssize_t t = 0; t < PRODUCE_MAX_TOPICS && names[t] != NULL; t++)
        Py_DECREF(names[t]);
    scan->release_framing(&f);
    return result;
}

static PyMethodDef methods[] = {
    {"append_request", (PyCFunction)(void (*)(void))append_request, METH_FASTCALL, append_request_doc},
    {"produce_payload", (PyCFunction)(void (*)(void))produce_payload, METH_FASTCALL, produce_payload_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tiered.server._produce",
    "The produce handler's appends of a whole request in one native call (see _produce.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__produce(void)
{
    PyObject **names[] = {&partitions_name, &role_name, &log_name, &tp_name, &durable_name};
    const char *texts[] = {"partitions", "role", "log", "tp", "durable"};
    for (int i = 0; i < 5; i++)
        if ((*names[i] = PyUnicode_InternFromString(texts[i])) == NULL)
            return NULL;
    if ((one = PyLong_FromLong(1)) == NULL)
        return NULL;
    PyObject *metrics = PyImport_ImportModule("tiered.metrics");
    if (metrics == NULL)
        return NULL;
    histogram_type = (PyTypeObject *)PyObject_GetAttrString(metrics, "Histogram"); /* kept for the module's life */
    Py_DECREF(metrics);
    if (histogram_type == NULL)
        return NULL;
    if (!PyType_Check(histogram_type)) {
        PyErr_SetString(PyExc_TypeError, "tiered.metrics.Histogram must be a class");
        return NULL;
    }
    if (slot_offset((PyObject *)histogram_type, "counts", &counts_at) < 0
        || slot_offset((PyObject *)histogram_type, "total", &total_at) < 0
        || slot_offset((PyObject *)histogram_type, "count", &count_at) < 0)
        return NULL;
    PyObject *scanner = PyImport_ImportModule("tiered.protocol._bundlescan"); /* the capsule's module, imported */
    if (scanner == NULL)
        return NULL;
    Py_DECREF(scanner);
    if ((scan = PyCapsule_Import(PRODUCE_SCAN_CAPSULE, 0)) == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
