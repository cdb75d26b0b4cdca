/* rsprof._native: the one boundary between Python and the C core.
 * Each part registers its types here; see docs/native.md for the Python-facing API. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "rs_unwind.h"
#include "stackwords.h"

int rsprof_perf_register(PyObject *module);   /* perf.c: PerfSampler */
int rsprof_heap_register(PyObject *module);   /* heapreader.c: HeapReader */
int rsprof_dwarf_register(PyObject *module);  /* dwarf.c: DWARF line-table helpers */
int rsprof_pyframes_register(PyObject *module); /* pyframes.c: PyFrameReader */
int rsprof_snapshot_register(PyObject *module); /* snapshot.c: StoppedProcess */
int rsprof_inject_register(PyObject *module);   /* inject.c: Tracee */
int rsprof_kallsyms_register(PyObject *module); /* kallsyms.c: kallsyms_text */
int rsprof_symtab_register(PyObject *module);   /* symtab.c: symtab_build */

/* cfi_functions(path) -> (ranges, rows, build_ms): the FDE function ranges of one ELF
 * file, from the same cached CFI tables the unwinder uses (native/unwind.c). */
static PyObject *native_cfi_functions(PyObject *mod, PyObject *arg) {
    PyObject *encoded;
    if (!PyUnicode_FSConverter(arg, &encoded)) return NULL;
    const uint64_t *ranges = NULL;
    size_t n = 0, rows = 0;
    double ms = 0;
    bool ok;
    Py_BEGIN_ALLOW_THREADS
    ok = rs_cfi_functions(PyBytes_AS_STRING(encoded), &ranges, &n, &rows, &ms);
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
        Py_DECREF(encoded);
        return NULL;
    }
    Py_DECREF(encoded);
    PyObject *lst = PyList_New((Py_ssize_t)n);
    if (lst == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *item = Py_BuildValue("(KK)", (unsigned long long)ranges[2 * i],
                                       (unsigned long long)ranges[2 * i + 1]);
        if (item == NULL) {
            Py_DECREF(lst);
            return NULL;
        }
        PyList_SET_ITEM(lst, (Py_ssize_t)i, item);
    }
    return Py_BuildValue("(NKd)", lst, (unsigned long long)rows, ms);
}

static PyMethodDef native_methods[] = {
    {"cfi_functions", native_cfi_functions, METH_O,
     "cfi_functions(path) -> (list[(start, end)], rows, build_ms)\n\nFunction ranges of the "
     "FDEs in an ELF file's .eh_frame/.debug_frame (link-time addresses, sorted), the number "
     "of rows of its unwind table and the time it took to build (cached per file)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "rsprof._native",
    "C core of rsprof: perf_event_open sampling, ring readers, heap event reader.", -1,
    native_methods, NULL, NULL, NULL, NULL,
};

/* The stack words' encoding (one definition: stackwords.h), for collector/frames.py and
 * collector/pyframes.py. PY_MARK does not fit a C long: added as an unsigned object. */
static int native_add_stack_words(PyObject *module) {
    PyObject *mark = PyLong_FromUnsignedLongLong(RS_PY_MARK);
    if (mark == NULL) return -1;
    int rc = PyModule_AddObjectRef(module, "PY_MARK", mark);
    Py_XDECREF(mark);
    if (rc < 0) return -1;
    mark = PyLong_FromUnsignedLongLong(RS_PY_MARK_SAMPLED);
    if (mark == NULL) return -1;
    rc = PyModule_AddObjectRef(module, "PY_MARK_SAMPLED", mark);
    Py_DECREF(mark);
    if (rc < 0 ||
        PyModule_AddIntConstant(module, "TRUNCATED_ADDRESS", RS_TRUNCATED_ADDRESS) < 0 ||
        PyModule_AddIntConstant(module, "KERNEL_ADDRESS", RS_KERNEL_ADDRESS) < 0 ||
        PyModule_AddIntConstant(module, "PY_FRAME_ENTRY_BIT", RS_PY_FRAME_ENTRY_BIT) < 0 ||
        PyModule_AddIntConstant(module, "PY_FRAME_FUNCTION_SHIFT",
                                RS_PY_FRAME_FUNCTION_SHIFT) < 0 ||
        PyModule_AddIntConstant(module, "PY_FRAME_FUNCTION_BITS", RS_PY_FRAME_FUNCTION_BITS) < 0 ||
        PyModule_AddIntConstant(module, "PY_FRAME_LINE_BITS", RS_PY_FRAME_LINE_BITS) < 0)
        return -1;
    return 0;
}

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) return NULL;
    if (native_add_stack_words(m) < 0 || rsprof_perf_register(m) < 0 ||
        rsprof_heap_register(m) < 0 || rsprof_dwarf_register(m) < 0 ||
        rsprof_pyframes_register(m) < 0 || rsprof_snapshot_register(m) < 0 ||
        rsprof_inject_register(m) < 0 || rsprof_kallsyms_register(m) < 0 ||
        rsprof_symtab_register(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
