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
#include <pthread.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "pyframes.h"
#include "bpf/pyperf.h"
#include "heapring.h"
#include "shim/shimpy_layout.h"

#define PYF_MAX_DEPTH RS_PY_MAX_DEPTH /* deeper chains are cut (counted in `truncated`) */
#define PYF_MAX_THREADS 4096      /* thread states looked at per walk */
#define PYF_MAX_INTERPS 64
#define PYF_MAX_STR 1024          /* code points of a name or file name */
#define PYF_MAX_LINETABLE 32768   /* bytes of a location table (cache: 32 MiB at most) */
#define PYF_MAX_NAME_BYTES (64u << 20) /* names and files kept by the function table */
#define PYF_HEADER 256            /* bytes of a code object read at once (all we use) */
#define PYF_FRAME 128             /* bytes of an _PyInterpreterFrame read at once */
#define PYF_CACHE 1024            /* code objects remembered (direct mapped) */
#define PYF_PAGE 4096
#define PYF_TSTATE 512           /* bytes of a thread state read at once, at most */
#define PYF_WINDOW_PAGES 4        /* frame memory read at once by a walk (see pyf_frame_read) */

/* Offsets, in the order of pyf_offset_names. -1: not in this version. */
enum {
    O_RUNTIME_INTERPRETERS_HEAD, O_INTERP_NEXT, O_INTERP_THREADS_HEAD, O_TSTATE_NEXT,
    O_TSTATE_NATIVE_THREAD_ID, O_TSTATE_CFRAME, O_CFRAME_CURRENT_FRAME, O_TSTATE_CURRENT_FRAME,
    O_FRAME_CODE, O_FRAME_INSTR, O_FRAME_PREVIOUS, O_FRAME_OWNER, O_OWNER_CSTACK, O_FRAME_IS_ENTRY,
    O_CODE_NAME, O_CODE_QUALNAME, O_CODE_FILENAME, O_CODE_FIRSTLINENO, O_CODE_LINETABLE,
    O_CODE_ADAPTIVE, O_UNICODE_LENGTH, O_UNICODE_STATE, O_UNICODE_ASCII_DATA,
    O_UNICODE_COMPACT_DATA, O_BYTES_SIZE, O_BYTES_DATA, O_TSTATE_THREAD_ID,
    O_TSTATE_INTERP, O_RUNTIME_GIL, O_INTERP_GIL, O_GIL_LAST_HOLDER, O_GIL_LOCKED, O_COUNT
};

static const char *const pyf_offset_names[O_COUNT] = {
    "runtime_interpreters_head", "interp_next", "interp_threads_head", "tstate_next",
    "tstate_native_thread_id", "tstate_cframe", "cframe_current_frame", "tstate_current_frame",
    "frame_code", "frame_instr", "frame_previous", "frame_owner", "owner_cstack", "frame_is_entry",
    "code_name", "code_qualname", "code_filename", "code_firstlineno", "code_linetable",
    "code_adaptive", "unicode_length", "unicode_state", "unicode_ascii_data",
    "unicode_compact_data", "bytes_size", "bytes_data", "tstate_thread_id",
    "tstate_interp", "runtime_gil", "interp_gil", "gil_last_holder", "gil_locked",
};

/* Offsets that may be -1 (absent in some versions). */
static int pyf_optional(int i) {
    return i == O_TSTATE_CFRAME || i == O_CFRAME_CURRENT_FRAME || i == O_TSTATE_CURRENT_FRAME ||
           i == O_OWNER_CSTACK || i == O_INTERP_NEXT || i == O_FRAME_IS_ENTRY ||
           i == O_TSTATE_THREAD_ID || i >= O_TSTATE_INTERP;  /* GIL: --gil only */
}

#define RS_PY_MAX_FUNCTIONS (1u << 18)  /* distinct (name, file, first line) per reader */

typedef struct {
    uint64_t code;                     /* 0: empty slot */
    uint64_t name_ptr, file_ptr, table_ptr;
    int32_t first_line;
    uint32_t function;                 /* id in the function table */
    uint8_t *table;                    /* location table copy (malloc) */
    uint32_t table_len;
    uint32_t bpf_tag;                  /* the BPF sampler's tag of it (0: code_tag < 0) */
} pyf_code;

typedef struct {
    char *name, *file;                 /* UTF-8, malloc, never freed before the reader */
    int32_t first_line;
    uint64_t hash;
} pyf_function;

struct rs_pyreader {
    pid_t pid;
    uint64_t runtime, code_type, unicode_type;
    long off[O_COUNT];
    long code_tag;                     /* rs_bpf_config.code_tag: -1, or inside the header */
    unsigned long long walks, dropped, truncated, reads;
    int gone;                          /* ESRCH seen */
    pyf_code cache[PYF_CACHE];
    struct { uint64_t tid, tstate; } threads[64]; /* tid -> thread state, checked on use */
    pyf_function *functions;           /* [0] unused: ids start at 1 */
    uint32_t n_functions, cap_functions;
    size_t name_bytes;                 /* of the function table's strings */
    uint32_t *index;                   /* open addressing: function ids, 0 = empty */
    uint32_t index_size;               /* a power of two, > 2 * n_functions */
    /* One walk's scratch (the walk holds the reader's lock): the frames' code objects and
     * instruction pointers, whether each was entered from C, and their code headers. */
    uint64_t walk_code[PYF_MAX_DEPTH], walk_instr[PYF_MAX_DEPTH];
    uint8_t walk_entry[PYF_MAX_DEPTH];
    uint8_t walk_heads[PYF_MAX_DEPTH * PYF_HEADER];
    /* The frame memory read last ([lo, hi), page aligned; empty when lo == hi). */
    uint64_t win_lo, win_hi;
    uint8_t window[PYF_WINDOW_PAGES * PYF_PAGE];
};

typedef struct {
    PyObject_HEAD
    rs_pyreader *core;
    pthread_mutex_t lock;              /* one walk at a time; never held while taking the GIL */
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

static int pyf_read(rs_pyreader *self, uint64_t addr, void *buf, size_t len) {
    if (addr == 0 || addr + len < addr) return -1;
    struct iovec local = {buf, len};
    struct iovec remote = {(void *)(uintptr_t)addr, len};
    self->reads++;
    ssize_t n = process_vm_readv(self->pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == ESRCH) self->gone = 1;
    return n == (ssize_t)len ? 0 : -1;
}

static int pyf_ptr(rs_pyreader *self, uint64_t addr, uint64_t *out) {
    return pyf_read(self, addr, out, sizeof *out);
}

static uint64_t u64_at(const uint8_t *buf, long off) {
    uint64_t v;
    memcpy(&v, buf + off, sizeof v);
    return v;
}

/* Appends code point `c` as UTF-8 (lone surrogates as U+FFFD). */
static size_t pyf_utf8(uint32_t c, char *out) {
    if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD;
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 63));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 63));
        out[2] = (char)(0x80 | (c & 63));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 63));
    out[2] = (char)(0x80 | ((c >> 6) & 63));
    out[3] = (char)(0x80 | (c & 63));
    return 4;
}

/* A str object as malloc'd UTF-8: its type must be str, compact (every str a code object
 * holds is, and so is every str made at run time), of a valid kind and at most `max`
 * (<= PYF_MAX_STR) code points. NULL when it is not. tag_name, when not NULL: what the BPF
 * sampler's code tag hashes of a str (rs_bpf_code_tag's `name`). */
static char *pyf_string(rs_pyreader *self, uint64_t addr, int64_t max,
                        unsigned long long *tag_name) {
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
    if (!compact || length < 0 || length > PYF_MAX_STR || length > max) return NULL;
    if (kind != 1 && kind != 2 && kind != 4) return NULL;
    if (ascii && kind != 1) return NULL;
    long data = ascii ? self->off[O_UNICODE_ASCII_DATA] : self->off[O_UNICODE_COMPACT_DATA];
    uint8_t text[PYF_MAX_STR * 4];
    if (length > 0 && pyf_read(self, addr + (uint64_t)data, text, (size_t)length * kind) < 0)
        return NULL;
    if (tag_name != NULL) {
        uint8_t chars[16] = {0};
        if (ascii) memcpy(chars, text, length < 16 ? (size_t)length : 16);
        memcpy(tag_name, chars, 16);
        tag_name[2] = (unsigned long long)length | (ascii ? 0 : 1ULL << 63);
    }
    char *out = malloc((size_t)length * 4 + 1);
    if (out == NULL) return NULL;
    size_t n = 0;
    for (int64_t i = 0; i < length; i++) {
        uint32_t c;
        if (kind == 1) {
            c = text[i];
        } else if (kind == 2) {
            uint16_t v;
            memcpy(&v, text + 2 * i, 2);
            c = v;
        } else {
            memcpy(&c, text + 4 * i, 4);
        }
        if ((ascii && c >= 0x80) || c > 0x10FFFF || c == 0) {
            free(out); /* not what CPython would have stored: garbage */
            return NULL;
        }
        n += pyf_utf8(c, out + n);
    }
    out[n] = '\0';
    return out;
}

/* The location table (bytes object) copied out; NULL when it is not one. */
static uint8_t *pyf_linetable(rs_pyreader *self, uint64_t addr, uint32_t *len_out) {
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

/* -- function table ------------------------------------------------------------------ */

static uint64_t pyf_hash(const char *name, const char *file, int32_t first_line) {
    uint64_t h = 1469598103934665603ULL ^ (uint32_t)first_line;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ULL;
    h = (h ^ 0xFF) * 1099511628211ULL;
    for (const char *p = file; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ULL;
    return h | 1;
}

static int pyf_index_grow(rs_pyreader *self) {
    uint32_t size = self->index_size ? self->index_size * 2 : 1024;
    uint32_t *index = calloc(size, sizeof *index);
    if (index == NULL) return -1;
    for (uint32_t id = 1; id <= self->n_functions; id++) {
        uint32_t slot = (uint32_t)self->functions[id].hash & (size - 1);
        while (index[slot]) slot = (slot + 1) & (size - 1);
        index[slot] = id;
    }
    free(self->index);
    self->index = index;
    self->index_size = size;
    return 0;
}

/* The id of (name, file, first_line); takes ownership of name and file (freed if the
 * function is known). 0 when the table is full or memory runs out. */
static uint32_t pyf_intern(rs_pyreader *self, char *name, char *file, int32_t first_line) {
    uint64_t hash = pyf_hash(name, file, first_line);
    if (self->index_size) {
        uint32_t slot = (uint32_t)hash & (self->index_size - 1);
        for (uint32_t id; (id = self->index[slot]) != 0; slot = (slot + 1) & (self->index_size - 1)) {
            pyf_function *f = &self->functions[id];
            if (f->hash == hash && f->first_line == first_line && strcmp(f->name, name) == 0 &&
                strcmp(f->file, file) == 0) {
                free(name);
                free(file);
                return id;
            }
        }
    }
    size_t bytes = strlen(name) + strlen(file) + 2;
    if (self->n_functions + 1 >= RS_PY_MAX_FUNCTIONS ||
        self->name_bytes + bytes > PYF_MAX_NAME_BYTES)
        goto full;
    if (self->n_functions + 2 > self->cap_functions) {
        uint32_t cap = self->cap_functions ? self->cap_functions * 2 : 256;
        pyf_function *grown = realloc(self->functions, cap * sizeof *grown);
        if (grown == NULL) goto full;
        self->functions = grown;
        self->cap_functions = cap;
    }
    if (2 * (self->n_functions + 1) >= self->index_size && pyf_index_grow(self) < 0) goto full;
    uint32_t id = ++self->n_functions;
    self->functions[id] = (pyf_function){name, file, first_line, hash};
    self->name_bytes += bytes;
    uint32_t slot = (uint32_t)hash & (self->index_size - 1);
    while (self->index[slot]) slot = (slot + 1) & (self->index_size - 1);
    self->index[slot] = id;
    return id;
full:
    free(name);
    free(file);
    return 0;
}

int rs_pyreader_function(const rs_pyreader *r, uint32_t id, const char **name,
                         const char **file, int32_t *first_line) {
    if (id == 0 || id > r->n_functions) return 0;
    *name = r->functions[id].name;
    *file = r->functions[id].file;
    *first_line = r->functions[id].first_line;
    return 1;
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
    free(c->table);
    c->table = NULL;
    c->code = 0;
}

/* The decoded code object at `addr`, from the cache when its header still points at the
 * same name, file and table; NULL when it is not a code object (or memory ran out). */
static pyf_code *pyf_code_from(rs_pyreader *self, uint64_t addr, const uint8_t *head);

static pyf_code *pyf_code_at(rs_pyreader *self, uint64_t addr) {
    uint8_t head[PYF_HEADER];
    long hlen = self->off[O_CODE_ADAPTIVE];
    if (pyf_read(self, addr, head, (size_t)hlen) < 0) return NULL;
    return pyf_code_from(self, addr, head);
}

/* pyf_code_at with the code object's header (its first code_adaptive bytes) read already. */
static pyf_code *pyf_code_from(rs_pyreader *self, uint64_t addr, const uint8_t *head) {
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
    unsigned long long text[3];  /* what the BPF sampler's tag hashes of it (pyperf.h) */
    char *name = pyf_string(self, name_ptr, PYF_MAX_STR,
                            self->code_tag >= 0 ? text : NULL);
    if (name == NULL) return NULL;
    char *file = pyf_string(self, file_ptr, PYF_MAX_STR, NULL);
    if (file == NULL) {
        free(name);
        return NULL;
    }
    uint32_t function = pyf_intern(self, name, file, first_line);
    if (function == 0) return NULL;
    c->code = addr;
    c->name_ptr = name_ptr;
    c->file_ptr = file_ptr;
    c->table_ptr = table_ptr;
    c->first_line = first_line;
    c->bpf_tag = 0;
    if (self->code_tag >= 0) {
        unsigned long long words[4];
        memcpy(words, head + self->code_tag, sizeof words);
        c->bpf_tag = (uint32_t)rs_bpf_code_tag(words, text);
    }
    c->function = function;
    c->table_len = 0;
    c->table = pyf_linetable(self, table_ptr, &c->table_len);
    return c;
}

/* The code object at `code` (*c), or RS_PY_GONE (the process left) / RS_PY_DROPPED
 * (counted): rs_pyreader_code's lookup. */
static int pyf_code_lookup(rs_pyreader *r, uint64_t code, pyf_code **c) {
    r->gone = 0;
    *c = pyf_code_at(r, code);
    if (*c != NULL) return 0;
    if (r->gone) return RS_PY_GONE;
    r->dropped++;
    return RS_PY_DROPPED;
}

int rs_pyreader_code(rs_pyreader *r, uint64_t code, uint32_t tag, int64_t unit,
                     uint32_t *function, int32_t *line) {
    pyf_code *c;
    int rc = pyf_code_lookup(r, code, &c);
    if (rc != 0) return rc;
    /* Another code object (or other strings) at the address since the shim saw it. */
    if (rsprof_heap_py_tag(c->name_ptr, c->file_ptr, c->table_ptr, c->first_line) != tag) {
        r->dropped++;
        return RS_PY_DROPPED;
    }
    *function = c->function;
    *line = pyf_line(c->table, c->table_len, c->first_line, unit);
    return 0;
}

static int pyf_read_heads(rs_pyreader *self, int n);

/* Frame i of a batch whose code objects are walk_code and whose first `heads` headers
 * pyf_read_heads read: its code object (a header the batch did not reach, unreadable or
 * after one that was, is read alone), or NULL. */
static pyf_code *pyf_batch_code(rs_pyreader *self, int i, int heads) {
    size_t hlen = (size_t)self->off[O_CODE_ADAPTIVE];
    return i < heads ? pyf_code_from(self, self->walk_code[i], self->walk_heads + (size_t)i * hlen)
                     : pyf_code_at(self, self->walk_code[i]);
}

/* The line of the instruction at `instr` in code object c, at `code` (an instr before the
 * bytecode: the first line), as the walk and the BPF records' frames compute it. */
static int32_t pyf_instr_line(const rs_pyreader *self, const pyf_code *c, uint64_t code,
                              uint64_t instr) {
    uint64_t base = code + (uint64_t)self->off[O_CODE_ADAPTIVE];
    int64_t unit = instr >= base ? (int64_t)((instr - base) / 2) : -1;
    return pyf_line(c->table, c->table_len, c->first_line, unit);
}

int rs_pyreader_resolve_many(rs_pyreader *r, int n, const uint64_t *codes,
                             const uint64_t *instrs, uint32_t *functions, int32_t *lines) {
    if (n <= 0) return 0;
    if (n > PYF_MAX_DEPTH) return RS_PY_DROPPED;
    r->gone = 0;
    for (int i = 0; i < n; i++) r->walk_code[i] = codes[i] & RS_BPF_CODE_ADDRESS_MASK;
    int heads = pyf_read_heads(r, n);
    for (int i = 0; i < n; i++) {
        pyf_code *c = pyf_batch_code(r, i, heads);
        if (c == NULL) {
            if (r->gone) return RS_PY_GONE;
            r->dropped++;
            return RS_PY_DROPPED;
        }
        uint32_t tag = (uint32_t)(codes[i] >> RS_BPF_CODE_TAG_SHIFT) |
                       (uint32_t)(instrs[i] >> RS_BPF_CODE_TAG_SHIFT) << 16;
        if (tag != 0 && tag != c->bpf_tag) {
            /* The cache holds what was at the address when it was decoded; its pointers
             * can all be the same for a code object made again there. Decode afresh. */
            pyf_code_clear(c);
            c = pyf_code_at(r, r->walk_code[i]);
            if (c == NULL || tag != c->bpf_tag) {
                if (r->gone) return RS_PY_GONE;
                r->dropped++;
                return c == NULL ? RS_PY_DROPPED : RS_PY_REPLACED;
            }
        }
        functions[i] = c->function;
        lines[i] = pyf_instr_line(r, c, r->walk_code[i], instrs[i] & RS_BPF_CODE_ADDRESS_MASK);
    }
    return 0;
}

int rs_pyreader_bpf_config(const rs_pyreader *r, struct rs_bpf_config *cfg, int32_t *pid) {
    /* The reader's own offsets (collector/pyframes.py LAYOUTS, or 3.13's _Py_DebugOffsets):
     * one table for the drain-time walk and the BPF one. */
    memset(cfg, 0, sizeof *cfg);
    cfg->runtime = r->runtime;
    cfg->runtime_interpreters_head = (int)r->off[O_RUNTIME_INTERPRETERS_HEAD];
    cfg->interp_next = (int)r->off[O_INTERP_NEXT];
    cfg->interp_threads_head = (int)r->off[O_INTERP_THREADS_HEAD];
    cfg->tstate_next = (int)r->off[O_TSTATE_NEXT];
    cfg->tstate_native_thread_id = (int)r->off[O_TSTATE_NATIVE_THREAD_ID];
    cfg->tstate_cframe = (int)r->off[O_TSTATE_CFRAME];
    cfg->cframe_current_frame = (int)r->off[O_CFRAME_CURRENT_FRAME];
    /* _PyCFrame is {uint8_t use_tracing; current_frame; previous} in 3.11 and {current_frame;
     * previous} in 3.12: `previous` is the pointer after `current_frame` in both. */
    cfg->cframe_previous = cfg->cframe_current_frame >= 0 ? cfg->cframe_current_frame + 8 : -1;
    cfg->tstate_current_frame = (int)r->off[O_TSTATE_CURRENT_FRAME];
    cfg->frame_code = (int)r->off[O_FRAME_CODE];
    cfg->frame_instr = (int)r->off[O_FRAME_INSTR];
    cfg->frame_previous = (int)r->off[O_FRAME_PREVIOUS];
    cfg->frame_owner = (int)r->off[O_FRAME_OWNER];
    cfg->owner_cstack = (int)r->off[O_OWNER_CSTACK];
    cfg->frame_is_entry = (int)r->off[O_FRAME_IS_ENTRY];
    /* The frame's head read at once ends at the word after its last field. */
    long end = 0;
    const int pointers[3] = {O_FRAME_CODE, O_FRAME_INSTR, O_FRAME_PREVIOUS};
    const int bytes[2] = {O_FRAME_OWNER, O_FRAME_IS_ENTRY};
    for (int i = 0; i < 3; i++)
        if (r->off[pointers[i]] + 8 > end) end = r->off[pointers[i]] + 8;
    for (int i = 0; i < 2; i++)
        if (r->off[bytes[i]] + 1 > end) end = r->off[bytes[i]] + 1;
    long head = ((end + 7) & ~7L) - RS_BPF_FRAME_HEAD;
    for (int i = 0; i < 3; i++)
        if (r->off[pointers[i]] < head || (r->off[pointers[i]] & 7) != 0) return EINVAL;
    for (int i = 0; i < 2; i++)
        if (r->off[bytes[i]] >= 0 && r->off[bytes[i]] < head) return EINVAL;
    cfg->frame_head = (int)head;
    cfg->tstate_interp = (int)r->off[O_TSTATE_INTERP];
    cfg->runtime_gil = (int)r->off[O_RUNTIME_GIL];
    cfg->interp_gil = (int)r->off[O_INTERP_GIL];
    cfg->gil_last_holder = (int)r->off[O_GIL_LAST_HOLDER];
    cfg->gil_locked = (int)r->off[O_GIL_LOCKED];
    cfg->code_tag = (int)r->code_tag;
    cfg->name_text = (int)r->off[O_UNICODE_ASCII_DATA];
    *pid = (int32_t)r->pid;
    return 0;
}

/* -- walk ---------------------------------------------------------------------------- */

/* Frame memory for a walk's first pass: `len` (<= PYF_FRAME) bytes at `addr`. A thread's
 * frames lie mostly in its data stack, each just below the one it called, so one read of
 * the PYF_WINDOW_PAGES pages ending with the frame serves the frames after it. Pages are
 * read top first, so an unmapped page below only shortens the window; a frame outside it
 * (a generator's, in its object) is read alone. The checks at the end of a walk read
 * afresh, never through the window. */
/* Copies [addr, addr + len) out of the window when it holds it. */
static int pyf_window_copy(const rs_pyreader *self, uint64_t addr, void *buf, size_t len) {
    if (addr < self->win_lo || addr + len > self->win_hi) return 0;
    uint64_t base = self->win_hi - (uint64_t)PYF_WINDOW_PAGES * PYF_PAGE;
    memcpy(buf, self->window + (addr - base), len);
    return 1;
}

static int pyf_frame_read(rs_pyreader *self, uint64_t addr, void *buf, size_t len) {
    if (addr == 0 || addr + len < addr) return -1;
    if (pyf_window_copy(self, addr, buf, len)) return 0;
    uint64_t hi = (addr + len + PYF_PAGE - 1) & ~(uint64_t)(PYF_PAGE - 1);
    if (hi <= addr) return pyf_read(self, addr, buf, len);  /* the top page of the space */
    int pages = PYF_WINDOW_PAGES;
    if (hi / PYF_PAGE < (uint64_t)pages) pages = (int)(hi / PYF_PAGE);
    struct iovec local[PYF_WINDOW_PAGES], remote[PYF_WINDOW_PAGES];
    for (int i = 0; i < pages; i++) {
        uint64_t page = hi - (uint64_t)(i + 1) * PYF_PAGE;
        remote[i].iov_base = (void *)(uintptr_t)page;
        remote[i].iov_len = PYF_PAGE;
        local[i].iov_base = self->window + (PYF_WINDOW_PAGES - 1 - i) * PYF_PAGE;
        local[i].iov_len = PYF_PAGE;
    }
    self->reads++;
    ssize_t got = process_vm_readv(self->pid, local, (unsigned long)pages, remote,
                                   (unsigned long)pages, 0);
    if (got < 0 && errno == ESRCH) self->gone = 1;
    uint64_t full = got > 0 ? (uint64_t)got / PYF_PAGE : 0;
    self->win_hi = full > 0 ? hi : 0;
    self->win_lo = full > 0 ? hi - full * PYF_PAGE : 0;
    if (pyf_window_copy(self, addr, buf, len)) return 0;
    if (self->gone) return -1;
    return pyf_read(self, addr, buf, len);
}

/* The code headers of the walk's n frames (walk_code) into walk_heads, in one read; returns
 * how many were read (those after the first unreadable one are not). */
static int pyf_read_heads(rs_pyreader *self, int n) {
    static const int most = 1024;  /* UIO_MAXIOV */
    size_t hlen = (size_t)self->off[O_CODE_ADAPTIVE];
    struct iovec remote[1024];
    int count = 0;
    for (; count < n && count < most; count++) {
        uint64_t code = self->walk_code[count];
        if (code == 0 || code + hlen < code) break;
        remote[count].iov_base = (void *)(uintptr_t)code;
        remote[count].iov_len = hlen;
    }
    if (count == 0) return 0;
    struct iovec local = {self->walk_heads, (size_t)count * hlen};
    self->reads++;
    ssize_t got = process_vm_readv(self->pid, &local, 1, remote, (unsigned long)count, 0);
    if (got < 0 && errno == ESRCH) self->gone = 1;
    return got > 0 ? (int)((size_t)got / hlen) : 0;
}

/* The thread state of `tid`, 0 if none. */
static uint64_t pyf_tstate(rs_pyreader *self, uint64_t tid) {
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
static int pyf_top_slot(rs_pyreader *self, uint64_t ts, uint64_t *slot) {
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

static int pyf_failed(rs_pyreader *self) {
    if (self->gone) return RS_PY_GONE;
    self->dropped++;
    return RS_PY_DROPPED;
}

int rs_pyreader_walk(rs_pyreader *self, uint32_t tid, rs_pyframe *out, int max) {
    self->walks++;
    self->gone = 0;
    if (max > RS_PY_MAX_DEPTH) max = RS_PY_MAX_DEPTH;
    /* The thread state found last time saves the list walk (2+ reads) while it still
     * holds this native thread id (ids are unique among live threads). Its fields the walk
     * needs (native id, cframe or current frame) are read together, in one read. */
    uint64_t ts = 0, native;
    int hint = (int)(tid % 64);
    long o_native = self->off[O_TSTATE_NATIVE_THREAD_ID];
    long o_current = self->off[O_TSTATE_CURRENT_FRAME] >= 0 ? self->off[O_TSTATE_CURRENT_FRAME]
                                                           : self->off[O_TSTATE_CFRAME];
    long tslen = (o_native > o_current ? o_native : o_current) + 8;
    uint8_t tsbuf[PYF_TSTATE];
    int have_block = 0;
    if (self->threads[hint].tid == tid && self->threads[hint].tstate != 0) {
        uint64_t hinted = self->threads[hint].tstate;
        if (o_current >= 0 && tslen <= PYF_TSTATE) {
            have_block = pyf_read(self, hinted, tsbuf, (size_t)tslen) == 0 &&
                         u64_at(tsbuf, o_native) == tid;
            if (have_block) ts = hinted;
        } else if (pyf_ptr(self, hinted + (uint64_t)o_native, &native) == 0 && native == tid) {
            ts = hinted;
        }
    }
    if (ts == 0) ts = pyf_tstate(self, tid);
    if (ts == 0) return self->gone ? RS_PY_GONE : RS_PY_NOTHREAD;
    self->threads[hint].tid = tid;
    self->threads[hint].tstate = ts;
    uint64_t slot, top;
    if (have_block && self->off[O_TSTATE_CURRENT_FRAME] >= 0) {
        slot = ts + (uint64_t)o_current;
        top = u64_at(tsbuf, o_current);
    } else if (have_block) {
        uint64_t cframe = u64_at(tsbuf, o_current);
        if (cframe == 0) return pyf_failed(self);
        slot = cframe + (uint64_t)self->off[O_CFRAME_CURRENT_FRAME];
        if (pyf_ptr(self, slot, &top) < 0) return pyf_failed(self);
    } else if (pyf_top_slot(self, ts, &slot) < 0 || pyf_ptr(self, slot, &top) < 0) {
        return pyf_failed(self);
    }
    uint64_t frame = top;
    /* The two innermost frames as read: (address, code, instr), checked again at the end. */
    uint64_t seen[2][3] = {{0, 0, 0}, {0, 0, 0}};
    int depth = 0, n = 0;
    self->win_lo = self->win_hi = 0;  /* another walk's memory is stale */
    /* First the chain (through the frame window), then every code object's header in one
     * read: a 30-frame walk read frame by frame was 60-90 process_vm_readv calls (120 µs
     * per off-CPU sample of a preempted thread, 30 % of the recorder's CPU under load). */
    for (; frame != 0 && depth < PYF_MAX_DEPTH && n < max; depth++) {
        uint8_t buf[PYF_FRAME];
        if (pyf_frame_read(self, frame, buf, PYF_FRAME) < 0) return pyf_failed(self);
        uint64_t code = u64_at(buf, self->off[O_FRAME_CODE]);
        uint64_t instr = u64_at(buf, self->off[O_FRAME_INSTR]);
        uint64_t previous = u64_at(buf, self->off[O_FRAME_PREVIOUS]);
        int owner = buf[self->off[O_FRAME_OWNER]];
        if (depth < 2) {
            seen[depth][0] = frame;
            seen[depth][1] = code;
            seen[depth][2] = instr;
        }
        if (previous == frame) return pyf_failed(self);
        if (self->off[O_OWNER_CSTACK] >= 0 && owner == self->off[O_OWNER_CSTACK]) {
            frame = previous; /* the C stack's entry shim, not Python code */
            continue;
        }
        /* Entered from C: 3.11 flags the frame; 3.12+ puts a C-stack shim frame below it. */
        int entry = previous == 0;
        if (self->off[O_FRAME_IS_ENTRY] >= 0) {
            entry = buf[self->off[O_FRAME_IS_ENTRY]] != 0;
        } else if (previous != 0 && self->off[O_OWNER_CSTACK] >= 0) {
            uint8_t owner_below;
            if (pyf_frame_read(self, previous + (uint64_t)self->off[O_FRAME_OWNER], &owner_below,
                               1) < 0)
                return pyf_failed(self);
            entry = owner_below == self->off[O_OWNER_CSTACK];
        }
        self->walk_code[n] = code;
        self->walk_instr[n] = instr;
        self->walk_entry[n] = (uint8_t)entry;
        n++;
        frame = previous;
    }
    int heads = pyf_read_heads(self, n);
    for (int i = 0; i < n; i++) {
        pyf_code *c = pyf_batch_code(self, i, heads);
        if (c == NULL) return pyf_failed(self);
        out[i].function = c->function;
        out[i].line = pyf_instr_line(self, c, self->walk_code[i], self->walk_instr[i]);
        out[i].entry = self->walk_entry[i];
    }
    if (frame != 0) self->truncated++;
    /* The thread kept running: if its top frame changed while we walked, the frames below
     * may have been popped and reused under us. Say nothing rather than something wrong.
     * The same top address is not enough: a return and a new call reuse the same slot of
     * the frame stack (seen: `light` at its return line over `main` at the line calling
     * `heavy`), so the top frame must still run the same code and its caller still wait
     * at the same instruction. */
    /* The slot and the two frames, read afresh in one call. */
    uint64_t again;
    uint8_t bufs[2][PYF_FRAME];
    struct iovec local[3] = {{&again, 8}, {bufs[0], PYF_FRAME}, {bufs[1], PYF_FRAME}};
    struct iovec remote[3] = {{(void *)(uintptr_t)slot, 8}, {NULL, PYF_FRAME}, {NULL, PYF_FRAME}};
    int parts = 1;
    size_t want = 8;
    for (int k = 0; k < 2 && k < depth; k++, parts++) {
        if (seen[k][0] == 0 || seen[k][0] + PYF_FRAME < seen[k][0]) return pyf_failed(self);
        remote[1 + k].iov_base = (void *)(uintptr_t)seen[k][0];
        want += PYF_FRAME;
    }
    if (slot == 0 || slot + 8 < slot) return pyf_failed(self);
    self->reads++;
    ssize_t got = process_vm_readv(self->pid, local, (unsigned long)parts, remote,
                                   (unsigned long)parts, 0);
    if (got < 0 && errno == ESRCH) self->gone = 1;
    if (got != (ssize_t)want || again != top) return pyf_failed(self);
    for (int k = 0; k < 2 && k < depth; k++) {
        if (u64_at(bufs[k], self->off[O_FRAME_CODE]) != seen[k][1]) return pyf_failed(self);
        if (k == 1 && u64_at(bufs[k], self->off[O_FRAME_INSTR]) != seen[k][2])
            return pyf_failed(self);
    }
    return n;
}

static void pyf_free(rs_pyreader *r) {
    if (r == NULL) return;
    for (int i = 0; i < PYF_CACHE; i++) pyf_code_clear(&r->cache[i]);
    for (uint32_t id = 1; id <= r->n_functions; id++) {
        free(r->functions[id].name);
        free(r->functions[id].file);
    }
    free(r->functions);
    free(r->index);
    free(r);
}

/* -- Python type --------------------------------------------------------------------- */

static PyObject *pyf_error(int code) {
    if (code == RS_PY_GONE) {
        errno = ESRCH;
        return PyErr_SetFromErrno(PyExc_ProcessLookupError);
    }
    return PyErr_NoMemory();
}

static int pyf_ready(PyFrameReader *self) {
    if (self->core == NULL) {
        PyErr_SetString(PyExc_ValueError, "PyFrameReader is not initialized");
        return -1;
    }
    return 0;
}

/* Walks with the GIL released; frames and their function entries go to the caller's
 * arrays (names stay valid for the reader's lifetime). */
static int pyf_walk_nogil(PyFrameReader *self, uint32_t tid, rs_pyframe *frames,
                             const char **names, const char **files, int32_t *firsts) {
    int n;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    n = rs_pyreader_walk(self->core, tid, frames, RS_PY_MAX_DEPTH);
    for (int i = 0; i < n; i++)
        rs_pyreader_function(self->core, frames[i].function, &names[i], &files[i], &firsts[i]);
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    return n;
}

static PyObject *PyFrameReader_frames(PyFrameReader *self, PyObject *arg) {
    if (pyf_ready(self) < 0) return NULL;
    unsigned long tid = PyLong_AsUnsignedLong(arg);
    if (tid == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    if (tid > UINT32_MAX) Py_RETURN_NONE;
    rs_pyframe *frames = malloc(RS_PY_MAX_DEPTH * sizeof *frames);
    const char **names = malloc(RS_PY_MAX_DEPTH * 2 * sizeof *names);
    int32_t *firsts = malloc(RS_PY_MAX_DEPTH * sizeof *firsts);
    PyObject *list = NULL;
    if (frames == NULL || names == NULL || firsts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const char **files = names + RS_PY_MAX_DEPTH;
    int n = pyf_walk_nogil(self, (uint32_t)tid, frames, names, files, firsts);
    if (n == RS_PY_NOTHREAD || n == RS_PY_DROPPED) {
        list = Py_NewRef(Py_None);
        goto done;
    }
    if (n < 0) {
        pyf_error(n);
        goto done;
    }
    list = PyList_New(n);
    if (list == NULL) goto done;
    for (int i = 0; i < n; i++) {
        PyObject *item = PyStructSequence_New(PyFrameType);
        if (item == NULL) {
            Py_CLEAR(list);
            goto done;
        }
        PyStructSequence_SetItem(item, 0, PyUnicode_DecodeUTF8(names[i], (Py_ssize_t)strlen(names[i]), "replace"));
        PyStructSequence_SetItem(item, 1, PyUnicode_DecodeUTF8(files[i], (Py_ssize_t)strlen(files[i]), "replace"));
        PyStructSequence_SetItem(item, 2, PyLong_FromLong(frames[i].line));
        PyStructSequence_SetItem(item, 3, PyLong_FromLong(firsts[i]));
        PyStructSequence_SetItem(item, 4, PyBool_FromLong(frames[i].entry));
        PyList_SET_ITEM(list, i, item);
        if (PyErr_Occurred()) {
            Py_CLEAR(list);
            goto done;
        }
    }
done:
    free(frames);
    free(names);
    free(firsts);
    return list;
}

static PyObject *PyFrameReader_walk(PyFrameReader *self, PyObject *arg) {
    if (pyf_ready(self) < 0) return NULL;
    unsigned long tid = PyLong_AsUnsignedLong(arg);
    if (tid == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    if (tid > UINT32_MAX) Py_RETURN_NONE;
    rs_pyframe *frames = malloc(RS_PY_MAX_DEPTH * sizeof *frames);
    if (frames == NULL) return PyErr_NoMemory();
    int n;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    n = rs_pyreader_walk(self->core, (uint32_t)tid, frames, RS_PY_MAX_DEPTH);
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    PyObject *list = NULL;
    if (n == RS_PY_NOTHREAD || n == RS_PY_DROPPED) {
        list = Py_NewRef(Py_None);
    } else if (n < 0) {
        pyf_error(n);
    } else if ((list = PyList_New(n)) != NULL) {
        for (int i = 0; i < n; i++) {
            PyObject *t = Py_BuildValue("(IiN)", frames[i].function, frames[i].line,
                                        PyBool_FromLong(frames[i].entry));
            if (t == NULL) {
                Py_CLEAR(list);
                break;
            }
            PyList_SET_ITEM(list, i, t);
        }
    }
    free(frames);
    return list;
}

static PyObject *PyFrameReader_functions(PyFrameReader *self, PyObject *args) {
    if (pyf_ready(self) < 0) return NULL;
    unsigned int start = 1;
    if (!PyArg_ParseTuple(args, "|I", &start)) return NULL;
    if (start == 0) start = 1;
    pthread_mutex_lock(&self->lock); /* never waits long: a walk holds it without the GIL */
    uint32_t count = self->core->n_functions;
    pthread_mutex_unlock(&self->lock);
    PyObject *list = PyList_New(0);
    for (uint32_t id = start; list != NULL && id <= count; id++) {
        const char *name, *file;
        int32_t first;
        pthread_mutex_lock(&self->lock);
        rs_pyreader_function(self->core, id, &name, &file, &first);
        pthread_mutex_unlock(&self->lock);
        PyObject *t = Py_BuildValue("(Issi)", id, name, file, first);
        if (t == NULL || PyList_Append(list, t) < 0) Py_CLEAR(list);
        Py_XDECREF(t);
    }
    return list;
}

/* Every thread state (all interpreters): native_thread_id into natives[], and with `idents`
 * its thread_id (the ident threading keys _active by: pthread_self) when the layout has
 * it, else 0. Returns how many; -1 when the process is gone and none was read. */
static int pyf_thread_states(PyFrameReader *self, uint64_t *natives, uint64_t *idents) {
    int n = 0, gone;
    rs_pyreader *r = self->core;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    r->gone = 0;
    uint64_t interp;
    if (pyf_ptr(r, r->runtime + (uint64_t)r->off[O_RUNTIME_INTERPRETERS_HEAD], &interp) < 0)
        interp = 0;
    for (int k = 0; interp != 0 && k < PYF_MAX_INTERPS && n < PYF_MAX_THREADS; k++) {
        uint64_t ts;
        if (pyf_ptr(r, interp + (uint64_t)r->off[O_INTERP_THREADS_HEAD], &ts) < 0) break;
        for (int j = 0; ts != 0 && n < PYF_MAX_THREADS && j < PYF_MAX_THREADS; j++) {
            if (pyf_ptr(r, ts + (uint64_t)r->off[O_TSTATE_NATIVE_THREAD_ID], &natives[n]) < 0)
                break;
            if (idents != NULL) {
                idents[n] = 0;
                if (r->off[O_TSTATE_THREAD_ID] >= 0 &&
                    pyf_ptr(r, ts + (uint64_t)r->off[O_TSTATE_THREAD_ID], &idents[n]) < 0)
                    break;
            }
            n++;
            if (pyf_ptr(r, ts + (uint64_t)r->off[O_TSTATE_NEXT], &ts) < 0) break;
        }
        if (r->off[O_INTERP_NEXT] < 0) break;
        if (pyf_ptr(r, interp + (uint64_t)r->off[O_INTERP_NEXT], &interp) < 0) break;
    }
    gone = r->gone;
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    return gone && n == 0 ? -1 : n;
}

static PyObject *PyFrameReader_threads(PyFrameReader *self, PyObject *unused) {
    if (pyf_ready(self) < 0) return NULL;
    uint64_t ids[PYF_MAX_THREADS];
    int n = pyf_thread_states(self, ids, NULL);
    if (n < 0) return pyf_error(RS_PY_GONE);
    PyObject *list = PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(ids[i]);
        if (v == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

static PyObject *PyFrameReader_thread_idents(PyFrameReader *self, PyObject *unused) {
    if (pyf_ready(self) < 0) return NULL;
    uint64_t *ids = malloc(2 * PYF_MAX_THREADS * sizeof *ids);
    if (ids == NULL) return PyErr_NoMemory();
    int n = pyf_thread_states(self, ids, ids + PYF_MAX_THREADS);
    PyObject *list = n < 0 ? pyf_error(RS_PY_GONE) : PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)ids[i],
                                    (unsigned long long)ids[PYF_MAX_THREADS + i]);
        if (t == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, t);
    }
    free(ids);
    return list;
}

#define PYF_MAX_READ (256u << 10) /* bytes one read() may copy */

static PyObject *PyFrameReader_read(PyFrameReader *self, PyObject *args) {
    if (pyf_ready(self) < 0) return NULL;
    unsigned long long addr;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "Kn", &addr, &size)) return NULL;
    if (size < 0 || size > (Py_ssize_t)PYF_MAX_READ) {
        PyErr_Format(PyExc_ValueError, "read: size %zd is not in 0..%u", size, PYF_MAX_READ);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL || size == 0) return out;
    int failed;
    char *buf = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    failed = pyf_read(self->core, addr, buf, (size_t)size) < 0;
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    if (failed) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

static PyObject *PyFrameReader_string(PyFrameReader *self, PyObject *args) {
    if (pyf_ready(self) < 0) return NULL;
    unsigned long long addr;
    Py_ssize_t max = PYF_MAX_STR;
    if (!PyArg_ParseTuple(args, "K|n", &addr, &max)) return NULL;
    char *text;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    text = pyf_string(self->core, addr, max, NULL);
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    if (text == NULL) Py_RETURN_NONE;
    PyObject *out = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    free(text);
    return out;
}

/* Where the BPF sampler's code tag is read (rs_bpf_config.code_tag): co_filename, when
 * co_name, co_qualname (RS_BPF_CODE_TAG_QUALNAME) and co_linetable follow it, word by word,
 * inside the header the drain reads, and a str's length, state and ASCII characters lie
 * where the program's one 48-byte read from offset 16 finds them (3.11-3.13); -1
 * otherwise (untagged). */
static long pyf_code_tag_offset(const long *off) {
    long at = off[O_CODE_FILENAME];
    if (at < 0 || (at & 7) != 0 || off[O_CODE_NAME] != at + 8 ||
        off[O_CODE_QUALNAME] != at + 8 * RS_BPF_CODE_TAG_QUALNAME ||
        off[O_CODE_LINETABLE] != at + 24 || at + 32 > off[O_CODE_ADAPTIVE] ||
        off[O_UNICODE_LENGTH] != 16 || off[O_UNICODE_STATE] != 32 ||
        off[O_UNICODE_ASCII_DATA] < 16 || off[O_UNICODE_ASCII_DATA] > 48 ||
        (off[O_UNICODE_ASCII_DATA] & 7) != 0)
        return -1;
    return at;
}

static int PyFrameReader_init(PyFrameReader *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pid", "runtime", "code_type", "unicode_type", "offsets", NULL};
    int pid;
    unsigned long long runtime, code_type, unicode_type;
    PyObject *offsets;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iKKKO!", kwlist, &pid, &runtime, &code_type,
                                     &unicode_type, &PyDict_Type, &offsets))
        return -1;
    if (self->core != NULL) {
        PyErr_SetString(PyExc_ValueError, "PyFrameReader is already initialized");
        return -1;
    }
    if (pid <= 0 || runtime == 0 || code_type == 0 || unicode_type == 0) {
        PyErr_SetString(PyExc_ValueError, "pid and addresses must be positive");
        return -1;
    }
    long off[O_COUNT];
    for (int i = 0; i < O_COUNT; i++) {
        PyObject *v = PyDict_GetItemString(offsets, pyf_offset_names[i]);
        if (v == NULL) {
            if (pyf_optional(i)) {
                off[i] = -1;
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
        off[i] = value;
    }
    /* Fields read out of fixed-size buffers must lie inside them. */
    if (off[O_CODE_ADAPTIVE] < 16 || off[O_CODE_ADAPTIVE] > PYF_HEADER ||
        off[O_CODE_QUALNAME] + 8 > off[O_CODE_ADAPTIVE] ||
        off[O_CODE_FILENAME] + 8 > off[O_CODE_ADAPTIVE] ||
        off[O_CODE_LINETABLE] + 8 > off[O_CODE_ADAPTIVE] ||
        off[O_CODE_FIRSTLINENO] + 4 > off[O_CODE_ADAPTIVE] ||
        off[O_FRAME_CODE] + 8 > PYF_FRAME || off[O_FRAME_INSTR] + 8 > PYF_FRAME ||
        off[O_FRAME_PREVIOUS] + 8 > PYF_FRAME || off[O_FRAME_OWNER] >= PYF_FRAME ||
        off[O_FRAME_IS_ENTRY] >= PYF_FRAME ||
        off[O_UNICODE_LENGTH] + 8 > off[O_UNICODE_COMPACT_DATA] ||
        off[O_UNICODE_STATE] + 4 > off[O_UNICODE_COMPACT_DATA] ||
        off[O_BYTES_SIZE] + 8 > off[O_BYTES_DATA] ||
        (off[O_TSTATE_CURRENT_FRAME] < 0 &&
         (off[O_TSTATE_CFRAME] < 0 || off[O_CFRAME_CURRENT_FRAME] < 0))) {
        PyErr_SetString(PyExc_ValueError, "offsets: inconsistent layout");
        return -1;
    }
    rs_pyreader *r = calloc(1, sizeof *r);
    if (r == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(r->off, off, sizeof off);
    r->code_tag = pyf_code_tag_offset(off);
    r->pid = pid;
    r->runtime = runtime;
    r->code_type = code_type;
    r->unicode_type = unicode_type;
    pthread_mutex_init(&self->lock, NULL);
    self->core = r;
    return 0;
}

static void PyFrameReader_dealloc(PyFrameReader *self) {
    if (self->core != NULL) {
        pyf_free(self->core);
        pthread_mutex_destroy(&self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define PYF_COUNTER(field, doc)                                                     \
    static PyObject *PyFrameReader_get_##field(PyFrameReader *self, void *closure) { \
        if (self->core == NULL) return PyLong_FromLong(0);                          \
        pthread_mutex_lock(&self->lock);                                            \
        unsigned long long v = self->core->field;                                   \
        pthread_mutex_unlock(&self->lock);                                          \
        return PyLong_FromUnsignedLongLong(v);                                      \
    }
PYF_COUNTER(walks, "")
PYF_COUNTER(dropped, "")
PYF_COUNTER(truncated, "")
PYF_COUNTER(reads, "")

static PyObject *PyFrameReader_get_pid(PyFrameReader *self, void *closure) {
    return PyLong_FromLong(self->core ? self->core->pid : 0);
}

static PyGetSetDef PyFrameReader_getset[] = {
    {"pid", (getter)PyFrameReader_get_pid, NULL, "target process", NULL},
    {"walks", (getter)PyFrameReader_get_walks, NULL, "walks (frames() and walk() calls)", NULL},
    {"dropped", (getter)PyFrameReader_get_dropped, NULL,
     "chains not returned: a garbage pointer, a non-code object, or the top frames changed "
     "while they were read", NULL},
    {"truncated", (getter)PyFrameReader_get_truncated, NULL, "chains cut at 1024 frames", NULL},
    {"reads", (getter)PyFrameReader_get_reads, NULL, "process_vm_readv calls", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef PyFrameReader_methods[] = {
    {"frames", (PyCFunction)PyFrameReader_frames, METH_O,
     "frames(tid) -> list[PyFrame] | None: the thread's Python frames, innermost first; None "
     "if it has no thread state or the chain could not be read consistently (dropped)."},
    {"walk", (PyCFunction)PyFrameReader_walk, METH_O,
     "walk(tid) -> list[tuple[int, int, bool]] | None: (function id, line, entry) per frame, "
     "innermost first; ids are resolved by functions()."},
    {"functions", (PyCFunction)PyFrameReader_functions, METH_VARARGS,
     "functions(start=1) -> list[tuple[int, str, str, int]]: (id, qualname, file, first line) "
     "of every function id >= start."},
    {"threads", (PyCFunction)PyFrameReader_threads, METH_NOARGS,
     "threads() -> list[int]: native thread ids of the interpreter's thread states."},
    {"thread_idents", (PyCFunction)PyFrameReader_thread_idents, METH_NOARGS,
     "thread_idents() -> list[tuple[int, int]]: (native thread id, thread ident) of every "
     "thread state; the ident is 0 when the layout has no tstate_thread_id."},
    {"read", (PyCFunction)PyFrameReader_read, METH_VARARGS,
     "read(address, size) -> bytes | None: `size` bytes (at most 256 KiB) of the target at "
     "`address`, or None when they cannot all be read."},
    {"string", (PyCFunction)PyFrameReader_string, METH_VARARGS,
     "string(address, max=1024) -> str | None: the str object at `address` if it is a "
     "compact str of at most `max` code points (checked as the frame walk checks names)."},
    {NULL, NULL, 0, NULL},
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
    .tp_getset = PyFrameReader_getset,
};

int rs_pyreader_from_object(PyObject *obj, rs_pyreader **core, pthread_mutex_t **lock) {
    if (!PyObject_TypeCheck(obj, &PyFrameReaderType) || ((PyFrameReader *)obj)->core == NULL)
        return -1;
    *core = ((PyFrameReader *)obj)->core;
    *lock = &((PyFrameReader *)obj)->lock;
    return 0;
}

/* dict[key] = value, consuming the reference to value (NULL: an error already set). */
static int pyf_set(PyObject *dict, const char *key, PyObject *value) {
    if (value == NULL) return -1;
    int rc = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return rc;
}

/* The heap shim's own offsets (shim/shimpy_layout.h), for tests to compare with
 * collector/pyframes.py's: SHIM_PY_LAYOUTS = {(3, 11): {field: offset}, (3, 12): ...};
 * SHIM_PY_DEBUG_313 = {field: (index of its uint64 in _Py_DebugOffsets after the cookie,
 * or -1; the value when -1)}, with the version and free_threaded words it checks. */
static int pyf_add_shim_layouts(PyObject *module) {
    int rc = -1;
    PyObject *l311 = PyDict_New(), *l312 = PyDict_New(), *d313 = PyDict_New(), *all = NULL;
    if (l311 == NULL || l312 == NULL || d313 == NULL) goto done;
#define SHIMPY_FIELD(name, v311, v312, index313, value313)                     \
    if (pyf_set(l311, #name, PyLong_FromLong(v311)) < 0 ||                     \
        pyf_set(l312, #name, PyLong_FromLong(v312)) < 0 ||                     \
        pyf_set(d313, #name, Py_BuildValue("(ii)", index313, value313)) < 0)   \
        goto done;
    SHIMPY_LAYOUT_FIELDS(SHIMPY_FIELD)
#undef SHIMPY_FIELD
    if (pyf_set(d313, "version", Py_BuildValue("(ii)", SHIMPY_DEBUG_VERSION, 0)) < 0 ||
        pyf_set(d313, "free_threaded", Py_BuildValue("(ii)", SHIMPY_DEBUG_FREE_THREADED, 0)) < 0)
        goto done;
    all = Py_BuildValue("{(ii)O(ii)O}", 3, 11, l311, 3, 12, l312);
    if (all == NULL || PyModule_AddObjectRef(module, "SHIM_PY_LAYOUTS", all) < 0 ||
        PyModule_AddObjectRef(module, "SHIM_PY_DEBUG_313", d313) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(l311);
    Py_XDECREF(l312);
    Py_XDECREF(d313);
    Py_XDECREF(all);
    return rc;
}

int rsprof_pyframes_register(PyObject *module) {
    if (pyf_add_shim_layouts(module) < 0) return -1;
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
