/* symtab_build(sources, section_ends): the function table of collector/symbols/symtab.py's
 * SymbolTable, built from ELF symbol sections (and a few symbols given as tuples: PLT stubs,
 * tests). In Python, decoding libpython3.13's 12.5 k .symtab/.dynsym entries into objects and
 * choosing among them was 36-46 ms, paid at the first new address of a recording in that
 * library (a leaf is any instruction: nearly every recording of a Python target meets one);
 * here 1-2 ms.
 *
 * sources: a list, each item either
 *   (entries: buffer, names: buffer, is64: bool, big_endian: bool), an SHT_SYMTAB/SHT_DYNSYM
 *   section's data and its string table (entries with name offset 0 are skipped, as
 *   ElfFile.symbols skips them; a partial last entry is ignored), or
 *   a list of (name: str, value, size, type, bind, shndx) tuples,
 * in the order SymbolTable's rule sees them (the first of two equally preferred aliases wins).
 * section_ends: {section index: end address} of the executable sections.
 *
 * The rule (SymbolTable's docstring): a symbol counts if its section is defined (not 0, not
 * reserved) and its value not 0, and it is a function (STT_FUNC, STT_GNU_IFUNC) or an untyped
 * label inside an executable section whose name does not start with "$" or ".L"; among the
 * symbols at one address the one preferred is sized, typed, global (then weak), shortest
 * name (in characters); a sized symbol ends at value + size, an unsized one at the next
 * symbol or its section's end, whichever is first, and at least one byte after its start.
 *
 * Returns (starts: bytes of uint64, ends: bytes of uint64, names: list[str]), by start. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STT_NOTYPE 0
#define STT_FUNC 2
#define STT_GNU_IFUNC 10
#define STB_GLOBAL 1
#define STB_WEAK 2
#define SHN_LORESERVE 0xFF00

typedef struct {
    uint64_t value, size;
    uint32_t shndx;
    uint32_t order;        /* position in the sources: ties keep the first */
    uint32_t rank;         /* the preference, packed: lower is preferred */
    const char *name;      /* in a names buffer, or in a tuple's UTF-8 */
    Py_ssize_t name_len;   /* bytes */
} st_symbol;

typedef struct {
    st_symbol *items;
    size_t n, cap;
    bool nomem;
} st_list;

typedef struct {
    uint64_t index, end;   /* an executable section and its end address */
} st_exec;

typedef struct {
    st_exec *items;        /* sorted by index */
    size_t n;
} st_sections;

static int st_by_index(const void *a, const void *b) {
    uint64_t x = ((const st_exec *)a)->index, y = ((const st_exec *)b)->index;
    return x < y ? -1 : x > y;
}

static bool st_exec_end(const st_sections *sections, uint32_t shndx, uint64_t *end) {
    st_exec key = {shndx, 0};
    const st_exec *found = sections->n ? bsearch(&key, sections->items, sections->n,
                                                 sizeof key, st_by_index)
                                       : NULL;
    if (found != NULL && end != NULL) *end = found->end;
    return found != NULL;
}

/* Characters of a UTF-8 name (Python's len of its decoded str for valid UTF-8). */
static uint32_t st_chars(const char *name, Py_ssize_t len) {
    uint32_t n = 0;
    for (Py_ssize_t i = 0; i < len; i++)
        if (((unsigned char)name[i] & 0xC0) != 0x80) n++;
    return n;
}

static void st_add(st_list *list, const st_sections *sections, const char *name,
                   Py_ssize_t name_len, uint64_t value, uint64_t size, unsigned type,
                   unsigned bind, uint32_t shndx) {
    if (shndx == 0 || shndx >= SHN_LORESERVE || value == 0) return;
    if (type != STT_FUNC && type != STT_GNU_IFUNC) {
        /* untyped labels count only inside code sections; local labels and ARM mapping
         * symbols ($x, $d) are noise */
        if (type != STT_NOTYPE || !st_exec_end(sections, shndx, NULL)) return;
        if (name_len >= 1 && name[0] == '$') return;
        if (name_len >= 2 && name[0] == '.' && name[1] == 'L') return;
    }
    if (list->n == list->cap) {
        size_t cap = list->cap ? list->cap * 2 : 4096;
        st_symbol *items = realloc(list->items, cap * sizeof *items);
        if (items == NULL) {
            list->nomem = true;
            return;
        }
        list->items = items;
        list->cap = cap;
    }
    unsigned bind_rank = bind == STB_GLOBAL ? 0 : bind == STB_WEAK ? 1 : 2;
    uint32_t chars = st_chars(name, name_len);
    if (chars > 0x3FFFFFF) chars = 0x3FFFFFF;
    st_symbol *s = &list->items[list->n];
    s->value = value;
    s->size = size;
    s->shndx = shndx;
    s->order = (uint32_t)list->n;
    s->rank = (size ? 0u : 1u) << 31 | (type != STT_NOTYPE ? 0u : 1u) << 30 |
              (uint32_t)bind_rank << 26 | chars;
    s->name = name;
    s->name_len = name_len;
    list->n++;
}

static uint64_t st_read(const unsigned char *p, int bytes, bool big) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
        unsigned shift = big ? (unsigned)(bytes - 1 - i) * 8 : (unsigned)i * 8;
        v |= (uint64_t)p[i] << shift;
    }
    return v;
}

static void st_section(st_list *list, const st_sections *sections, const Py_buffer *entries,
                       const Py_buffer *names, bool is64, bool big) {
    const unsigned char *data = entries->buf;
    const char *strtab = names->buf;
    size_t size = is64 ? 24 : 16;
    size_t count = (size_t)entries->len / size;
    for (size_t i = 0; i < count && !list->nomem; i++) {
        const unsigned char *e = data + i * size;
        uint64_t name_off, value, sym_size;
        unsigned info, shndx;
        if (is64) {  /* Elf64_Sym: name u32, info u8, other u8, shndx u16, value, size */
            name_off = st_read(e, 4, big);
            info = e[4];
            shndx = (unsigned)st_read(e + 6, 2, big);
            value = st_read(e + 8, 8, big);
            sym_size = st_read(e + 16, 8, big);
        } else {     /* Elf32_Sym: name, value, size u32, info, other u8, shndx u16 */
            name_off = st_read(e, 4, big);
            value = st_read(e + 4, 4, big);
            sym_size = st_read(e + 8, 4, big);
            info = e[12];
            shndx = (unsigned)st_read(e + 14, 2, big);
        }
        if (name_off == 0) continue;
        const char *name = "";
        Py_ssize_t name_len = 0;
        if (name_off < (uint64_t)names->len) {
            name = strtab + name_off;
            const char *nul = memchr(name, '\0', (size_t)(names->len - (Py_ssize_t)name_off));
            name_len = nul ? nul - name : names->len - (Py_ssize_t)name_off;
        }
        st_add(list, sections, name, name_len, value, sym_size, info & 0xF, info >> 4, shndx);
    }
}

static int st_by_value(const void *a, const void *b) {
    const st_symbol *x = a, *y = b;
    if (x->value != y->value) return x->value < y->value ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static PyObject *native_symtab_build(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *sources, *section_ends;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &sources, &PyDict_Type, &section_ends))
        return NULL;
    PyObject *result = NULL;
    st_list list = {0};
    st_sections sections = {0};
    Py_ssize_t n_sources = PyList_GET_SIZE(sources);
    Py_buffer *buffers = PyMem_Calloc((size_t)(2 * n_sources + 1), sizeof(Py_buffer));
    Py_ssize_t n_buffers = 0;
    PyObject *names = NULL;
    uint64_t *starts = NULL, *ends = NULL;
    if (buffers == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* the executable sections, sorted by index */
    Py_ssize_t n_ends = PyDict_GET_SIZE(section_ends), pos = 0;
    sections.items = malloc((size_t)(n_ends + 1) * sizeof *sections.items);
    if (sections.items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *key, *value;
    while (PyDict_Next(section_ends, &pos, &key, &value)) {
        unsigned long long index = PyLong_AsUnsignedLongLong(key);
        unsigned long long end = PyLong_AsUnsignedLongLong(value);
        if (PyErr_Occurred()) goto done;
        if (index > UINT32_MAX) continue;  /* no symbol's shndx (16 bits) names it */
        sections.items[sections.n++] = (st_exec){index, end};
    }
    if (sections.n) qsort(sections.items, sections.n, sizeof *sections.items, st_by_index);

    for (Py_ssize_t k = 0; k < n_sources && !list.nomem; k++) {
        PyObject *source = PyList_GET_ITEM(sources, k);
        if (PyTuple_Check(source) && PyTuple_GET_SIZE(source) == 4) {
            Py_buffer *entries = &buffers[n_buffers], *strtab = &buffers[n_buffers + 1];
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(source, 0), entries, PyBUF_SIMPLE) < 0)
                goto done;
            n_buffers++;
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(source, 1), strtab, PyBUF_SIMPLE) < 0)
                goto done;
            n_buffers++;
            int is64 = PyObject_IsTrue(PyTuple_GET_ITEM(source, 2));
            int big = PyObject_IsTrue(PyTuple_GET_ITEM(source, 3));
            if (is64 < 0 || big < 0) goto done;
            st_section(&list, &sections, entries, strtab, is64, big);
        } else if (PyList_Check(source)) {
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(source) && !list.nomem; i++) {
                const char *name;
                Py_ssize_t name_len;
                unsigned long long v, size;
                unsigned int type, bind, shndx;
                if (!PyArg_ParseTuple(PyList_GET_ITEM(source, i), "s#KKIII", &name, &name_len,
                                      &v, &size, &type, &bind, &shndx))
                    goto done;
                /* the UTF-8 stays valid while the list holds the str */
                st_add(&list, &sections, name, name_len, v, size, type, bind, shndx);
            }
        } else {
            PyErr_SetString(PyExc_TypeError,
                            "symtab_build: a source is (entries, names, is64, big_endian) or a"
                            " list of (name, value, size, type, bind, shndx)");
            goto done;
        }
    }
    if (list.nomem) {
        PyErr_NoMemory();
        goto done;
    }

    /* by value, the preferred alias first; keep the first of each value */
    if (list.n) qsort(list.items, list.n, sizeof *list.items, st_by_value);
    size_t kept = 0;
    for (size_t i = 0; i < list.n; i++)
        if (kept == 0 || list.items[kept - 1].value != list.items[i].value)
            list.items[kept++] = list.items[i];
    starts = malloc((kept ? kept : 1) * sizeof *starts);
    ends = malloc((kept ? kept : 1) * sizeof *ends);
    names = PyList_New((Py_ssize_t)kept);
    if (starts == NULL || ends == NULL || names == NULL) {
        if (names != NULL) PyErr_NoMemory();  /* PyList_New has set its error */
        goto done;
    }
    for (size_t i = 0; i < kept; i++) {
        const st_symbol *s = &list.items[i];
        starts[i] = s->value;
        if (s->size) {  /* a size past the address space (a broken file) ends there */
            ends[i] = s->value + s->size < s->value ? UINT64_MAX : s->value + s->size;
        } else {
            uint64_t limit = s->value + 1;
            (void)st_exec_end(&sections, s->shndx, &limit);
            uint64_t next = i + 1 < kept ? list.items[i + 1].value : limit;
            uint64_t end = next < limit ? next : limit;
            ends[i] = end > s->value + 1 ? end : s->value + 1;
        }
        PyObject *name = PyUnicode_DecodeUTF8(s->name, s->name_len, "replace");
        if (name == NULL) goto done;
        PyList_SET_ITEM(names, (Py_ssize_t)i, name);
    }
    result = Py_BuildValue("(y#y#O)", (const char *)starts, (Py_ssize_t)(kept * sizeof *starts),
                           (const char *)ends, (Py_ssize_t)(kept * sizeof *ends), names);
done:
    for (Py_ssize_t i = 0; i < n_buffers; i++) PyBuffer_Release(&buffers[i]);
    PyMem_Free(buffers);
    free(sections.items);
    free(list.items);
    free(starts);
    free(ends);
    Py_XDECREF(names);
    return result;
}

static PyMethodDef symtab_methods[] = {
    {"symtab_build", native_symtab_build, METH_VARARGS,
     "symtab_build(sources, section_ends) -> (starts, ends, names)\n\nA SymbolTable's"
     " function table from ELF symbol sections and symbol tuples (native/symtab.c)."},
    {NULL, NULL, 0, NULL},
};

int rsprof_symtab_register(PyObject *module) {
    return PyModule_AddFunctions(module, symtab_methods);
}
