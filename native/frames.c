/* native._frames: ringlog_proto.frames.FrameDecoder in C, for the broker's connections, and
FrameReader in C (`Reader`, below), for the clients' connections.

Why it exists: every request a connection sends is fed, split and wrapped in a `Frame` here; in
Python that is ~3 us per small frame (and a frozen dataclass's __init__ is most of a microsecond
of it), on every request of both backends, and ~2 us of every response a client reads.

Rules this module keeps:
- Each is its Python class's twin, not a variant: the same frames for the same bytes, the
  same `ProtocolError` messages at the same points, the same bounds (tests/ringlog_proto checks both
  against each other on generated streams). Python's stays the reference and the fallback.
- The frame layout is ringlog_proto/frames.py's; this module's copies of its constants are
  checked against it when ringlog_proto.frames imports it (a mismatch raises there).
- `configure(Frame, NEED_DATA, ProtocolError)` is called once, by ringlog_proto.frames, before any
  decoder runs. A `Frame` is built the way object.__setattr__ would set its slots (its fields'
  member descriptors are found by name at configure and must be slots of object type); its
  dataclass __init__ is not run.
- Decoder's buffering is `StreamDecoder`'s: the buffer grows only as bytes arrive (never to a
  declared length), and what frames were taken from is let go when `next_frame` runs out of whole
  frames (freed when nothing is left, moved to the front otherwise, the allocation shrunk when it
  is mostly empty). Reader's is `FrameReader`'s (see its section).
- Decoder also lends its space to a receive, which FrameDecoder does not (a C-only facility, for
  the io_uring backend's recv; section "Lending" below): the same frames and errors as feeding
  the same bytes, without the copy from a receive buffer into the decoder's, and a large body is
  a read-only view of where it was received rather than a copy (section "Bodies in place").
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MAGIC 0x52
#define FRAME_VERSION 1
#define HEADER_SIZE 24
#define LENGTH_SIZE 4
#define MAGIC_OFFSET 4
#define FLAGS_KNOWN 0x0001
#define SHRINK_ABOVE (64 * 1024) /* an allocation this big and mostly empty is shrunk */

#define N_FIELDS 7
static const char *const FIELDS[N_FIELDS] = {
    "api_key", "api_version", "flags", "correlation_id", "topic_id", "partition", "body",
};
static PyTypeObject *frame_type = NULL;
static Py_ssize_t frame_offsets[N_FIELDS];
static PyObject *need_data = NULL;
static PyObject *protocol_error = NULL;

#define VIEW_MIN_BYTES (8 * 1024) /* a lending decoder's body this large may be a view ... */
#define VIEW_CAP_RATIO 8           /* ... of an allocation at most this many times its size */

/* Memory that frame bodies view (section "Bodies in place"): freed when the last view and the
   decoder have let it go. */
typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t cap;
    Py_ssize_t exports;           /* bodies viewing it, not yet released */
    Py_ssize_t next_at, next_len; /* what the next export views: set just before it is made */
} Chunk;

typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t cap;
    Chunk *chunk; /* owns `buf` once a body viewed it (else the decoder does); NULL before */
    Chunk *spare; /* the allocation left to the views, taken back once they are gone */
    Py_ssize_t pos; /* bytes before pos were taken as frames */
    Py_ssize_t end; /* bytes held: buf[pos:end] */
    Py_ssize_t max_frame_bytes;
    Py_ssize_t lent;    /* Decoder: bytes after `end` offered by the last `buffer()` */
    Py_ssize_t exports; /* views of the buffer not yet released (a Decoder's lent space, a Reader's) */
    int lending;        /* Decoder: `buffer()` was called: its buffering rules apply */
} Decoder;

static inline uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint16_t be16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }

/* The offsets of `names`' slots in `type` (a slots class without a __dict__, whose fields are
   object slots), into `offsets`; -1 with TypeError raised otherwise. */
static int slot_offsets(PyObject *type, const char *const *names, int n, Py_ssize_t *offsets)
{
    PyTypeObject *t = (PyTypeObject *)type;
    if (t->tp_dictoffset != 0 || t->tp_itemsize != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a slots class without a __dict__", t->tp_name);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *descr = PyObject_GetAttrString(type, names[i]);
        if (!descr) return -1;
        int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type)
                 && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (ok) offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", t->tp_name, names[i]);
            return -1;
        }
    }
    return 0;
}

/* An instance of `type` with its slots at `offsets` set to `values` (new references, taken
   over whatever happens; NULL among them means an error is set), without its __init__. */
static PyObject *make_slots(PyTypeObject *type, const Py_ssize_t *offsets, PyObject **values, int n)
{
    PyObject *made = NULL;
    for (int i = 0; i < n; i++)
        if (!values[i]) goto fail;
    made = type->tp_alloc(type, 0);
    if (!made) goto fail;
    for (int i = 0; i < n; i++) *(PyObject **)((char *)made + offsets[i]) = values[i];
    return made;
fail:
    for (int i = 0; i < n; i++) Py_XDECREF(values[i]);
    return NULL;
}

static PyObject *configure(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *type, *nd, *err;
    if (!PyArg_ParseTuple(args, "O!OO", &PyType_Type, &type, &nd, &err)) return NULL;
    if (!PyType_Check(err) || !PyType_IsSubtype((PyTypeObject *)err, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "ProtocolError must be an Exception class");
        return NULL;
    }
    Py_ssize_t offsets[N_FIELDS];
    if (slot_offsets(type, FIELDS, N_FIELDS, offsets) < 0) return NULL;
    Py_INCREF(type);
    Py_XSETREF(frame_type, (PyTypeObject *)type);
    memcpy(frame_offsets, offsets, sizeof(offsets));
    Py_INCREF(nd);
    Py_XSETREF(need_data, nd);
    Py_INCREF(err);
    Py_XSETREF(protocol_error, err);
    Py_RETURN_NONE;
}

static PyObject *protocol_error_raise(const char *message)
{
    PyErr_SetString(protocol_error, message);
    return NULL;
}

/* A Frame with these fields and `body` (a new reference, NULL on error: the frame's is taken
   over either way), its slots set in place. */
static PyObject *make_frame(const unsigned char *h, PyObject *body)
{
    PyObject *values[N_FIELDS] = {
        PyLong_FromLong(be16(h + 6)),
        PyLong_FromLong(be16(h + 8)),
        PyLong_FromLong(be16(h + 10)),
        PyLong_FromUnsignedLong(be32(h + 12)),
        PyLong_FromUnsignedLong(be32(h + 16)),
        PyLong_FromUnsignedLong(be32(h + 20)),
        body,
    };
    return make_slots(frame_type, frame_offsets, values, N_FIELDS);
}

/* FrameDecoder._check_prefix: the magic and the version, as soon as those bytes are here. */
static int check_prefix(const unsigned char *h)
{
    char message[160];
    if (h[MAGIC_OFFSET] != MAGIC) {
        snprintf(message, sizeof(message),
                 "bad frame magic 0x%02x (expected 0x%02x): not a ringlog client?", h[MAGIC_OFFSET],
                 MAGIC);
        protocol_error_raise(message);
        return -1;
    }
    if (h[5] != FRAME_VERSION) {
        snprintf(message, sizeof(message),
                 "unsupported frame version %u (this broker speaks %d)", h[5], FRAME_VERSION);
        protocol_error_raise(message);
        return -1;
    }
    return 0;
}

/* ---- Bodies in place

A lending decoder's frame body of VIEW_MIN_BYTES or more, and at least 1/VIEW_CAP_RATIO of the
allocation it was received in, is a read-only memoryview of those bytes, not a copy (a 64 KiB
batch copied into a new bytes object: ~5% of an ingesting io_uring worker's CPU). The allocation
then belongs to a Chunk, which the views keep alive. Nothing the decoder does afterwards writes
into bytes a live view sees, or moves them: where it would (the partial frame moved to the front,
a new size, a receive into space before the end), it first takes other memory for what it holds
(`unpin`): its spare (the allocation it left to views earlier, once they are all gone) or a new
one, and leaves the current to the views. A pinned allocation is at most VIEW_CAP_RATIO times a
body that pins it (the bodies are counted in the connection's budget, the allocation is not), and
a decoder keeps at most one spare, dropped when its receives shrink (a quiet connection). In a
steady ingest the bodies of one receive are gone by the next, or the one after: two allocations
take turns, and nothing is allocated. */

static void Chunk_dealloc(Chunk *self)
{
    PyMem_Free(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Chunk_getbuffer(Chunk *self, Py_buffer *view, int flags)
{
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->buf + self->next_at, self->next_len, 1, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void Chunk_releasebuffer(Chunk *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

static PyBufferProcs Chunk_as_buffer = {
    .bf_getbuffer = (getbufferproc)Chunk_getbuffer,
    .bf_releasebuffer = (releasebufferproc)Chunk_releasebuffer,
};

static PyTypeObject ChunkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native._frames.Chunk",
    .tp_doc = "Received bytes that frame bodies view (see native/frames.c).",
    .tp_basicsize = sizeof(Chunk),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Chunk_dealloc,
    .tp_as_buffer = &Chunk_as_buffer,
};

static inline int pinned(Decoder *self) { return self->chunk && self->chunk->exports; }

/* The decoder's memory resized to `cap`, wherever it is (no body views it). */
static int set_cap(Decoder *self, Py_ssize_t cap)
{
    char *buf = PyMem_Realloc(self->buf, cap);
    if (!buf) {
        PyErr_NoMemory();
        return -1;
    }
    self->buf = buf;
    self->cap = cap;
    if (self->chunk) {
        self->chunk->buf = buf;
        self->chunk->cap = cap;
    }
    return 0;
}

/* Bodies view the decoder's memory: what it holds goes to the front of other memory of `cap`
   bytes (the spare when no body views it any more, else a new allocation), and the current is
   left to the views (kept as the spare). */
static int unpin(Decoder *self, Py_ssize_t cap)
{
    Py_ssize_t held = self->end - self->pos;
    if (cap < held) cap = held;
    Chunk *spare = self->spare, *now = NULL;
    char *buf;
    if (spare && !spare->exports) {
        if (spare->cap != cap) {
            buf = PyMem_Realloc(spare->buf, cap);
            if (!buf) {
                PyErr_NoMemory();
                return -1;
            }
            spare->buf = buf;
            spare->cap = cap;
        }
        now = spare;
        buf = spare->buf;
    } else {
        buf = PyMem_Malloc(cap);
        if (!buf) {
            PyErr_NoMemory();
            return -1;
        }
        Py_XDECREF(spare); /* still viewed: its views free it */
    }
    if (held) memcpy(buf, self->buf + self->pos, held);
    self->spare = self->chunk; /* the decoder's reference moves: taken back once the views go */
    self->chunk = now;
    self->buf = buf;
    self->cap = cap;
    self->pos = 0;
    self->end = held;
    return 0;
}

/* A read-only view of `length` bytes at `at` of the decoder's memory, which a Chunk owns from now. */
static PyObject *body_view(Decoder *self, const unsigned char *at, Py_ssize_t length)
{
    Chunk *chunk = self->chunk;
    if (!chunk) {
        chunk = PyObject_New(Chunk, &ChunkType);
        if (!chunk) return NULL;
        chunk->buf = self->buf;
        chunk->cap = self->cap;
        chunk->exports = 0;
        self->chunk = chunk;
    }
    chunk->next_at = (const char *)at - self->buf;
    chunk->next_len = length;
    return PyMemoryView_FromObject((PyObject *)chunk);
}

static void Decoder_dealloc(Decoder *self)
{
    if (self->chunk)
        Py_DECREF(self->chunk); /* it owns the memory (and may outlive us in views) */
    else
        PyMem_Free(self->buf);
    Py_XDECREF(self->spare);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Decoder_init(Decoder *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_frame_bytes", NULL};
    Py_ssize_t max_frame_bytes = 8 * 1024 * 1024;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n", kwlist, &max_frame_bytes)) return -1;
    if (!frame_type) {
        PyErr_SetString(PyExc_RuntimeError, "native._frames.configure() was not called");
        return -1;
    }
    if (max_frame_bytes < HEADER_SIZE) {
        PyErr_SetString(PyExc_ValueError, "max_frame_bytes is below the frame header's size");
        return -1;
    }
    self->max_frame_bytes = max_frame_bytes;
    return 0;
}

static PyObject *lent_error(void)
{
    PyErr_SetString(PyExc_BufferError, "the decoder's space is lent to a receive (a view is held)");
    return NULL;
}

static PyObject *Decoder_feed(Decoder *self, PyObject *data)
{
    if (self->exports) return lent_error();
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n = view.len;
    if (pinned(self) && unpin(self, self->end - self->pos + n) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (self->pos && self->pos >= self->end / 2) { /* compact: amortised O(1) per byte */
        memmove(self->buf, self->buf + self->pos, self->end - self->pos);
        self->end -= self->pos;
        self->pos = 0;
    }
    if (self->end + n > self->cap) {
        Py_ssize_t want = self->end + n;
        Py_ssize_t grown = self->cap + (self->cap >> 2);
        if (grown > want) want = grown;
        if (set_cap(self, want) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    memcpy(self->buf + self->end, view.buf, n);
    self->end += n;
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* StreamDecoder._need_data: let go of the frames taken, return NEED_DATA. A decoder that lends
   leaves that to the next `buffer()` (which compacts and sizes the allocation for the receive
   it lends to), and keeps its allocation meanwhile: freed or shrunk here, it would be allocated
   again at every receive. */
static PyObject *need_more(Decoder *self)
{
    if (self->lending) {
        if (self->pos == self->end && !self->exports) self->pos = self->end = 0;
    } else if (self->pos) { /* (no body views a decoder that never lent: no chunk) */
        Py_ssize_t held = self->end - self->pos;
        if (!held) {
            PyMem_Free(self->buf);
            self->buf = NULL;
            self->cap = 0;
        } else {
            memmove(self->buf, self->buf + self->pos, held);
            if (self->cap > SHRINK_ABOVE && held < self->cap / 4) {
                char *buf = PyMem_Realloc(self->buf, held);
                if (buf) {
                    self->buf = buf;
                    self->cap = held;
                }
            }
        }
        self->end = held;
        self->pos = 0;
    }
    Py_INCREF(need_data);
    return need_data;
}

/* FrameDecoder._parse: the whole frame at `pos` (and `pos` moved past it), or NULL: with `*need`
   set when more bytes must come first, else with the ProtocolError raised. */
static PyObject *take_frame(Decoder *self, int *need)
{
    *need = 0;
    Py_ssize_t held = self->end - self->pos;
    const unsigned char *h = (const unsigned char *)self->buf + self->pos;
    if (held < HEADER_SIZE) {
        if (held >= 6 && check_prefix(h) < 0) return NULL;
        *need = 1;
        return NULL;
    }
    if (check_prefix(h) < 0) return NULL;
    uint32_t length = be32(h);
    uint16_t flags = be16(h + 10);
    char message[160];
    if (length < HEADER_SIZE - LENGTH_SIZE) {
        snprintf(message, sizeof(message), "frame length %u is shorter than the %d-byte header",
                 length, HEADER_SIZE);
        return protocol_error_raise(message);
    }
    if ((long long)length + LENGTH_SIZE > (long long)self->max_frame_bytes) {
        snprintf(message, sizeof(message), "frame of %lld bytes exceeds the maximum %lld",
                 (long long)length + LENGTH_SIZE, (long long)self->max_frame_bytes);
        return protocol_error_raise(message);
    }
    if (flags & ~FLAGS_KNOWN) {
        snprintf(message, sizeof(message), "unknown frame flags 0x%04x", flags);
        return protocol_error_raise(message);
    }
    Py_ssize_t size = (Py_ssize_t)length + LENGTH_SIZE;
    if (held < size) {
        *need = 1;
        return NULL;
    }
    Py_ssize_t body_length = size - HEADER_SIZE;
    PyObject *body;
    if (self->lending && body_length >= VIEW_MIN_BYTES && body_length * VIEW_CAP_RATIO >= self->cap)
        body = body_view(self, h + HEADER_SIZE, body_length);
    else
        body = PyBytes_FromStringAndSize((const char *)h + HEADER_SIZE, body_length);
    PyObject *frame = make_frame(h, body);
    if (frame) self->pos += size;
    return frame;
}

static PyObject *Decoder_next_frame(Decoder *self, PyObject *unused)
{
    (void)unused;
    int need;
    PyObject *frame = take_frame(self, &need);
    return frame || !need ? frame : need_more(self);
}

static PyObject *Decoder_get_buffered(Decoder *self, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(self->end - self->pos);
}

/* ---- Lending

`buffer(n)` is a writable memoryview of exactly `n` bytes after those held, for a receive to
write into; `received(k)` counts the first `k` of them as arrived (k <= n, and at most what is
still lent: each call moves the end). While a view of the space is held (the receive in flight)
nothing may move the buffer: `feed()` and another `buffer()` raise BufferError, and `next_frame`
takes frames but lets go of nothing until the view is released. `buffer(n)` itself lets go of
the frames taken (the partial frame after them moved to the front) and makes room for what is
held plus `n`: an eighth more when it must grow (the next partial frame then fits without a
move), exactly that when the allocation is over SHRINK_ABOVE and half as large again as needed
(a quiet connection's receive asks for a small buffer again: a stalled one holds what it sent
plus that). Between receives a decoder that lends keeps its allocation (`next_frame` neither
frees nor shrinks it): what it holds is then at most what it held plus the last receive's
space, which that receive needed anyway. */

static PyObject *Decoder_buffer(Decoder *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1) {
        PyErr_Format(PyExc_ValueError, "buffer(%zd): lend at least one byte", n);
        return NULL;
    }
    if (self->exports) return lent_error();
    self->lending = 1;
    Py_ssize_t held = self->end - self->pos;
    if (n > PY_SSIZE_T_MAX / 2 - held) return PyErr_NoMemory();
    Py_ssize_t need = held + n, cap = self->cap;
    if (need > cap)
        cap = need + (need >> 3); /* room for the next partial frame, without a move each time */
    else if (cap > SHRINK_ABOVE && cap > need + (need >> 1))
        cap = need; /* a smaller receive (a quiet connection's) gets a smaller allocation */
    if (cap < self->cap) Py_CLEAR(self->spare);
    if (pinned(self)) { /* bodies view this memory: the receive goes to other memory */
        if (unpin(self, cap) < 0) return NULL;
    } else {
        if (self->pos) {
            if (held) memmove(self->buf, self->buf + self->pos, held);
            self->pos = 0;
            self->end = held;
        }
        if (cap != self->cap && set_cap(self, cap) < 0) return NULL;
    }
    self->lent = n;
    return PyMemoryView_FromObject((PyObject *)self);
}

static int Decoder_getbuffer(Decoder *self, Py_buffer *view, int flags)
{
    if (!self->lent) {
        PyErr_SetString(PyExc_BufferError, "nothing is lent: call buffer(n) first");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->buf + self->end, self->lent, 0, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void Decoder_releasebuffer(Decoder *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

static PyObject *Decoder_received(Decoder *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > self->lent) {
        PyErr_Format(PyExc_ValueError, "received(%zd): %zd bytes are lent", n, self->lent);
        return NULL;
    }
    self->end += n;
    self->lent -= n;
    Py_RETURN_NONE;
}

static PyMethodDef Decoder_methods[] = {
    {"feed", (PyCFunction)Decoder_feed, METH_O, "Buffer bytes of the stream (any pieces)."},
    {"next_frame", (PyCFunction)Decoder_next_frame, METH_NOARGS,
     "The next whole Frame, or NEED_DATA; raises ProtocolError for bytes that cannot be framed."},
    {"buffer", (PyCFunction)Decoder_buffer, METH_O,
     "buffer(n): n writable bytes after those held, lent to a receive (see native/frames.c)."},
    {"received", (PyCFunction)Decoder_received, METH_O,
     "received(k): k bytes of the lent space were written."},
    {NULL, NULL, 0, NULL},
};

static PyBufferProcs Decoder_as_buffer = {
    .bf_getbuffer = (getbufferproc)Decoder_getbuffer,
    .bf_releasebuffer = (releasebufferproc)Decoder_releasebuffer,
};

static PyMemberDef Decoder_members[] = {
    {"max_frame_bytes", T_PYSSIZET, offsetof(Decoder, max_frame_bytes), READONLY,
     "the largest frame accepted, header included"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Decoder_getset[] = {
    {"buffered", (getter)Decoder_get_buffered, NULL,
     "bytes received and not yet returned as frames", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native._frames.Decoder",
    .tp_doc = "ringlog_proto.frames.FrameDecoder in C (see native/frames.c).",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_methods = Decoder_methods,
    .tp_members = Decoder_members,
    .tp_getset = Decoder_getset,
    .tp_as_buffer = &Decoder_as_buffer,
};

/* ---- Reader: ringlog_proto.frames.FrameReader in C ----

The buffer is kept for the reader's life and grown to the largest frame met, never shrunk; a
transport receives straight into it: `buffer()` is a writable memoryview of the space after the
bytes held (at least READ_MIN), `received(n)` counts what was written there. The view is this
object's own buffer export: while one is held, the buffer cannot move to a larger allocation, and
`buffer()` or `feed()` that would need one raises BufferError (FrameReader's contract: release the
view, as a transport does, before the next call). */

#define READ_MIN (64 * 1024)

typedef struct {
    Decoder d; /* the fields, frame parsing, views count and attributes of a Decoder; its
                  buffering rules are not used */
} Reader;

static void Reader_dealloc(Reader *self)
{
    PyMem_Free(self->d.buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Reader_init(Reader *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_frame_bytes", "size", NULL};
    Py_ssize_t max_frame_bytes = 8 * 1024 * 1024, size = 64 * 1024;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|nn", kwlist, &max_frame_bytes, &size)) return -1;
    if (!frame_type) {
        PyErr_SetString(PyExc_RuntimeError, "native._frames.configure() was not called");
        return -1;
    }
    if (max_frame_bytes < HEADER_SIZE || size < 0) {
        PyErr_SetString(PyExc_ValueError, "max_frame_bytes below the frame header's size, or a negative size");
        return -1;
    }
    if (self->d.buf || self->d.exports) {
        PyErr_SetString(PyExc_RuntimeError, "a Reader is initialised once");
        return -1;
    }
    self->d.buf = PyMem_Malloc(size ? size : 1);
    if (!self->d.buf) {
        PyErr_NoMemory();
        return -1;
    }
    self->d.cap = size;
    self->d.max_frame_bytes = max_frame_bytes;
    return 0;
}

/* FrameReader.buffer's making of room: at least `least` (and READ_MIN) bytes free after those
   held, and room for the whole frame whose length is held when it is within the limit. */
static int reader_room(Reader *self, Py_ssize_t least)
{
    Decoder *d = &self->d;
    Py_ssize_t want = least > READ_MIN ? least : READ_MIN;
    if (d->cap - d->end >= want) return 0;
    Py_ssize_t held = d->end - d->pos;
    Py_ssize_t need = held + want;
    if (held >= LENGTH_SIZE) {
        Py_ssize_t size = (Py_ssize_t)be32((const unsigned char *)d->buf + d->pos) + LENGTH_SIZE;
        if (size <= d->max_frame_bytes && size > need) need = size;
    }
    if (need > d->cap) {
        if (self->d.exports) {
            PyErr_SetString(PyExc_BufferError, "a view of the reader's buffer is still held");
            return -1;
        }
        Py_ssize_t doubled = 2 * d->cap, ceiling = d->max_frame_bytes + READ_MIN;
        Py_ssize_t grown = doubled < ceiling ? doubled : ceiling;
        Py_ssize_t cap = need > grown ? need : grown;
        char *buf = PyMem_Malloc(cap);
        if (!buf) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(buf, d->buf + d->pos, held);
        PyMem_Free(d->buf);
        d->buf = buf;
        d->cap = cap;
    } else if (held) {
        memmove(d->buf, d->buf + d->pos, held);
    }
    d->pos = 0;
    d->end = held;
    return 0;
}

static PyObject *Reader_buffer(Reader *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t least = 1;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "buffer() takes at most one argument");
        return NULL;
    }
    if (nargs == 1) {
        least = PyLong_AsSsize_t(args[0]);
        if (least == -1 && PyErr_Occurred()) return NULL;
    }
    if (reader_room(self, least) < 0) return NULL;
    return PyMemoryView_FromObject((PyObject *)self);
}

static int Reader_getbuffer(Reader *self, Py_buffer *view, int flags)
{
    Decoder *d = &self->d;
    if (PyBuffer_FillInfo(view, (PyObject *)self, d->buf + d->end, d->cap - d->end, 0, flags) < 0)
        return -1;
    self->d.exports++;
    return 0;
}

static PyObject *Reader_received(Reader *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > self->d.cap - self->d.end) {
        PyErr_Format(PyExc_ValueError, "received(%zd): the buffer has %zd bytes free", n,
                     self->d.cap - self->d.end);
        return NULL;
    }
    self->d.end += n;
    Py_RETURN_NONE;
}

static PyObject *Reader_feed(Reader *self, PyObject *data)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (reader_room(self, view.len) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    memcpy(self->d.buf + self->d.end, view.buf, view.len);
    self->d.end += view.len;
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *Reader_next_frame(Reader *self, PyObject *unused)
{
    (void)unused;
    int need;
    PyObject *frame = take_frame(&self->d, &need);
    if (frame || !need) return frame;
    if (self->d.pos == self->d.end) self->d.pos = self->d.end = 0; /* nothing held: no copy */
    Py_INCREF(need_data);
    return need_data;
}

static PyMethodDef Reader_methods[] = {
    {"buffer", (PyCFunction)(void (*)(void))Reader_buffer, METH_FASTCALL,
     "buffer(least=1): writable space for at least `least` bytes after those held."},
    {"received", (PyCFunction)Reader_received, METH_O, "received(n): n bytes were written there."},
    {"feed", (PyCFunction)Reader_feed, METH_O, "Copy bytes of the stream in (any pieces)."},
    {"next_frame", (PyCFunction)Reader_next_frame, METH_NOARGS,
     "The next whole Frame, or NEED_DATA; raises ProtocolError for bytes that cannot be framed."},
    {NULL, NULL, 0, NULL},
};

static PyBufferProcs Reader_as_buffer = {
    .bf_getbuffer = (getbufferproc)Reader_getbuffer,
    .bf_releasebuffer = (releasebufferproc)Decoder_releasebuffer, /* the Decoder's count */
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native._frames.Reader",
    .tp_doc = "ringlog_proto.frames.FrameReader in C (see native/frames.c).",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
    .tp_members = Decoder_members, /* a Reader begins with its Decoder: the same offsets */
    .tp_getset = Decoder_getset,
    .tp_as_buffer = &Reader_as_buffer,
};

/* ---- KafkaDecoder: broker/kafka/codec.py's KafkaFrameDecoder in C ----

A Decoder (its buffering, lending and bodies in place, inherited) that takes Kafka requests
instead of our frames: a signed 32-bit size, then the request (api key, api version and
correlation id, signed, first), returned as a KafkaRequest whose `data` is everything after the
size. A connection's Kafka decoder reads its `auth`: once a SaslHandshake v0 has set
`auth.raw_tokens`, what follows is bare size-prefixed SASL tokens, returned as RawSaslToken
(always bytes: at most `raw_max` of them). `configure_kafka(KafkaRequest, RawSaslToken, raw_max)`
is called once, by broker/kafka/codec.py, before any KafkaDecoder is made. */

#define KAFKA_N_FIELDS 4
static const char *const KAFKA_FIELDS[KAFKA_N_FIELDS] = {
    "api_key", "api_version", "correlation_id", "data",
};
static const char *const TOKEN_FIELDS[1] = {"token"};
#define KAFKA_FIXED 12 /* size, api key, api version, correlation id */
static PyTypeObject *kafka_request_type = NULL, *raw_token_type = NULL;
static Py_ssize_t kafka_offsets[KAFKA_N_FIELDS], token_offset[1];
static Py_ssize_t raw_token_max = 0;
static PyObject *raw_tokens_name = NULL;

typedef struct {
    Decoder d;
    PyObject *auth; /* a ConnectionAuth, or None */
} KafkaDecoder;

static PyObject *configure_kafka(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *request, *token;
    Py_ssize_t raw_max;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyType_Type, &request, &PyType_Type, &token, &raw_max))
        return NULL;
    Py_ssize_t offsets[KAFKA_N_FIELDS], toffset[1];
    if (slot_offsets(request, KAFKA_FIELDS, KAFKA_N_FIELDS, offsets) < 0
        || slot_offsets(token, TOKEN_FIELDS, 1, toffset) < 0)
        return NULL;
    if (!raw_tokens_name && !(raw_tokens_name = PyUnicode_InternFromString("raw_tokens"))) return NULL;
    Py_INCREF(request);
    Py_XSETREF(kafka_request_type, (PyTypeObject *)request);
    Py_INCREF(token);
    Py_XSETREF(raw_token_type, (PyTypeObject *)token);
    memcpy(kafka_offsets, offsets, sizeof(offsets));
    token_offset[0] = toffset[0];
    raw_token_max = raw_max;
    Py_RETURN_NONE;
}

static int KafkaDecoder_init(KafkaDecoder *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_frame_bytes", "auth", NULL};
    Py_ssize_t max_frame_bytes;
    PyObject *auth = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|O", kwlist, &max_frame_bytes, &auth)) return -1;
    if (!kafka_request_type || !need_data) {
        PyErr_SetString(PyExc_RuntimeError, "native._frames.configure_kafka() was not called");
        return -1;
    }
    self->d.max_frame_bytes = max_frame_bytes;
    Py_INCREF(auth);
    Py_XSETREF(self->auth, auth);
    return 0;
}

static void KafkaDecoder_dealloc(KafkaDecoder *self)
{
    Py_CLEAR(self->auth);
    Decoder_dealloc(&self->d);
}

static inline int32_t sbe32(const unsigned char *p) { return (int32_t)be32(p); }
static inline int16_t sbe16(const unsigned char *p) { return (int16_t)be16(p); }

/* KafkaFrameDecoder.next_frame's request: as take_frame (the request and `pos` moved past it,
   or NULL with `*need` set, or NULL with ProtocolError raised). */
static PyObject *take_request(Decoder *self, int *need)
{
    *need = 0;
    Py_ssize_t held = self->end - self->pos;
    const unsigned char *h = (const unsigned char *)self->buf + self->pos;
    if (held < LENGTH_SIZE) {
        *need = 1;
        return NULL;
    }
    int32_t size = sbe32(h);
    char message[160];
    if (size < KAFKA_FIXED - LENGTH_SIZE) {
        snprintf(message, sizeof(message), "kafka request size %d is shorter than a request header", size);
        return protocol_error_raise(message);
    }
    if ((long long)size + LENGTH_SIZE > (long long)self->max_frame_bytes) {
        snprintf(message, sizeof(message), "kafka request of %lld bytes exceeds the maximum %lld",
                 (long long)size + LENGTH_SIZE, (long long)self->max_frame_bytes);
        return protocol_error_raise(message);
    }
    Py_ssize_t whole = (Py_ssize_t)size + LENGTH_SIZE;
    if (held < whole) {
        *need = 1;
        return NULL;
    }
    int16_t api_key = sbe16(h + 4), api_version = sbe16(h + 6);
    if (api_key < 0 || api_version < 0) {
        snprintf(message, sizeof(message), "kafka request with api key %d version %d", api_key, api_version);
        return protocol_error_raise(message);
    }
    PyObject *data;
    if (self->lending && size >= VIEW_MIN_BYTES && (Py_ssize_t)size * VIEW_CAP_RATIO >= self->cap)
        data = body_view(self, h + LENGTH_SIZE, size);
    else
        data = PyBytes_FromStringAndSize((const char *)h + LENGTH_SIZE, size);
    PyObject *values[KAFKA_N_FIELDS] = {
        PyLong_FromLong(api_key),
        PyLong_FromLong(api_version),
        PyLong_FromLong(sbe32(h + 8)),
        data,
    };
    PyObject *request = make_slots(kafka_request_type, kafka_offsets, values, KAFKA_N_FIELDS);
    if (request) self->pos += whole;
    return request;
}

/* KafkaFrameDecoder.next_raw: a bare size-prefixed token's bytes, as take_frame. */
static PyObject *take_raw(Decoder *self, Py_ssize_t max_bytes, int *need)
{
    *need = 0;
    Py_ssize_t held = self->end - self->pos;
    const unsigned char *h = (const unsigned char *)self->buf + self->pos;
    if (held < LENGTH_SIZE) {
        *need = 1;
        return NULL;
    }
    int32_t size = sbe32(h);
    if (size < 0 || size > max_bytes) {
        char message[160];
        snprintf(message, sizeof(message), "SASL token of %d bytes (at most %zd)", size, max_bytes);
        return protocol_error_raise(message);
    }
    if (held < (Py_ssize_t)size + LENGTH_SIZE) {
        *need = 1;
        return NULL;
    }
    PyObject *token = PyBytes_FromStringAndSize((const char *)h + LENGTH_SIZE, size);
    if (token) self->pos += (Py_ssize_t)size + LENGTH_SIZE;
    return token;
}

static PyObject *KafkaDecoder_next_raw(KafkaDecoder *self, PyObject *arg)
{
    Py_ssize_t max_bytes = PyLong_AsSsize_t(arg);
    if (max_bytes == -1 && PyErr_Occurred()) return NULL;
    int need;
    PyObject *token = take_raw(&self->d, max_bytes, &need);
    return token || !need ? token : need_more(&self->d);
}

static PyObject *KafkaDecoder_next_frame(KafkaDecoder *self, PyObject *unused)
{
    (void)unused;
    int need;
    PyObject *taken;
    int raw = 0;
    if (self->auth != Py_None) {
        PyObject *flag = PyObject_GetAttr(self->auth, raw_tokens_name);
        if (!flag) return NULL;
        raw = PyObject_IsTrue(flag);
        Py_DECREF(flag);
        if (raw < 0) return NULL;
    }
    if (raw) {
        PyObject *values[1] = {take_raw(&self->d, raw_token_max, &need)};
        if (!values[0]) return need ? need_more(&self->d) : NULL;
        return make_slots(raw_token_type, token_offset, values, 1);
    }
    taken = take_request(&self->d, &need);
    return taken || !need ? taken : need_more(&self->d);
}

static PyMethodDef KafkaDecoder_methods[] = {
    {"next_frame", (PyCFunction)KafkaDecoder_next_frame, METH_NOARGS,
     "The next whole KafkaRequest (a RawSaslToken while auth.raw_tokens), or NEED_DATA; raises "
     "ProtocolError for bytes that cannot be framed."},
    {"next_raw", (PyCFunction)KafkaDecoder_next_raw, METH_O,
     "next_raw(max_bytes): a bare size-prefixed token's bytes, or NEED_DATA."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef KafkaDecoder_members[] = {
    {"auth", T_OBJECT, offsetof(KafkaDecoder, auth), 0,
     "the connection's ConnectionAuth (its raw_tokens is read before each request), or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject KafkaDecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native._frames.KafkaDecoder",
    .tp_doc = "broker/kafka/codec.py's KafkaFrameDecoder in C, a Decoder that lends (see native/frames.c).",
    .tp_basicsize = sizeof(KafkaDecoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_base = &DecoderType,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KafkaDecoder_init,
    .tp_dealloc = (destructor)KafkaDecoder_dealloc,
    .tp_methods = KafkaDecoder_methods,
    .tp_members = KafkaDecoder_members,
};

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Frame, NEED_DATA, ProtocolError): what decoders return and raise."},
    {"configure_kafka", configure_kafka, METH_VARARGS,
     "configure_kafka(KafkaRequest, RawSaslToken, raw_max): what a KafkaDecoder returns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef frames_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "native._frames",
    .m_doc = "ringlog_proto.frames.FrameDecoder in C (see native/frames.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__frames(void)
{
    if (PyType_Ready(&ChunkType) < 0 || PyType_Ready(&DecoderType) < 0 || PyType_Ready(&ReaderType) < 0
        || PyType_Ready(&KafkaDecoderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&frames_module);
    if (!m) return NULL;
    /* The layout this build has, for ringlog_proto.frames to check against its own. */
    PyObject *layout = Py_BuildValue("{sisisisisisisi}", "MAGIC", MAGIC, "FRAME_VERSION", FRAME_VERSION,
                                     "HEADER_SIZE", HEADER_SIZE, "LENGTH_SIZE", LENGTH_SIZE,
                                     "MAGIC_OFFSET", MAGIC_OFFSET, "FLAGS_KNOWN", FLAGS_KNOWN,
                                     "READ_MIN", READ_MIN);
    if (!layout || PyModule_AddObject(m, "LAYOUT", layout) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&KafkaDecoderType);
    if (PyModule_AddObject(m, "KafkaDecoder", (PyObject *)&KafkaDecoderType) < 0) {
        Py_DECREF(&KafkaDecoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
