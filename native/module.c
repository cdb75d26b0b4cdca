/* rsprof._native: the one boundary between Python and the C core.
 * Each part registers its types here; see docs/native.md for the Python-facing API. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

int rsprof_perf_register(PyObject *module);   /* perf.c: PerfSampler */
int rsprof_heap_register(PyObject *module);   /* heapreader.c: HeapReader */
int rsprof_dwarf_register(PyObject *module);  /* dwarf.c: DWARF line-table helpers */

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "rsprof._native",
    "C core of rsprof: perf_event_open sampling, ring readers, heap event reader.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) return NULL;
    if (rsprof_perf_register(m) < 0 || rsprof_heap_register(m) < 0 ||
        rsprof_dwarf_register(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
