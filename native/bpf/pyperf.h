/* pyperf.h: what the BPF sampler of Python frames (native/bpf/pyperf.bpf.c) and the
 * recorder (native/perf.c, native/pybpf.c) share: the per-process configuration userspace
 * writes into the `configs` map, and the record the program writes into the `records`
 * ring buffer for each perf sample of a configured process. Plain C with fixed-size
 * fields: it is compiled for both the BPF target and the host. docs/native.md, "Python
 * frames read at sample time (BPF)". */
#ifndef RSPROF_BPF_PYPERF_H
#define RSPROF_BPF_PYPERF_H

/* Python frames walked per sample at most; a deeper chain is cut (its outermost frames
 * are not read) and the record says so (RS_BPF_TRUNCATED): the sample keeps its native
 * frames, as a read that does not pair up does. 3.12/3.13 also step over one C-stack
 * entry frame per C->Python entry, which counts against RS_BPF_MAX_STEPS. */
#define RS_BPF_MAX_FRAMES 128
#define RS_BPF_MAX_STEPS 192
/* Thread states looked at per sample to find the sampled thread's (all interpreters). */
#define RS_BPF_MAX_THREADS 256
#define RS_BPF_MAX_INTERPS 8
/* Bytes of a frame read at once: the whole _PyInterpreterFrame before its localsplus in
 * 3.11-3.13, so the read never leaves the frame. */
#define RS_BPF_FRAME_HEAD 72

/* Offsets (bytes; -1: the field does not exist in this version) of the CPython
 * structures the walk reads, copied from the PyFrameReader of the process (whose numbers
 * are collector/pyframes.py's LAYOUTS, or 3.13's own _Py_DebugOffsets). */
struct rs_bpf_config {
    unsigned long long runtime;       /* address of _PyRuntime in the process */
    int runtime_interpreters_head;
    int interp_next;
    int interp_threads_head;
    int tstate_next;
    int tstate_native_thread_id;
    int tstate_cframe;                /* 3.11/3.12: tstate->cframe->current_frame */
    int cframe_current_frame;
    int cframe_previous;              /* 3.11/3.12: the caller's _PyCFrame */
    int tstate_current_frame;         /* 3.13: tstate->current_frame */
    int frame_head;                   /* where the RS_BPF_FRAME_HEAD bytes read per frame
                                       * start; every frame_* field lies in them (pointers
                                       * 8-byte aligned within) */
    int frame_code;
    int frame_instr;
    int frame_previous;
    int frame_owner;
    int owner_cstack;                 /* FRAME_OWNED_BY_CSTACK (3.12+), else -1 */
    int frame_is_entry;               /* 3.11 */
    /* --gil: the GIL is at runtime + runtime_gil (3.11), or *(tstate->interp + interp_gil)
     * (3.12+, the interpreter's pointer); -1: unknown, no GIL flags in the records. */
    int tstate_interp;
    int runtime_gil;
    int interp_gil;
    int gil_last_holder;              /* PyThreadState *, in struct _gil_runtime_state */
    int gil_locked;                   /* int */
    /* A code object's tag (rs_bpf_code_tag) hashes the 4 pointers at code_tag (co_filename,
     * co_name, co_qualname, co_linetable: set at creation, never changed) and its qualname:
     * its length and, when ASCII, its first 16 characters (at co_qualname + name_text; the
     * str's length at +16 and state at +32). -1: frames go untagged (another layout). */
    int code_tag;
    int name_text;
};

enum {
    RS_BPF_OK = 0,          /* frames[0..n) is the whole chain */
    RS_BPF_NOTHREAD = 1,    /* no thread state has this thread's id: no Python frames */
    RS_BPF_FAULT = 2,       /* a read failed (page not present, garbage): no frames */
    RS_BPF_TRUNCATED = 3,   /* deeper than RS_BPF_MAX_FRAMES: the inner ones only */
};

/* Flags or'ed into a record's status above its RS_BPF_* value: whether the sampled thread
 * held the GIL when it was sampled (GIL_KNOWN: the GIL was read; GIL_HELD: it is locked
 * and its last_holder is this thread's state, as py-spy's --gil decides). */
#define RS_BPF_STATUS_MASK 0xff
#define RS_BPF_GIL_KNOWN 0x100
#define RS_BPF_GIL_HELD 0x200
/* A record made at a context switch (rs_pyswitch: the thread leaves the CPU) rather than
 * at a perf sample: it pairs with an off-CPU sample, never with a CPU one. No GIL flags. */
#define RS_BPF_SWITCH 0x400

/* Indices of the program's counters (the `counters` per-CPU array). */
enum {
    RS_BPF_RUNS = 0,        /* samples of configured processes the program ran for */
    RS_BPF_RB_FULL = 1,     /* records not written: the ring buffer was full */
    RS_BPF_OUTER = 2,       /* chains read from the caller's _PyCFrame: the innermost one
                             * did not link to it (being set up, 3.11/3.12) */
    RS_BPF_SWITCHES = 3,    /* context switches of configured processes (rs_pyswitch) */
    RS_BPF_N_COUNTERS = 4,
};

/* One frame: the code object, and the instruction pointer with bit 0 set when the frame
 * was entered from C (the outermost Python frame of one _PyEval_EvalFrameDefault call;
 * instructions are 2-byte aligned, so bit 0 is free).
 *
 * `code` and `instr` carry the code object's 32-bit tag (0: untagged), read at the sample,
 * in their top 16 bits (user addresses are below 2^48): its low half in `code`'s, its high
 * half in `instr`'s. (With 16 bits, 1 in 65,536 replaced objects would pass for the one
 * sampled: seen in a test that replaces hundreds per second.) The drain names code objects later; by then the one
 * sampled may have been freed and another made at its address (pymalloc hands a freed
 * block to the next object of its size: a module's code, freed once the import ran, and
 * the next script's functions), and the frame would be named after code that never ran.
 * The drain names a frame only when the object there still carries the tag. The name's
 * characters are in it because a code object made again from the same source can get
 * every pointer of the one before (its strings freed and made again in the same order). */
#define RS_BPF_CODE_TAG_SHIFT 48
#define RS_BPF_CODE_ADDRESS_MASK ((1ULL << RS_BPF_CODE_TAG_SHIFT) - 1)
#define RS_BPF_CODE_TAG_QUALNAME 2 /* co_qualname's index among the 4 pointers at code_tag */

/* `name`: the qualname's first 16 characters when it is ASCII, zero past its end (the
 * bytes after a short name are its allocation's neighbour's, which change), else 0; and
 * its length, with bit 63 set when it is not ASCII. */
static inline unsigned long long rs_bpf_code_tag(const unsigned long long words[4],
                                                 const unsigned long long name[3]) {
    unsigned long long h = words[0] * 0x9E3779B97F4A7C15ULL;
    h = (h ^ words[1]) * 0xC2B2AE3D27D4EB4FULL;
    h = (h ^ words[2]) * 0x9E3779B97F4A7C15ULL;
    h = (h ^ words[3]) * 0xC2B2AE3D27D4EB4FULL;
    h = (h ^ name[0]) * 0x9E3779B97F4A7C15ULL;
    h = (h ^ name[1]) * 0xC2B2AE3D27D4EB4FULL;
    h = (h ^ name[2]) * 0x9E3779B97F4A7C15ULL;
    return (h >> 32) | 1; /* 32 bits, never 0 */
}

/* The first `n` bytes of little-endian word w (n >= 8: all of it). */
static inline unsigned long long rs_bpf_low_bytes(unsigned long long w, unsigned long long n) {
    return n >= 8 ? w : w & ((1ULL << (8 * n)) - 1);
}

struct rs_bpf_frame {
    unsigned long long code;
    unsigned long long instr;
};

struct rs_bpf_record {
    unsigned long long time;          /* bpf_ktime_get_ns(): CLOCK_MONOTONIC, as the samples */
    unsigned long long ip, sp;        /* the interrupted registers, as the sample's (0, 0 at a
                                       * context switch) */
    unsigned int tid;
    unsigned short n;                 /* frames that follow */
    unsigned short status;            /* RS_BPF_* */
    struct rs_bpf_frame frames[RS_BPF_MAX_FRAMES];
};

#define RS_BPF_RECORD_HEADER 32 /* offsetof(struct rs_bpf_record, frames) */

#endif
