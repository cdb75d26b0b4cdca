/* perf.c: rsprof._native.PerfSampler, CPU sampling of a process (and, optionally, of every
 * process it starts) through perf_event_open.
 *
 * Design (see docs/native.md, "PerfSampler", for the Python-facing contract):
 *
 * - Inherited events, one ring per CPU, as `perf record` does.  For every thread present at
 *   attach and every online CPU, one software cpu-clock event (pid = TID, cpu = CPU,
 *   inherit = 1).  The first event on a CPU owns that CPU's ring; the others send their
 *   records to it (PERF_EVENT_IOC_SET_OUTPUT).  Threads and processes created later inherit
 *   the events in the kernel from their first instruction: no race with a thread that lives
 *   20 ms, and children of `rsprof run` are sampled from fork on.  (A per-thread event with
 *   cpu = -1 cannot be inherited and mmapped at once, so the first version opened events by
 *   hand on FORK records and missed most samples of short-lived threads.)
 * - Records are time-ordered across rings before they are handled (per drain pass), so a
 *   fork, an exec and the samples around them are seen in the order they happened.
 * - Processes are "images": an image is one process between two execs.  Image 1 is the
 *   target as attached; a fork makes a new image (same mappings as its parent's), an exec
 *   makes a new image for the same pid (fresh mappings).  Stacks are interned per image, so
 *   the same addresses in two programs are never the same stack, and mappings are tagged
 *   with the image they belong to.  Without `follow`, only the target's own pid is kept.
 * - Call chains come from frame pointers (PERF_SAMPLE_CALLCHAIN, user part only), or, with
 *   stack_bytes > 0, from CFI: each sample carries the user registers (ip, sp, bp) and a
 *   copy of the top of the user stack (PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER),
 *   unwound right here in the drain by native/unwind.c against the mappings of the
 *   sample's image (one rs_space per image: a fork copies its parent's, an exec starts
 *   empty); the copy is dropped once walked.  Either way the chains are de-duplicated into a stack table and counted per (stack id, tid) in C (perf_tables.h);
 *   Python only sees batches through take(), never an object per sample.
 * - poll() may run on a background thread while take() runs on the main thread.  All
 *   sampler state is guarded by `lock`.  The lock is only ever acquired with the GIL
 *   released, and the drain never touches Python, so the two locks cannot deadlock.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <linux/perf_event.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "perf_tables.h"
#include "pyframes.h"
#include "pybpf.h"
#include "rs_unwind.h"
#include "stackwords.h"

/* A record's size is a u16, so no record (and no call chain in one) is larger than this. */
#define PERF_MAX_RECORD 65536u
#define PERF_MAX_CHAIN (PERF_MAX_RECORD / sizeof(uint64_t))
/* Kernel frames kept of an off-CPU sample's chain (the scheduler's, the waited-in function,
 * the system call's: 6-12 seen on 6.18) */
#define PERF_OFF_KERNEL_FRAMES 32
#define PERF_OFF_KERNEL_MAX_STACK 16
#define PERF_COMM_LEN 16
#define PERF_BUILD_ID_MAX 20
#define PERF_MAX_CPUS 4096
/* 65535 - header, ip, pid/tid, time, abi, 3 regs, size, dyn_size (80 bytes), 8-aligned */
#define PERF_MAX_STACK_BYTES 65448
/* x86_64 perf register numbers (arch/x86/include/uapi/asm/perf_regs.h): the record holds
 * the selected registers in bit order, so bp, sp, ip. */
#define PERF_X86_BP 6
#define PERF_X86_SP 7
#define PERF_X86_IP 8
#define PERF_UNWIND_REGS ((1ULL << PERF_X86_BP) | (1ULL << PERF_X86_SP) | (1ULL << PERF_X86_IP))

/* Python frames read at drain time (docs/native.md, "Python frames in CPU samples"): an
 * interned chain is image, native ips, then RS_PY_MARK and one RS_PY_FRAME word per Python
 * frame, innermost first (stackwords.h). A sample taken in kernel mode has
 * RS_KERNEL_ADDRESS on top of its user stack. */
/* With a Python reader the rings are drained at least this often (ms): a sample's Python
 * frames are those its thread runs when the drain reads them. */
#define PERF_PY_DRAIN_MS 1
/* When every Python reader's frames are read at sample time (by the BPF program, and the
 * switch-outs' too when off-CPU time is recorded), nothing asks for a quick drain: the
 * rings are drained this often (ms), not at every sample nor every PERF_PY_DRAIN_MS. Waking
 * 1,000 + 499 times a second was ~1.5 k context switches a second of the drain thread, on
 * 2 cores often on the target's own core (a switch-out of the target's, itself recorded).
 * Only while it is quiet: a pass that drained PERF_BPF_BUSY_RECORDS records or more (many
 * threads, or switch-outs: a CPU gives at most 2 cpu-clock samples in 4 ms at 499 Hz)
 * goes back to waking at every sample, as a reader at drain time does (a switch storm
 * fills a ring of 128 stack copies in under a millisecond: 78 % of its records were lost
 * with 1 ms sleeps, 4 % woken by the data). */
#define PERF_BPF_DRAIN_MS 4
#define PERF_BPF_BUSY_RECORDS 8
/* A sample drained later than this after it was taken gets no Python frames (counted as
 * late): its thread has likely moved on. */
#define PERF_PY_MAX_STALE_NS 10000000ULL
/* Python frames read at sample time (native/bpf/pyperf.bpf.c): a sample pairs with the
 * record of the same thread taken within this of it (the program runs in the sample's own
 * interrupt, microseconds apart; a thread's next sample is a sampling period later) that
 * saw the same interrupted instruction pointer. */
#define PERF_BPF_PAIR_NS 200000LL
/* Records whose sample never came (lost in a full perf ring) are forgotten this long after. */
#define PERF_BPF_KEEP_NS 2000000000ULL
/* The BPF ring buffer: 256 KiB per CPU (128 records of the deepest chain, ~800 of a
 * 20-frame one, as the perf rings hold 128 samples), a power of two, at most 8 MiB. Its
 * pages are mapped (twice) into rsprof at once: 8 MiB flat cost 16 MiB of RSS. */
#define PERF_BPF_RING_PER_CPU (256u << 10)
#define PERF_BPF_RING_MAX (8u << 20)

/* ------------------------------------------------------------------ state */

typedef struct {
    uint32_t image;
    PyObject *object;        /* the PyFrameReader (a reference) */
    rs_pyreader *core;
    pthread_mutex_t *lock;   /* the reader's own: its Python methods walk under it too */
    uint64_t bpf_since;      /* samples from then on are read by BPF (0: at drain time) */
    int32_t bpf_pid;         /* the process configured in the BPF program */
} perf_py;

/* Totals of the Python frame reads since construction (python_stats()). */
typedef struct {
    uint64_t walks;          /* samples of an image with a reader whose thread was walked */
    uint64_t attached;       /* ... that got Python frames */
    uint64_t empty;          /* no thread state, or one running no Python frame */
    uint64_t dropped;        /* the chain changed under two reads, or garbage: no frames */
    uint64_t retries;        /* first reads dropped, read again */
    uint64_t late;           /* drained more than PERF_PY_MAX_STALE_NS after the sample */
    uint64_t stale_ns_sum, stale_ns_max;  /* sample time -> walk start, walked samples */
    uint64_t stale_over_1ms;
    uint64_t stale_log2_us[24];  /* walked samples by delay: [0] < 1 us, [k] < 2^k us */
    uint64_t walk_ns_sum;    /* time spent walking */
    uint64_t frames;         /* Python frames attached */
    /* At sample time (BPF): samples that got Python frames, and those that did not: */
    uint64_t bpf_attached;
    uint64_t bpf_missing;    /* no record of the program paired with the sample */
    uint64_t bpf_empty;      /* the thread ran no Python (no thread state, or no frame) */
    uint64_t bpf_fault;      /* a read of the chain failed at sample time */
    uint64_t bpf_truncated;  /* deeper than RS_BPF_MAX_FRAMES */
    uint64_t bpf_freed;      /* a code object was no longer one when named at drain time */
    uint64_t bpf_replaced;   /* ... was another one than sampled (its tag differs) */
    uint64_t bpf_frames;
    uint64_t bpf_ip_mismatch;  /* records of the thread near the sample with another ip */
    uint64_t bpf_records, bpf_unpaired;  /* records consumed; forgotten without a sample */
    uint64_t before_reader;  /* samples of a CPython image drained before set_python found it,
                              * or taken before the BPF program was configured for it */
    uint64_t bpf_switch_attached, bpf_switch_missing;  /* off-CPU samples among bpf_attached
                                                        * and bpf_missing */
    uint64_t off_unread_preempted;  /* off-CPU samples of preempted threads left without
                                     * Python frames: no program read them at the switch */
    uint64_t off_shed_unread;  /* off-CPU samples after the switch program was paused */
    uint64_t off_unread_ran;   /* ... without the program, of threads that ran again before
                                * the drain (not preempted ones: off_unread_preempted) */
    /* gil_only (--gil): CPython samples left out because the thread did not hold the GIL
     * at sample time, and those kept without knowing (no BPF record with the GIL read) */
    uint64_t gil_dropped, gil_unknown;
    int64_t bpf_dt_min, bpf_dt_max;      /* record time - sample time of the pairs (ns) */
} perf_py_stats;

typedef struct {
    int32_t tid;             /* the thread the event was opened on (its tree inherits it) */
    int cpu;
    int fd;
    bool owns_ring;          /* this event's fd is the CPU's ring: kept open until close() */
    bool hup;                /* POLLHUP: the thread and everything that inherited it are gone */
    bool off;                /* an off-CPU (sched_switch) event, feeding off_rings */
    uint8_t off_role;        /* PERF_OFF_* below: which off-CPU event of the pair it is */
} perf_event_fd;

/* With the kernel call chain, each thread has two off-CPU events per CPU: the one with the
 * chain runs until the switch rate passes off_kernel_max_rate, then the one without it (its
 * standby, opened disabled) takes over: an unwind of the kernel stack at every switch-out
 * costs ~1-2 us, which a context-switch storm pays 100-400 k times a second
 * (docs/benchmarks.md, "Off-CPU: context-switch storm"). */
#define PERF_OFF_ONLY 0      /* no kernel chain asked: the one off-CPU event */
#define PERF_OFF_CHAIN 1     /* with the kernel chain, until shed */
#define PERF_OFF_STANDBY 2   /* without it, from the shedding on */
/* The switch rate is measured over windows of this much record time. */
#define PERF_OFF_RATE_WINDOW_NS 250000000ull

/* Off-CPU: a thread switched out, waiting for its switch-in (docs/native.md, "Off-CPU"). */
typedef struct {
    int32_t tid;
    uint32_t stack_id;       /* its stack at the switch-out */
    uint64_t since;          /* perf clock of the switch-out (or of the last take()) */
    uint8_t state;           /* 'S', 'D', 'R', 'T' */
} perf_off_pending;

typedef struct {
    int fd;                  /* -1: no ring on this CPU yet */
    void *base;              /* mmap: metadata page followed by the data area */
} perf_ring;

typedef struct {
    int32_t pid;
    uint32_t image;          /* the image the process runs now */
} perf_proc;

typedef struct {
    int32_t tid;
    char name[PERF_COMM_LEN + 1];
} perf_comm;

typedef struct {
    uint32_t image;
    uint64_t start, len, pgoff;
    char *filename;          /* malloc'd */
    int build_id_size;       /* -1: the kernel gave no build id for this mapping */
    uint8_t build_id[PERF_BUILD_ID_MAX];
} perf_mmap;

enum { PROC_FORK, PROC_EXEC, PROC_EXIT };
static const char *const PROC_KIND_NAMES[] = {"fork", "exec", "exit"};

typedef struct {
    uint8_t kind;
    uint32_t image;          /* the new image (fork, exec) or the image that ended (exit) */
    int32_t pid, ppid;
    uint32_t parent_image;   /* fork: the parent's image; exec: the image replaced; 0: none */
    uint64_t time;
    char *command;           /* exec: /proc/PID/cmdline read when the record was drained */
} perf_proc_event;

/* Everything take() hands out, reset by take(). */
typedef struct {
    uint64_t samples, lost;
    uint64_t truncated;      /* CFI mode: samples whose stack ends in a [truncated] root */
    uint64_t first_time, last_time;
    bool target_exited;
    perf_count_table counts;
    uint64_t *new_stacks;    /* flat: id, depth, image, ips[depth], id, depth, ... */
    size_t n_new_stacks, cap_new_stacks;
    int32_t *new_threads;    /* flat: pid, tid, pid, tid, ... */
    size_t n_new_threads, cap_new_threads;
    int32_t *exited;
    size_t n_exited, cap_exited;
    perf_comm *comms;
    size_t n_comms, cap_comms;
    perf_mmap *mmaps;
    size_t n_mmaps, cap_mmaps;
    perf_proc_event *procs;
    size_t n_procs, cap_procs;
    /* Off-CPU: (stack id, tid | state << 24) -> switch-outs, and -> nanoseconds off CPU */
    perf_count_table off_counts, off_ns;
    uint64_t off_switches;   /* switch-outs read */
    uint64_t off_lost;       /* records lost in the off-CPU rings (PERF_RECORD_LOST) */
    uint64_t off_unpaired;   /* switch-outs whose switch-in was never seen (closed otherwise) */
} perf_batch;

/* A record of the BPF sampler, waiting for its sample. */
typedef struct {
    uint64_t time, ip, sp;
    uint32_t tid;
    uint16_t n, status;
    uint16_t flags;          /* RS_BPF_GIL_*, RS_BPF_SWITCH */
    size_t frames;           /* index of its first frame in PerfSampler.bpf_frames */
    bool used;
} perf_bpf_rec;

/* A thread seen running (a CPU sample, a switch-in) among a drain's staged records, at the
 * latest such time: perf_ran_build. */
typedef struct {
    int32_t tid;             /* 0: empty slot */
    uint64_t time;
} perf_ran;

/* One record copied out of a ring, for the time-ordered pass. */
typedef struct {
    uint64_t time;
    uint32_t seq;
    uint32_t size;
    size_t off;              /* in PerfSampler.stage */
    bool off_ring;           /* read from an off-CPU ring */
} perf_staged;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    bool lock_ready;
    int32_t pid;
    int freq_hz;
    int max_stack;
    bool gil_only;           /* --gil: CPython samples of threads not holding the GIL dropped */
    bool gil_drop, gil_known;  /* the sample being handled: drop it / its GIL state was read */
    bool follow;             /* sample the processes the target starts, too */
    int stack_bytes;         /* 0: frame-pointer call chains; else user stack bytes copied */
    bool wake_each;          /* wake the poll at every sample (for Python frames), not at 1/4 */
    rs_space **spaces;       /* CFI mode: address space of image space_images[i] */
    uint32_t *space_images;
    size_t n_spaces, cap_spaces, cap_space_images;
    rs_unwind_stats unwind_done;  /* stats of spaces already freed */
    size_t data_size;        /* bytes of ring data area, a power-of-two number of pages */
    size_t map_len;          /* data_size + one metadata page */
    bool enabled;
    bool closed;
    bool format_lost;        /* PERF_FORMAT_LOST accepted by the kernel (>= 6.0) */
    bool kernel;             /* kernel mode sampled too (permissions allowing) */
    int *cpus;               /* online CPUs at construction */
    size_t n_cpus;
    perf_ring *rings;        /* one per entry of cpus */
    perf_event_fd *events;
    size_t n_events, cap_events;
    perf_proc *procs;        /* live processes being sampled */
    size_t n_procs, cap_procs;
    int32_t *threads;        /* live threads known to be sampled (inherited ones included) */
    size_t n_threads, cap_threads;
    uint32_t next_image;
    uint64_t lost_records;   /* sum of PERF_RECORD_LOST.lost ever seen */
    uint64_t lost_closed;    /* PERF_FORMAT_LOST counters of events already closed */
    perf_stack_table stacks;
    perf_batch batch;
    uint8_t *stage;          /* records of one drain pass, sorted by time via staged[] */
    size_t stage_len, stage_cap;
    perf_staged *staged;
    size_t n_staged, cap_staged;
    uint64_t *chain;         /* PERF_MAX_CHAIN + 1 entries: image, then the call chain */
    perf_py *py;             /* Python frame readers by image (set_python) */
    size_t n_py, cap_py;
    /* Samples drained per image, indexed by image number, while it has no reader: at
     * set_python they are the image's samples that could not get Python frames (the
     * interpreter's start-up before rsprof found it), counted in before_reader. */
    uint64_t *image_samples;
    size_t cap_image_samples;
    perf_py_stats py_stats;
    size_t last_pass;        /* records of the last drain pass (poll's cadence) */
    rs_pyframe *pyframes;    /* RS_PY_MAX_DEPTH entries, the walk's output */
    rs_pybpf *bpf;           /* the BPF sampler of Python frames; NULL: drain time only */
    char bpf_error[256];     /* why there is none ('' when not asked for) */
    /* The program also reads off-CPU samples' frames at the switch-out (its rs_pyswitch on
     * sched_switch, attached with the first process configured while off-CPU time is
     * recorded); false: they are read at drain time, bpf_switch_error says why. */
    bool bpf_switch;
    char bpf_switch_error[256];
    perf_bpf_rec *bpf_recs;  /* its records not paired with a sample yet */
    size_t n_bpf_recs, cap_bpf_recs;
    struct rs_bpf_frame *bpf_frames;  /* their frames */
    size_t n_bpf_frames, cap_bpf_frames;
    uint64_t bpf_last_time;  /* the latest sample time seen */
    /* Off-CPU time (sched:sched_switch tracepoint); off_tracepoint < 0: not recorded */
    int64_t off_tracepoint;  /* the tracepoint's id (tracefs events/sched/sched_switch/id) */
    int off_state_offset;    /* offset of prev_state in its raw data */
    bool off_kernel;         /* with the kernel call chain (when kernel is allowed too) */
    uint32_t off_kernel_max_rate;  /* switch-outs per second above which the chain is
                                      shed (0: never) */
    bool off_shed;           /* the chain was shed: the standby events record */
    uint64_t off_shed_time;  /* when (record time, CLOCK_MONOTONIC ns); 0: not shed */
    uint64_t off_shed_rate;  /* the switch-outs per second that passed the bound */
    uint64_t off_window_start, off_window_end, off_window_count;
    perf_ring *off_rings;    /* one per entry of cpus */
    char off_error[256];     /* why off-CPU recording stopped ('' while it runs) */
    perf_off_pending *off_pending;
    size_t n_off_pending, cap_off_pending;
    /* Off-CPU samples read at drain time (no switch program): tid -> the latest time this
     * drain's records show the thread running (an open-addressing table, cap_ran a power of
     * two; built at this drain's first question: ran_asked; ran_built false when the build
     * failed) */
    perf_ran *ran;
    size_t cap_ran;
    bool ran_asked, ran_built;
} PerfSampler;

static void perf_bpf_fail(PerfSampler *self, const char *what, int err);

static void perf_batch_free(perf_batch *b) {
    perf_count_table_free(&b->counts);
    perf_count_table_free(&b->off_counts);
    perf_count_table_free(&b->off_ns);
    free(b->new_stacks);
    free(b->new_threads);
    free(b->exited);
    free(b->comms);
    for (size_t i = 0; i < b->n_mmaps; i++) free(b->mmaps[i].filename);
    free(b->mmaps);
    for (size_t i = 0; i < b->n_procs; i++) free(b->procs[i].command);
    free(b->procs);
    memset(b, 0, sizeof(*b));
}

/* Acquires the sampler lock without holding the GIL (see the header comment). */
static void perf_lock(PerfSampler *self) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    Py_END_ALLOW_THREADS
}

static void perf_unlock(PerfSampler *self) { pthread_mutex_unlock(&self->lock); }

static inline uint64_t rd_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline bool append_i32(int32_t **buf, size_t *n, size_t *cap, int32_t v) {
    if (!perf_vec_reserve((void **)buf, cap, *n + 1, sizeof(int32_t))) return false;
    (*buf)[(*n)++] = v;
    return true;
}

/* ---------------------------------------------------------- event set-up */

static long sys_perf_event_open(struct perf_event_attr *attr, pid_t tid, int cpu, int group) {
    return syscall(SYS_perf_event_open, attr, tid, cpu, group, PERF_FLAG_FD_CLOEXEC);
}

/* The CPUs to open events on: /sys/devices/system/cpu/online ("0-3,8"), else 0..n-1. */
static bool perf_online_cpus(int **out, size_t *n_out) {
    int *cpus = malloc(PERF_MAX_CPUS * sizeof(int));
    if (cpus == NULL) return false;
    size_t n = 0;
    FILE *f = fopen("/sys/devices/system/cpu/online", "re");
    if (f != NULL) {
        char buf[4096];
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *p = buf;
        while (*p && n < PERF_MAX_CPUS) {
            char *end;
            long lo = strtol(p, &end, 10);
            if (end == p || lo < 0) break;
            long hi = lo;
            p = end;
            if (*p == '-') {
                hi = strtol(p + 1, &end, 10);
                if (end == p + 1 || hi < lo) break;
                p = end;
            }
            for (long c = lo; c <= hi && n < PERF_MAX_CPUS; c++) cpus[n++] = (int)c;
            if (*p == ',') p++;
            else break;
        }
    }
    if (n == 0) {
        long conf = sysconf(_SC_NPROCESSORS_CONF);
        for (long c = 0; c < (conf > 0 ? conf : 1) && n < PERF_MAX_CPUS; c++) cpus[n++] = (int)c;
    }
    *out = cpus;
    *n_out = n;
    return true;
}

static void perf_fill_attr(const PerfSampler *self, struct perf_event_attr *attr, bool extras) {
    memset(attr, 0, sizeof(*attr));
    attr->size = sizeof(*attr);
    /* No hardware PMU in VMs: the hrtimer-driven software clock works everywhere. */
    attr->type = PERF_TYPE_SOFTWARE;
    attr->config = PERF_COUNT_SW_CPU_CLOCK;
    attr->freq = 1;
    attr->sample_freq = (uint64_t)self->freq_hz;
    attr->sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CALLCHAIN;
    if (self->stack_bytes > 0) {
        /* CFI mode: registers and a stack copy instead of the kernel's frame-pointer walk. */
        attr->sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME |
                            PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
        attr->sample_regs_user = PERF_UNWIND_REGS;
        attr->sample_stack_user = (uint32_t)self->stack_bytes;
    }
    attr->disabled = 1;                 /* enable() starts all threads together */
    attr->inherit = 1;                  /* new threads and processes from their first instruction */
    /* Kernel mode too when allowed (root, CAP_PERFMON, perf_event_paranoid <= 1): time in
     * system calls is the program's time. Its kernel call chain is never taken. */
    attr->exclude_kernel = self->kernel ? 0 : 1;
    attr->exclude_hv = 1;
    attr->exclude_callchain_kernel = 1;
    attr->sample_max_stack = (uint16_t)self->max_stack;
    attr->mmap = 1;                     /* with mmap2: executable mappings as MMAP2 */
    attr->mmap2 = 1;
    attr->comm = 1;
    attr->comm_exec = 1;                /* COMM records say which ones are an exec */
    attr->task = 1;                     /* FORK/EXIT: threads and processes come and go */
    attr->sample_id_all = 1;            /* every record carries pid, tid and time */
    attr->use_clockid = 1;              /* times comparable with time.monotonic_ns() */
    attr->clockid = CLOCK_MONOTONIC;
    if (self->wake_each) {
        /* Python frames are read at drain time: wake the drain at every sample, so they are
         * read while the thread still runs what it was sampled in (docs/native.md). */
        attr->wakeup_events = 1;
    } else {
        attr->watermark = 1;
        attr->wakeup_watermark = (uint32_t)(self->data_size / 4);
    }
    if (extras) {
        attr->build_id = 1;                    /* kernel >= 5.12 */
        attr->read_format = PERF_FORMAT_LOST;  /* kernel >= 6.0 */
    }
}

/* The off-CPU event: sched:sched_switch on the thread (it fires in the thread being switched
 * out, so its user registers and stack are the waiting thread's), with the raw record for
 * prev_state, and context-switch records for the switch-in that ends the wait. */
static void perf_fill_off_attr(const PerfSampler *self, struct perf_event_attr *attr,
                               uint8_t role) {
    memset(attr, 0, sizeof(*attr));
    attr->size = sizeof(*attr);
    attr->type = PERF_TYPE_TRACEPOINT;
    attr->config = (uint64_t)self->off_tracepoint;
    attr->sample_period = 1;
    attr->sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_RAW;
    if (self->stack_bytes > 0) {
        attr->sample_type |= PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
        attr->sample_regs_user = PERF_UNWIND_REGS;
        attr->sample_stack_user = (uint32_t)self->stack_bytes;
    }
    /* The kernel call chain says which kernel function the thread waits in (pipe_read,
     * futex_wait, do_nanosleep: docs/native.md, "Off-CPU time"), when kernel stacks are
     * allowed; in CFI mode the user part is left out (the stack copy is unwound). */
    bool kchain = self->kernel && self->off_kernel;
    /* The standby asks for the chain too, with its kernel part left out (an empty chain in
     * CFI mode): both events' records have one layout. */
    if (self->stack_bytes <= 0 || kchain) attr->sample_type |= PERF_SAMPLE_CALLCHAIN;
    attr->disabled = 1;
    attr->inherit = 1;
    attr->exclude_kernel = 0;           /* a tracepoint fires in the kernel */
    attr->exclude_hv = 1;
    attr->exclude_callchain_kernel = kchain && role != PERF_OFF_STANDBY ? 0 : 1;
    attr->exclude_callchain_user = self->stack_bytes > 0 ? 1 : 0;
    /* CFI mode: the chain is the kernel part only, and the waited-in function is within its
     * first few frames; the kernel stops unwinding there */
    attr->sample_max_stack = self->stack_bytes > 0 ? PERF_OFF_KERNEL_MAX_STACK
                                                   : (uint16_t)self->max_stack;
    attr->context_switch = 1;           /* PERF_RECORD_SWITCH: the switch-in ends a wait */
    attr->sample_id_all = 1;
    attr->use_clockid = 1;
    attr->clockid = CLOCK_MONOTONIC;
    attr->watermark = 1;
    attr->wakeup_watermark = (uint32_t)(self->data_size / 4);
}

/* Off-CPU recording is refused (or failed): CPU sampling goes on, off_error says why. */
static void perf_off_fail(PerfSampler *self, const char *what, int err) {
    if (self->off_tracepoint < 0) return;
    snprintf(self->off_error, sizeof self->off_error, "%s: %s", what, strerror(err));
    self->off_tracepoint = -1;
    size_t kept = 0;
    for (size_t i = 0; i < self->n_events; i++) {
        if (self->events[i].off) {
            ioctl(self->events[i].fd, PERF_EVENT_IOC_DISABLE, 0);
            close(self->events[i].fd);
        } else {
            self->events[kept++] = self->events[i];
        }
    }
    self->n_events = kept;
    for (size_t c = 0; c < self->n_cpus; c++) {
        if (self->off_rings[c].fd >= 0) munmap(self->off_rings[c].base, self->map_len);
        self->off_rings[c] = (perf_ring){-1, NULL};
    }
}

static bool perf_event_active(const PerfSampler *self, const perf_event_fd *e);

/* Opens one of thread tid's off-CPU events on cpu index c. Lock held. A refusal of the first
 * one (no permission for tracepoints, no tracefs) turns off-CPU recording off; ESRCH is the
 * thread's exit, the CPU event's business. */
static void perf_open_off_one(PerfSampler *self, int32_t tid, size_t c, uint8_t role) {
    if (self->off_tracepoint < 0) return;
    if (!perf_vec_reserve((void **)&self->events, &self->cap_events, self->n_events + 1,
                          sizeof(perf_event_fd)))
        return;
    struct perf_event_attr attr;
    perf_fill_off_attr(self, &attr, role);
    long fd = sys_perf_event_open(&attr, tid, self->cpus[c], -1);
    if (fd < 0) {
        int err = errno;
        if (err != ESRCH && err != ENODEV && err != ENXIO)
            perf_off_fail(self, "perf_event_open(sched:sched_switch)", err);
        return;
    }
    perf_ring *ring = &self->off_rings[c];
    bool owns = false;
    if (ring->fd < 0) {
        void *base = mmap(NULL, self->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
        if (base == MAP_FAILED) {
            int err = errno;
            close((int)fd);
            perf_off_fail(self, "mmap of the off-CPU ring", err);
            return;
        }
        *ring = (perf_ring){(int)fd, base};
        owns = true;
    } else if (ioctl((int)fd, PERF_EVENT_IOC_SET_OUTPUT, ring->fd) < 0) {
        int err = errno;
        close((int)fd);
        perf_off_fail(self, "PERF_EVENT_IOC_SET_OUTPUT (off-CPU)", err);
        return;
    }
    perf_event_fd event = {tid, self->cpus[c], (int)fd, owns, false, true, role};
    if (self->enabled && perf_event_active(self, &event) &&
        ioctl((int)fd, PERF_EVENT_IOC_ENABLE, 0) < 0) {
        int err = errno;
        if (owns) {
            munmap(ring->base, self->map_len);
            *ring = (perf_ring){-1, NULL};
        }
        close((int)fd);
        perf_off_fail(self, "PERF_EVENT_IOC_ENABLE (off-CPU)", err);
        return;
    }
    self->events[self->n_events++] = event;
}

/* The kernel chain is asked for with a rate bound: each thread has the chain's off-CPU
 * event and its standby, and the drain watches the rate. */
static bool perf_off_paired(const PerfSampler *self) {
    return self->kernel && self->off_kernel && self->off_kernel_max_rate > 0;
}

/* The switch rate is watched: a switch-out costs the target more than the switch itself
 * (the kernel chain's unwind, the switch program's walk of the Python frames). */
static bool perf_off_watched(const PerfSampler *self) {
    return self->off_kernel_max_rate > 0 && (perf_off_paired(self) || self->bpf_switch);
}

/* Thread tid's off-CPU events on cpu index c: one, or with the kernel chain and a rate bound
 * the chain's event and its standby (only the standby once the chain is shed). */
static void perf_open_off(PerfSampler *self, int32_t tid, size_t c) {
    if (!perf_off_paired(self)) {
        perf_open_off_one(self, tid, c, PERF_OFF_ONLY);
        return;
    }
    if (!self->off_shed) perf_open_off_one(self, tid, c, PERF_OFF_CHAIN);
    perf_open_off_one(self, tid, c, PERF_OFF_STANDBY);
}

/* The switch rate passed off_kernel_max_rate: the switch program stops reading Python
 * frames, and the standby events record from now on, the chain's stop. Standbys first: a
 * switch-out in between is recorded twice (the second is counted unpaired, its wait charged
 * once), never lost. Lock held. */
static void perf_off_shed(PerfSampler *self, uint64_t time, uint64_t rate) {
    self->off_shed = true;
    self->off_shed_time = time;
    self->off_shed_rate = rate;
    if (self->bpf_switch) (void)rs_pybpf_pause_switch(self->bpf);
    if (!perf_off_paired(self) || !self->enabled) return;  /* enable() starts the standbys */
    for (size_t i = 0; i < self->n_events; i++)
        if (self->events[i].off_role == PERF_OFF_STANDBY && !self->events[i].hup)
            ioctl(self->events[i].fd, PERF_EVENT_IOC_ENABLE, 0);
    for (size_t i = 0; i < self->n_events; i++)
        if (self->events[i].off_role == PERF_OFF_CHAIN)
            ioctl(self->events[i].fd, PERF_EVENT_IOC_DISABLE, 0);
}

/* One more switch-out (or lost ones) at record time `time`: the rate over windows of
 * PERF_OFF_RATE_WINDOW_NS; records of several CPUs' rings arrive out of time order, so a
 * window spans from its first record to the latest time seen. */
static void perf_off_rate(PerfSampler *self, uint64_t time, uint64_t switches) {
    if (self->off_shed || !perf_off_watched(self)) return;
    if (self->off_window_start == 0) {
        self->off_window_start = self->off_window_end = time;
        self->off_window_count = 0;
    }
    self->off_window_count += switches;
    if (time > self->off_window_end) self->off_window_end = time;
    uint64_t span = self->off_window_end - self->off_window_start;
    if (span < PERF_OFF_RATE_WINDOW_NS) return;
    uint64_t rate = self->off_window_count * 1000000000ull / span;
    self->off_window_start = 0;
    if (rate > self->off_kernel_max_rate) perf_off_shed(self, time, rate);
}

/* The event records now (enable() and a thread opened later start it): a chain event
 * until the chain is shed, its standby from then on. */
static bool perf_event_active(const PerfSampler *self, const perf_event_fd *e) {
    if (e->off_role == PERF_OFF_CHAIN) return !self->off_shed;
    if (e->off_role == PERF_OFF_STANDBY) return self->off_shed;
    return true;
}

static ssize_t perf_find_thread(const PerfSampler *self, int32_t tid) {
    for (size_t i = 0; i < self->n_threads; i++)
        if (self->threads[i] == tid) return (ssize_t)i;
    return -1;
}

static void perf_forget_thread(PerfSampler *self, int32_t tid) {
    ssize_t i = perf_find_thread(self, tid);
    if (i >= 0) self->threads[i] = self->threads[--self->n_threads];
}

static bool perf_remember_thread(PerfSampler *self, int32_t tid) {
    if (perf_find_thread(self, tid) >= 0) return true;
    if (!perf_vec_reserve((void **)&self->threads, &self->cap_threads, self->n_threads + 1,
                          sizeof(int32_t)))
        return false;
    self->threads[self->n_threads++] = tid;
    return true;
}

static bool perf_has_events_on(const PerfSampler *self, int32_t tid) {
    for (size_t i = 0; i < self->n_events; i++)
        if (self->events[i].tid == tid) return true;
    return false;
}

static ssize_t perf_find_proc(const PerfSampler *self, int32_t pid) {
    for (size_t i = 0; i < self->n_procs; i++)
        if (self->procs[i].pid == pid) return (ssize_t)i;
    return -1;
}

static bool perf_add_proc(PerfSampler *self, int32_t pid, uint32_t image) {
    if (!perf_vec_reserve((void **)&self->procs, &self->cap_procs, self->n_procs + 1,
                          sizeof(perf_proc)))
        return false;
    self->procs[self->n_procs++] = (perf_proc){pid, image};
    return true;
}

/* Reads an event's PERF_FORMAT_LOST counter (0 if the kernel has none). */
static uint64_t perf_event_lost(const PerfSampler *self, int fd) {
    uint64_t vals[2];
    if (self->format_lost && read(fd, vals, sizeof vals) == (ssize_t)sizeof vals) return vals[1];
    return 0;
}

/* Opens one event on tid for every CPU, each feeding that CPU's ring (mapped on first use),
 * and enables them if the sampler runs.  Lock held; no GIL needed.  Returns 0 or an errno
 * value (ESRCH: the thread is gone). */
static int perf_open_thread(PerfSampler *self, int32_t tid) {
    if (!perf_vec_reserve((void **)&self->events, &self->cap_events,
                          self->n_events + self->n_cpus, sizeof(perf_event_fd)))
        return ENOMEM;
    size_t opened = 0;
    int first_err = 0;
    for (size_t c = 0; c < self->n_cpus; c++) {
        struct perf_event_attr attr;
        perf_fill_attr(self, &attr, self->format_lost);
        long fd = sys_perf_event_open(&attr, tid, self->cpus[c], -1);
        if (fd < 0 && errno == EINVAL && self->format_lost) {
            /* Older kernel without build_id / PERF_FORMAT_LOST: retry without, and remember. */
            perf_fill_attr(self, &attr, false);
            fd = sys_perf_event_open(&attr, tid, self->cpus[c], -1);
            if (fd >= 0) self->format_lost = false;
        }
        if (fd < 0 && (errno == EACCES || errno == EPERM) && self->kernel && self->n_events == 0) {
            /* Not allowed to sample kernel mode: user mode only, and say so (kernel_sampled). */
            self->kernel = false;
            perf_fill_attr(self, &attr, self->format_lost);
            fd = sys_perf_event_open(&attr, tid, self->cpus[c], -1);
        }
        if (fd < 0) {
            int err = errno;
            if (err == ENODEV || err == ENXIO) continue;  /* CPU went offline */
            if (first_err == 0) first_err = err;
            if (err == ESRCH) break;  /* the thread exited while we opened */
            continue;
        }
        perf_ring *ring = &self->rings[c];
        bool owns = false;
        if (ring->fd < 0) {
            void *base = mmap(NULL, self->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
            if (base == MAP_FAILED) {
                if (first_err == 0) first_err = errno;
                close((int)fd);
                continue;
            }
            ring->fd = (int)fd;
            ring->base = base;
            owns = true;
        } else if (ioctl((int)fd, PERF_EVENT_IOC_SET_OUTPUT, ring->fd) < 0) {
            if (first_err == 0) first_err = errno;
            close((int)fd);
            continue;
        }
        if (self->bpf != NULL) {
            int err = rs_pybpf_attach(self->bpf, (int)fd);
            if (err != 0) perf_bpf_fail(self, "PERF_EVENT_IOC_SET_BPF", err);
        }
        if (self->enabled && ioctl((int)fd, PERF_EVENT_IOC_ENABLE, 0) < 0) {
            /* Opened but refused to start (a security module may deny it): it would never
             * sample.  Dropped like any event that failed, its ring with it if it owned it
             * (no other event sends there yet: this one was the first on the CPU). */
            if (first_err == 0) first_err = errno;
            if (owns) {
                munmap(ring->base, self->map_len);
                *ring = (perf_ring){-1, NULL};
            }
            close((int)fd);
            continue;
        }
        self->events[self->n_events++] =
            (perf_event_fd){tid, self->cpus[c], (int)fd, owns, false, false, PERF_OFF_ONLY};
        opened++;
        perf_open_off(self, tid, c);
    }
    if (opened == 0) return first_err ? first_err : ESRCH;
    return perf_remember_thread(self, tid) ? 0 : ENOMEM;
}

/* ------------------------------------------------------- address spaces */

static ssize_t perf_find_space(const PerfSampler *self, uint32_t image) {
    for (size_t i = 0; i < self->n_spaces; i++)
        if (self->space_images[i] == image) return (ssize_t)i;
    return -1;
}

/* Adds `space` for image (taking ownership); false (space freed) without memory. */
static bool perf_put_space(PerfSampler *self, uint32_t image, rs_space *space) {
    if (space == NULL) return false;
    if (!perf_vec_reserve((void **)&self->spaces, &self->cap_spaces, self->n_spaces + 1,
                          sizeof(rs_space *)) ||
        !perf_vec_reserve((void **)&self->space_images, &self->cap_space_images,
                          self->n_spaces + 1, sizeof(uint32_t))) {
        rs_space_free(space);
        return false;
    }
    self->spaces[self->n_spaces] = space;
    self->space_images[self->n_spaces++] = image;
    return true;
}

static void perf_drop_space(PerfSampler *self, uint32_t image) {
    ssize_t i = perf_find_space(self, image);
    if (i < 0) return;
    const rs_unwind_stats *st = rs_space_stats(self->spaces[i]);
    self->unwind_done.frames += st->frames;
    self->unwind_done.fp_frames += st->fp_frames;
    self->unwind_done.truncated += st->truncated;
    self->unwind_done.modules_loaded += st->modules_loaded;
    rs_space_free(self->spaces[i]);
    self->n_spaces--;
    self->spaces[i] = self->spaces[self->n_spaces];
    self->space_images[i] = self->space_images[self->n_spaces];
}

/* The address space of an image; one seen for the first time (its FORK was lost) starts
 * from /proc/PID/maps.  NULL in frame-pointer mode or without memory. */
static rs_space *perf_space_of(PerfSampler *self, uint32_t image, int32_t pid) {
    if (self->stack_bytes <= 0) return NULL;
    ssize_t i = perf_find_space(self, image);
    if (i >= 0) return self->spaces[i];
    rs_space *space = rs_space_new(pid);
    if (space == NULL) return NULL;
    (void)rs_space_read_proc_maps(space);
    return perf_put_space(self, image, space) ? space : NULL;
}

/* ------------------------------------------------------- record handling */

static uint32_t perf_image_of(PerfSampler *self, int32_t pid, bool create) {
    ssize_t i = perf_find_proc(self, pid);
    if (i >= 0) return self->procs[i].image;
    if (!self->follow || !create) return 0;
    /* A followed process whose FORK record was lost: a new image of unknown parentage. */
    uint32_t image = self->next_image++;
    perf_batch *b = &self->batch;
    if (!perf_add_proc(self, pid, image) ||
        !perf_vec_reserve((void **)&b->procs, &b->cap_procs, b->n_procs + 1,
                          sizeof(perf_proc_event)))
        return 0;
    b->procs[b->n_procs++] = (perf_proc_event){PROC_FORK, image, pid, 0, 0, 0, NULL};
    return image;
}

/* CFI mode: IP | TID | TIME | REGS_USER | STACK_USER: header, ip, pid, tid, time, abi,
 * regs[3] (bp, sp, ip), size, data[size], dyn_size.  Writes the walk to chain; returns its
 * depth. */
static void perf_intern_sample(PerfSampler *self, int32_t tid, uint32_t depth);
static uint32_t perf_add_python(PerfSampler *self, uint32_t image, int32_t tid, uint64_t time,
                                uint64_t ip, uint64_t sp, uint32_t depth, bool off);

static void perf_off_running(PerfSampler *self, int32_t tid, uint64_t time);

static uint32_t perf_unwind_sample(PerfSampler *self, const uint8_t *rec, size_t size,
                                   uint64_t ip, uint32_t image, int32_t pid, uint64_t *chain) {
    uint64_t abi = size >= 40 ? rd_u64(rec + 32) : PERF_SAMPLE_REGS_ABI_NONE;
    rs_space *space = perf_space_of(self, image, pid);
    if (abi == PERF_SAMPLE_REGS_ABI_NONE || size < 72 || space == NULL) {
        /* no user registers (the task was exiting), or no memory for the space */
        if (ip == 0 || (int64_t)ip < 0) return 0;
        chain[0] = ip;
        return 1;
    }
    uint64_t bp = rd_u64(rec + 40), sp = rd_u64(rec + 48), uip = rd_u64(rec + 56);
    uint64_t dump = rd_u64(rec + 64);
    const uint8_t *stack = rec + 72;
    uint64_t dyn = 0;
    if (dump > 0) {
        if (dump > size - 72 || size - 72 - dump < 8) return 0;  /* malformed */
        dyn = rd_u64(stack + dump);
        if (dyn > dump) dyn = dump;
    }
    bool truncated;
    uint32_t max = (uint32_t)self->max_stack + 1;  /* + 1: room for the [truncated] root */
    uint32_t depth = rs_unwind(space, uip, sp, bp, stack, dyn, chain, max, &truncated);
    if (truncated) self->batch.truncated++;
    return depth;
}

static perf_py *perf_py_of(PerfSampler *self, uint32_t image);

/* Interns the sample's chain (depth frames after the image), unless --gil left it out. */
static void perf_keep_sample(PerfSampler *self, int32_t tid, uint32_t image, uint32_t depth) {
    if (self->gil_only) {
        if (self->gil_drop) {
            self->py_stats.gil_dropped++;
            return;
        }
        if (!self->gil_known && perf_py_of(self, image) != NULL) self->py_stats.gil_unknown++;
    }
    perf_intern_sample(self, tid, depth);
}

static void perf_on_sample(PerfSampler *self, const uint8_t *rec, size_t size) {
    /* IP | TID | TIME | CALLCHAIN: header, ip, pid, tid, time, nr, ips[nr] */
    perf_batch *b = &self->batch;
    self->gil_drop = false;
    self->gil_known = false;
    if (size < 40) return;
    uint64_t ip = rd_u64(rec + 8);
    int32_t pid = (int32_t)rd_u32(rec + 16);
    int32_t tid = (int32_t)rd_u32(rec + 20);
    uint64_t time = rd_u64(rec + 24);
    uint64_t nr = self->stack_bytes > 0 ? 0 : rd_u64(rec + 32);
    if (nr > (size - 40) / sizeof(uint64_t)) return;  /* malformed */
    uint32_t image = perf_image_of(self, pid, true);
    if (image == 0) return;  /* a child process we do not follow */

    b->samples++;
    perf_off_running(self, tid, time);
    if (b->first_time == 0 || time < b->first_time) b->first_time = time;
    if (time > b->last_time) b->last_time = time;

    /* A sample taken in kernel mode (a system call, a page fault): a [kernel] frame on top
     * of the user stack, which starts at the user pc the kernel was entered from. */
    uint16_t misc;
    memcpy(&misc, rec + 4, sizeof misc);  /* header: type u32, misc u16, size u16 */
    bool in_kernel = (misc & PERF_RECORD_MISC_CPUMODE_MASK) == PERF_RECORD_MISC_KERNEL;
    uint32_t top = in_kernel ? 1 : 0;
    if (in_kernel) self->chain[1] = RS_KERNEL_ADDRESS;

    if (self->stack_bytes > 0) {
        uint32_t walked =
            perf_unwind_sample(self, rec, size, in_kernel ? 0 : ip, image, pid, self->chain + 1 + top);
        if (walked == 0 && !in_kernel) return;
        self->chain[0] = image;
        perf_keep_sample(self, tid, image,
                         perf_add_python(self, image, tid, time, ip, 0, walked + top, false));
        return;
    }

    /* The chain is leaf first and interleaved with context markers (PERF_CONTEXT_USER
     * first); markers and kernel addresses (upper half) are not frames of this process.
     * chain[0] is the image, so equal addresses in two programs are two stacks. */
    uint32_t depth = 0;
    uint64_t *chain = self->chain + 1 + top;
    const uint8_t *p = rec + 40;
    for (uint64_t i = 0; i < nr; i++) {
        uint64_t a = rd_u64(p + i * 8);
        if (a >= (uint64_t)PERF_CONTEXT_MAX || (int64_t)a < 0) continue;
        chain[depth++] = a;
    }
    if (depth == 0 && !in_kernel) {
        /* No user frames were walked; the sample IP alone still says where we were. */
        if (ip == 0 || (int64_t)ip < 0) return;
        chain[depth++] = ip;
    }
    self->chain[0] = image;
    perf_keep_sample(self, tid, image,
                     perf_add_python(self, image, tid, time, ip, 0, depth + top, false));
}

static uint64_t perf_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The BPF record of thread tid's sample at `time` with instruction pointer `ip`: the
 * closest in time within PERF_BPF_PAIR_NS, not used yet, of the sample's kind. at_switch: an
 * off-CPU sample, whose record rs_pyswitch made at the same switch-out, with the user `ip`
 * and `sp` the thread entered the kernel with (0, 0 where one side does not have them:
 * then the time alone pairs). NULL if there is none. */
static perf_bpf_rec *perf_bpf_find(PerfSampler *self, int32_t tid, uint64_t time, uint64_t ip,
                                   uint64_t sp, bool at_switch) {
    perf_bpf_rec *best = NULL;
    int64_t best_dt = 0;
    for (size_t i = 0; i < self->n_bpf_recs; i++) {
        perf_bpf_rec *r = &self->bpf_recs[i];
        if (r->used || r->tid != (uint32_t)tid) continue;
        if (((r->flags & RS_BPF_SWITCH) != 0) != at_switch) continue;
        int64_t dt = (int64_t)(r->time - time);
        int64_t abs_dt = dt < 0 ? -dt : dt;
        if (abs_dt > PERF_BPF_PAIR_NS) continue;
        bool other = at_switch ? (ip | sp) != 0 && (r->ip | r->sp) != 0 &&
                                     (r->ip != ip || r->sp != sp)
                               : r->ip != ip;
        if (other) {
            /* Another switch-out of the thread nearby is no pairing fault: count CPU ones */
            if (!at_switch) self->py_stats.bpf_ip_mismatch++;
            continue;
        }
        if (best == NULL || abs_dt < (best_dt < 0 ? -best_dt : best_dt)) {
            best = r;
            best_dt = dt;
        }
    }
    if (best != NULL) {
        perf_py_stats *st = &self->py_stats;
        if (st->bpf_dt_min == 0 && st->bpf_dt_max == 0) st->bpf_dt_min = st->bpf_dt_max = best_dt;
        if (best_dt < st->bpf_dt_min) st->bpf_dt_min = best_dt;
        if (best_dt > st->bpf_dt_max) st->bpf_dt_max = best_dt;
    }
    return best;
}

/* Python frames read at sample time by the BPF program, named now by py's reader.
 * at_switch: an off-CPU sample, read by rs_pyswitch at its switch-out. */
static uint32_t perf_add_python_bpf(PerfSampler *self, perf_py *py, int32_t tid, uint64_t time,
                                    uint64_t ip, uint64_t sp, uint32_t depth, bool at_switch) {
    perf_py_stats *st = &self->py_stats;
    perf_bpf_rec *r = perf_bpf_find(self, tid, time, ip, sp, at_switch);
    if (r == NULL) {
        st->bpf_missing++;
        if (at_switch) st->bpf_switch_missing++;
        return depth;
    }
    r->used = true;
    if (self->gil_only && !at_switch) {
        /* py-spy's --gil: only the GIL holder's samples (a thread without a Python thread
         * state cannot hold it); one the program could not decide is kept and counted. */
        if (!(r->flags & RS_BPF_GIL_KNOWN)) {
            self->gil_known = false;
        } else if (!(r->flags & RS_BPF_GIL_HELD)) {
            self->gil_drop = true;
            return depth;
        } else {
            self->gil_known = true;
        }
    }
    if (r->status == RS_BPF_NOTHREAD || (r->status == RS_BPF_OK && r->n == 0)) {
        st->bpf_empty++;
        return depth;
    }
    if (r->status == RS_BPF_FAULT) {
        st->bpf_fault++;
        return depth;
    }
    if (r->status == RS_BPF_TRUNCATED) {
        /* The outer frames are missing: they would not pair with the evaluator frames. */
        st->bpf_truncated++;
        return depth;
    }
    size_t room = PERF_MAX_CHAIN > depth + 2 ? PERF_MAX_CHAIN - depth - 2 : 0;
    if (r->n > room || r->n > RS_BPF_MAX_FRAMES) {
        st->bpf_truncated++;
        return depth;
    }
    uint64_t *out = self->chain + 1 + depth;
    const struct rs_bpf_frame *frames = &self->bpf_frames[r->frames];
    uint64_t codes[RS_BPF_MAX_FRAMES], instrs[RS_BPF_MAX_FRAMES];
    uint32_t functions[RS_BPF_MAX_FRAMES];
    int32_t lines[RS_BPF_MAX_FRAMES];
    uint32_t n = r->n;
    for (uint32_t i = 0; i < n; i++) {
        codes[i] = frames[i].code;
        instrs[i] = frames[i].instr & ~1ULL;
    }
    pthread_mutex_lock(py->lock);
    int rc = rs_pyreader_resolve_many(py->core, (int)n, codes, instrs, functions, lines);
    pthread_mutex_unlock(py->lock);
    if (rc == 0)
        for (uint32_t i = 0; i < n; i++)
            out[1 + i] = RS_PY_FRAME(functions[i], lines[i], frames[i].instr & 1);
    if (rc != 0) {
        /* never a partial chain: it would not pair up */
        if (rc == RS_PY_REPLACED) st->bpf_replaced++;
        else st->bpf_freed++;
        return depth;
    }
    out[0] = RS_PY_MARK_SAMPLED;
    st->bpf_attached++;
    if (at_switch) st->bpf_switch_attached++;
    st->bpf_frames += r->n;
    return depth + 1 + r->n;
}

/* The CPython reader set for the image (set_python keeps one per image), or NULL. */
static perf_py *perf_py_of(PerfSampler *self, uint32_t image) {
    for (size_t i = 0; i < self->n_py; i++)
        if (self->py[i].image == image) return &self->py[i];
    return NULL;
}

/* Appends thread tid's Python frames after chain[1..depth] when its image runs CPython
 * (set_python); returns the new depth. `time`, `ip`: when and where the sample was taken.
 * `off`: an off-CPU sample (a switch-out; `ip`, `sp`: the user registers it entered the
 * kernel with, 0 if unknown), whose frames the program read at the switch when
 * self->bpf_switch; otherwise a cpu-clock sample, read in its interrupt. Without the program
 * they are read now, at drain time. */
static uint32_t perf_add_python(PerfSampler *self, uint32_t image, int32_t tid, uint64_t time,
                                uint64_t ip, uint64_t sp, uint32_t depth, bool off) {
    perf_py *py = perf_py_of(self, image);
    if (py == NULL || self->pyframes == NULL) {
        size_t had = self->cap_image_samples;
        if (image < (1u << 20) &&
            perf_vec_reserve((void **)&self->image_samples, &self->cap_image_samples,
                             (size_t)image + 1, sizeof(uint64_t))) {
            /* realloc leaves the grown part as it was: counters start at zero */
            memset(self->image_samples + had, 0,
                   (self->cap_image_samples - had) * sizeof(uint64_t));
            self->image_samples[image]++;
        }
        return depth;
    }
    if (time > self->bpf_last_time) self->bpf_last_time = time;
    perf_py_stats *st = &self->py_stats;
    if (off && self->bpf_switch && self->off_shed && time >= self->off_shed_time) {
        /* The switch rate passed the bound: the program reads no more, and a read at drain
         * time would be of another moment in a storm (the thread runs within microseconds) */
        st->off_shed_unread++;
        return depth;
    }
    if (py->bpf_since != 0 && (!off || self->bpf_switch)) {
        if (time >= py->bpf_since)
            return perf_add_python_bpf(self, py, tid, time, ip, sp, depth, off);
        /* Taken before the program was configured for the process, drained after: a read
         * now would be of another moment (seen: zlib's deflateInit2_ under the function that
         * alternates with the zlib one every 0.1 ms, in the loop's first milliseconds, in
         * about one recording in ten), so its native frames stay, counted as before_reader. */
        st->before_reader++;
        return depth;
    }
    uint64_t start = perf_now_ns();
    uint64_t stale = start > time ? start - time : 0;
    if (stale > PERF_PY_MAX_STALE_NS) {
        st->late++;
        return depth;
    }
    /* Room: the marker and the frames after the image and the native chain. */
    size_t room = PERF_MAX_CHAIN > depth + 2 ? PERF_MAX_CHAIN - depth - 2 : 0;
    int max = room < RS_PY_MAX_DEPTH ? (int)room : RS_PY_MAX_DEPTH;
    if (max <= 0) return depth;
    pthread_mutex_lock(py->lock);
    int n = rs_pyreader_walk(py->core, (uint32_t)tid, self->pyframes, max);
    if (n == RS_PY_DROPPED) {
        /* The chain changed while it was read: read it once more, a few µs later, rather
         * than leave the sample without its Python frames (which would bias the shares
         * towards native-only stacks). */
        st->retries++;
        n = rs_pyreader_walk(py->core, (uint32_t)tid, self->pyframes, max);
    }
    pthread_mutex_unlock(py->lock);
    st->walks++;
    st->walk_ns_sum += perf_now_ns() - start;
    st->stale_ns_sum += stale;
    if (stale > st->stale_ns_max) st->stale_ns_max = stale;
    if (stale > 1000000) st->stale_over_1ms++;
    int bucket = 0;
    for (uint64_t us = stale / 1000; us > 0 && bucket < 23; us >>= 1) bucket++;
    st->stale_log2_us[bucket]++;
    if (n == RS_PY_DROPPED) st->dropped++;
    if (n <= 0) {
        if (n != RS_PY_DROPPED) st->empty++;
        return depth;
    }
    uint64_t *out = self->chain + 1 + depth;
    out[0] = RS_PY_MARK;
    for (int i = 0; i < n; i++)
        out[1 + i] = RS_PY_FRAME(self->pyframes[i].function, self->pyframes[i].line,
                                 self->pyframes[i].entry);
    st->attached++;
    st->frames += (uint64_t)n;
    return depth + 1 + (uint32_t)n;
}

/* Interns chain[0] = image, chain[1..depth]; returns its id (0: out of memory). */
static uint32_t perf_intern_stack(PerfSampler *self, uint32_t depth) {
    perf_batch *b = &self->batch;
    /* Room for announcing the stack is reserved before interning it: an id must never
     * exist without Python learning its frames. */
    size_t need = b->n_new_stacks + 3 + depth;
    if (!perf_vec_reserve((void **)&b->new_stacks, &b->cap_new_stacks, need, sizeof(uint64_t)))
        return 0;
    bool is_new;
    uint32_t id = perf_stack_table_intern(&self->stacks, self->chain, depth + 1, &is_new);
    if (id == 0) return 0;
    if (is_new) {
        uint64_t *dst = &b->new_stacks[b->n_new_stacks];
        dst[0] = id;
        dst[1] = depth;
        memcpy(dst + 2, self->chain, (size_t)(depth + 1) * sizeof(uint64_t));
        b->n_new_stacks = need;
    }
    return id;
}

/* Interns chain[0] = image, chain[1..depth] and counts one sample of tid on it.  Out of
 * memory, the sample counts as lost. */
static void perf_intern_sample(PerfSampler *self, int32_t tid, uint32_t depth) {
    perf_batch *b = &self->batch;
    uint32_t id = perf_intern_stack(self, depth);
    if (id == 0 || !perf_count_table_add(&b->counts, id, tid, 1)) b->lost++;
}

/* ------------------------------------------------------------- off-CPU */

static ssize_t perf_off_find(const PerfSampler *self, int32_t tid) {
    for (size_t i = 0; i < self->n_off_pending; i++)
        if (self->off_pending[i].tid == tid) return (ssize_t)i;
    return -1;
}

/* Charges the wait of pending[i] up to `until` and forgets it (keep = false) or restarts it
 * at `until` (keep = true: take() cuts a wait that goes on at the checkpoint). */
static void perf_off_close(PerfSampler *self, size_t i, uint64_t until, bool keep) {
    perf_off_pending *p = &self->off_pending[i];
    perf_batch *b = &self->batch;
    uint64_t ns = until > p->since ? until - p->since : 0;
    int32_t key = p->tid | ((int32_t)p->state << 24);
    if (!perf_count_table_add(&b->off_ns, p->stack_id, key, ns)) b->off_lost++;
    if (keep) {
        if (until > p->since) p->since = until;
        return;
    }
    self->off_pending[i] = self->off_pending[--self->n_off_pending];
}

/* The state a thread was switched out in: prev_state of sched_switch (TASK_REPORT bits). */
static uint8_t perf_off_state(uint64_t prev_state) {
    uint64_t s = prev_state & 0xff;
    if (s == 0) return 'R';       /* preempted while runnable */
    if (s & 0x01) return 'S';     /* TASK_INTERRUPTIBLE: sleeping */
    if (s & 0x02) return 'D';     /* TASK_UNINTERRUPTIBLE */
    if (s & 0x80) return 'I';     /* TASK_REPORT_IDLE */
    return 'T';                   /* stopped, traced, parked, dead */
}

static uint32_t perf_unwind_sample(PerfSampler *self, const uint8_t *rec, size_t size,
                                   uint64_t ip, uint32_t image, int32_t pid, uint64_t *chain);
static bool perf_ran_after(PerfSampler *self, int32_t tid, uint64_t time);

/* A sched_switch sample: the thread leaves the CPU. Its stack is interned like a CPU
 * sample's (a [kernel] leaf over the user stack that entered the kernel) and its wait starts.
 * With kernel stacks allowed, the kernel call chain (leaf first, upper-half addresses) takes
 * the [kernel] leaf's place: the frame reader names the function waited in from it.
 * CFI: IP | TID | TIME | [CALLCHAIN (kernel part)] | RAW | REGS_USER | STACK_USER;
 * frame pointers: IP | TID | TIME | CALLCHAIN | RAW. */
static void perf_on_off_sample(PerfSampler *self, const uint8_t *rec, size_t size) {
    perf_batch *b = &self->batch;
    if (size < 40) return;
    int32_t pid = (int32_t)rd_u32(rec + 16);
    int32_t tid = (int32_t)rd_u32(rec + 20);
    uint64_t time = rd_u64(rec + 24);
    size_t raw_at = 32;
    uint64_t nr = 0;
    bool has_chain = self->stack_bytes <= 0 || (self->kernel && self->off_kernel);
    if (has_chain) {
        nr = rd_u64(rec + 32);
        if (nr > (size - 40) / sizeof(uint64_t)) return;
        raw_at = 40 + nr * 8;
    }
    if (raw_at + 4 > size) return;
    uint32_t raw_size = rd_u32(rec + raw_at);
    size_t raw_len = 4 + (size_t)raw_size;  /* the kernel pads it to 8-byte alignment */
    if (raw_at + raw_len > size) return;
    const uint8_t *raw = rec + raw_at + 4;
    uint8_t state = 'S';
    if ((size_t)self->off_state_offset + 8 <= raw_size)
        state = perf_off_state(rd_u64(raw + self->off_state_offset));
    uint32_t image = perf_image_of(self, pid, true);
    if (image == 0) return;
    b->off_switches++;
    perf_off_rate(self, time, 1);
    if (b->first_time == 0 || time < b->first_time) b->first_time = time;
    if (time > b->last_time) b->last_time = time;
    ssize_t old = perf_off_find(self, tid);
    if (old >= 0) {
        /* its switch-in was lost: the wait is not charged, only counted */
        b->off_unpaired++;
        self->off_pending[old] = self->off_pending[--self->n_off_pending];
    }
    /* Kernel frames first (the chain's kernel context), at most PERF_OFF_KERNEL_FRAMES:
     * the waited-in function is within the first few, under the scheduler's. */
    uint32_t kdepth = 0;
    for (uint64_t i = 0; i < nr && kdepth < PERF_OFF_KERNEL_FRAMES; i++) {
        uint64_t a = rd_u64(rec + 40 + i * 8);
        if (a >= (uint64_t)PERF_CONTEXT_MAX) {
            if (a == (uint64_t)PERF_CONTEXT_USER) break;
            continue;
        }
        if ((int64_t)a < 0) self->chain[1 + kdepth++] = a;
    }
    if (kdepth == 0) self->chain[1 + kdepth++] = RS_KERNEL_ADDRESS;
    uint32_t depth;
    uint64_t user_ip = 0, user_sp = 0;  /* REGS_USER: abi, bp, sp, ip */
    if (self->stack_bytes > 0 && raw_at + raw_len + 32 <= size &&
        rd_u64(rec + raw_at + raw_len) != PERF_SAMPLE_REGS_ABI_NONE) {
        user_sp = rd_u64(rec + raw_at + raw_len + 16);
        user_ip = rd_u64(rec + raw_at + raw_len + 24);
    }
    if (self->stack_bytes > 0) {
        /* perf_unwind_sample reads REGS_USER from offset 32 on: skip the chain and the raw
         * data. batch.truncated (meta truncated_samples) counts CPU samples only: a
         * switch-out is not one (test_recursion_deeper_than_the_copy counted 1239 for 944
         * samples). */
        uint64_t truncated = b->truncated;
        size_t skip = raw_at + raw_len - 32;
        depth = perf_unwind_sample(self, rec + skip, size - skip, 0, image, pid,
                                   self->chain + 1 + kdepth);
        b->truncated = truncated;
    } else {
        depth = 0;
        uint64_t *chain = self->chain + 1 + kdepth;
        for (uint64_t i = 0; i < nr; i++) {
            uint64_t a = rd_u64(rec + 40 + i * 8);
            if (a >= (uint64_t)PERF_CONTEXT_MAX || (int64_t)a < 0) continue;
            chain[depth++] = a;
        }
    }
    self->chain[0] = image;
    depth += kdepth;
    perf_py *py = perf_py_of(self, image);
    bool at_switch = self->bpf_switch && py != NULL && py->bpf_since != 0;
    if (py != NULL && !at_switch && (state == 'R' || perf_ran_after(self, tid, time))) {
        /* No program read its frames at the switch, and by the drain the thread has run
         * on: preempted (it runs again within a timeslice; the alternating zlib/hashlib
         * script: about half of such reads put one function's C frames under the other), or
         * seen running after the switch-out in this drain's records. A read now would be of
         * another moment, so its native frames stay. A thread still waiting is read. */
        if (state == 'R') self->py_stats.off_unread_preempted++;
        else self->py_stats.off_unread_ran++;
    } else {
        depth = perf_add_python(self, image, tid, time, user_ip, user_sp, depth, true);
    }
    uint32_t id = perf_intern_stack(self, depth);
    if (id == 0 || !perf_vec_reserve((void **)&self->off_pending, &self->cap_off_pending,
                                     self->n_off_pending + 1, sizeof(perf_off_pending))) {
        b->off_lost++;
        return;
    }
    self->off_pending[self->n_off_pending++] = (perf_off_pending){tid, id, time, state};
    if (!perf_count_table_add(&b->off_counts, id, tid | ((int32_t)state << 24), 1)) b->off_lost++;
}

/* PERF_RECORD_SWITCH of an off-CPU event: a switch-in ends the thread's wait. */
static void perf_on_switch(PerfSampler *self, const uint8_t *rec, size_t size, uint16_t misc) {
    if (misc & PERF_RECORD_MISC_SWITCH_OUT) return;  /* the sched_switch sample said it */
    if (size < 24) return;  /* header, sample_id: pid, tid, time */
    int32_t tid = (int32_t)rd_u32(rec + size - 12);
    uint64_t time = rd_u64(rec + size - 8);
    ssize_t i = perf_off_find(self, tid);
    if (i >= 0) perf_off_close(self, (size_t)i, time, false);
}

/* A CPU sample of a thread with a wait open: its switch-in was lost (it runs): closed at
 * the sample, counted. */
static void perf_off_running(PerfSampler *self, int32_t tid, uint64_t time) {
    if (self->n_off_pending == 0) return;
    ssize_t i = perf_off_find(self, tid);
    if (i < 0 || self->off_pending[i].since > time) return;
    self->batch.off_unpaired++;
    perf_off_close(self, (size_t)i, time, false);
}

static bool perf_note_proc(PerfSampler *self, uint8_t kind, uint32_t image, int32_t pid,
                           int32_t ppid, uint32_t parent_image, uint64_t time) {
    perf_batch *b = &self->batch;
    if (!perf_vec_reserve((void **)&b->procs, &b->cap_procs, b->n_procs + 1,
                          sizeof(perf_proc_event)))
        return false;
    b->procs[b->n_procs++] = (perf_proc_event){kind, image, pid, ppid, parent_image, time, NULL};
    return true;
}

static void perf_on_fork(PerfSampler *self, const uint8_t *rec, size_t size) {
    /* header, pid, ppid, tid, ptid, time */
    if (size < 32) return;
    int32_t pid = (int32_t)rd_u32(rec + 8);
    int32_t ppid = (int32_t)rd_u32(rec + 12);
    int32_t tid = (int32_t)rd_u32(rec + 16);
    uint64_t time = rd_u64(rec + 24);
    perf_batch *b = &self->batch;
    if (pid != tid || pid == ppid) {
        /* A new thread of process pid (ppid is pid here). */
        if (perf_find_proc(self, pid) < 0 || perf_find_thread(self, tid) >= 0) return;
        if (perf_remember_thread(self, tid) &&
            perf_vec_reserve((void **)&b->new_threads, &b->cap_new_threads,
                             b->n_new_threads + 2, sizeof(int32_t))) {
            b->new_threads[b->n_new_threads++] = pid;
            b->new_threads[b->n_new_threads++] = tid;
        }
        return;
    }
    /* A new process (fork, vfork, posix_spawn): followed if its parent is. */
    ssize_t parent = perf_find_proc(self, ppid);
    if (!self->follow || parent < 0 || perf_find_proc(self, pid) >= 0) return;
    uint32_t image = self->next_image++;
    if (!perf_add_proc(self, pid, image)) return;
    (void)perf_note_proc(self, PROC_FORK, image, pid, ppid, self->procs[parent].image, time);
    if (self->stack_bytes > 0) {
        /* the child starts with its parent's mappings */
        ssize_t ps = perf_find_space(self, self->procs[parent].image);
        if (ps >= 0) (void)perf_put_space(self, image, rs_space_clone(self->spaces[ps], pid));
    }
    if (perf_remember_thread(self, tid) &&
        perf_vec_reserve((void **)&b->new_threads, &b->cap_new_threads, b->n_new_threads + 2,
                         sizeof(int32_t))) {
        b->new_threads[b->n_new_threads++] = pid;
        b->new_threads[b->n_new_threads++] = tid;
    }
}

static void perf_on_exit(PerfSampler *self, const uint8_t *rec, size_t size) {
    /* header, pid, ppid, tid, ptid, time */
    if (size < 32) return;
    int32_t pid = (int32_t)rd_u32(rec + 8);
    int32_t ppid = (int32_t)rd_u32(rec + 12);
    int32_t tid = (int32_t)rd_u32(rec + 16);
    uint64_t time = rd_u64(rec + 24);
    perf_batch *b = &self->batch;
    ssize_t waiting = perf_off_find(self, tid);
    if (waiting >= 0) self->off_pending[waiting] = self->off_pending[--self->n_off_pending];
    if (perf_find_thread(self, tid) >= 0) {
        perf_forget_thread(self, tid);
        (void)append_i32(&b->exited, &b->n_exited, &b->cap_exited, tid);
    }
    if (tid != pid) return;
    ssize_t i = perf_find_proc(self, pid);
    if (i < 0) return;
    (void)perf_note_proc(self, PROC_EXIT, self->procs[i].image, pid, ppid, 0, time);
    perf_drop_space(self, self->procs[i].image);  /* records are time-ordered: none follow */
    self->procs[i] = self->procs[--self->n_procs];
    if (pid == self->pid) b->target_exited = true;
}

/* The command line of a process that just exec'd, read while it most likely still runs (a
 * drain follows the exec by milliseconds; Python would only look at the next checkpoint,
 * after a short program is long gone).  NULs become spaces.  NULL if unreadable. */
static char *perf_read_cmdline(int32_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    FILE *f = fopen(path, "re");
    if (f == NULL) return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    while (n > 0 && buf[n - 1] == '\0') n--;
    if (n == 0) return NULL;
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\0') buf[i] = ' ';
    buf[n] = '\0';
    return strdup(buf);
}

static void perf_on_comm(PerfSampler *self, const uint8_t *rec, size_t size, uint16_t misc) {
    /* header, pid, tid, comm[] (NUL terminated, padded), sample_id */
    if (size < 17) return;
    int32_t pid = (int32_t)rd_u32(rec + 8);
    int32_t tid = (int32_t)rd_u32(rec + 12);
    ssize_t i = perf_find_proc(self, pid);
    if (i < 0) return;
    perf_batch *b = &self->batch;
    if (misc & PERF_RECORD_MISC_COMM_EXEC) {
        /* A new program in this process: a new image, whose mappings follow as MMAP2. */
        uint32_t old = self->procs[i].image;
        uint32_t image = self->next_image++;
        self->procs[i].image = image;
        if (self->stack_bytes > 0) {
            /* the old program's mappings are gone; the new one's arrive as MMAP2 */
            perf_drop_space(self, old);
            (void)perf_put_space(self, image, rs_space_new(pid));
        }
        size_t tail = size >= 16 ? size - 8 : size;  /* sample_id: ..., time last */
        if (perf_note_proc(self, PROC_EXEC, image, pid, 0, old, rd_u64(rec + tail)))
            b->procs[b->n_procs - 1].command = perf_read_cmdline(pid);
    }
    if (!perf_vec_reserve((void **)&b->comms, &b->cap_comms, b->n_comms + 1, sizeof(perf_comm)))
        return;
    perf_comm *c = &b->comms[b->n_comms++];
    c->tid = tid;
    size_t n = strnlen((const char *)rec + 16, size - 16);
    if (n > PERF_COMM_LEN) n = PERF_COMM_LEN;
    memcpy(c->name, rec + 16, n);
    c->name[n] = '\0';
}

static void perf_on_mmap2(PerfSampler *self, const uint8_t *rec, size_t size, uint16_t misc) {
    /* header, pid, tid, addr, len, pgoff, {maj, min, ino, ino_gen | build id}, prot, flags,
     * filename[], sample_id */
    if (size < 73) return;
    int32_t pid = (int32_t)rd_u32(rec + 8);
    uint32_t prot = rd_u32(rec + 64);
    if (!(prot & PROT_EXEC)) return;
    uint32_t image = perf_image_of(self, pid, false);
    if (image == 0) return;
    perf_batch *b = &self->batch;
    if (!perf_vec_reserve((void **)&b->mmaps, &b->cap_mmaps, b->n_mmaps + 1, sizeof(perf_mmap)))
        return;
    size_t n = strnlen((const char *)rec + 72, size - 72);
    char *name = malloc(n + 1);
    if (name == NULL) return;
    memcpy(name, rec + 72, n);
    name[n] = '\0';
    rs_space *space = perf_space_of(self, image, pid);
    if (space != NULL)
        rs_space_add(space, rd_u64(rec + 16), rd_u64(rec + 16) + rd_u64(rec + 24), rd_u64(rec + 32),
                     name);
    perf_mmap *m = &b->mmaps[b->n_mmaps++];
    m->image = image;
    m->start = rd_u64(rec + 16);
    m->len = rd_u64(rec + 24);
    m->pgoff = rd_u64(rec + 32);
    m->filename = name;
    m->build_id_size = -1;
    if (misc & PERF_RECORD_MISC_MMAP_BUILD_ID) {
        int bsz = rec[40];
        if (bsz > PERF_BUILD_ID_MAX) bsz = PERF_BUILD_ID_MAX;
        m->build_id_size = bsz;
        memcpy(m->build_id, rec + 44, (size_t)bsz);
    }
}

static void perf_on_record(PerfSampler *self, const uint8_t *rec,
                           const struct perf_event_header *hdr, bool off_ring) {
    if (off_ring) {
        if (hdr->type == PERF_RECORD_SAMPLE) perf_on_off_sample(self, rec, hdr->size);
        else if (hdr->type == PERF_RECORD_SWITCH) perf_on_switch(self, rec, hdr->size, hdr->misc);
        else if (hdr->type == PERF_RECORD_LOST && hdr->size >= 24) {
            uint64_t lost = rd_u64(rec + 16);
            self->batch.off_lost += lost;
            /* lost switch-outs count toward the rate (sample_id: pid, tid, time last) */
            if (hdr->size >= 40) perf_off_rate(self, rd_u64(rec + hdr->size - 8), lost);
        }
        return;
    }
    switch (hdr->type) {
    case PERF_RECORD_SAMPLE:
        perf_on_sample(self, rec, hdr->size);
        break;
    case PERF_RECORD_FORK:
        perf_on_fork(self, rec, hdr->size);
        break;
    case PERF_RECORD_EXIT:
        perf_on_exit(self, rec, hdr->size);
        break;
    case PERF_RECORD_COMM:
        perf_on_comm(self, rec, hdr->size, hdr->misc);
        break;
    case PERF_RECORD_MMAP2:
        perf_on_mmap2(self, rec, hdr->size, hdr->misc);
        break;
    case PERF_RECORD_LOST:
        /* header, id, lost, sample_id */
        if (hdr->size >= 24) {
            uint64_t lost = rd_u64(rec + 16);
            self->batch.lost += lost;
            self->lost_records += lost;
        }
        break;
    default:
        break;  /* THROTTLE/UNTHROTTLE and friends carry nothing we report */
    }
}

/* When a record happened: a sample's TIME field, else the sample_id trailer's (last 8 bytes,
 * since sample_type is IP|TID|TIME|CALLCHAIN and sample_id_all is set). */
static uint64_t perf_record_time(const uint8_t *rec, const struct perf_event_header *hdr) {
    if (hdr->type == PERF_RECORD_SAMPLE) return hdr->size >= 32 ? rd_u64(rec + 24) : 0;
    return hdr->size >= 16 ? rd_u64(rec + hdr->size - 8) : 0;
}

/* Copies the records of one ring into the stage.  Lock held. */
static size_t perf_stage_ring(PerfSampler *self, perf_ring *ring, bool off_ring) {
    struct perf_event_mmap_page *meta = ring->base;
    uint8_t *data = (uint8_t *)meta + meta->data_offset;
    uint64_t size = meta->data_size;
    /* Acquire pairs with the kernel's release of data_head: record bytes up to head are
     * visible once head is. */
    uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
    uint64_t tail = meta->data_tail;  /* only we write it */
    size_t n = 0;
    while (tail < head) {
        size_t off = (size_t)(tail & (size - 1));
        struct perf_event_header hdr;
        /* Records are 8-byte aligned, so the header itself never wraps. */
        memcpy(&hdr, data + off, sizeof hdr);
        if (hdr.size < sizeof hdr || hdr.size > head - tail) {
            tail = head;  /* corrupt or torn: resynchronise by skipping what we have */
            break;
        }
        if (!perf_vec_reserve((void **)&self->stage, &self->stage_cap,
                              self->stage_len + hdr.size, 1) ||
            !perf_vec_reserve((void **)&self->staged, &self->cap_staged, self->n_staged + 1,
                              sizeof(perf_staged))) {
            self->batch.lost++;  /* out of memory: the record is dropped, and counted */
            tail += hdr.size;
            continue;
        }
        uint8_t *dst = self->stage + self->stage_len;
        if (off + hdr.size > size) {
            size_t first = (size_t)(size - off);
            memcpy(dst, data + off, first);
            memcpy(dst + first, data, hdr.size - first);
        } else {
            memcpy(dst, data + off, hdr.size);
        }
        self->staged[self->n_staged] = (perf_staged){
            perf_record_time(dst, &hdr), (uint32_t)self->n_staged, hdr.size, self->stage_len,
            off_ring};
        self->n_staged++;
        self->stage_len += hdr.size;
        tail += hdr.size;
        n++;
    }
    /* Release: our reads of the records complete before the kernel may overwrite them. */
    __atomic_store_n(&meta->data_tail, tail, __ATOMIC_RELEASE);
    return n;
}

static int perf_staged_cmp(const void *a, const void *b) {
    const perf_staged *x = a, *y = b;
    if (x->time != y->time) return x->time < y->time ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* rs_pybpf_consume's callback: keeps a record until its sample is handled. */
static void perf_bpf_take(void *ctx, const struct rs_bpf_record *rec, size_t size) {
    PerfSampler *self = ctx;
    self->py_stats.bpf_records++;
    uint32_t n = rec->n;
    size_t fit = (size - RS_BPF_RECORD_HEADER) / sizeof(struct rs_bpf_frame);
    if (n > fit) n = (uint32_t)fit;
    if (!perf_vec_reserve((void **)&self->bpf_recs, &self->cap_bpf_recs, self->n_bpf_recs + 1,
                          sizeof(perf_bpf_rec)) ||
        !perf_vec_reserve((void **)&self->bpf_frames, &self->cap_bpf_frames,
                          self->n_bpf_frames + n, sizeof(struct rs_bpf_frame)))
        return;  /* out of memory: its sample counts as missing */
    memcpy(&self->bpf_frames[self->n_bpf_frames], rec->frames, n * sizeof(struct rs_bpf_frame));
    self->bpf_recs[self->n_bpf_recs++] = (perf_bpf_rec){
        rec->time, rec->ip, rec->sp, rec->tid, (uint16_t)n, (uint16_t)(rec->status & RS_BPF_STATUS_MASK),
        (uint16_t)(rec->status & ~RS_BPF_STATUS_MASK), self->n_bpf_frames, false};  /* flags */
    self->n_bpf_frames += n;
}

/* Drops the records paired with their samples, and those too old to meet theirs. */
static void perf_bpf_compact(PerfSampler *self) {
    size_t kept = 0, frames = 0;
    for (size_t i = 0; i < self->n_bpf_recs; i++) {
        perf_bpf_rec r = self->bpf_recs[i];
        if (r.used) continue;
        if (r.time + PERF_BPF_KEEP_NS < self->bpf_last_time) {
            self->py_stats.bpf_unpaired++;
            continue;
        }
        /* Frames move down in order: a kept record's frames never overlap a later one's. */
        memmove(&self->bpf_frames[frames], &self->bpf_frames[r.frames],
                r.n * sizeof(struct rs_bpf_frame));
        r.frames = frames;
        frames += r.n;
        self->bpf_recs[kept++] = r;
    }
    self->n_bpf_recs = kept;
    self->n_bpf_frames = frames;
}

static perf_ran *perf_ran_slot(PerfSampler *self, int32_t tid) {
    size_t mask = self->cap_ran - 1;
    for (size_t i = ((uint32_t)tid * 0x9E3779B1u) & mask;; i = (i + 1) & mask)
        if (self->ran[i].tid == tid || self->ran[i].tid == 0) return &self->ran[i];
}

/* Off-CPU samples whose frames are read at drain time: notes, per thread, the latest time
 * the staged records show it running again (its CPU samples, its switch-ins). Lock held. */
static void perf_ran_build(PerfSampler *self) {
    self->ran_built = false;
    size_t want = 64;
    while (want < self->n_staged * 2) want <<= 1;
    if (want > self->cap_ran) {
        perf_ran *grown = calloc(want, sizeof *grown);
        if (grown == NULL) return;  /* then no off-CPU sample is read (perf_ran_after) */
        free(self->ran);
        self->ran = grown;
        self->cap_ran = want;
    } else {
        memset(self->ran, 0, self->cap_ran * sizeof *self->ran);
    }
    for (size_t k = 0; k < self->n_staged; k++) {
        const uint8_t *rec = self->stage + self->staged[k].off;
        struct perf_event_header hdr;
        memcpy(&hdr, rec, sizeof hdr);
        int32_t tid = 0;
        if (!self->staged[k].off_ring && hdr.type == PERF_RECORD_SAMPLE && hdr.size >= 24)
            tid = (int32_t)rd_u32(rec + 20);
        else if (self->staged[k].off_ring && hdr.type == PERF_RECORD_SWITCH &&
                 !(hdr.misc & PERF_RECORD_MISC_SWITCH_OUT) && hdr.size >= 24)
            tid = (int32_t)rd_u32(rec + hdr.size - 12);
        if (tid <= 0) continue;
        perf_ran *slot = perf_ran_slot(self, tid);
        slot->tid = tid;
        if (self->staged[k].time > slot->time) slot->time = self->staged[k].time;
    }
    self->ran_built = true;
}

/* Whether thread tid ran again after `time` by what this drain staged (true when unknown).
 * The table is built at the first question of a drain (perf_drain_all resets ran_asked):
 * drains without such an off-CPU sample never scan their records for it. */
static bool perf_ran_after(PerfSampler *self, int32_t tid, uint64_t time) {
    if (!self->ran_asked) {
        self->ran_asked = true;
        perf_ran_build(self);
    }
    if (!self->ran_built) return true;
    const perf_ran *slot = perf_ran_slot(self, tid);
    return slot->tid == tid && slot->time > time;
}

/* Drains every ring and handles the records in time order.  Lock held, no GIL needed. */
static size_t perf_drain_all(PerfSampler *self) {
    self->stage_len = 0;
    self->n_staged = 0;
    for (size_t c = 0; c < self->n_cpus; c++)
        if (self->rings[c].fd >= 0) perf_stage_ring(self, &self->rings[c], false);
    for (size_t c = 0; c < self->n_cpus; c++)
        if (self->off_rings[c].fd >= 0) perf_stage_ring(self, &self->off_rings[c], true);
    /* After the rings: the program writes a sample's record before the kernel writes the
     * sample, so every sample staged above has its record in the BPF ring by now. */
    if (self->bpf != NULL) (void)rs_pybpf_consume(self->bpf, perf_bpf_take, self);
    /* Records of one ring are already in order; merging rings is what the sort is for. */
    qsort(self->staged, self->n_staged, sizeof(perf_staged), perf_staged_cmp);
    self->ran_asked = self->ran_built = false;
    for (size_t k = 0; k < self->n_staged; k++) {
        const uint8_t *rec = self->stage + self->staged[k].off;
        struct perf_event_header hdr;
        memcpy(&hdr, rec, sizeof hdr);
        perf_on_record(self, rec, &hdr, self->staged[k].off_ring);
    }
    if (self->bpf != NULL) perf_bpf_compact(self);
    size_t n = self->n_staged;
    if (self->stage_cap > (8u << 20)) {  /* a burst: give the memory back */
        free(self->stage);
        self->stage = NULL;
        self->stage_cap = 0;
    }
    return n;
}

/* ------------------------------------------------------------ Python API */

static PyObject *perf_oserror(int err, const char *what, int32_t tid) {
    char msg[256];
    const char *hint = "";
    if (err == EACCES || err == EPERM)
        hint = " (needs root, CAP_PERFMON or kernel.perf_event_paranoid <= 1)";
    else if (err == EINVAL)
        hint = " (freq_hz above kernel.perf_event_max_sample_rate?)";
    else if (err == EOVERFLOW)
        hint = " (max_stack above kernel.perf_event_max_stack?)";
    snprintf(msg, sizeof msg, "%s(tid=%d): %s%s", what, (int)tid, strerror(err), hint);
    PyObject *exc = PyObject_CallFunction(PyExc_OSError, "is", err, msg);
    if (exc != NULL) {
        /* OSError(errno, msg) picks the subclass: ProcessLookupError, PermissionError... */
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* PyLong_AsInt only exists from 3.13. */
static int perf_as_int(PyObject *arg, int *out) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "value does not fit in a C int");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static PyObject *perf_closed_error(void) {
    PyErr_SetString(PyExc_ValueError, "PerfSampler is closed");
    return NULL;
}

static PyObject *PerfSampler_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pid", "freq_hz", "ring_kib", "max_stack", "follow", "stack_bytes",
                             "kernel", "wake_each", "bpf_object", "offcpu_tracepoint",
                             "offcpu_state_offset", "offcpu_kernel",
                             "gil_only", "offcpu_kernel_max_rate", NULL};
    int pid, freq_hz = 99, ring_kib = 128, max_stack = 127, follow = 0, stack_bytes = 0;
    int kernel = 1, wake_each = 0;
    long long offcpu_tracepoint = -1;
    int offcpu_state_offset = 32, offcpu_kernel = 1;
    int gil_only = 0;
    unsigned int offcpu_kernel_max_rate = 0;
    PyObject *bpf_object = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|iiipippOLippI:PerfSampler", kwlist, &pid,
                                     &freq_hz, &ring_kib, &max_stack, &follow, &stack_bytes,
                                     &kernel, &wake_each, &bpf_object, &offcpu_tracepoint,
                                     &offcpu_state_offset, &offcpu_kernel, &gil_only,
                                     &offcpu_kernel_max_rate))
        return NULL;
    if (offcpu_state_offset < 0 || offcpu_state_offset > 4096) {
        PyErr_SetString(PyExc_ValueError, "offcpu_state_offset must be in 0..4096");
        return NULL;
    }
    if (bpf_object != Py_None && !PyUnicode_Check(bpf_object)) {
        PyErr_SetString(PyExc_TypeError, "bpf_object must be a path (str) or None");
        return NULL;
    }
    /* A sample record's size is a u16: the copy plus the other fields must fit. */
    if (stack_bytes < 0 || stack_bytes % 8 != 0 || stack_bytes > PERF_MAX_STACK_BYTES) {
        PyErr_Format(PyExc_ValueError,
                     "stack_bytes must be 0 (frame pointers) or a multiple of 8 up to %d, got %d",
                     PERF_MAX_STACK_BYTES, stack_bytes);
        return NULL;
    }
    if (pid <= 0) {
        PyErr_SetString(PyExc_ValueError, "pid must be positive");
        return NULL;
    }
    if (freq_hz <= 0) {
        PyErr_SetString(PyExc_ValueError, "freq_hz must be positive");
        return NULL;
    }
    if (max_stack < 1 || max_stack > UINT16_MAX) {
        PyErr_SetString(PyExc_ValueError, "max_stack must be in 1..65535");
        return NULL;
    }
    long page = sysconf(_SC_PAGESIZE);
    size_t data_size = (size_t)ring_kib * 1024;
    size_t pages = page > 0 ? data_size / (size_t)page : 0;
    if (ring_kib <= 0 || ring_kib > (1 << 20) || pages == 0 || data_size % (size_t)page != 0 ||
        (pages & (pages - 1)) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "ring_kib must be a power-of-two number of %ld-byte pages, got %d", page,
                     ring_kib);
        return NULL;
    }
    /* Fail early on a pid that does not exist; permission problems surface in add_thread. */
    if (kill(pid, 0) < 0 && errno == ESRCH) return perf_oserror(ESRCH, "PerfSampler", pid);

    PerfSampler *self = (PerfSampler *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->pid = pid;
    self->freq_hz = freq_hz;
    self->max_stack = max_stack;
    self->follow = follow != 0;
    self->stack_bytes = stack_bytes;
    self->data_size = data_size;
    self->map_len = data_size + (size_t)page;
    self->format_lost = true;
    self->kernel = kernel != 0;
    self->wake_each = wake_each != 0;
    self->next_image = 2;  /* image 1 is the target as attached */
    self->off_tracepoint = offcpu_tracepoint < 0 ? -1 : offcpu_tracepoint;
    self->off_state_offset = offcpu_state_offset;
    self->off_kernel = offcpu_kernel != 0;
    self->off_kernel_max_rate = offcpu_kernel_max_rate;
    self->gil_only = gil_only != 0;
    self->chain = malloc((PERF_MAX_CHAIN + 1) * sizeof(uint64_t));
    if (self->chain == NULL || !perf_online_cpus(&self->cpus, &self->n_cpus) ||
        (self->rings = malloc(self->n_cpus * sizeof(perf_ring))) == NULL ||
        (self->off_rings = malloc(self->n_cpus * sizeof(perf_ring))) == NULL ||
        !perf_add_proc(self, pid, 1)) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (size_t c = 0; c < self->n_cpus; c++) self->rings[c] = (perf_ring){-1, NULL};
    for (size_t c = 0; c < self->n_cpus; c++) self->off_rings[c] = (perf_ring){-1, NULL};
    if (stack_bytes > 0) {
        /* The target's mappings now (image 1); later ones arrive as MMAP2 records. */
        rs_space *space = rs_space_new(pid);
        if (space != NULL && !rs_space_read_proc_maps(space)) {
            int err = errno;
            rs_space_free(space);
            Py_DECREF(self);
            return perf_oserror(err, "PerfSampler: /proc/PID/maps", pid);
        }
        if (!perf_put_space(self, 1, space)) {
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
    }
    if (pthread_mutex_init(&self->lock, NULL) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->lock_ready = true;
    if (bpf_object != Py_None) {
        /* Python frames at sample time; when the program cannot be loaded (built without
         * libbpf, not permitted, refused by the verifier) they are read at drain time, and
         * python_stats() says why. */
        const char *path = PyUnicode_AsUTF8(bpf_object);
        if (path == NULL) {
            Py_DECREF(self);
            return NULL;
        }
        size_t ring = PERF_BPF_RING_PER_CPU;
        while (ring < self->n_cpus * PERF_BPF_RING_PER_CPU && ring < PERF_BPF_RING_MAX) ring *= 2;
        Py_BEGIN_ALLOW_THREADS
        self->bpf = rs_pybpf_open(path, ring, self->bpf_error, sizeof self->bpf_error);
        Py_END_ALLOW_THREADS
    }
    return (PyObject *)self;
}

/* The BPF sampler cannot be used (an event refused it): Python frames are read at drain
 * time from now on. Lock held. */
static void perf_bpf_fail(PerfSampler *self, const char *what, int err) {
    if (self->bpf == NULL) return;
    snprintf(self->bpf_error, sizeof self->bpf_error, "%s: %s", what, strerror(err));
    for (size_t i = 0; i < self->n_py; i++) {
        if (self->py[i].bpf_pid != 0) (void)rs_pybpf_configure(self->bpf, (uint32_t)self->py[i].bpf_pid, NULL);
        self->py[i].bpf_since = 0;
        self->py[i].bpf_pid = 0;
    }
    rs_pybpf_close(self->bpf);  /* detaches rs_pyswitch too */
    self->bpf = NULL;
    self->bpf_switch = false;
}

/* Disables and releases every event and ring.  Lock held.  Lost records the kernel had no
 * room to announce as PERF_RECORD_LOST are picked up from the PERF_FORMAT_LOST counters, so
 * they are not silently dropped. */
static void perf_close_locked(PerfSampler *self) {
    if (self->closed) return;
    for (size_t i = 0; i < self->n_events; i++) ioctl(self->events[i].fd, PERF_EVENT_IOC_DISABLE, 0);
    uint64_t counted = self->lost_closed;
    for (size_t i = 0; i < self->n_events; i++) counted += perf_event_lost(self, self->events[i].fd);
    if (counted > self->lost_records) {
        self->batch.lost += counted - self->lost_records;
        self->lost_records = counted;
    }
    for (size_t c = 0; c < self->n_cpus; c++)
        if (self->rings[c].fd >= 0) munmap(self->rings[c].base, self->map_len);
    for (size_t c = 0; self->off_rings != NULL && c < self->n_cpus; c++)
        if (self->off_rings[c].fd >= 0) munmap(self->off_rings[c].base, self->map_len);
    for (size_t i = 0; i < self->n_events; i++) close(self->events[i].fd);
    self->n_events = 0;
    self->closed = true;
}

static void PerfSampler_dealloc(PerfSampler *self) {
    if (self->lock_ready) {
        /* Nobody else can hold a reference, hence nobody holds the lock. */
        perf_close_locked(self);
        pthread_mutex_destroy(&self->lock);
    }
    free(self->events);
    free(self->cpus);
    free(self->rings);
    free(self->off_rings);
    free(self->off_pending);
    free(self->ran);
    free(self->procs);
    free(self->threads);
    perf_stack_table_free(&self->stacks);
    perf_batch_free(&self->batch);
    free(self->stage);
    free(self->staged);
    free(self->chain);
    for (size_t i = 0; i < self->n_py; i++) Py_DECREF(self->py[i].object);
    free(self->py);
    free(self->pyframes);
    rs_pybpf_close(self->bpf);
    free(self->bpf_recs);
    free(self->bpf_frames);
    for (size_t i = 0; i < self->n_spaces; i++) rs_space_free(self->spaces[i]);
    free(self->spaces);
    free(self->space_images);
    free(self->image_samples);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *PerfSampler_add_thread(PerfSampler *self, PyObject *arg) {
    int tid;
    if (perf_as_int(arg, &tid) < 0) return NULL;
    if (tid <= 0) {
        PyErr_SetString(PyExc_ValueError, "tid must be positive");
        return NULL;
    }
    int err = 0;
    bool closed;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    closed = self->closed;
    /* A thread already known (opened, or announced by a FORK record: it inherits an event)
     * must not get a second event: it would be sampled twice. */
    if (!closed && perf_find_thread(self, tid) < 0 && !perf_has_events_on(self, tid))
        err = perf_open_thread(self, tid);
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    if (closed) return perf_closed_error();
    if (err == ENOMEM) return PyErr_NoMemory();
    if (err != 0) return perf_oserror(err, "perf_event_open", tid);
    Py_RETURN_NONE;
}

static PyObject *PerfSampler_enable(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    perf_lock(self);
    if (self->closed) {
        perf_unlock(self);
        return perf_closed_error();
    }
    /* The kernel enables an event whose thread has exited without complaint (its EXIT/HUP
     * retires it; one already HUP has nothing left to sample); a refusal (a security
     * module's EACCES, say) would leave the recording without samples: undone and raised,
     * as perf_event_open's own errors are. */
    for (size_t i = 0; i < self->n_events; i++) {
        if (self->events[i].hup || !perf_event_active(self, &self->events[i])) continue;
        if (ioctl(self->events[i].fd, PERF_EVENT_IOC_ENABLE, 0) < 0) {
            int err = errno;
            int32_t tid = self->events[i].tid;
            for (size_t k = 0; k < i; k++) ioctl(self->events[k].fd, PERF_EVENT_IOC_DISABLE, 0);
            perf_unlock(self);
            return perf_oserror(err, "PERF_EVENT_IOC_ENABLE", tid);
        }
    }
    self->enabled = true;
    perf_unlock(self);
    Py_RETURN_NONE;
}

/* The end of the recording window (a duration reached, a stop asked for): no sample is
 * taken from now on, while the recorder still drains, resolves and writes what the rings
 * hold.  A checkpoint that runs long on a loaded machine (300 spinning threads beside the
 * recorder) no longer stretches the window past the duration.  DISABLE reaches the
 * inherited events too; threads that start later inherit the disabled state, and
 * add_thread() and the off-CPU shedding enable nothing once `enabled` is false. */
static PyObject *PerfSampler_disable(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    perf_lock(self);
    if (!self->closed) {
        for (size_t i = 0; i < self->n_events; i++)
            ioctl(self->events[i].fd, PERF_EVENT_IOC_DISABLE, 0);
        self->enabled = false;
    }
    perf_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *PerfSampler_poll(PerfSampler *self, PyObject *arg) {
    int timeout_ms;
    if (perf_as_int(arg, &timeout_ms) < 0) return NULL;
    if (timeout_ms < 0) timeout_ms = 0;  /* never block forever: the caller must keep control */

    size_t processed = 0;
    int poll_errno = 0;
    bool closed = false, nomem = false;
    Py_BEGIN_ALLOW_THREADS
    /* Snapshot the fds, then wait without the lock so take()/add_thread() never stall
     * behind a poll.  Every event fd is polled: a ring's data wakes any fd that writes to
     * it, and POLLHUP on an fd says its thread and everything that inherited from it ended. */
    struct pollfd *pfds = NULL;
    size_t n = 0;
    pthread_mutex_lock(&self->lock);
    closed = self->closed;
    if (!closed && self->n_events > 0) {
        pfds = malloc(self->n_events * sizeof(*pfds));
        if (pfds == NULL) {
            nomem = true;
        } else {
            for (size_t i = 0; i < self->n_events; i++) {
                if (self->events[i].hup) continue;  /* would wake every poll */
                pfds[n].fd = self->events[i].fd;
                pfds[n].events = POLLIN;
                pfds[n].revents = 0;
                n++;
            }
        }
    }
    pthread_mutex_unlock(&self->lock);

    /* With a Python reader, samples must be drained while their threads still run the
     * Python frames they were taken in: wake every PERF_PY_DRAIN_MS until the timeout,
     * instead of only when a ring is a quarter full. */
    uint64_t deadline = perf_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
    bool again = !closed && !nomem;
    pthread_mutex_lock(&self->lock);
    size_t last_pass = self->last_pass;  /* of the poll before: a poll may be one pass */
    pthread_mutex_unlock(&self->lock);
    while (again) {
        pthread_mutex_lock(&self->lock);
        bool python = self->n_py > 0;
        /* frames read at drain time: a reader the program does not serve, or switch-outs
         * the switch program does not read */
        bool at_drain = python && self->off_tracepoint >= 0 && !self->bpf_switch;
        for (size_t i = 0; i < self->n_py; i++) at_drain = at_drain || self->py[i].bpf_pid == 0;
        pthread_mutex_unlock(&self->lock);
        int wait_ms = timeout_ms;
        bool sleep_only = n == 0;
        if (python) {
            uint64_t now = perf_now_ns();
            uint64_t left = deadline > now ? (deadline - now + 999999) / 1000000 : 0;
            bool quiet = !at_drain && last_pass < PERF_BPF_BUSY_RECORDS;
            int every = quiet ? PERF_BPF_DRAIN_MS : PERF_PY_DRAIN_MS;
            wait_ms = left < (uint64_t)every ? (int)left : every;
            /* quiet and read at sample time: the fds, which wake at every sample (wake_each),
             * are not waited on */
            sleep_only = sleep_only || quiet;
        }
        if (sleep_only) {
            struct timespec ts = {wait_ms / 1000, (long)(wait_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            /* what ended meanwhile (POLLHUP), without waiting */
            if (n != 0 && poll(pfds, (nfds_t)n, 0) < 0) poll_errno = errno;
        } else if (poll(pfds, (nfds_t)n, wait_ms) < 0) {
            poll_errno = errno;
        }
        bool hup = false;
        pthread_mutex_lock(&self->lock);
        closed = self->closed;
        if (!closed) {
            last_pass = self->last_pass = perf_drain_all(self);
            processed += last_pass;
            for (size_t k = 0; poll_errno == 0 && k < n; k++) {
                if (!(pfds[k].revents & (POLLHUP | POLLERR))) continue;
                hup = true;
                for (size_t i = 0; i < self->n_events; i++) {
                    perf_event_fd *ev = &self->events[i];
                    if (ev->fd != pfds[k].fd || ev->hup) continue;
                    ev->hup = true;
                    if (ev->owns_ring) break;  /* the ring stays mapped for the others */
                    self->lost_closed += perf_event_lost(self, ev->fd);
                    close(ev->fd);
                    self->events[i] = self->events[--self->n_events];
                    break;
                }
            }
        }
        pthread_mutex_unlock(&self->lock);
        /* A closed fd must not be polled again (its number may be reused): return, and let
         * the next poll() take a fresh snapshot. */
        again = python && !closed && !hup && poll_errno == 0 && perf_now_ns() < deadline;
    }
    free(pfds);
    Py_END_ALLOW_THREADS

    if (nomem) return PyErr_NoMemory();
    if (poll_errno == EINTR) {
        if (PyErr_CheckSignals() < 0) return NULL;  /* e.g. KeyboardInterrupt */
    } else if (poll_errno != 0) {
        errno = poll_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSize_t(processed);
}

/* What take() returns: struct sequences (typed in rsprof/_native.pyi), not string-keyed
 * dicts, so a misspelt field is an AttributeError at the boundary, not a silent KeyError later. */
enum {
    PB_SAMPLES, PB_LOST, PB_NEW_STACKS, PB_COUNTS, PB_NEW_THREADS, PB_EXITED_THREADS, PB_COMMS,
    PB_MMAPS, PB_PROCESSES, PB_TARGET_EXITED, PB_FIRST_TIME_NS, PB_LAST_TIME_NS, PB_TRUNCATED,
    PB_OFFCPU, PB_OFFCPU_SWITCHES, PB_OFFCPU_LOST, PB_OFFCPU_UNPAIRED,
    PB_NFIELDS
};
static PyStructSequence_Field perf_batch_fields[] = {
    {"samples", "samples read from the rings since the last take()"},
    {"lost", "records the kernel dropped (PERF_RECORD_LOST)"},
    {"new_stacks", "[(stack_id, image, (ip, ...)), ...] stacks first seen in this batch"},
    {"counts", "[(stack_id, tid, count), ...]"},
    {"new_threads", "[(pid, tid), ...] threads that appeared"},
    {"exited_threads", "[tid, ...] threads that ended"},
    {"comms", "[(tid, name), ...] thread names (PERF_RECORD_COMM)"},
    {"mmaps", "[PerfMmap, ...] executable mappings (PERF_RECORD_MMAP2)"},
    {"processes", "[(kind, image, pid, ppid, parent_image, time_ns, command), ...]"},
    {"target_exited", "the target process (the one attached to) has exited"},
    {"first_time_ns", "perf clock of the first record in the batch (0: none)"},
    {"last_time_ns", "perf clock of the last record in the batch (0: none)"},
    {"truncated", "CFI mode: samples whose stack ends in a [truncated] root"},
    {"offcpu", "[(stack_id, tid, state, switches, ns), ...] time off the CPU (state: 'S' "
               "sleeping, 'D' uninterruptible, 'R' preempted, 'I' idle, 'T' other)"},
    {"offcpu_switches", "switch-outs read from the off-CPU rings"},
    {"offcpu_lost", "off-CPU records the kernel dropped (PERF_RECORD_LOST)"},
    {"offcpu_unpaired", "switch-outs whose switch-in was not seen (lost)"},
    {NULL, NULL},
};
static PyStructSequence_Desc perf_batch_desc = {
    "rsprof._native.PerfBatch", "What PerfSampler.take() collected since the last call.",
    perf_batch_fields, PB_NFIELDS,
};
static PyStructSequence_Field perf_mmap_fields[] = {
    {"start", "first address"}, {"length", "bytes mapped"}, {"pgoff", "file offset"},
    {"path", "file name as the kernel reports it"}, {"build_id", "GNU build id, or None"},
    {"image", "the process image (see processes) the mapping belongs to"},
    {NULL, NULL},
};
static PyStructSequence_Desc perf_mmap_desc = {
    "rsprof._native.PerfMmap", "One executable mapping seen by the kernel.", perf_mmap_fields, 6,
};
static PyTypeObject *PerfBatchType, *PerfMmapType;

/* Builds a struct sequence from owned references; on any NULL, releases them all. */
static PyObject *perf_struct(PyTypeObject *type, PyObject **vals, int n) {
    PyObject *item = PyStructSequence_New(type);
    for (int k = 0; k < n; k++)
        if (vals[k] == NULL) Py_CLEAR(item);
    if (item == NULL) {
        for (int k = 0; k < n; k++) Py_XDECREF(vals[k]);
        return NULL;
    }
    for (int k = 0; k < n; k++) PyStructSequence_SetItem(item, k, vals[k]);
    return item;
}

static PyObject *perf_stacks_list(const perf_batch *b) {
    PyObject *lst = PyList_New(0);
    if (lst == NULL) return NULL;
    for (size_t off = 0; off < b->n_new_stacks;) {
        uint64_t id = b->new_stacks[off], depth = b->new_stacks[off + 1];
        uint64_t image = b->new_stacks[off + 2];
        PyObject *ips = PyTuple_New((Py_ssize_t)depth);
        if (ips == NULL) goto fail;
        for (uint64_t k = 0; k < depth; k++) {
            PyObject *ip = PyLong_FromUnsignedLongLong(b->new_stacks[off + 3 + k]);
            if (ip == NULL) {
                Py_DECREF(ips);
                goto fail;
            }
            PyTuple_SET_ITEM(ips, (Py_ssize_t)k, ip);
        }
        PyObject *item = Py_BuildValue("(KKN)", (unsigned long long)id,
                                       (unsigned long long)image, ips);
        if (item == NULL || PyList_Append(lst, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        off += 3 + depth;
    }
    return lst;
fail:
    Py_DECREF(lst);
    return NULL;
}

static PyObject *perf_counts_list(const perf_batch *b) {
    PyObject *lst = PyList_New((Py_ssize_t)b->counts.used);
    if (lst == NULL) return NULL;
    Py_ssize_t k = 0;
    for (size_t s = 0; s < b->counts.n_slots; s++) {
        const perf_count_slot *c = &b->counts.slots[s];
        if (c->stack_id == 0) continue;
        PyObject *item = Py_BuildValue("(IiK)", (unsigned int)c->stack_id, (int)c->tid,
                                       (unsigned long long)c->count);
        if (item == NULL) {
            Py_DECREF(lst);
            return NULL;
        }
        PyList_SET_ITEM(lst, k++, item);
    }
    return lst;
}

static PyObject *perf_threads_lists(const perf_batch *b, PyObject **exited) {
    PyObject *born = PyList_New((Py_ssize_t)(b->n_new_threads / 2));
    *exited = PyList_New((Py_ssize_t)b->n_exited);
    if (born == NULL || *exited == NULL) goto fail;
    for (size_t k = 0; k + 1 < b->n_new_threads; k += 2) {
        PyObject *t = Py_BuildValue("(ii)", (int)b->new_threads[k], (int)b->new_threads[k + 1]);
        if (t == NULL) goto fail;
        PyList_SET_ITEM(born, (Py_ssize_t)(k / 2), t);
    }
    for (size_t k = 0; k < b->n_exited; k++) {
        PyObject *t = PyLong_FromLong(b->exited[k]);
        if (t == NULL) goto fail;
        PyList_SET_ITEM(*exited, (Py_ssize_t)k, t);
    }
    return born;
fail:
    Py_XDECREF(born);
    Py_CLEAR(*exited);
    return NULL;
}

static PyObject *perf_comms_list(const perf_batch *b) {
    /* Names are bytes in the kernel, decoded leniently. */
    PyObject *lst = PyList_New((Py_ssize_t)b->n_comms);
    if (lst == NULL) return NULL;
    for (size_t k = 0; k < b->n_comms; k++) {
        PyObject *name = PyUnicode_DecodeUTF8(b->comms[k].name,
                                              (Py_ssize_t)strlen(b->comms[k].name), "replace");
        PyObject *item = name ? Py_BuildValue("(iN)", (int)b->comms[k].tid, name) : NULL;
        if (item == NULL) {
            Py_DECREF(lst);
            return NULL;
        }
        PyList_SET_ITEM(lst, (Py_ssize_t)k, item);
    }
    return lst;
}

static PyObject *perf_mmaps_list(const perf_batch *b) {
    PyObject *lst = PyList_New((Py_ssize_t)b->n_mmaps);
    if (lst == NULL) return NULL;
    for (size_t k = 0; k < b->n_mmaps; k++) {
        const perf_mmap *m = &b->mmaps[k];
        PyObject *vals[6] = {
            PyLong_FromUnsignedLongLong(m->start),
            PyLong_FromUnsignedLongLong(m->len),
            PyLong_FromUnsignedLongLong(m->pgoff),
            PyUnicode_DecodeFSDefault(m->filename),
            m->build_id_size >= 0
                ? PyBytes_FromStringAndSize((const char *)m->build_id, m->build_id_size)
                : Py_NewRef(Py_None),
            PyLong_FromUnsignedLong(m->image),
        };
        PyObject *item = perf_struct(PerfMmapType, vals, 6);
        if (item == NULL) {
            Py_DECREF(lst);
            return NULL;
        }
        PyList_SET_ITEM(lst, (Py_ssize_t)k, item);
    }
    return lst;
}

static PyObject *perf_procs_list(const perf_batch *b) {
    PyObject *lst = PyList_New((Py_ssize_t)b->n_procs);
    if (lst == NULL) return NULL;
    for (size_t k = 0; k < b->n_procs; k++) {
        const perf_proc_event *e = &b->procs[k];
        PyObject *command = e->command ? PyUnicode_DecodeUTF8(e->command, (Py_ssize_t)strlen(
                                             e->command), "replace")
                                       : Py_NewRef(Py_None);
        PyObject *item = command ? Py_BuildValue("(sIiiIKN)", PROC_KIND_NAMES[e->kind],
                                                 (unsigned)e->image, (int)e->pid, (int)e->ppid,
                                                 (unsigned)e->parent_image,
                                                 (unsigned long long)e->time, command)
                                 : NULL;
        if (item == NULL) {
            Py_DECREF(lst);
            return NULL;
        }
        PyList_SET_ITEM(lst, (Py_ssize_t)k, item);
    }
    return lst;
}

static PyObject *perf_offcpu_list(const perf_batch *b) {
    PyObject *lst = PyList_New(0);
    if (lst == NULL) return NULL;
    for (size_t s = 0; s < b->off_counts.n_slots; s++) {
        const perf_count_slot *c = &b->off_counts.slots[s];
        if (c->stack_id == 0) continue;
        uint64_t ns = 0;
        /* the same key in off_ns (a wait still open at take() has its part there too) */
        const perf_count_table *t = &b->off_ns;
        if (t->n_slots) {
            size_t mask = t->n_slots - 1;
            for (size_t k = perf_count_slot_of(c->stack_id, c->tid, mask); t->slots[k].stack_id;
                 k = (k + 1) & mask)
                if (t->slots[k].stack_id == c->stack_id && t->slots[k].tid == c->tid) {
                    ns = t->slots[k].count;
                    break;
                }
        }
        char state[2] = {(char)((uint32_t)c->tid >> 24), 0};
        PyObject *item = Py_BuildValue("(IisKK)", (unsigned int)c->stack_id,
                                       (int)(c->tid & 0xFFFFFF), state,
                                       (unsigned long long)c->count, (unsigned long long)ns);
        if (item == NULL || PyList_Append(lst, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(lst);
            return NULL;
        }
        Py_DECREF(item);
    }
    /* waits that went on across a take(): time with no new switch-out */
    for (size_t s = 0; s < b->off_ns.n_slots; s++) {
        const perf_count_slot *c = &b->off_ns.slots[s];
        if (c->stack_id == 0) continue;
        const perf_count_table *t = &b->off_counts;
        bool found = false;
        if (t->n_slots) {
            size_t mask = t->n_slots - 1;
            for (size_t k = perf_count_slot_of(c->stack_id, c->tid, mask); t->slots[k].stack_id;
                 k = (k + 1) & mask)
                if (t->slots[k].stack_id == c->stack_id && t->slots[k].tid == c->tid) {
                    found = true;
                    break;
                }
        }
        if (found) continue;
        char state[2] = {(char)((uint32_t)c->tid >> 24), 0};
        PyObject *item = Py_BuildValue("(IisKK)", (unsigned int)c->stack_id,
                                       (int)(c->tid & 0xFFFFFF), state, 0ULL,
                                       (unsigned long long)c->count);
        if (item == NULL || PyList_Append(lst, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(lst);
            return NULL;
        }
        Py_DECREF(item);
    }
    return lst;
}

static PyObject *perf_batch_to_struct(const perf_batch *b) {
    PyObject *exited = NULL;
    PyObject *vals[PB_NFIELDS];
    vals[PB_SAMPLES] = PyLong_FromUnsignedLongLong(b->samples);
    vals[PB_LOST] = PyLong_FromUnsignedLongLong(b->lost);
    vals[PB_NEW_STACKS] = perf_stacks_list(b);
    vals[PB_COUNTS] = perf_counts_list(b);
    vals[PB_NEW_THREADS] = perf_threads_lists(b, &exited);
    vals[PB_EXITED_THREADS] = exited;
    vals[PB_COMMS] = perf_comms_list(b);
    vals[PB_MMAPS] = perf_mmaps_list(b);
    vals[PB_PROCESSES] = perf_procs_list(b);
    vals[PB_TARGET_EXITED] = PyBool_FromLong(b->target_exited);
    vals[PB_FIRST_TIME_NS] = PyLong_FromUnsignedLongLong(b->first_time);
    vals[PB_LAST_TIME_NS] = PyLong_FromUnsignedLongLong(b->last_time);
    vals[PB_TRUNCATED] = PyLong_FromUnsignedLongLong(b->truncated);
    vals[PB_OFFCPU] = perf_offcpu_list(b);
    vals[PB_OFFCPU_SWITCHES] = PyLong_FromUnsignedLongLong(b->off_switches);
    vals[PB_OFFCPU_LOST] = PyLong_FromUnsignedLongLong(b->off_lost);
    vals[PB_OFFCPU_UNPAIRED] = PyLong_FromUnsignedLongLong(b->off_unpaired);
    return perf_struct(PerfBatchType, vals, PB_NFIELDS);
}

static PyObject *PerfSampler_take(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    /* Swap the batch out under the lock; build Python objects after releasing it, so the
     * drain is blocked only for a struct copy. */
    perf_batch b;
    perf_lock(self);
    /* Waits still open are charged up to now and go on from here: a thread blocked for
     * minutes shows at every checkpoint, not only when it wakes. */
    uint64_t now = perf_now_ns();
    for (size_t i = 0; i < self->n_off_pending; i++) perf_off_close(self, i, now, true);
    b = self->batch;
    memset(&self->batch, 0, sizeof(self->batch));
    perf_unlock(self);
    PyObject *d = perf_batch_to_struct(&b);
    perf_batch_free(&b);
    return d;
}

/* A Python list of ints from a snapshot taken under the lock (freed here). */
static PyObject *perf_int_list(int32_t *vals, size_t n) {
    if (n && vals == NULL) return PyErr_NoMemory();
    PyObject *lst = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; lst != NULL && i < n; i++) {
        PyObject *v = PyLong_FromLong(vals[i]);
        if (v == NULL) Py_CLEAR(lst);
        else PyList_SET_ITEM(lst, (Py_ssize_t)i, v);
    }
    free(vals);
    return lst;
}

static PyObject *PerfSampler_threads(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    perf_lock(self);
    size_t n = self->n_threads;
    int32_t *tids = n ? malloc(n * sizeof(int32_t)) : NULL;
    if (tids != NULL) memcpy(tids, self->threads, n * sizeof(int32_t));
    perf_unlock(self);
    return perf_int_list(tids, n);
}

static PyObject *PerfSampler_processes(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    perf_lock(self);
    size_t n = self->n_procs;
    int32_t *pids = n ? malloc(n * sizeof(int32_t)) : NULL;
    if (pids != NULL)
        for (size_t i = 0; i < n; i++) pids[i] = self->procs[i].pid;
    perf_unlock(self);
    return perf_int_list(pids, n);
}

/* images() -> [(pid, image)] of the live processes being sampled. */
static PyObject *PerfSampler_images(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    perf_lock(self);
    size_t n = self->n_procs;
    perf_proc *copy = n ? malloc(n * sizeof(perf_proc)) : NULL;
    if (copy != NULL) memcpy(copy, self->procs, n * sizeof(perf_proc));
    perf_unlock(self);
    if (n && copy == NULL) return PyErr_NoMemory();
    PyObject *lst = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; lst != NULL && i < n; i++) {
        PyObject *v = Py_BuildValue("(iI)", copy[i].pid, copy[i].image);
        if (v == NULL) Py_CLEAR(lst);
        else PyList_SET_ITEM(lst, (Py_ssize_t)i, v);
    }
    free(copy);
    return lst;
}

/* set_python(image, reader): the samples of `image` get the Python frames `reader` (a
 * PyFrameReader of that image's process) reads at drain time; None stops it. */
static PyObject *PerfSampler_set_python(PerfSampler *self, PyObject *args) {
    unsigned int image;
    PyObject *reader;
    if (!PyArg_ParseTuple(args, "IO:set_python", &image, &reader)) return NULL;
    rs_pyreader *core = NULL;
    pthread_mutex_t *lock = NULL;
    if (reader != Py_None && rs_pyreader_from_object(reader, &core, &lock) < 0) {
        PyErr_SetString(PyExc_TypeError, "set_python: reader must be a PyFrameReader or None");
        return NULL;
    }
    PyObject *old = NULL;
    bool nomem = false;
    perf_lock(self);
    if (self->pyframes == NULL && reader != Py_None)
        self->pyframes = malloc(RS_PY_MAX_DEPTH * sizeof(rs_pyframe));
    size_t i = 0;
    while (i < self->n_py && self->py[i].image != image) i++;
    if (i < self->n_py) {
        old = self->py[i].object;
        int32_t pid = self->py[i].bpf_pid;
        self->py[i] = self->py[--self->n_py];
        /* A process that exec'd a new CPython has the new image's configuration under the
         * same pid already (PythonImages attaches new images before it detaches gone ones):
         * that one stays. */
        bool reused = false;
        for (size_t k = 0; k < self->n_py; k++) reused = reused || self->py[k].bpf_pid == pid;
        if (self->bpf != NULL && pid != 0 && !reused)
            (void)rs_pybpf_configure(self->bpf, (uint32_t)pid, NULL);
    }
    if (reader != Py_None) {
        if (self->pyframes == NULL ||
            !perf_vec_reserve((void **)&self->py, &self->cap_py, self->n_py + 1, sizeof(perf_py))) {
            nomem = true;
        } else {
            Py_INCREF(reader);
            perf_py entry = {image, reader, core, lock, 0, 0};
            if (image < self->cap_image_samples) {
                self->py_stats.before_reader += self->image_samples[image];
                self->image_samples[image] = 0;
            }
            if (self->bpf != NULL) {
                /* From now on the program reads this process's frames at sample time; the
                 * samples taken before (the program did not know the process) keep their
                 * native frames (perf_add_python). The offsets are the reader's: one table
                 * for both. */
                struct rs_bpf_config cfg;
                int32_t pid;
                int unfit = rs_pyreader_bpf_config(core, &cfg, &pid);
                /* Without --gil the program need not read the GIL: 3 reads per sample
                 * saved, and no GIL flags in the records. */
                if (!self->gil_only) cfg.gil_locked = cfg.gil_last_holder = -1;
                if (unfit != 0) {
                    perf_bpf_fail(self, "the interpreter's frame layout", unfit);
                } else {
                    /* The switch program first: every switch-out after the configuration then
                     * has its record, as every cpu-clock sample has. */
                    if (self->off_tracepoint >= 0 && !self->bpf_switch &&
                        self->bpf_switch_error[0] == 0) {
                        int e = rs_pybpf_attach_switch(self->bpf);
                        if (e == 0)
                            self->bpf_switch = true;
                        else
                            snprintf(self->bpf_switch_error, sizeof self->bpf_switch_error,
                                     "attaching to sched_switch: %s", strerror(e));
                    }
                    int err = rs_pybpf_configure(self->bpf, (uint32_t)pid, &cfg);
                    if (err != 0) {
                        perf_bpf_fail(self, "configuring the BPF program", err);
                    } else {
                        entry.bpf_pid = pid;
                        entry.bpf_since = perf_now_ns();
                    }
                }
            }
            self->py[self->n_py++] = entry;
        }
    }
    perf_unlock(self);
    Py_XDECREF(old);
    if (nomem) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *PerfSampler_python_stats(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    perf_lock(self);
    perf_py_stats st = self->py_stats;
    uint64_t counters[RS_BPF_N_COUNTERS] = {0};
    bool bpf = self->bpf != NULL;
    if (bpf) rs_pybpf_counters(self->bpf, counters);
    char bpf_error[sizeof self->bpf_error];
    memcpy(bpf_error, self->bpf_error, sizeof bpf_error);
    bool bpf_switch = self->bpf_switch;
    uint64_t switch_shed_ns = self->bpf_switch && self->off_shed ? self->off_shed_time : 0;
    char bpf_switch_error[sizeof self->bpf_switch_error];
    memcpy(bpf_switch_error, self->bpf_switch_error, sizeof bpf_switch_error);
    perf_unlock(self);
    PyObject *hist = PyList_New(24);
    for (int i = 0; hist != NULL && i < 24; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(st.stale_log2_us[i]);
        if (v == NULL) Py_CLEAR(hist);
        else PyList_SET_ITEM(hist, i, v);
    }
    if (hist == NULL) return NULL;
    PyObject *stats = Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsN}", "walks", (unsigned long long)st.walks, "retries",
        (unsigned long long)st.retries, "attached",
        (unsigned long long)st.attached, "empty", (unsigned long long)st.empty, "dropped",
        (unsigned long long)st.dropped, "late", (unsigned long long)st.late, "frames",
        (unsigned long long)st.frames, "stale_ns_sum", (unsigned long long)st.stale_ns_sum,
        "stale_ns_max", (unsigned long long)st.stale_ns_max, "stale_over_1ms",
        (unsigned long long)st.stale_over_1ms, "walk_ns_sum", (unsigned long long)st.walk_ns_sum,
        "stale_log2_us", hist);
    PyObject *more = Py_BuildValue(
        "{sssssKsKsKsKsKsKsKsKsKsKsKsLsLsKsKsKsK}", "mode", bpf ? "bpf" : "drain", "bpf_error",
        bpf_error, "bpf_attached", (unsigned long long)st.bpf_attached, "bpf_missing",
        (unsigned long long)st.bpf_missing, "bpf_empty", (unsigned long long)st.bpf_empty,
        "bpf_fault", (unsigned long long)st.bpf_fault, "bpf_truncated",
        (unsigned long long)st.bpf_truncated, "bpf_freed", (unsigned long long)st.bpf_freed,
        "bpf_replaced", (unsigned long long)st.bpf_replaced, "bpf_frames",
        (unsigned long long)st.bpf_frames, "bpf_ip_mismatch",
        (unsigned long long)st.bpf_ip_mismatch, "bpf_records", (unsigned long long)st.bpf_records,
        "bpf_unpaired", (unsigned long long)st.bpf_unpaired, "bpf_dt_min_ns",
        (long long)st.bpf_dt_min, "bpf_dt_max_ns", (long long)st.bpf_dt_max, "bpf_runs",
        (unsigned long long)counters[RS_BPF_RUNS], "bpf_ring_full",
        (unsigned long long)counters[RS_BPF_RB_FULL], "before_reader",
        (unsigned long long)st.before_reader, "bpf_outer",
        (unsigned long long)counters[RS_BPF_OUTER]);
    if (stats == NULL || more == NULL || PyDict_Update(stats, more) < 0) {
        Py_XDECREF(stats);
        Py_XDECREF(more);
        return NULL;
    }
    Py_DECREF(more);
    more = Py_BuildValue(
        "{sKsKsOsssKsKsKsKsKsKsK}", "gil_dropped", (unsigned long long)st.gil_dropped, "gil_unknown",
        (unsigned long long)st.gil_unknown, "bpf_switch", bpf_switch ? Py_True : Py_False,
        "bpf_switch_error", bpf_switch_error, "bpf_switches",
        (unsigned long long)counters[RS_BPF_SWITCHES], "bpf_switch_attached",
        (unsigned long long)st.bpf_switch_attached, "bpf_switch_missing",
        (unsigned long long)st.bpf_switch_missing, "off_unread_preempted",
        (unsigned long long)st.off_unread_preempted, "bpf_switch_shed_ns",
        (unsigned long long)switch_shed_ns, "off_shed_unread",
        (unsigned long long)st.off_shed_unread, "off_unread_ran",
        (unsigned long long)st.off_unread_ran);
    if (more == NULL || PyDict_Update(stats, more) < 0) {
        Py_DECREF(stats);
        Py_XDECREF(more);
        return NULL;
    }
    Py_DECREF(more);
    return stats;
}

static PyObject *PerfSampler_close(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    perf_lock(self);
    perf_close_locked(self);
    perf_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *PerfSampler_enter(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    return Py_NewRef((PyObject *)self);
}

static PyObject *PerfSampler_exit(PerfSampler *self, PyObject *args) {
    PyObject *r = PerfSampler_close(self, NULL);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *PerfSampler_get_pid(PerfSampler *self, void *closure) {
    return PyLong_FromLong(self->pid);
}

static PyObject *PerfSampler_get_kernel(PerfSampler *self, void *closure) {
    perf_lock(self);
    bool kernel = self->kernel;
    perf_unlock(self);
    return PyBool_FromLong(kernel);
}

static PyObject *PerfSampler_get_offcpu(PerfSampler *self, void *closure) {
    perf_lock(self);
    bool on = self->off_tracepoint >= 0;
    perf_unlock(self);
    return PyBool_FromLong(on);
}

static PyObject *PerfSampler_get_offcpu_error(PerfSampler *self, void *closure) {
    perf_lock(self);
    char error[sizeof self->off_error];
    memcpy(error, self->off_error, sizeof error);
    perf_unlock(self);
    return PyUnicode_DecodeUTF8(error, (Py_ssize_t)strlen(error), "replace");
}

static PyObject *PerfSampler_get_offcpu_kernel_shed(PerfSampler *self, void *closure) {
    perf_lock(self);
    uint64_t time = self->off_shed_time, rate = self->off_shed_rate;
    bool shed = self->off_shed && perf_off_paired(self);  /* the chain's, not only Python's */
    perf_unlock(self);
    if (!shed) Py_RETURN_NONE;
    return Py_BuildValue("(KK)", (unsigned long long)time, (unsigned long long)rate);
}

static PyObject *PerfSampler_get_stack_bytes(PerfSampler *self, void *closure) {
    return PyLong_FromLong(self->stack_bytes);
}

static PyObject *PerfSampler_unwind_stats(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    perf_lock(self);
    rs_unwind_stats st = self->unwind_done;
    for (size_t i = 0; i < self->n_spaces; i++) {
        const rs_unwind_stats *one = rs_space_stats(self->spaces[i]);
        st.frames += one->frames;
        st.fp_frames += one->fp_frames;
        st.truncated += one->truncated;
        st.modules_loaded += one->modules_loaded;
    }
    perf_unlock(self);
    return Py_BuildValue("{sKsKsKsK}", "cfi_frames", (unsigned long long)st.frames, "fp_frames",
                         (unsigned long long)st.fp_frames, "truncated",
                         (unsigned long long)st.truncated, "modules",
                         (unsigned long long)st.modules_loaded);
}

static PyObject *PerfSampler_get_closed(PerfSampler *self, void *closure) {
    perf_lock(self);
    bool closed = self->closed;
    perf_unlock(self);
    return PyBool_FromLong(closed);
}

static PyMethodDef PerfSampler_methods[] = {
    {"add_thread", (PyCFunction)PerfSampler_add_thread, METH_O,
     "add_thread(tid) -> None\n\nOpen the sampling event of one thread of the target. "
     "No-op if already tracked. Raises OSError (ESRCH: thread gone, EACCES/EPERM: no "
     "permission)."},
    {"enable", (PyCFunction)PerfSampler_enable, METH_NOARGS,
     "enable() -> None\n\nStart sampling on every tracked thread; later threads start at once."},
    {"disable", (PyCFunction)PerfSampler_disable, METH_NOARGS,
     "disable() -> None\n\nStop sampling every thread (the recording window ends); the "
     "rings keep what was taken until poll() drains it. Idempotent, a no-op once closed."},
    {"poll", (PyCFunction)PerfSampler_poll, METH_O,
     "poll(timeout_ms) -> int\n\nWait (GIL released) up to timeout_ms for ring data, then "
     "drain every ring into the aggregates. Returns the number of records processed."},
    {"take", (PyCFunction)PerfSampler_take, METH_NOARGS,
     "take() -> PerfBatch\n\nReturn and reset everything aggregated since the previous take()."},
    {"processes", (PyCFunction)PerfSampler_processes, METH_NOARGS,
     "processes() -> list[int]\n\nLive processes being sampled: the target, and with follow "
     "the descendants whose FORK was drained and whose EXIT was not yet."},
    {"images", (PyCFunction)PerfSampler_images, METH_NOARGS,
     "images() -> list[tuple[int, int]]\n\n(pid, image) of the live processes being sampled."},
    {"set_python", (PyCFunction)PerfSampler_set_python, METH_VARARGS,
     "set_python(image, reader) -> None\n\nAttach the Python frames `reader` (a PyFrameReader "
     "of the image's process) reads at drain time to the image's samples; None stops it."},
    {"python_stats", (PyCFunction)PerfSampler_python_stats, METH_NOARGS,
     "python_stats() -> dict\n\nTotals of the Python frame reads: walks, attached, empty, "
     "dropped, late, frames, stale_ns_sum, stale_ns_max, stale_over_1ms, walk_ns_sum."},
    {"threads", (PyCFunction)PerfSampler_threads, METH_NOARGS,
     "threads() -> list[int]\n\nLive threads being sampled (opened or inherited)."},
    {"unwind_stats", (PyCFunction)PerfSampler_unwind_stats, METH_NOARGS,
     "unwind_stats() -> dict\n\nCFI mode totals since construction: cfi_frames, fp_frames, "
     "truncated, modules (all 0 in frame-pointer mode)."},
    {"close", (PyCFunction)PerfSampler_close, METH_NOARGS,
     "close() -> None\n\nDisable and release every event. Idempotent."},
    {"__enter__", (PyCFunction)PerfSampler_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)PerfSampler_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PerfSampler_getset[] = {
    {"pid", (getter)PerfSampler_get_pid, NULL, "Target process id.", NULL},
    {"closed", (getter)PerfSampler_get_closed, NULL, "True once close() ran.", NULL},
    {"kernel", (getter)PerfSampler_get_kernel, NULL,
     "Kernel mode is sampled too (False: not allowed, or not asked).", NULL},
    {"offcpu", (getter)PerfSampler_get_offcpu, NULL,
     "Off-CPU time is recorded (sched:sched_switch opened on every thread).", NULL},
    {"offcpu_error", (getter)PerfSampler_get_offcpu_error, NULL,
     "Why off-CPU time is not recorded ('' when it is, or was not asked for).", NULL},
    {"offcpu_kernel_shed", (getter)PerfSampler_get_offcpu_kernel_shed, NULL,
     "(time_ns, switch-outs per second) when the off-CPU kernel chain was shed, or None.",
     NULL},
    {"stack_bytes", (getter)PerfSampler_get_stack_bytes, NULL,
     "User stack bytes copied per sample (0: frame-pointer call chains).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PerfSamplerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rsprof._native.PerfSampler",
    .tp_basicsize = sizeof(PerfSampler),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PerfSampler(pid, freq_hz=99, ring_kib=128, max_stack=127, follow=False, "
              "stack_bytes=0)\n\n"
              "CPU sampling of every thread of a process, and with follow=True of every process\n"
              "it starts; stacks by frame pointers (stack_bytes=0) or by CFI from a copy of the\n"
              "user stack (see docs/native.md).",
    .tp_new = PerfSampler_new,
    .tp_dealloc = (destructor)PerfSampler_dealloc,
    .tp_methods = PerfSampler_methods,
    .tp_getset = PerfSampler_getset,
};

int rsprof_perf_register(PyObject *module) {
    if (PyType_Ready(&PerfSamplerType) < 0) return -1;
    PerfBatchType = PyStructSequence_NewType(&perf_batch_desc);
    PerfMmapType = PyStructSequence_NewType(&perf_mmap_desc);
    if (PerfBatchType == NULL || PerfMmapType == NULL) return -1;
    if (PyModule_AddObjectRef(module, "PerfBatch", (PyObject *)PerfBatchType) < 0 ||
        PyModule_AddObjectRef(module, "PerfMmap", (PyObject *)PerfMmapType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "PerfSampler", (PyObject *)&PerfSamplerType);
}
