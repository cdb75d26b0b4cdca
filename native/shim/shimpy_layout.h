/* shimpy_layout.h: the CPython structure offsets the heap shim reads Python frames with
 * (native/shim/shimpy.c), one row per field. Pure C (the shim has no Python in it).
 *
 * The extension includes it too and exports it (rsprof._native.SHIM_PY_LAYOUTS and
 * SHIM_PY_DEBUG_313) so that tests/test_heap_python.py checks, field by field and for
 * every version, that these are the numbers of collector/pyframes.py (LAYOUTS,
 * _DEBUG_FIELDS_313 and debug_offsets_layout), which tests/test_pyframes.py checks against
 * each installed Python's own headers (tests/targets/pyoffsets.c).
 *
 * X(field, 3.11 offset, 3.12 offset, 3.13 index, 3.13 value):
 * - 3.11, 3.12: byte offsets, -1 where the field does not exist;
 * - 3.13: the index of the field's uint64 in _Py_DebugOffsets (at the start of _PyRuntime,
 *   counted after the 8-byte "xdebugpy" cookie), or -1 when 3.13 does not publish it: the
 *   field's value is then the last column (unused otherwise). */
#ifndef RSPROF_SHIMPY_LAYOUT_H
#define RSPROF_SHIMPY_LAYOUT_H

/* owner_cstack: FRAME_OWNED_BY_CSTACK, the owner of the C stack's entry frames (3.12+). */
#define SHIMPY_LAYOUT_FIELDS(X)                     \
    X(tstate_native_thread_id,  160,  144,  24,  0) \
    X(tstate_cframe,             56,   56,  -1, -1) \
    X(cframe_current_frame,       8,    0,  -1, -1) \
    X(tstate_current_frame,      -1,   -1,  22,  0) \
    X(frame_code,                32,    0,  29,  0) \
    X(frame_instr,               56,   56,  30,  0) \
    X(frame_previous,            48,    8,  28,  0) \
    X(frame_owner,               69,   70,  32,  0) \
    X(owner_cstack,              -1,    3,  -1,  3) \
    X(frame_is_entry,            68,   -1,  -1, -1) \
    X(code_qualname,            128,  128,  36,  0) \
    X(code_filename,            112,  112,  34,  0) \
    X(code_linetable,           136,  136,  37,  0) \
    X(code_firstlineno,          72,   68,  38,  0) \
    X(code_adaptive,            184,  192,  42,  0)

/* 3.13's _Py_DebugOffsets: the uint64 indices (after the cookie) of the version
 * (PY_VERSION_HEX) and of the free-threaded flag the shim checks first. */
#define SHIMPY_DEBUG_COOKIE "xdebugpy"
#define SHIMPY_DEBUG_VERSION 0
#define SHIMPY_DEBUG_FREE_THREADED 1

#endif
