/* PyFrameReader: a running CPython's Python call stack, read from outside.
 *
 * Given where the interpreter's `_PyRuntime`, `PyCode_Type` and `PyUnicode_Type` are in the
 * target and the structure offsets of its version (collector/pyframes.py has the table),
 * `frames(tid)` walks _PyRuntime.interpreters.head -> threads -> the thread state whose
 * native_thread_id is tid -> its current _PyInterpreterFrame -> previous ..., and decodes
 * each frame's code object: qualified name, file, first line and the line being run.
 *
 * Everything is read with process_vm_readv: the target is never stopped, traced or
 * written. It keeps running while we read, so any pointer may be stale or garbage: every
 * read is bounded and checked, objects must carry the right type pointer, strings and
 * tables have size limits, and a chain whose top frame changed while it was walked is
 * dropped (counted), never returned as a wrong stack. See docs/native.md, PyFrameReader.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>

#define PYF_MAX_DEPTH 1024        /* deeper chains are cut (counted in `truncated`) */
#define PYF_MAX_THREADS 4096      /* thread states looked at per walk */
#define PYF_MAX_INTERPS 64
#define PYF_MAX_STR 1024          /* code points of a name or file name */
#define PYF_MAX_LINETABLE 65536   /* bytes of a location table */
#define PYF_HEADER 256            /* bytes of a code object read at once (all we use) */
#define PYF_FRAME 128             /* bytes of an _PyInterpreterFrame read at once */
#define PYF_CACHE 1024            /* code objects remembered (direct mapped) */

/* Offsets, in the order of pyf_offset_names. -1: not in this version. */
enum {
    O_RUNTIME_INTERPRETERS_HEAD, O_INTERP_NEXT, O_INTERP_THREADS_HEAD, O_TSTATE_NEXT,
    O_TSTATE_NATIVE_THREAD_ID, O_TSTATE_CFRAME, O_CFRAME_CURRENT_FRAME, O_TSTATE_CURRENT_FRAME,
    O_FRAME_CODE, O_FRAME_INSTR, O_FRAME_PREVIOUS, O_FRAME_OWNER, O_OWNER_CSTACK, O_FRAME_IS_ENTRY,
    O_CODE_NAME, O_CODE_QUALNAME, O_CODE_FILENAME, O_CODE_FIRSTLINENO, O_CODE_LINETABLE,
    O_CODE_ADAPTIVE, O_UNICODE_LENGTH, O_UNICODE_STATE, O_UNICODE_ASCII_DATA,
    O_UNICODE_COMPACT_DATA, O_BYTES_SIZE, O_BYTES_DATA, O_COUNT
};

static const char *const pyf_offset_names[O_COUNT] = {
    "runtime_interpreters_head", "interp_next", "interp_threads_head", "tstate_next",
    "tstate_native_thread_id", "tstate_cframe", "cframe_current_frame", "tstate_current_frame",
    "frame_code", "frame_instr", "frame_previous", "frame_owner", "owner_cstack", "frame_is_entry",
    "code_name", "code_qualname", "code_filename", "code_firstlineno", "code_linetable",
    "code_adaptive", "unicode_length", "unicode_state", "unicode_ascii_data",
    "unicode_compact_data", "bytes_size", "bytes_data",
};

/* Offsets that may be -1 (absent in some versions). */
static int pyf_optional(int i) {
    return i == O_TSTATE_CFRAME || i == O_CFRAME_CURRENT_FRAME || i == O_TSTATE_CURRENT_FRAME ||
           i == O_OWNER_CSTACK || i == O_INTERP_NEXT || i == O_FRAME_IS_ENTRY;
}

typedef struct {
    uint64_t code;                     /* 0: empty slot */
    uint64_t name_ptr, file_ptr, table_ptr;
    int32_t first_line;
    PyObject *name, *file;             /* strong references */
    uint8_t *table;                    /* location table copy (malloc) */
    uint32_t table_len;
} pyf_code;

typedef struct {
    PyObject_HEAD
    pid_t pid;
    uint64_t runtime, code_type, unicode_type;
    long off[O_COUNT];
    unsigned long long walks, dropped, truncated, reads;
    pyf_code cache[PYF_CACHE];
    int gone;                          /* ESRCH seen */
} PyFrameReader;

static PyTypeObject *PyFrameType;

static PyStructSequence_Field pyframe_fields[] = {
    {"function", "qualified name of the code object (co_qualname)"},
    {"file", "co_filename"},
    {"line", "line being run (from the location table), else first_line"},
    {"first_line", "co_firstlineno"},
    {"entry", "the frame was entered from C: the outermost Python frame of one "
              "_PyEval_EvalFrameDefault call (3.11+ runs Python-to-Python calls inside one)"},
    {NULL, NULL},
};

static PyStructSequence_Desc pyframe_desc = {
    "rsprof._native.PyFrame", "One Python frame read from another process.", pyframe_fields, 5,
};

/* -- reads --------------------------------------------------------------------------- */

static int pyf_read(PyFrameReader *self, uint64_t addr, void *buf, size_t len) {
    if (addr == 0 || addr + len < addr) return -1;
    struct iovec local = {buf, len};
    struct iovec remote = {(void *)(uintptr_t)addr, len};
    self->reads++;
    ssize_t n = process_vm_readv(self->pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == ESRCH) self->gone = 1;
    return n == (ssize_t)len ? 0 : -1;
}

static int pyf_ptr(PyFrameReader *self, uint64_t addr, uint64_t *out) {
    return pyf_read(self, addr, out, sizeof *out);
}

static uint64_t u64_at(const uint8_t *buf, long off) {
    uint64_t v;
    memcpy(&v, buf + off, sizeof v);
    return v;
}

/* A str object: its type must be str, compact (every str a code object holds is), and at
 * most PYF_MAX_STR code points. NULL (no exception) when it is not. */
static PyObject *pyf_string(PyFrameReader *self, uint64_t addr) {
    uint8_t head[128];
    long hlen = self->off[O_UNICODE_COMPACT_DATA];
    if (hlen <= 0 || hlen > (long)sizeof head) return NULL;
    if (pyf_read(self, addr, head, (size_t)hlen) < 0) return NULL;
    if (u64_at(head, 8) != self->unicode_type) return NULL;
    int64_t length;
    memcpy(&length, head + self->off[O_UNICODE_LENGTH], sizeof length);
    uint32_t state;
    memcpy(&state, head + self->off[O_UNICODE_STATE], sizeof state);
    unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    if (!compact || length < 0 || length > PYF_MAX_STR) return NULL;
    if (kind != 1 && kind != 2 && kind != 4) return NULL;
    if (ascii && kind != 1) return NULL;
    long data = ascii ? self->off[O_UNICODE_ASCII_DATA] : self->off[O_UNICODE_COMPACT_DATA];
    uint8_t text[PYF_MAX_STR * 4];
    if (length > 0 && pyf_read(self, addr + (uint64_t)data, text, (size_t)length * kind) < 0)
        return NULL;
    if (ascii) {
        for (int64_t i = 0; i < length; i++)
            if (text[i] >= 0x80) return NULL;
    }
    PyObject *s = PyUnicode_FromKindAndData((int)kind, text, (Py_ssize_t)length);
    if (s == NULL) PyErr_Clear(); /* e.g. a code point above 0x10FFFF: garbage */
    return s;
}

/* The location table (bytes object) copied out; NULL when it is not one. */
static uint8_t *pyf_linetable(PyFrameReader *self, uint64_t addr, uint32_t *len_out) {
    uint8_t head[64];
    long hlen = self->off[O_BYTES_DATA];
    if (hlen <= 0 || hlen > (long)sizeof head) return NULL;
    if (pyf_read(self, addr, head, (size_t)hlen) < 0) return NULL;
    int64_t size;
    memcpy(&size, head + self->off[O_BYTES_SIZE], sizeof size);
    if (size < 0 || size > PYF_MAX_LINETABLE) return NULL;
    uint8_t *table = malloc(size ? (size_t)size : 1);
    if (table == NULL) return NULL;
    if (size > 0 && pyf_read(self, addr + (uint64_t)hlen, table, (size_t)size) < 0) {
        free(table);
        return NULL;
    }
    *len_out = (uint32_t)size;
    return table;
}

/* -- location table (CPython 3.11+, Objects/locations.md) ---------------------------- */

static int pyf_varint(const uint8_t *t, uint32_t n, uint32_t *i, uint32_t *out) {
    uint32_t value = 0, shift = 0;
    for (;;) {
        if (*i >= n || shift > 28) return -1;
        uint8_t b = t[(*i)++];
        value |= (uint32_t)(b & 63) << shift;
        shift += 6;
        if (!(b & 64)) break;
    }
    *out = value;
    return 0;
}

/* The line of the code unit at `unit` (index into co_code_adaptive); `first` if unknown. */
static int32_t pyf_line(const uint8_t *t, uint32_t n, int32_t first, int64_t unit) {
    if (t == NULL || unit < 0) return first;
    int32_t line = first;
    int64_t addr = 0;
    uint32_t i = 0;
    while (i < n) {
        uint8_t b = t[i++];
        if (!(b & 0x80)) return first; /* not an entry start: corrupt */
        int code = (b >> 3) & 15;
        int64_t end = addr + (b & 7) + 1;
        int32_t entry_line = line;
        uint32_t v;
        if (code == 15) {
            entry_line = -1;
        } else if (code == 14 || code == 13) {
            if (pyf_varint(t, n, &i, &v) < 0) return first;
            int32_t delta = (v & 1) ? -(int32_t)(v >> 1) : (int32_t)(v >> 1);
            line += delta;
            entry_line = line;
            if (code == 14) { /* end line, start column, end column */
                for (int k = 0; k < 3; k++)
                    if (pyf_varint(t, n, &i, &v) < 0) return first;
            }
        } else if (code >= 10) {
            line += code - 10;
            entry_line = line;
            i += 2;
        } else {
            i += 1;
        }
        if (unit >= addr && unit < end) return entry_line > 0 ? entry_line : first;
        addr = end;
    }
    return first;
}

/* -- code objects -------------------------------------------------------------------- */

static void pyf_code_clear(pyf_code *c) {
    Py_CLEAR(c->name);
    Py_CLEAR(c->file);
    free(c->table);
    c->table = NULL;
    c->code = 0;
}

/* The decoded code object at `addr`, from the cache when its header still points at the
 * same name, file and table; NULL when it is not a code object. */
static pyf_code *pyf_code_at(PyFrameReader *self, uint64_t addr) {
    uint8_t head[PYF_HEADER];
    long hlen = self->off[O_CODE_ADAPTIVE];
    if (pyf_read(self, addr, head, (size_t)hlen) < 0) return NULL;
    if (u64_at(head, 8) != self->code_type) return NULL;
    uint64_t name_ptr = u64_at(head, self->off[O_CODE_QUALNAME]);
    uint64_t file_ptr = u64_at(head, self->off[O_CODE_FILENAME]);
    uint64_t table_ptr = u64_at(head, self->off[O_CODE_LINETABLE]);
    int32_t first_line;
    memcpy(&first_line, head + self->off[O_CODE_FIRSTLINENO], sizeof first_line);
    pyf_code *c = &self->cache[(addr >> 4) % PYF_CACHE];
    if (c->code == addr && c->name_ptr == name_ptr && c->file_ptr == file_ptr &&
        c->table_ptr == table_ptr && c->first_line == first_line)
        return c;
    pyf_code_clear(c);
    PyObject *name = pyf_string(self, name_ptr);
    if (name == NULL) return NULL;
    PyObject *file = pyf_string(self, file_ptr);
    if (file == NULL) {
        Py_DECREF(name);
        return NULL;
    }
    c->code = addr;
    c->name_ptr = name_ptr;
    c->file_ptr = file_ptr;
    c->table_ptr = table_ptr;
    c->first_line = first_line;
    c->name = name;
    c->file = file;
    c->table_len = 0;
    c->table = pyf_linetable(self, table_ptr, &c->table_len);
    return c;
}

/* -- walk ---------------------------------------------------------------------------- */

/* The thread state of `tid`, 0 if none. */
static uint64_t pyf_tstate(PyFrameReader *self, unsigned long tid) {
    uint64_t interp;
    if (pyf_ptr(self, self->runtime + (uint64_t)self->off[O_RUNTIME_INTERPRETERS_HEAD], &interp) < 0)
        return 0;
    for (int k = 0; interp != 0 && k < PYF_MAX_INTERPS; k++) {
        uint64_t ts;
        if (pyf_ptr(self, interp + (uint64_t)self->off[O_INTERP_THREADS_HEAD], &ts) < 0) return 0;
        for (int j = 0; ts != 0 && j < PYF_MAX_THREADS; j++) {
            uint64_t native;
            if (pyf_ptr(self, ts + (uint64_t)self->off[O_TSTATE_NATIVE_THREAD_ID], &native) < 0)
                return 0;
            if (native == tid) return ts;
            if (pyf_ptr(self, ts + (uint64_t)self->off[O_TSTATE_NEXT], &ts) < 0) return 0;
        }
        if (self->off[O_INTERP_NEXT] < 0) break;
        if (pyf_ptr(self, interp + (uint64_t)self->off[O_INTERP_NEXT], &interp) < 0) return 0;
    }
    return 0;
}

/* The address of the pointer to the thread's current frame. */
static int pyf_top_slot(PyFrameReader *self, uint64_t ts, uint64_t *slot) {
    if (self->off[O_TSTATE_CURRENT_FRAME] >= 0) {
        *slot = ts + (uint64_t)self->off[O_TSTATE_CURRENT_FRAME];
        return 0;
    }
    uint64_t cframe;
    if (pyf_ptr(self, ts + (uint64_t)self->off[O_TSTATE_CFRAME], &cframe) < 0 || cframe == 0)
        return -1;
    *slot = cframe + (uint64_t)self->off[O_CFRAME_CURRENT_FRAME];
    return 0;
}

static PyObject *pyf_gone(PyFrameReader *self) {
    errno = ESRCH;
    return PyErr_SetFromErrno(PyExc_ProcessLookupError);
}

static PyObject *PyFrameReader_frames(PyFrameReader *self, PyObject *arg) {
    unsigned long tid = PyLong_AsUnsignedLong(arg);
    if (tid == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    self->walks++;
    self->gone = 0;
    uint64_t ts = pyf_tstate(self, tid);
    if (ts == 0) {
        if (self->gone) return pyf_gone(self);
        Py_RETURN_NONE;
    }
    uint64_t slot, top;
    if (pyf_top_slot(self, ts, &slot) < 0 || pyf_ptr(self, slot, &top) < 0) {
        if (self->gone) return pyf_gone(self);
        self->dropped++;
        Py_RETURN_NONE;
    }
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    uint64_t frame = top;
    /* The two innermost frames as read: (address, code, instr), checked again at the end. */
    uint64_t seen[2][3] = {{0, 0, 0}, {0, 0, 0}};
    int depth = 0;
    for (; frame != 0 && depth < PYF_MAX_DEPTH; depth++) {
        uint8_t buf[PYF_FRAME];
        if (pyf_read(self, frame, buf, PYF_FRAME) < 0) goto drop;
        uint64_t code = u64_at(buf, self->off[O_FRAME_CODE]);
        uint64_t instr = u64_at(buf, self->off[O_FRAME_INSTR]);
        uint64_t previous = u64_at(buf, self->off[O_FRAME_PREVIOUS]);
        int owner = buf[self->off[O_FRAME_OWNER]];
        if (depth < 2) {
            seen[depth][0] = frame;
            seen[depth][1] = code;
            seen[depth][2] = instr;
        }
        if (previous == frame) goto drop;
        if (self->off[O_OWNER_CSTACK] >= 0 && owner == self->off[O_OWNER_CSTACK]) {
            frame = previous; /* the C stack's entry shim, not Python code */
            continue;
        }
        pyf_code *c = pyf_code_at(self, code);
        if (c == NULL) goto drop;
        /* Entered from C: 3.11 flags the frame; 3.12+ puts a C-stack shim frame below it. */
        int entry = previous == 0;
        if (self->off[O_FRAME_IS_ENTRY] >= 0) {
            entry = buf[self->off[O_FRAME_IS_ENTRY]] != 0;
        } else if (previous != 0 && self->off[O_OWNER_CSTACK] >= 0) {
            uint8_t owner_below;
            if (pyf_read(self, previous + (uint64_t)self->off[O_FRAME_OWNER], &owner_below, 1) < 0)
                goto drop;
            entry = owner_below == self->off[O_OWNER_CSTACK];
        }
        uint64_t base = code + (uint64_t)self->off[O_CODE_ADAPTIVE];
        int64_t unit = instr >= base ? (int64_t)((instr - base) / 2) : -1;
        int32_t line = pyf_line(c->table, c->table_len, c->first_line, unit);
        PyObject *item = PyStructSequence_New(PyFrameType);
        if (item == NULL) goto fail;
        Py_INCREF(c->name);
        Py_INCREF(c->file);
        PyStructSequence_SetItem(item, 0, c->name);
        PyStructSequence_SetItem(item, 1, c->file);
        PyStructSequence_SetItem(item, 2, PyLong_FromLong(line));
        PyStructSequence_SetItem(item, 3, PyLong_FromLong(c->first_line));
        PyStructSequence_SetItem(item, 4, PyBool_FromLong(entry));
        if (PyErr_Occurred() || PyList_Append(list, item) < 0) {
            Py_DECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        frame = previous;
    }
    if (frame != 0) self->truncated++;
    /* The thread kept running: if its top frame changed while we walked, the frames below
     * may have been popped and reused under us. Say nothing rather than something wrong.
     * The same top address is not enough: a return and a new call reuse the same slot of
     * the frame stack (seen: `light` at its return line over `main` at the line calling
     * `heavy`), so the top frame must still run the same code and its caller still wait
     * at the same instruction. */
    uint64_t again;
    if (pyf_ptr(self, slot, &again) < 0 || again != top) goto drop;
    for (int k = 0; k < 2 && k < depth; k++) {
        uint8_t buf[PYF_FRAME];
        if (pyf_read(self, seen[k][0], buf, PYF_FRAME) < 0) goto drop;
        if (u64_at(buf, self->off[O_FRAME_CODE]) != seen[k][1]) goto drop;
        if (k == 1 && u64_at(buf, self->off[O_FRAME_INSTR]) != seen[k][2]) goto drop;
    }
    return list;
drop:
    Py_DECREF(list);
    if (self->gone) return pyf_gone(self);
    self->dropped++;
    Py_RETURN_NONE;
fail:
    Py_DECREF(list);
    return NULL;
}

static PyObject *PyFrameReader_threads(PyFrameReader *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    self->gone = 0;
    uint64_t interp;
    if (pyf_ptr(self, self->runtime + (uint64_t)self->off[O_RUNTIME_INTERPRETERS_HEAD], &interp) < 0)
        interp = 0;
    for (int k = 0; interp != 0 && k < PYF_MAX_INTERPS; k++) {
        uint64_t ts;
        if (pyf_ptr(self, interp + (uint64_t)self->off[O_INTERP_THREADS_HEAD], &ts) < 0) break;
        for (int j = 0; ts != 0 && j < PYF_MAX_THREADS; j++) {
            uint64_t native;
            if (pyf_ptr(self, ts + (uint64_t)self->off[O_TSTATE_NATIVE_THREAD_ID], &native) < 0)
                break;
            PyObject *v = PyLong_FromUnsignedLongLong(native);
            if (v == NULL || PyList_Append(list, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(v);
            if (pyf_ptr(self, ts + (uint64_t)self->off[O_TSTATE_NEXT], &ts) < 0) break;
        }
        if (self->off[O_INTERP_NEXT] < 0) break;
        if (pyf_ptr(self, interp + (uint64_t)self->off[O_INTERP_NEXT], &interp) < 0) break;
    }
    if (self->gone && PyList_GET_SIZE(list) == 0) {
        Py_DECREF(list);
        return pyf_gone(self);
    }
    return list;
}

/* -- type ---------------------------------------------------------------------------- */

static int PyFrameReader_init(PyFrameReader *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pid", "runtime", "code_type", "unicode_type", "offsets", NULL};
    int pid;
    unsigned long long runtime, code_type, unicode_type;
    PyObject *offsets;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iKKKO!", kwlist, &pid, &runtime, &code_type,
                                     &unicode_type, &PyDict_Type, &offsets))
        return -1;
    if (pid <= 0 || runtime == 0 || code_type == 0 || unicode_type == 0) {
        PyErr_SetString(PyExc_ValueError, "pid and addresses must be positive");
        return -1;
    }
    for (int i = 0; i < O_COUNT; i++) {
        PyObject *v = PyDict_GetItemString(offsets, pyf_offset_names[i]);
        if (v == NULL) {
            if (pyf_optional(i)) {
                self->off[i] = -1;
                continue;
            }
            PyErr_Format(PyExc_ValueError, "offsets: %s is missing", pyf_offset_names[i]);
            return -1;
        }
        long value = PyLong_AsLong(v);
        if (value == -1 && PyErr_Occurred()) return -1;
        if (value < -1 || value > 1 << 20 || (value < 0 && !pyf_optional(i))) {
            PyErr_Format(PyExc_ValueError, "offsets: %s = %ld is out of range",
                         pyf_offset_names[i], value);
            return -1;
        }
        self->off[i] = value;
    }
    /* Fields read out of fixed-size buffers must lie inside them. */
    if (self->off[O_CODE_ADAPTIVE] < 16 || self->off[O_CODE_ADAPTIVE] > PYF_HEADER ||
        self->off[O_CODE_QUALNAME] + 8 > self->off[O_CODE_ADAPTIVE] ||
        self->off[O_CODE_FILENAME] + 8 > self->off[O_CODE_ADAPTIVE] ||
        self->off[O_CODE_LINETABLE] + 8 > self->off[O_CODE_ADAPTIVE] ||
        self->off[O_CODE_FIRSTLINENO] + 4 > self->off[O_CODE_ADAPTIVE] ||
        self->off[O_FRAME_CODE] + 8 > PYF_FRAME || self->off[O_FRAME_INSTR] + 8 > PYF_FRAME ||
        self->off[O_FRAME_PREVIOUS] + 8 > PYF_FRAME || self->off[O_FRAME_OWNER] >= PYF_FRAME ||
        self->off[O_FRAME_IS_ENTRY] >= PYF_FRAME ||
        self->off[O_UNICODE_LENGTH] + 8 > self->off[O_UNICODE_COMPACT_DATA] ||
        self->off[O_UNICODE_STATE] + 4 > self->off[O_UNICODE_COMPACT_DATA] ||
        self->off[O_BYTES_SIZE] + 8 > self->off[O_BYTES_DATA] ||
        (self->off[O_TSTATE_CURRENT_FRAME] < 0 &&
         (self->off[O_TSTATE_CFRAME] < 0 || self->off[O_CFRAME_CURRENT_FRAME] < 0))) {
        PyErr_SetString(PyExc_ValueError, "offsets: inconsistent layout");
        return -1;
    }
    for (int i = 0; i < PYF_CACHE; i++) pyf_code_clear(&self->cache[i]);
    self->pid = pid;
    self->runtime = runtime;
    self->code_type = code_type;
    self->unicode_type = unicode_type;
    return 0;
}

static void PyFrameReader_dealloc(PyFrameReader *self) {
    for (int i = 0; i < PYF_CACHE; i++) pyf_code_clear(&self->cache[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef PyFrameReader_methods[] = {
    {"frames", (PyCFunction)PyFrameReader_frames, METH_O,
     "frames(tid) -> list[PyFrame] | None: the thread's Python frames, innermost first; None "
     "if it has no thread state or the chain could not be read consistently (dropped)."},
    {"threads", (PyCFunction)PyFrameReader_threads, METH_NOARGS,
     "threads() -> list[int]: native thread ids of the interpreter's thread states."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef PyFrameReader_members[] = {
    {"pid", T_INT, offsetof(PyFrameReader, pid), READONLY, "target process"},
    {"walks", T_ULONGLONG, offsetof(PyFrameReader, walks), READONLY, "frames() calls"},
    {"dropped", T_ULONGLONG, offsetof(PyFrameReader, dropped), READONLY,
     "chains not returned: a garbage pointer, a non-code object, or the top frame changed"},
    {"truncated", T_ULONGLONG, offsetof(PyFrameReader, truncated), READONLY,
     "chains cut at the depth limit"},
    {"reads", T_ULONGLONG, offsetof(PyFrameReader, reads), READONLY,
     "process_vm_readv calls"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PyFrameReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rsprof._native.PyFrameReader",
    .tp_basicsize = sizeof(PyFrameReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PyFrameReader(pid, runtime, code_type, unicode_type, offsets): a CPython "
              "process's Python frames, read with process_vm_readv (docs/native.md).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PyFrameReader_init,
    .tp_dealloc = (destructor)PyFrameReader_dealloc,
    .tp_methods = PyFrameReader_methods,
    .tp_members = PyFrameReader_members,
};

int rsprof_pyframes_register(PyObject *module) {
    PyFrameType = PyStructSequence_NewType(&pyframe_desc);
    if (PyFrameType == NULL) return -1;
    if (PyType_Ready(&PyFrameReaderType) < 0) return -1;
    Py_INCREF(&PyFrameReaderType);
    if (PyModule_AddObject(module, "PyFrameReader", (PyObject *)&PyFrameReaderType) < 0) {
        Py_DECREF(&PyFrameReaderType);
        return -1;
    }
    Py_INCREF(PyFrameType);
    if (PyModule_AddObject(module, "PyFrame", (PyObject *)PyFrameType) < 0) {
        Py_DECREF(PyFrameType);
        return -1;
    }
    return 0;
}
