/* The Python frame reader's C core (native/pyframes.c), callable without the GIL, e.g.
 * from the perf drain at sample time: docs/native.md, PyFrameReader, "C API". */
#ifndef RSPROF_PYFRAMES_H
#define RSPROF_PYFRAMES_H

#include <stdint.h>
#include <sys/types.h>

#define RS_PY_MAX_DEPTH 1024

enum {
    RS_PY_NOTHREAD = -1, /* no thread state has this native thread id */
    RS_PY_DROPPED = -2,  /* garbage, or the chain changed while it was read: counted */
    RS_PY_GONE = -3,     /* the process is gone (ESRCH) */
    RS_PY_NOMEM = -4,    /* the function table is full or malloc failed */
    RS_PY_REPLACED = -5, /* another code object than the one sampled (its tag differs) */
};

typedef struct {
    uint32_t function; /* id in the reader's function table, 1, 2, 3, ... */
    int32_t line;      /* line being run; the function's first line when unknown */
    uint8_t entry;     /* entered from C: outermost frame of one _PyEval_EvalFrameDefault */
} rs_pyframe;

typedef struct rs_pyreader rs_pyreader;

/* Innermost first into out[0..max); returns the number of frames (max at most: deeper
 * chains are cut and counted) or one of the negative codes above. Not thread-safe: one
 * caller at a time per reader (the Python type serializes with its own mutex). */
int rs_pyreader_walk(rs_pyreader *r, uint32_t tid, rs_pyframe *out, int max);

/* Function `id` (1..count): qualified name and file (UTF-8, NUL-terminated, owned by the
 * reader, stable for its lifetime) and first line. 0 if there is no such id. */
int rs_pyreader_function(const rs_pyreader *r, uint32_t id, const char **name,
                         const char **file, int32_t *first_line);

/* The code object at `code` (an address in the target), if it still carries `tag`
 * (rsprof_heap_py_tag, as the heap shim computed it): its function id and the line of
 * instruction `unit` (-1: the first line). 0, or RS_PY_DROPPED (not a code object, or
 * another one) / RS_PY_GONE / RS_PY_NOMEM. Same locking rule as the walk. */
int rs_pyreader_code(rs_pyreader *r, uint64_t code, uint32_t tag, int64_t unit,
                     uint32_t *function, int32_t *line);

/* The code objects at codes[0..n) (n <= RS_PY_MAX_DEPTH; read at sample time by the BPF
 * sampler) and the lines of the instructions at instrs[i] (a frame's prev_instr /
 * instr_ptr): function ids and lines. Every header in one process_vm_readv (read one call
 * per frame, 1-2 µs of kernel work apiece, they were 29 % of the drain thread's CPU at
 * 499 Hz with --no-off-cpu). 0 with functions[i], lines[i] set for every frame, or the
 * first failure: RS_PY_DROPPED (not a code object now: freed since) / RS_PY_REPLACED (a
 * code object, but not the one sampled: the tag in codes[i]'s and instrs[i]'s top bits,
 * native/bpf/pyperf.h, differs) /
 * RS_PY_GONE / RS_PY_NOMEM; nothing half done is to be used. Same locking rule as the
 * walk. */
int rs_pyreader_resolve_many(rs_pyreader *r, int n, const uint64_t *codes,
                             const uint64_t *instrs, uint32_t *functions, int32_t *lines);

/* The BPF sampler's configuration of the reader's process (native/bpf/pyperf.h): its
 * _PyRuntime and the reader's offsets; *pid: the process. 0, or EINVAL: the layout's frame
 * fields do not fit the program's one read per frame (RS_BPF_FRAME_HEAD). */
struct rs_bpf_config;
int rs_pyreader_bpf_config(const rs_pyreader *r, struct rs_bpf_config *cfg, int32_t *pid);

#ifdef Py_PYTHON_H
#include <pthread.h>
/* The C reader of a PyFrameReader object and the mutex that serializes its walks (held
 * while walking; never held while taking the GIL). -1 if `obj` is no initialized reader. */
int rs_pyreader_from_object(PyObject *obj, rs_pyreader **core, pthread_mutex_t **lock);
#endif

#endif
