/* kallsyms_text(source): the kernel's text symbols from /proc/kallsyms (a path, read in
 * 256 KiB pieces) or from its text (bytes), for collector/kallsyms.py. The Python parse (one
 * regular expression over the file) was 127 ms of the recorder's main thread at the first
 * off-CPU stack of every recording (6.18: 122 k lines, 64 k text symbols; the kernel writes
 * the file in another 42-44 ms): in a 2 s recording at 499 Hz, 127 µs per sample. This one
 * reads the same lines the same way in 3-5 ms.
 *
 * A line is `ADDRESS TYPE NAME[\t[MODULE]]`. Kept: TYPE t, T, w or W (text), NAME not
 * starting with `__pfx_` (a function's padding: no return address is ever in one), ADDRESS
 * not 0 (hidden). Returned: (starts: bytes of uint64, modules: bytes of uint16 indexes into
 * module_names, ends: bytes of uint32, the offset in names where each name ends, names: str
 * of the names joined by "\n", module_names: list[str] ("[ext4]", or "[kernel.kallsyms]" for
 * the kernel image's), sched_text_start, sched_text_end, text_start, text_end (_stext,
 * _etext; 0: not listed), listed (a non-blank line was seen), nonzero (a line with a
 * non-zero address)), the symbols in address order (ks_sort). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf_tables.h" /* perf_vec_reserve */

#define KS_CHUNK (256u << 10)
#define KS_MAX_MODULES 65535
#define KS_KERNEL_MODULE "[kernel.kallsyms]"

typedef struct {
    uint64_t *starts;
    uint16_t *modules;
    uint32_t *ends;          /* the offset in names of each name's end */
    size_t n, cap, cap_modules_of, cap_ends;  /* symbols; the arrays' capacities */
    char *names;             /* "\n"-joined */
    size_t names_len, names_cap;
    char **module_names;     /* "[ext4]", KS_KERNEL_MODULE */
    size_t n_modules, cap_modules;
    uint64_t sched_start, sched_end;
    uint64_t text_start, text_end;  /* _stext, _etext: the kernel image's code */
    bool listed, nonzero, nomem;
    bool unordered;          /* a start below the one before it */
} ks_state;

static int ks_hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool ks_space(char c) {
    /* Python's \s for ASCII */
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
           (c >= 0x1c && c <= 0x1f);
}

/* The module's index (label "[name]" as given, or the kernel's), -1 out of memory. */
static int ks_module(ks_state *s, const char *label, size_t len) {
    for (size_t i = 0; i < s->n_modules; i++)
        if (strlen(s->module_names[i]) == len && memcmp(s->module_names[i], label, len) == 0)
            return (int)i;
    if (s->n_modules >= KS_MAX_MODULES ||
        !perf_vec_reserve((void **)&s->module_names, &s->cap_modules, s->n_modules + 1, sizeof(char *)))
        return -1;
    char *copy = malloc(len + 1);
    if (copy == NULL) return -1;
    memcpy(copy, label, len);
    copy[len] = '\0';
    s->module_names[s->n_modules] = copy;
    return (int)s->n_modules++;
}

/* One line (without its "\n"). */
static void ks_line(ks_state *s, const char *p, const char *end) {
    const char *q = p;
    while (q < end && ks_space(*q)) q++;
    if (q < end) s->listed = true;
    /* ^0*[1-9a-fA-F]: any line whose address is not all zeros */
    q = p;
    while (q < end && *q == '0') q++;
    if (q < end && ks_hex(*q) > 0) s->nonzero = true;
    /* ^([0-9a-fA-F]+) [tTwW] (?!__pfx_)(\S+)(?:\t\[(\S+)\])? */
    uint64_t address = 0;
    q = p;
    while (q < end && ks_hex(*q) >= 0) address = address << 4 | (uint64_t)ks_hex(*q++);
    if (q == p || end - q < 3 || q[0] != ' ' || q[2] != ' ') return;
    char type = q[1];
    if (type != 't' && type != 'T' && type != 'w' && type != 'W') return;
    const char *name = q + 3, *name_end = name;
    while (name_end < end && !ks_space(*name_end)) name_end++;
    size_t name_len = (size_t)(name_end - name);
    if (name_len == 0 || (name_len >= 6 && memcmp(name, "__pfx_", 6) == 0)) return;
    if (name_len == 18 && memcmp(name, "__sched_text_start", 18) == 0) s->sched_start = address;
    if (name_len == 16 && memcmp(name, "__sched_text_end", 16) == 0) s->sched_end = address;
    if (name_len == 6 && memcmp(name, "_stext", 6) == 0) s->text_start = address;
    if (name_len == 6 && memcmp(name, "_etext", 6) == 0) s->text_end = address;
    if (address == 0) return;
    /* the module: "\t[" then a run of non-spaces ending in "]" (its last "]") */
    const char *label = KS_KERNEL_MODULE;
    size_t label_len = strlen(KS_KERNEL_MODULE);
    if (name_end + 1 < end && name_end[0] == '\t' && name_end[1] == '[') {
        const char *m = name_end + 2, *m_end = m;
        while (m_end < end && !ks_space(*m_end)) m_end++;
        const char *close = m_end;
        while (close > m && close[-1] != ']') close--;
        if (close > m + 1) {  /* at least one character before the last "]" */
            label = m - 1;
            label_len = (size_t)(close - label);
        }
    }
    int module = ks_module(s, label, label_len);
    if (module < 0 ||
        !perf_vec_reserve((void **)&s->starts, &s->cap, s->n + 1, sizeof(uint64_t)) ||
        !perf_vec_reserve((void **)&s->modules, &s->cap_modules_of, s->n + 1, sizeof(uint16_t)) ||
        !perf_vec_reserve((void **)&s->ends, &s->cap_ends, s->n + 1, sizeof(uint32_t)) ||
        s->names_len + name_len + 1 > UINT32_MAX ||
        !perf_vec_reserve((void **)&s->names, &s->names_cap, s->names_len + name_len + 1, 1)) {
        s->nomem = true;
        return;
    }
    if (s->n > 0 && address < s->starts[s->n - 1]) s->unordered = true;
    s->starts[s->n] = address;
    s->modules[s->n] = (uint16_t)module;
    s->n++;
    if (s->names_len) s->names[s->names_len++] = '\n';
    memcpy(s->names + s->names_len, name, name_len);
    s->names_len += name_len;
    s->ends[s->n - 1] = (uint32_t)s->names_len;
}

/* Whole lines of buf[0..len); returns the bytes used (a last line without "\n" is left
 * unless `last`). */
static size_t ks_feed(ks_state *s, const char *buf, size_t len, bool last) {
    size_t at = 0;
    while (at < len && !s->nomem) {
        const char *nl = memchr(buf + at, '\n', len - at);
        if (nl == NULL) {
            if (!last) break;
            ks_line(s, buf + at, buf + len);
            return len;
        }
        ks_line(s, buf + at, nl);
        at = (size_t)(nl - buf) + 1;
    }
    return at;
}

static void ks_free(ks_state *s) {
    free(s->starts);
    free(s->modules);
    free(s->ends);
    free(s->names);
    for (size_t i = 0; i < s->n_modules; i++) free(s->module_names[i]);
    free(s->module_names);
}

/* qsort's context: the starts the indexes refer to (one sort at a time: the GIL is held) */
static const uint64_t *ks_sort_starts;

static int ks_by_start(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    uint64_t x = ks_sort_starts[i], y = ks_sort_starts[j];
    if (x != y) return x < y ? -1 : 1;
    return i < j ? -1 : i > j;  /* stable: equal starts keep the file's order */
}

/* Puts the symbols in address order. The file lists them ascending but for the few BPF
 * programs and ftrace trampolines at its end (6.18: 3 of 64 k out of place); sorted in
 * Python that was 30-40 ms of the recorder's main thread at each recording's first off-CPU
 * stack. False: out of memory. */
static bool ks_sort(ks_state *s) {
    if (!s->unordered || s->n < 2) return true;
    uint32_t *order = malloc(s->n * sizeof *order);
    uint64_t *starts = malloc(s->n * sizeof *starts);
    uint16_t *modules = malloc(s->n * sizeof *modules);
    uint32_t *ends = malloc(s->n * sizeof *ends);
    char *names = malloc(s->names_len ? s->names_len : 1);
    bool ok = order && starts && modules && ends && names;
    if (ok) {
        for (size_t i = 0; i < s->n; i++) order[i] = (uint32_t)i;
        ks_sort_starts = s->starts;
        qsort(order, s->n, sizeof *order, ks_by_start);
        size_t len = 0;
        for (size_t k = 0; k < s->n; k++) {
            uint32_t i = order[k];
            size_t begin = i ? s->ends[i - 1] + 1 : 0;
            size_t name_len = s->ends[i] - begin;
            starts[k] = s->starts[i];
            modules[k] = s->modules[i];
            if (k) names[len++] = '\n';
            memcpy(names + len, s->names + begin, name_len);
            len += name_len;
            ends[k] = (uint32_t)len;
        }
        free(s->starts);
        free(s->modules);
        free(s->ends);
        free(s->names);
        s->starts = starts;
        s->modules = modules;
        s->ends = ends;
        s->names = names;
        s->cap = s->cap_modules_of = s->cap_ends = s->n;
        s->names_cap = s->names_len ? s->names_len : 1;
        s->unordered = false;
        starts = NULL;
        modules = NULL;
        ends = NULL;
        names = NULL;
    }
    free(order);
    free(starts);
    free(modules);
    free(ends);
    free(names);
    return ok;
}

static PyObject *ks_result(ks_state *s) {
    PyObject *mods = PyList_New((Py_ssize_t)s->n_modules);
    if (mods == NULL) return NULL;
    for (size_t i = 0; i < s->n_modules; i++) {
        PyObject *m = PyUnicode_DecodeUTF8(s->module_names[i],
                                           (Py_ssize_t)strlen(s->module_names[i]), "replace");
        if (m == NULL) {
            Py_DECREF(mods);
            return NULL;
        }
        PyList_SET_ITEM(mods, (Py_ssize_t)i, m);
    }
    return Py_BuildValue(
        "(y#y#y#NNKKKKOO)",  /* a NULL y# would be None: no symbol gives empty arrays */
        s->n ? (const char *)s->starts : "", (Py_ssize_t)(s->n * sizeof(uint64_t)),
        s->n ? (const char *)s->modules : "", (Py_ssize_t)(s->n * sizeof(uint16_t)),
        s->n ? (const char *)s->ends : "", (Py_ssize_t)(s->n * sizeof(uint32_t)),
        PyUnicode_DecodeUTF8(s->names ? s->names : "", (Py_ssize_t)s->names_len, "replace"),
        mods, (unsigned long long)s->sched_start, (unsigned long long)s->sched_end,
        (unsigned long long)s->text_start, (unsigned long long)s->text_end,
        s->listed ? Py_True : Py_False, s->nonzero ? Py_True : Py_False);
}

static PyObject *native_kallsyms_text(PyObject *mod, PyObject *arg) {
    (void)mod;
    ks_state s;
    memset(&s, 0, sizeof s);
    if (PyBytes_Check(arg)) {
        (void)ks_feed(&s, PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg), true);
    } else {
        PyObject *encoded;
        if (!PyUnicode_FSConverter(arg, &encoded)) return NULL;
        int fd = -1, err = 0;
        char *buf = malloc(2 * KS_CHUNK);
        Py_BEGIN_ALLOW_THREADS
        fd = buf == NULL ? -1 : open(PyBytes_AS_STRING(encoded), O_RDONLY | O_CLOEXEC);
        if (buf == NULL) err = ENOMEM;
        else if (fd < 0) err = errno;
        size_t have = 0;
        while (fd >= 0 && !s.nomem) {
            ssize_t got = read(fd, buf + have, 2 * KS_CHUNK - have);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) {
                err = errno;
                break;
            }
            have += (size_t)got;
            size_t used = ks_feed(&s, buf, have, got == 0);
            memmove(buf, buf + used, have - used);
            have -= used;
            if (got == 0) break;
            if (have == 2 * KS_CHUNK) have = 0;  /* a 512 KiB line: no symbol, dropped */
        }
        if (fd >= 0) close(fd);
        Py_END_ALLOW_THREADS
        free(buf);
        if (err != 0) {
            errno = err;
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
            Py_DECREF(encoded);
            ks_free(&s);
            return NULL;
        }
        Py_DECREF(encoded);
    }
    if (s.nomem || !ks_sort(&s)) {
        ks_free(&s);
        return PyErr_NoMemory();
    }
    PyObject *result = ks_result(&s);
    ks_free(&s);
    return result;
}

static PyMethodDef kallsyms_methods[] = {
    {"kallsyms_text", native_kallsyms_text, METH_O,
     "kallsyms_text(path or bytes) -> (starts, modules, ends, names, module_names, "
     "sched_text_start,"
     " sched_text_end, text_start, text_end, listed, nonzero)\n\nThe text symbols of /proc/kallsyms (native/"
     "kallsyms.c)."},
    {NULL, NULL, 0, NULL},
};

int rsprof_kallsyms_register(PyObject *module) {
    return PyModule_AddFunctions(module, kallsyms_methods);
}
