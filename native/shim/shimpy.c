/* shimpy.c: Python frames of the thread that calls malloc, read in-process.
 *
 * Why in-process: by the time anything outside could read the chain the thread has moved
 * on. The allocating thread itself reads it, and only when it holds the GIL: then no other
 * thread can change the interpreter's frames, code objects or its thread state while we
 * read them, and every pointer followed is one the interpreter itself keeps valid.
 *
 * Holding the GIL is checked without touching another thread's memory:
 * - 3.12, 3.13: PyThreadState_GetUnchecked() / _PyThreadState_UncheckedGet() return this
 *   thread's own thread state while it is attached (holds the GIL), else NULL;
 * - 3.11: _PyThreadState_UncheckedGet() returns the GIL holder's (any thread's) state:
 *   compared, as a pointer, with this thread's own (PyGILState_GetThisThreadState(), a
 *   pthread key), so another thread's state is never dereferenced;
 * then the state's native_thread_id must be our tid.
 *
 * What is read, with offsets per version (shimpy_layout.h: 3.11, 3.12 from the table, the
 * same numbers as collector/pyframes.py LAYOUTS, checked by tests; 3.13: its own
 * _Py_DebugOffsets at the start of _PyRuntime): thread state -> current frame -> previous
 * ..., each frame's code object, instruction pointer, owner and entry flag, the code
 * object's type, qualname, filename, location table and first line (for the tag). Checks
 * on everything, so that a wrong assumption gives a native-only record, never a fault:
 * pointers non-NULL, 8-aligned and below 2^47; the code object's type is PyCode_Type; a
 * frame that is its own previous ends the walk as garbage; at most 1024 frames are visited
 * and RSPROF_HEAP_MAX_PY_FRAMES kept (a deeper chain is dropped whole: it could not be
 * spliced).
 */
#define _GNU_SOURCE
#include "shimpy.h"

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "heapring.h"
#include "shimpy_layout.h"

/* One long per field of shimpy_layout.h, -1 where the version has no such field. */
typedef struct {
#define SHIMPY_FIELD(name, v311, v312, index313, value313) long name;
    SHIMPY_LAYOUT_FIELDS(SHIMPY_FIELD)
#undef SHIMPY_FIELD
} py_layout;

/* From each version's own headers (tests/targets/pyoffsets.c; collector/pyframes.py LAYOUTS;
 * tests/system/test_heap_python.py checks that both tables agree). */
static const py_layout LAYOUT_311 = {
#define SHIMPY_FIELD(name, v311, v312, index313, value313) .name = v311,
    SHIMPY_LAYOUT_FIELDS(SHIMPY_FIELD)
#undef SHIMPY_FIELD
};
static const py_layout LAYOUT_312 = {
#define SHIMPY_FIELD(name, v311, v312, index313, value313) .name = v312,
    SHIMPY_LAYOUT_FIELDS(SHIMPY_FIELD)
#undef SHIMPY_FIELD
};

static py_layout g_l;
static uintptr_t g_code_type;
static void *(*g_get_tstate)(void);   /* the GIL holder's (3.11) or our attached state */
static void *(*g_this_tstate)(void);  /* 3.11: this thread's own state (pthread key) */

#define MAX_VISITED 1024

static inline int ptr_ok(uintptr_t p) { return p >= 4096 && p < (1ull << 47) && !(p & 7); }

static inline uintptr_t load(uintptr_t base, long off) {
    return *(const uintptr_t *)(base + (uintptr_t)off);
}

/* 3.13: _Py_DebugOffsets at the start of _PyRuntime, as uint64 words after the cookie
 * (indices in shimpy_layout.h, as in collector/pyframes.py _DEBUG_FIELDS_313). */
static int layout_313(const uint64_t *runtime) {
    if (memcmp(runtime, SHIMPY_DEBUG_COOKIE, 8) != 0) return 0;
    const uint64_t *w = runtime + 1;
    if (w[SHIMPY_DEBUG_VERSION] >> 16 != 0x030D || w[SHIMPY_DEBUG_FREE_THREADED] != 0) return 0;
    g_l = (py_layout){
#define SHIMPY_FIELD(name, v311, v312, index313, value313) \
        .name = (index313) >= 0 ? (long)w[(index313) >= 0 ? (index313) : 0] : (value313),
        SHIMPY_LAYOUT_FIELDS(SHIMPY_FIELD)
#undef SHIMPY_FIELD
    };
    const long *f = (const long *)&g_l;
    for (unsigned i = 0; i < sizeof g_l / sizeof(long); i++)
        if (f[i] < -1 || f[i] > 1 << 16) return 0;
    return 1;
}

int shimpy_init(int debug) {
    (void)debug;
    const uint32_t *version = dlsym(RTLD_DEFAULT, "Py_Version");
    void *code_type = dlsym(RTLD_DEFAULT, "PyCode_Type");
    const uint64_t *runtime = dlsym(RTLD_DEFAULT, "_PyRuntime");
    if (version == NULL || code_type == NULL || runtime == NULL) return 0;
    unsigned minor = (*version >> 16) & 0xff;
    if ((*version >> 24) != 3) return 0;
    void *get = NULL;
    if (minor == 11) {
        g_l = LAYOUT_311;
        get = dlsym(RTLD_DEFAULT, "_PyThreadState_UncheckedGet");
        g_this_tstate = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
        if (g_this_tstate == NULL) return 0;
    } else if (minor == 12) {
        g_l = LAYOUT_312;
        get = dlsym(RTLD_DEFAULT, "_PyThreadState_UncheckedGet");
    } else if (minor == 13) {
        if (!layout_313(runtime)) return 0;
        get = dlsym(RTLD_DEFAULT, "PyThreadState_GetUnchecked");
    } else {
        return 0;
    }
    if (get == NULL) return 0;
    g_get_tstate = (void *(*)(void))get;
    g_code_type = (uintptr_t)code_type;
    return 1;
}

unsigned shimpy_capture(uint64_t *out, unsigned max, uint32_t tid) {
    uintptr_t ts = (uintptr_t)g_get_tstate();
    if (ts == 0) return 0; /* 3.12+: this thread does not hold the GIL */
    if (g_this_tstate != NULL && (uintptr_t)g_this_tstate() != ts) return 0; /* 3.11 */
    if (!ptr_ok(ts) || (uint32_t)load(ts, g_l.tstate_native_thread_id) != tid) return 0;
    uintptr_t frame;
    if (g_l.tstate_current_frame >= 0) {
        frame = load(ts, g_l.tstate_current_frame);
    } else {
        uintptr_t cframe = load(ts, g_l.tstate_cframe);
        if (!ptr_ok(cframe)) return 0;
        frame = load(cframe, g_l.cframe_current_frame);
    }
    unsigned n = 0;
    for (unsigned visited = 0; frame != 0; visited++) {
        if (!ptr_ok(frame) || visited >= MAX_VISITED) return 0;
        uintptr_t previous = load(frame, g_l.frame_previous);
        if (previous == frame) return 0;
        unsigned owner = *(const uint8_t *)(frame + (uintptr_t)g_l.frame_owner);
        if (g_l.owner_cstack >= 0 && owner == (unsigned)g_l.owner_cstack) {
            frame = previous; /* the C stack's entry shim (3.12+), not Python code */
            continue;
        }
        uintptr_t code = load(frame, g_l.frame_code);
        if (!ptr_ok(code) || load(code, 8) != g_code_type) return 0;
        if (n >= max) return 0; /* too deep to splice: native only */
        int entry;
        if (g_l.frame_is_entry >= 0) {
            entry = *(const uint8_t *)(frame + (uintptr_t)g_l.frame_is_entry) != 0;
        } else if (previous == 0) {
            entry = 1;
        } else {
            if (!ptr_ok(previous)) return 0;
            entry = *(const uint8_t *)(previous + (uintptr_t)g_l.frame_owner) ==
                    (unsigned)g_l.owner_cstack;
        }
        uintptr_t instr = load(frame, g_l.frame_instr);
        uintptr_t base = code + (uintptr_t)g_l.code_adaptive;
        int64_t unit = instr >= base && (instr - base) / 2 < 0x7fffffff
                           ? (int64_t)((instr - base) / 2) : -1;
        int32_t first_line = *(const int32_t *)(code + (uintptr_t)g_l.code_firstlineno);
        uint32_t tag = rsprof_heap_py_tag(load(code, g_l.code_qualname),
                                          load(code, g_l.code_filename),
                                          load(code, g_l.code_linetable), first_line);
        out[2 * n] = (uint64_t)code | (uint64_t)entry;
        out[2 * n + 1] = (uint64_t)(uint32_t)(int32_t)unit | (uint64_t)tag << 32;
        n++;
        frame = previous;
    }
    return n;
}
