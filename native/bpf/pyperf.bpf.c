/* pyperf.bpf.c: reads the sampled thread's Python frames at sample time.
 *
 * A BPF_PROG_TYPE_PERF_EVENT program attached (PERF_EVENT_IOC_SET_BPF) to the recorder's
 * cpu-clock events: it runs in the sample's own interrupt, on the sampled thread, before
 * the kernel writes the sample, so the frames it reads are the ones the thread ran at the
 * sampled instruction (a read from outside at drain time sees whatever the thread runs
 * later). For a process userspace configured (the `configs` map, keyed by tgid), it finds
 * the thread's PyThreadState, walks the frame chain with bpf_probe_read_user and writes
 * (code object, instruction, entry flag) per frame, innermost first, to the `records` ring
 * buffer. Code objects are named at drain time by the PyFrameReader (native/pyframes.c).
 * It always returns 1: the sample itself is kept. rs_pyswitch does the same at each context
 * switch, for the off-CPU samples. docs/native.md. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "pyperf.h"

char LICENSE[] SEC("license") = "GPL";  /* bpf_probe_read_user needs a GPL program */

/* bpf_perf_event_data without asm/bpf_perf_event.h: on x86-64 the interrupted registers
 * are a struct pt_regs (ip at word 16, sp at word 19). Only used to let userspace check
 * that a record and a sample belong together. */
struct rs_perf_ctx {
    unsigned long long regs[21];
    unsigned long long sample_period;
    unsigned long long addr;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, unsigned int); /* tgid */
    __type(value, struct rs_bpf_config);
} configs SEC(".maps");

/* tid -> its PyThreadState, found last time (checked again before each use: thread ids
 * are unique among live threads, and a thread state freed and reused for another thread
 * holds that thread's id). Saves the list walk. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 8192);
    __type(key, unsigned int);
    __type(value, unsigned long long);
} tstates SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 256 << 10); /* resized by the loader (bpf_map__set_max_entries) */
} records SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, unsigned int);
    __type(value, struct rs_bpf_record);
} scratch SEC(".maps");

/* [0] != 0: rs_pyswitch reads no more (userspace sets it when the target's switch rate
 * passes the recorder's bound: a walk at every switch-out of a storm costs the target
 * ~4.5 us each for a 22-frame stack). */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, unsigned int);
    __type(value, unsigned int);
} switch_paused SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, RS_BPF_N_COUNTERS);
    __type(key, unsigned int);
    __type(value, unsigned long long);
} counters SEC(".maps");

static __always_inline void count(unsigned int which) {
    unsigned long long *c = bpf_map_lookup_elem(&counters, &which);
    if (c) *c += 1;
}

static __always_inline int read_ptr(unsigned long long addr, long off,
                                    unsigned long long *out) {
    *out = 0;
    return bpf_probe_read_user(out, sizeof *out, (const void *)(addr + off));
}

/* The state of the two walks, on the program's stack, shared with bpf_loop callbacks:
 * bpf_loop has each step verified once, where a plain bounded loop of this many steps is
 * verified step by step (over the 1M-instruction limit). */
struct walk_state {
    const struct rs_bpf_config *cfg;
    struct rs_bpf_record *rec;
    unsigned long long interp, ts, frame;
    unsigned int tid;
    int interps;
    unsigned int n;
    int status;
    /* 3.11/3.12: the caller's _PyCFrame's current frame, which the innermost group's entry
     * frame must link to (check: not seen yet) */
    unsigned long long expect;
    int check;
};

/* One thread state of the list walk: 1 stops (found, or the end). */
static long tstate_step(unsigned int k, void *data) {
    struct walk_state *w = data;
    const struct rs_bpf_config *cfg = w->cfg;
    unsigned long long native;
    if (w->ts == 0) {
        if (cfg->interp_next < 0 || w->interps >= RS_BPF_MAX_INTERPS ||
            read_ptr(w->interp, cfg->interp_next, &w->interp) < 0 || w->interp == 0 ||
            read_ptr(w->interp, cfg->interp_threads_head, &w->ts) < 0) {
            w->ts = 0;
            return 1;
        }
        w->interps++;
        return 0;
    }
    if (read_ptr(w->ts, cfg->tstate_native_thread_id, &native) < 0) {
        w->ts = 0;
        return 1;
    }
    if (native == w->tid) return 1;
    if (read_ptr(w->ts, cfg->tstate_next, &w->ts) < 0) {
        w->ts = 0;
        return 1;
    }
    return 0;
}

/* The thread state whose native_thread_id is the thread's, 0 if none (or a read failed). */
static __always_inline unsigned long long find_tstate(struct walk_state *w) {
    const struct rs_bpf_config *cfg = w->cfg;
    unsigned long long *cached = bpf_map_lookup_elem(&tstates, &w->tid);
    unsigned long long native;
    if (cached && *cached && read_ptr(*cached, cfg->tstate_native_thread_id, &native) == 0 &&
        native == w->tid)
        return *cached;
    w->ts = 0;
    w->interps = 1;
    if (read_ptr(cfg->runtime, cfg->runtime_interpreters_head, &w->interp) < 0 ||
        w->interp == 0 || read_ptr(w->interp, cfg->interp_threads_head, &w->ts) < 0)
        return 0;
    bpf_loop(RS_BPF_MAX_THREADS, tstate_step, w, 0);
    if (w->ts != 0) bpf_map_update_elem(&tstates, &w->tid, &w->ts, BPF_ANY);
    return w->ts;
}

static __always_inline void mark_entry(struct walk_state *w) {
    /* The frame emitted last was entered from C. */
    if (w->n > 0 && w->n <= RS_BPF_MAX_FRAMES)
        w->rec->frames[(w->n - 1) & (RS_BPF_MAX_FRAMES - 1)].instr |= 1;
}

/* A frame's head as read (RS_BPF_FRAME_HEAD bytes), in a zeroed buffer of HEAD_BUF bytes,
 * a power of two: an offset masked into it is in bounds (the host checked the offsets,
 * rs_pyreader_bpf_config; a mask is what the verifier follows where clang may compare a
 * copy of the register it then uses). */
#define HEAD_BUF 128

static __always_inline unsigned long long head_word(const unsigned long long *head, int off) {
    return head[((unsigned int)off >> 3) & (HEAD_BUF / 8 - 1)];
}

static __always_inline unsigned char head_byte(const unsigned long long *head, int off) {
    return ((const unsigned char *)head)[(unsigned int)off & (HEAD_BUF - 1)];
}

/* The tag of a code object whose 4 pointers at code_tag are `words`, from `str`: the 48
 * bytes of its qualname from offset 16 (length, hash, state, ..., the first characters of
 * an ASCII str at name_text), in a zeroed buffer of 64. */
static __always_inline unsigned long long name_tag(const struct rs_bpf_config *cfg,
                                                   const unsigned long long *words,
                                                   const unsigned long long *str) {
    unsigned long long length = str[0], name[3] = {0, 0, length | (1ULL << 63)};
    if (((unsigned int)str[2] >> 6) & 1) { /* ASCII */
        unsigned int at = (unsigned int)(cfg->name_text - 16) >> 3; /* masked at each use */
        unsigned long long n = length < 16 ? length : 16;
        name[0] = rs_bpf_low_bytes(str[at & 7], n);
        name[1] = n > 8 ? rs_bpf_low_bytes(str[(at + 1) & 7], n - 8) : 0;
        name[2] = length;
    }
    return rs_bpf_code_tag(words, name);
}

/* One frame of the chain, innermost first: 1 stops (w->status says why). */
static long frame_step(unsigned int k, void *data) {
    struct walk_state *w = data;
    const struct rs_bpf_config *cfg = w->cfg;
    if (w->frame == 0) {
        mark_entry(w); /* the outermost frame was entered from C (Py_RunMain, a thread) */
        w->status = RS_BPF_OK;
        return 1;
    }
    /* Every field of the frame in one read (rs_bpf_config.frame_head): each read costs
     * ~50 ns whatever its size, and a frame took five. */
    unsigned long long head[HEAD_BUF / 8] = {0};
    if (bpf_probe_read_user(head, RS_BPF_FRAME_HEAD,
                            (const void *)(w->frame + cfg->frame_head)) < 0)
        return 1; /* status stays RS_BPF_FAULT */
    unsigned long long previous = head_word(head, cfg->frame_previous - cfg->frame_head);
    unsigned char owner = head_byte(head, cfg->frame_owner - cfg->frame_head), is_entry = 0;
    if (previous == w->frame) return 1;
    if (cfg->owner_cstack >= 0 && owner == cfg->owner_cstack) {
        /* The C stack's entry frame (3.12+), not Python code: the frame above it was
         * entered from C. */
        if (w->check) {
            w->check = 0;
            if (previous != w->expect) return 1; /* not linked to the caller's: stale */
        }
        mark_entry(w);
        w->frame = previous;
        return 0;
    }
    if (w->n >= RS_BPF_MAX_FRAMES) {
        w->status = RS_BPF_TRUNCATED;
        return 1;
    }
    unsigned long long code = head_word(head, cfg->frame_code - cfg->frame_head);
    unsigned long long instr = head_word(head, cfg->frame_instr - cfg->frame_head), tag = 0;
    if (cfg->frame_is_entry >= 0)
        is_entry = head_byte(head, cfg->frame_is_entry - cfg->frame_head);
    if (is_entry && w->check) { /* 3.11: the entry frame links to the caller's frame */
        w->check = 0;
        if (previous != w->expect) return 1; /* stale */
    }
    if (cfg->code_tag >= 0 && code != 0 && code <= RS_BPF_CODE_ADDRESS_MASK &&
        instr <= RS_BPF_CODE_ADDRESS_MASK) {
        /* The tag the drain checks the code object against (pyperf.h), read once the frame
         * is known not to be stale; an unreadable object (or no room in the top bits) goes
         * untagged: the drain finds out what it is. */
        unsigned long long words[4], str[8] = {0};
        if (bpf_probe_read_user(words, sizeof words, (const void *)(code + cfg->code_tag)) == 0 &&
            bpf_probe_read_user(str, 48, (const void *)(words[RS_BPF_CODE_TAG_QUALNAME] + 16)) == 0)
            tag = name_tag(cfg, words, str);
    }
    struct rs_bpf_frame *out = &w->rec->frames[w->n & (RS_BPF_MAX_FRAMES - 1)];
    out->code = code | (tag & 0xffff) << RS_BPF_CODE_TAG_SHIFT;
    out->instr = (instr & ~1ULL) | (is_entry ? 1 : 0) | (tag >> 16) << RS_BPF_CODE_TAG_SHIFT;
    w->n++;
    w->frame = previous;
    return 0;
}

static __always_inline void walk_from(struct walk_state *w, unsigned long long frame) {
    w->frame = frame;
    w->n = 0;
    w->status = RS_BPF_FAULT;
    long steps = bpf_loop(RS_BPF_MAX_STEPS, frame_step, w, 0);
    if (steps >= RS_BPF_MAX_STEPS && w->status == RS_BPF_FAULT && w->frame != 0)
        w->status = RS_BPF_TRUNCATED; /* C-stack frames used up the steps */
    if (w->status == RS_BPF_OK && w->check)
        w->status = RS_BPF_FAULT; /* no entry frame: not a chain an evaluator runs */
}

/* Walks the thread's chain into rec->frames; returns the record's status.
 *
 * 3.11/3.12: a C -> Python call sets tstate->cframe to its new _PyCFrame a few
 * instructions before that one's current_frame, which until then holds whatever the C
 * stack held there: a chain that faults, or a stale one. The innermost group's entry frame
 * must link to the caller's _PyCFrame's current frame (3.11: the entry frame's previous;
 * 3.12: the C-stack entry frame's); when it does not, or the read faults, the chain is
 * read from the caller's _PyCFrame instead: the outer evaluators' frames, one group fewer
 * than evaluator frames, which the resolver splices with the innermost evaluator kept
 * native (between frames, as when a frame is being entered or left: python_between). */
static __always_inline int walk(struct walk_state *w, unsigned long long ts) {
    const struct rs_bpf_config *cfg = w->cfg;
    unsigned long long frame;
    w->check = 0;
    if (cfg->tstate_current_frame >= 0) {
        if (read_ptr(ts, cfg->tstate_current_frame, &frame) < 0) return RS_BPF_FAULT;
    } else {
        unsigned long long cframe, caller;
        if (read_ptr(ts, cfg->tstate_cframe, &cframe) < 0 || cframe == 0) return RS_BPF_FAULT;
        if (read_ptr(cframe, cfg->cframe_current_frame, &frame) < 0) return RS_BPF_FAULT;
        if (cfg->cframe_previous >= 0 && read_ptr(cframe, cfg->cframe_previous, &caller) == 0 &&
            caller != 0 && read_ptr(caller, cfg->cframe_current_frame, &w->expect) == 0)
            w->check = 1;
    }
    int have_caller = w->check;
    walk_from(w, frame);
    if (w->status == RS_BPF_FAULT && have_caller) {
        w->check = 0;
        walk_from(w, w->expect);
        if (w->status == RS_BPF_OK) count(RS_BPF_OUTER);
    }
    w->rec->n = (unsigned short)w->n;
    return w->status;
}

/* RS_BPF_GIL_* flags: does thread state ts hold its interpreter's GIL now? A thread
 * without a state (ts 0) cannot hold it. 0 when the layout has no GIL offsets or a read
 * fails (unknown). */
static __always_inline unsigned short gil_flags(const struct rs_bpf_config *cfg,
                                                unsigned long long ts) {
    unsigned long long gil = 0, holder = 0, interp = 0;
    int locked = 0;
    if (cfg->gil_locked < 0 || cfg->gil_last_holder < 0 ||
        (cfg->runtime_gil < 0 && (cfg->interp_gil < 0 || cfg->tstate_interp < 0)))
        return 0;
    if (ts == 0) return RS_BPF_GIL_KNOWN;
    if (cfg->runtime_gil >= 0) {
        gil = cfg->runtime + cfg->runtime_gil;
    } else {
        if (read_ptr(ts, cfg->tstate_interp, &interp) < 0 || interp == 0 ||
            read_ptr(interp, cfg->interp_gil, &gil) < 0 || gil == 0)
            return 0;
    }
    if (bpf_probe_read_user(&locked, sizeof locked, (const void *)(gil + cfg->gil_locked)) < 0 ||
        read_ptr(gil, cfg->gil_last_holder, &holder) < 0)
        return 0;
    return RS_BPF_GIL_KNOWN | (locked == 1 && holder == ts ? RS_BPF_GIL_HELD : 0);
}

/* Reads the current thread's frames into a record and hands it over. `ip`, `sp`: the
 * interrupted registers of a perf sample (0 at a switch-out); `kind`: RS_BPF_SWITCH for a
 * record made at a context switch, 0 for one made at a perf sample. */
static __always_inline void take_record(unsigned long long ip, unsigned long long sp,
                                        unsigned short kind) {
    unsigned long long pid_tgid = bpf_get_current_pid_tgid();
    unsigned int tgid = (unsigned int)(pid_tgid >> 32), tid = (unsigned int)pid_tgid;
    const struct rs_bpf_config *cfg = bpf_map_lookup_elem(&configs, &tgid);
    if (!cfg) return;
    unsigned int zero = 0;
    struct rs_bpf_record *rec = bpf_map_lookup_elem(&scratch, &zero);
    if (!rec) return;
    count(kind ? RS_BPF_SWITCHES : RS_BPF_RUNS);
    rec->time = bpf_ktime_get_ns();
    rec->ip = ip;
    rec->sp = sp;
    rec->tid = tid;
    rec->n = 0;
    struct walk_state w = {.cfg = cfg, .rec = rec, .tid = tid};
    unsigned long long ts = find_tstate(&w);
    rec->status = ts ? walk(&w, ts) : RS_BPF_NOTHREAD;
    if (rec->status == RS_BPF_FAULT) rec->n = 0;
    rec->status |= kind ? kind : gil_flags(cfg, ts);
    unsigned long long size = RS_BPF_RECORD_HEADER +
        (unsigned long long)(rec->n & (RS_BPF_MAX_FRAMES * 2 - 1)) * sizeof(struct rs_bpf_frame);
    if (size > sizeof *rec) size = sizeof *rec;
    if (bpf_ringbuf_output(&records, rec, size, 0) < 0) count(RS_BPF_RB_FULL);
}

SEC("perf_event")
int rs_pyperf(struct rs_perf_ctx *ctx) {
#if defined(__TARGET_ARCH_x86)
    take_record(ctx->regs[16], ctx->regs[19], 0);
#else
    take_record(0, 0, 0);
#endif
    return 1;
}

/* The sched_switch tracepoint runs in the thread being switched out (`current` is prev),
 * before the switch: its frames are those it waits in (an off-CPU sample's, which the
 * recorder's sched_switch perf event takes at the same call). Attached once for the whole
 * system when a process is configured (rs_pybpf_attach_switch), so every context switch
 * runs it: for a thread of a process not configured it is one map lookup. */
SEC("raw_tracepoint/sched_switch")
int rs_pyswitch(void *ctx) {
    unsigned int zero = 0;
    const unsigned int *paused = bpf_map_lookup_elem(&switch_paused, &zero);
    if (paused && *paused) return 0;
    unsigned long long ip = 0, sp = 0;
#if defined(__TARGET_ARCH_x86)
    /* The user registers saved at the kernel entry, as the perf sample's REGS_USER holds
     * them: the record pairs with its sample by them, as a cpu-clock one by its ip
     * (consecutive switch-outs of one thread can be closer in time than the pairing's
     * window). */
    unsigned long long regs = (unsigned long long)bpf_task_pt_regs(bpf_get_current_task_btf());
    if (regs != 0) {
        bpf_probe_read_kernel(&ip, sizeof ip, (const void *)(regs + 16 * 8));
        bpf_probe_read_kernel(&sp, sizeof sp, (const void *)(regs + 19 * 8));
    }
#endif
    take_record(ip, sp, RS_BPF_SWITCH);
    return 0;
}
