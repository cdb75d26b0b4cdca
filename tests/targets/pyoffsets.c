/* Prints the CPython structure offsets rsprof's Python frame reader needs, as JSON, from
 * the internal headers of the Python it is compiled against:
 *   gcc -DPy_BUILD_CORE -I<prefix>/include/python3.X -I<prefix>/include/python3.X/internal
 * tests/system/test_pyframes.py compares the table in collector/pyframes.py with its output for
 * every installed Python; rerun it to add a version. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_frame.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_runtime.h"
#include "internal/pycore_dict.h"
#include "internal/pycore_moduleobject.h"
#include "internal/pycore_gil.h"

#define F(name, value) printf("%s\"%s\": %ld", first ? "" : ", ", name, (long)(value)), first = 0

int main(void) {
    int first = 1;
    printf("{");
    F("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
    F("interp_next", offsetof(PyInterpreterState, next));
    F("interp_threads_head", offsetof(PyInterpreterState, threads.head));
    F("tstate_next", offsetof(PyThreadState, next));
    F("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
#if PY_VERSION_HEX < 0x030D0000
    F("tstate_cframe", offsetof(PyThreadState, cframe));
    F("cframe_current_frame", offsetof(_PyCFrame, current_frame));
    F("tstate_current_frame", -1);
    F("frame_code", offsetof(_PyInterpreterFrame, f_code));
    F("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#else
    F("tstate_cframe", -1);
    F("cframe_current_frame", -1);
    F("tstate_current_frame", offsetof(PyThreadState, current_frame));
    F("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    F("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#endif
    F("frame_previous", offsetof(_PyInterpreterFrame, previous));
    F("frame_owner", offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX >= 0x030C0000
    F("owner_cstack", FRAME_OWNED_BY_CSTACK);
    F("frame_is_entry", -1);
#else
    F("owner_cstack", -1);
    F("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#endif
    F("code_name", offsetof(PyCodeObject, co_name));
    F("code_qualname", offsetof(PyCodeObject, co_qualname));
    F("code_filename", offsetof(PyCodeObject, co_filename));
    F("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    F("code_linetable", offsetof(PyCodeObject, co_linetable));
    F("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    F("unicode_length", offsetof(PyASCIIObject, length));
    F("unicode_state", offsetof(PyASCIIObject, length) + 2 * sizeof(Py_ssize_t));
    F("unicode_ascii_data", sizeof(PyASCIIObject));
    F("unicode_compact_data", sizeof(PyCompactUnicodeObject));
    F("bytes_size", offsetof(PyVarObject, ob_size));
    F("bytes_data", offsetof(PyBytesObject, ob_sval));
    /* Python thread names (collector/pythreads.py): sys.modules -> threading._active ->
     * each Thread's instance dict -> _name. */
    F("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX < 0x030C0000
    F("interp_modules", offsetof(PyInterpreterState, modules));
    F("long_size", offsetof(PyVarObject, ob_size));
    F("long_digits", offsetof(PyLongObject, ob_digit));
#else
    F("interp_modules", offsetof(PyInterpreterState, imports.modules));
    F("long_size", offsetof(PyLongObject, long_value.lv_tag));
    F("long_digits", offsetof(PyLongObject, long_value.ob_digit));
#endif
    F("module_dict", offsetof(PyModuleObject, md_dict));
    F("dict_used", offsetof(PyDictObject, ma_used));
    F("dict_version", offsetof(PyDictObject, ma_version_tag));
    F("dict_keys", offsetof(PyDictObject, ma_keys));
    F("dict_values", offsetof(PyDictObject, ma_values));
    F("dictkeys_log2_size", offsetof(PyDictKeysObject, dk_log2_size));
    F("dictkeys_log2_index_bytes", offsetof(PyDictKeysObject, dk_log2_index_bytes));
    F("dictkeys_kind", offsetof(PyDictKeysObject, dk_kind));
    F("dictkeys_nentries", offsetof(PyDictKeysObject, dk_nentries));
    F("dictkeys_indices", offsetof(PyDictKeysObject, dk_indices));
    F("dictvalues_values", offsetof(PyDictValues, values));
    F("type_flags", offsetof(PyTypeObject, tp_flags));
    F("heaptype_cached_keys", offsetof(PyHeapTypeObject, ht_cached_keys));
    /* --gil: who holds the GIL (3.11: one per runtime; 3.12+: the interpreter's pointer) */
    F("tstate_interp", offsetof(PyThreadState, interp));
#if PY_VERSION_HEX < 0x030C0000
    F("runtime_gil", offsetof(_PyRuntimeState, ceval.gil));
    F("interp_gil", -1);
#else
    F("runtime_gil", -1);
    F("interp_gil", offsetof(PyInterpreterState, ceval.gil));
#endif
    F("gil_last_holder", offsetof(struct _gil_runtime_state, last_holder));
    F("gil_locked", offsetof(struct _gil_runtime_state, locked));
    printf("}\n");
    return 0;
}
