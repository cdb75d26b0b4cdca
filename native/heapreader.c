/* Placeholder until this part lands: registers nothing. */
#include <Python.h>
int rsprof_heap_register(PyObject *module) { (void)module; return 0; }
