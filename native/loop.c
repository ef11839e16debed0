/* native._loop: the io_uring loop's per-completion step in C (broker/backends/uring_loop.py).

Why it exists: reaping a pass's completions and calling each one's continuation cost ~4 us of
Python per pass for a single completion (three cffi unpacks, a zip, a list of tuples, a dict
lookup each), more than the continuation of a small request itself. Here it is one C call: the
CQEs are copied out of the ring and marked seen, the references the ring kept for each final one
are dropped, then each continuation is looked up and called.

Rules this module keeps (those of native/ring.py and uring_loop.py, which it serves):
- A batch is reaped whole *before* any continuation runs, and no ring pointer is used after that:
  a continuation may prep, submit or even close the ring.
- A final CQE (no IORING_CQE_F_MORE) drops its user_data from the ring's references *at reap*,
  for the whole batch, and its continuation is popped from the loop's table when it runs; a CQE
  with F_MORE leaves both. user_data without a continuation is skipped (an op nobody waits for).
- `rest` is how many completions of the batch being run are still to run (the loop's `quiet()`).
- A continuation that raises ends the call with its exception; the batch's remaining completions
  are not run (as the Python loop's was: the exception ends the worker's pass).

Built by setup.py (`pip install -e .`), linked against liburing like native._uring; the ring is
passed as the address of native._uring's `struct io_uring` (`Ring.address`, 0 once closed).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <liburing.h>

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity; /* the most completions one `run` reaps */
    Py_ssize_t rest;     /* completions of the batch being run not yet run */
    uint64_t *ud;
    int32_t *res;
    uint32_t *flags;
} Completions;

static void Completions_dealloc(Completions *self)
{
    PyMem_Free(self->ud);
    PyMem_Free(self->res);
    PyMem_Free(self->flags);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Completions_init(Completions *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"capacity", NULL};
    Py_ssize_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &capacity)) return -1;
    if (capacity < 1 || capacity > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "capacity must be 1..1048576");
        return -1;
    }
    PyMem_Free(self->ud);
    PyMem_Free(self->res);
    PyMem_Free(self->flags);
    self->ud = PyMem_New(uint64_t, capacity);
    self->res = PyMem_New(int32_t, capacity);
    self->flags = PyMem_New(uint32_t, capacity);
    if (!self->ud || !self->res || !self->flags) {
        PyErr_NoMemory();
        return -1;
    }
    self->capacity = capacity;
    self->rest = 0;
    return 0;
}

/* Copy up to `max` CQEs out of the ring and mark them seen: the one reap of every Ring. */
static Py_ssize_t reap(struct io_uring *ring, Completions *self, Py_ssize_t max)
{
    struct io_uring_cqe *cqes[64];
    Py_ssize_t total = 0;
    while (total < max) {
        unsigned want = max - total > 64 ? 64 : (unsigned)(max - total);
        unsigned n = io_uring_peek_batch_cqe(ring, cqes, want);
        for (unsigned i = 0; i < n; i++) {
            self->ud[total + i] = cqes[i]->user_data;
            self->res[total + i] = cqes[i]->res;
            self->flags[total + i] = cqes[i]->flags;
        }
        io_uring_cq_advance(ring, n);
        total += n;
        if (n < want) break;
    }
    return total;
}

/* dict.pop(key, None) with the public API of 3.11 (PyDict_Pop is 3.13's): 1 and a new reference
   in *value when found, 0 and NULL when not, -1 on error. */
static int dict_pop(PyObject *dict, PyObject *key, PyObject **value)
{
    PyObject *item = PyDict_GetItemWithError(dict, key); /* borrowed */
    *value = NULL;
    if (!item) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(item);
    if (PyDict_DelItem(dict, key) < 0) {
        Py_DECREF(item);
        return -1;
    }
    *value = item;
    return 1;
}

/* The batch's CQEs reaped from the ring at `address` into self's arrays (at most `max`, and at
   most the capacity), and the references in `refs` of every final one dropped, as both `run` and
   `reap` begin: the count, or -1 with an exception set. */
static Py_ssize_t reap_and_release(Completions *self, PyObject *address_obj, PyObject *refs,
                                   PyObject *max_obj)
{
    uintptr_t address = (uintptr_t)PyLong_AsUnsignedLongLong(address_obj);
    if (address == (uintptr_t)-1 && PyErr_Occurred()) return -1;
    Py_ssize_t max = PyLong_AsSsize_t(max_obj);
    if (max == -1 && PyErr_Occurred()) return -1;
    if (max > self->capacity) max = self->capacity;
    self->rest = 0;
    if (!address || max <= 0) return 0;
    Py_ssize_t n = reap((struct io_uring *)address, self, max);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (self->flags[i] & IORING_CQE_F_MORE) continue;
        PyObject *key = PyLong_FromUnsignedLongLong(self->ud[i]);
        if (!key) return -1;
        PyObject *gone = NULL;
        int rc = dict_pop(refs, key, &gone);
        Py_DECREF(key);
        Py_XDECREF(gone);
        if (rc < 0) return -1;
    }
    return n;
}

/* run(ring_address, ops, refs, max) -> the number of completions reaped (see the module rules). */
static PyObject *Completions_run(Completions *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "run(ring_address, ops, refs, max)");
        return NULL;
    }
    PyObject *ops = args[1], *refs = args[2];
    if (!PyDict_CheckExact(ops) || !PyDict_CheckExact(refs)) {
        PyErr_SetString(PyExc_TypeError, "ops and refs must be dicts");
        return NULL;
    }
    Py_ssize_t n = reap_and_release(self, args[0], refs, args[3]);
    if (n < 0) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        self->rest = n - i - 1;
        uint32_t flags = self->flags[i];
        PyObject *key = PyLong_FromUnsignedLongLong(self->ud[i]);
        if (!key) return NULL;
        PyObject *callback = NULL;
        if (flags & IORING_CQE_F_MORE) {
            callback = PyDict_GetItemWithError(ops, key); /* borrowed */
            Py_XINCREF(callback);
            Py_DECREF(key);
            if (!callback && PyErr_Occurred()) return NULL;
        } else {
            int rc = dict_pop(ops, key, &callback);
            Py_DECREF(key);
            if (rc < 0) return NULL;
        }
        if (!callback) continue;
        PyObject *call_args[2];
        call_args[0] = PyLong_FromLong(self->res[i]);
        call_args[1] = PyLong_FromUnsignedLong(flags);
        PyObject *result = NULL;
        if (call_args[0] && call_args[1])
            result = PyObject_Vectorcall(callback, call_args, 2, NULL);
        Py_XDECREF(call_args[0]);
        Py_XDECREF(call_args[1]);
        Py_DECREF(callback);
        if (!result) return NULL;
        Py_DECREF(result);
    }
    self->rest = 0;
    return PyLong_FromSsize_t(n);
}

/* reap(ring_address, refs, max) -> [(user_data, res, flags), ...]: the batch, no continuation
   run (Ring.completions: a caller that dispatches them itself). */
static PyObject *Completions_reap(Completions *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "reap(ring_address, refs, max)");
        return NULL;
    }
    if (!PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "refs must be a dict");
        return NULL;
    }
    Py_ssize_t n = reap_and_release(self, args[0], args[1], args[2]);
    if (n < 0) return NULL;
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = Py_BuildValue("(KiI)", (unsigned long long)self->ud[i], (int)self->res[i],
                                       (unsigned int)self->flags[i]);
        if (!item) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *Completions_get_rest(Completions *self, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(self->rest);
}

static PyMethodDef Completions_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Completions_run, METH_FASTCALL,
     "run(ring_address, ops, refs, max) -> int: reap up to max CQEs, drop the references of the "
     "final ones from refs, then call ops[user_data](res, flags) for each (popped when final)."},
    {"reap", (PyCFunction)(void (*)(void))Completions_reap, METH_FASTCALL,
     "reap(ring_address, refs, max) -> [(user_data, res, flags)]: reap up to max CQEs and drop "
     "the references of the final ones from refs, running nothing."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Completions_getset[] = {
    {"rest", (getter)Completions_get_rest, NULL, "completions of the batch being run not yet run",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CompletionsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native._loop.Completions",
    .tp_doc = "A ring's batch of completions: reaped (and run, for the loop) in one C call.",
    .tp_basicsize = sizeof(Completions),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Completions_init,
    .tp_dealloc = (destructor)Completions_dealloc,
    .tp_methods = Completions_methods,
    .tp_getset = Completions_getset,
};

static struct PyModuleDef loop_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "native._loop",
    .m_doc = "The io_uring loop's per-completion step in C (see native/loop.c).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__loop(void)
{
    if (PyType_Ready(&CompletionsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&loop_module);
    if (!m) return NULL;
    Py_INCREF(&CompletionsType);
    if (PyModule_AddObject(m, "Completions", (PyObject *)&CompletionsType) < 0) {
        Py_DECREF(&CompletionsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
