/* native._batch: a whole RecordBatch v2 of plain values (no keys, headers or timestamps of their
own: the producer's common case) in one CPython call, straight into the `bytes` it returns.

Why it exists: a one-record send is the latency a producer's caller waits for. Through cffi the
same encode (native/rl_encode.h's `rc_encode_batch`) needed the values joined, an int64 array of
their lengths, an output bytearray and a copy of it into bytes: ~2 us of a one-record send's
client CPU, where this call takes a fraction of one.

Rules this module keeps:
- `encode_values` gives the bytes `ringlog_proto.batch.encode_batch` gives for the same values and
  fields, and None for anything it does not encode (an item that is not `bytes`, no items or more
  than RC_RECORD_COUNT_MAX, a field out of its width): `encode_batch`'s own path then encodes it
  or raises its error (tests/ringlog_proto/test_plain_encode.py holds the two against each other).
- `encode_framed` gives `head` + what `encode_values` gives, with two big-endian u32 fields of the
  head set (the sizes after one, and of the batch): a produce request's whole frame in one bytes
  object, written in one `write` (a one-record send: ~1.5 us less than the head, the batch and the
  request built in Python). Which fields those are is the caller's (ringlog_proto/messages.py):
  this module knows nothing of the frame.
- The batch header's layout is ringlog_proto/batch.py's: this build's copy is exported as LAYOUT
  and checked there when batch.py loads it (a mismatch raises).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rl_crc32c.h"
#include "rl_encode.h"

/* The most a record may add to its value (ringlog_proto.records_codec's bound): a short
   capacity only makes rc_encode_batch refuse, and encode_batch's own path then encodes. */
#define RECORD_OVERHEAD_MAX 36
#define VALUES_ON_STACK 64

/* The batch of `values` after a copy of `head` (none: head_len 0), in one new bytes object; None
   (new reference) for what rc_encode_batch does not encode; NULL with an exception set. */
static PyObject *encode_after(const char *head, Py_ssize_t head_len, PyObject *values, long long ts,
                              long long base_offset, long long leader_epoch, long long producer_id,
                              long long producer_epoch, long long base_sequence)
{
    PyObject *seq = PySequence_Fast(values, "values must be iterable");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = NULL;
    if (n < 1 || n > RC_RECORD_COUNT_MAX) goto none;
    /* The values' lengths, and one blob of them: rc_encode_batch reads the values in order, so a
       single value is its own blob (no copy); several are joined. */
    int64_t lens_stack[VALUES_ON_STACK];
    int64_t *lens = n <= VALUES_ON_STACK ? lens_stack : PyMem_Malloc((size_t)n * sizeof(int64_t));
    if (!lens) {
        PyErr_NoMemory();
        goto done;
    }
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(items[i])) goto none_free;
        lens[i] = PyBytes_GET_SIZE(items[i]);
        total += (size_t)lens[i];
    }
    const unsigned char *blob;
    PyObject *joined = NULL;
    if (n == 1) {
        blob = (const unsigned char *)PyBytes_AS_STRING(items[0]);
    } else {
        joined = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
        if (!joined) goto free;
        char *w = PyBytes_AS_STRING(joined);
        for (Py_ssize_t i = 0; i < n; i++) {
            memcpy(w, PyBytes_AS_STRING(items[i]), (size_t)lens[i]);
            w += lens[i];
        }
        blob = (const unsigned char *)PyBytes_AS_STRING(joined);
    }
    size_t cap = RC_BATCH_HEADER_SIZE + total + (size_t)n * RECORD_OVERHEAD_MAX;
    out = PyBytes_FromStringAndSize(NULL, head_len + (Py_ssize_t)cap);
    if (out) {
        unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
        if (head_len) memcpy(w, head, (size_t)head_len);
        int64_t size = rc_encode_batch(w + head_len, cap, (uint32_t)n, blob, total, lens, ts, base_offset,
                                       leader_epoch, producer_id, producer_epoch, base_sequence);
        if (size < 0) {
            Py_CLEAR(out); /* refused (a field out of its width): Python's path says why */
        } else if (_PyBytes_Resize(&out, head_len + (Py_ssize_t)size) < 0) {
            out = NULL;
        }
    }
    Py_XDECREF(joined);
    if (!out && !PyErr_Occurred()) goto none_free;
free:
    if (lens != lens_stack) PyMem_Free(lens);
done:
    Py_DECREF(seq);
    return out;
none_free:
    if (lens != lens_stack) PyMem_Free(lens);
none:
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyObject *encode_values(PyObject *self, PyObject *args)
{
    PyObject *values;
    long long ts, base_offset, leader_epoch, producer_id, producer_epoch, base_sequence;
    if (!PyArg_ParseTuple(args, "OLLLLLL", &values, &ts, &base_offset, &leader_epoch, &producer_id,
                          &producer_epoch, &base_sequence)) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
        PyErr_Clear(); /* a field beyond int64: encode_batch's own path says so */
        Py_RETURN_NONE;
    }
    return encode_after(NULL, 0, values, ts, base_offset, leader_epoch, producer_id, producer_epoch,
                        base_sequence);
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* The batch after `head`, and two big-endian u32 fields of the head filled in: at `total_at` the
   size of everything after that field, at `length_at` the batch's size. A request frame around
   the batch in one bytes object, for a one-record send: the head's layout stays the caller's. */
static PyObject *encode_framed(PyObject *self, PyObject *args)
{
    const char *head;
    Py_ssize_t head_len, total_at, length_at;
    PyObject *values;
    long long ts, base_offset, leader_epoch, producer_id, producer_epoch, base_sequence;
    if (!PyArg_ParseTuple(args, "y#nnOLLLLLL", &head, &head_len, &total_at, &length_at, &values, &ts,
                          &base_offset, &leader_epoch, &producer_id, &producer_epoch, &base_sequence)) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (total_at < 0 || total_at > head_len - 4 || length_at < 0 || length_at > head_len - 4) {
        PyErr_SetString(PyExc_ValueError, "the length fields must lie within the head");
        return NULL;
    }
    PyObject *out = encode_after(head, head_len, values, ts, base_offset, leader_epoch, producer_id,
                                 producer_epoch, base_sequence);
    if (!out || out == Py_None) return out;
    Py_ssize_t size = PyBytes_GET_SIZE(out);
    if (size - total_at - 4 > (Py_ssize_t)UINT32_MAX) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    put_be32(w + length_at, (uint32_t)(size - head_len));
    put_be32(w + total_at, (uint32_t)(size - total_at - 4));
    return out;
}

static PyMethodDef module_methods[] = {
    {"encode_values", encode_values, METH_VARARGS,
     "encode_values(values, timestamp, base_offset, leader_epoch, producer_id, producer_epoch, "
     "base_sequence): the batch's bytes, or None for what it does not encode."},
    {"encode_framed", encode_framed, METH_VARARGS,
     "encode_framed(head, total_at, length_at, values, timestamp, base_offset, leader_epoch, "
     "producer_id, producer_epoch, base_sequence): head + the batch in one bytes, the big-endian "
     "u32 at total_at set to the size after it and the one at length_at to the batch's; None for "
     "what encode_values does not encode."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef batch_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "native._batch",
    .m_doc = "A whole RecordBatch v2 of plain values in one call (see native/batch.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__batch(void)
{
    PyObject *m = PyModule_Create(&batch_module);
    if (!m) return NULL;
    /* The header layout this build writes, for ringlog_proto.batch to check against its own. */
    PyObject *layout = Py_BuildValue(
        "{sisisisisisisisisisisisisisisisisi}", "HEADER_SIZE", RC_BATCH_HEADER_SIZE, "CRC_START",
        RC_BATCH_CRC_START, "MAGIC", RC_BATCH_MAGIC, "RECORD_COUNT_MAX", RC_RECORD_COUNT_MAX,
        "base_offset", RC_AT_BASE_OFFSET, "batch_length", RC_AT_LENGTH, "partition_leader_epoch",
        RC_AT_LEADER_EPOCH, "magic", RC_AT_MAGIC, "crc", RC_AT_CRC, "attributes", RC_AT_ATTRIBUTES,
        "last_offset_delta", RC_AT_LAST_DELTA, "base_timestamp", RC_AT_BASE_TS, "max_timestamp",
        RC_AT_MAX_TS, "producer_id", RC_AT_PRODUCER_ID, "producer_epoch", RC_AT_PRODUCER_EPOCH,
        "base_sequence", RC_AT_BASE_SEQUENCE, "record_count", RC_AT_COUNT);
    if (!layout || PyModule_AddObject(m, "LAYOUT", layout) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
