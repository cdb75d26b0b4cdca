/* perf.c: rsprof._native.PerfSampler, CPU sampling of one process through perf_event_open.
 *
 * Design (see docs/native.md, "PerfSampler", for the Python-facing contract):
 *
 * - One software cpu-clock event per thread (pid = TID, cpu = -1).  inherit=1 cannot be
 *   combined with mmap on a per-task, any-CPU event, so threads are followed by hand:
 *   task=1 makes the kernel write PERF_RECORD_FORK into the ring of the thread that called
 *   clone(), and the drain loop opens an event for the new TID on the spot (in C, so a new
 *   thread is followed within one drain period, without a round trip through Python).
 *   PERF_RECORD_EXIT (or POLLHUP, in case the EXIT record itself was lost) closes the event.
 * - Call chains come from frame pointers (PERF_SAMPLE_CALLCHAIN, user part only).  They are
 *   de-duplicated into a stack table and counted per (stack id, tid) in C (perf_tables.h);
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

/* A record's size is a u16, so no record (and no call chain in one) is larger than this. */
#define PERF_MAX_RECORD 65536u
#define PERF_MAX_CHAIN (PERF_MAX_RECORD / sizeof(uint64_t))
#define PERF_COMM_LEN 16
#define PERF_BUILD_ID_MAX 20

/* ------------------------------------------------------------------ state */

typedef struct {
    int32_t tid;
    int fd;
    void *base;              /* mmap: metadata page followed by the data area */
    uint64_t lost_reported;  /* sum of PERF_RECORD_LOST.lost seen in this ring */
    bool exited;             /* EXIT record or POLLHUP seen: drain once more, then close */
} perf_thread_event;

typedef struct {
    int32_t tid;
    char name[PERF_COMM_LEN + 1];
} perf_comm;

typedef struct {
    uint64_t start, len, pgoff;
    char *filename;          /* malloc'd */
    int build_id_size;       /* -1: the kernel gave no build id for this mapping */
    uint8_t build_id[PERF_BUILD_ID_MAX];
} perf_mmap;

/* Everything take() hands out, reset by take(). */
typedef struct {
    uint64_t samples, lost;
    uint64_t first_time, last_time;
    bool target_exited;
    perf_count_table counts;
    uint64_t *new_stacks;    /* flat: id, depth, ips[depth], id, depth, ... */
    size_t n_new_stacks, cap_new_stacks;
    int32_t *new_threads;
    size_t n_new_threads, cap_new_threads;
    int32_t *exited;
    size_t n_exited, cap_exited;
    perf_comm *comms;
    size_t n_comms, cap_comms;
    perf_mmap *mmaps;
    size_t n_mmaps, cap_mmaps;
} perf_batch;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    bool lock_ready;
    int32_t pid;
    int freq_hz;
    int max_stack;
    size_t data_size;        /* bytes of ring data area, a power-of-two number of pages */
    size_t map_len;          /* data_size + one metadata page */
    bool enabled;
    bool closed;
    bool format_lost;        /* PERF_FORMAT_LOST accepted by the kernel (>= 6.0) */
    perf_thread_event *events;
    size_t n_events, cap_events;
    perf_stack_table stacks;
    perf_batch batch;
    uint8_t *scratch;        /* PERF_MAX_RECORD bytes: records that wrap around the ring end */
    uint64_t *chain;         /* PERF_MAX_CHAIN entries: a sample's call chain minus markers */
} PerfSampler;

static void perf_batch_free(perf_batch *b) {
    perf_count_table_free(&b->counts);
    free(b->new_stacks);
    free(b->new_threads);
    free(b->exited);
    free(b->comms);
    for (size_t i = 0; i < b->n_mmaps; i++) free(b->mmaps[i].filename);
    free(b->mmaps);
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

static long sys_perf_event_open(struct perf_event_attr *attr, pid_t tid) {
    return syscall(SYS_perf_event_open, attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
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
    attr->disabled = 1;                 /* enable() starts all threads together */
    attr->exclude_kernel = 1;
    attr->exclude_hv = 1;
    attr->exclude_callchain_kernel = 1;
    attr->sample_max_stack = (uint16_t)self->max_stack;
    attr->mmap = 1;                     /* with mmap2: executable mappings as MMAP2 */
    attr->mmap2 = 1;
    attr->comm = 1;
    attr->comm_exec = 1;
    attr->task = 1;                     /* FORK/EXIT: how new threads are followed */
    attr->sample_id_all = 1;
    attr->use_clockid = 1;              /* times comparable with time.monotonic_ns() */
    attr->clockid = CLOCK_MONOTONIC;
    attr->watermark = 1;
    attr->wakeup_watermark = (uint32_t)(self->data_size / 4);
    if (extras) {
        attr->build_id = 1;                    /* kernel >= 5.12 */
        attr->read_format = PERF_FORMAT_LOST;  /* kernel >= 6.0 */
    }
}

static ssize_t perf_find_event(const PerfSampler *self, int32_t tid) {
    for (size_t i = 0; i < self->n_events; i++)
        if (self->events[i].tid == tid) return (ssize_t)i;
    return -1;
}

/* Opens, maps and (if the sampler is enabled) enables the event for one thread.
 * Called with the lock held; no GIL needed.  Returns 0 or an errno value. */
static int perf_open_thread(PerfSampler *self, int32_t tid) {
    if (!perf_vec_reserve((void **)&self->events, &self->cap_events, self->n_events + 1,
                          sizeof(perf_thread_event)))
        return ENOMEM;
    struct perf_event_attr attr;
    perf_fill_attr(self, &attr, self->format_lost);
    long fd = sys_perf_event_open(&attr, tid);
    if (fd < 0 && errno == EINVAL && self->format_lost) {
        /* Older kernel without build_id / PERF_FORMAT_LOST: retry without, and remember. */
        perf_fill_attr(self, &attr, false);
        fd = sys_perf_event_open(&attr, tid);
        if (fd >= 0) self->format_lost = false;
    }
    if (fd < 0) return errno;
    void *base = mmap(NULL, self->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
    if (base == MAP_FAILED) {
        int err = errno;
        close((int)fd);
        return err;
    }
    if (self->enabled && ioctl((int)fd, PERF_EVENT_IOC_ENABLE, 0) < 0) {
        int err = errno;
        munmap(base, self->map_len);
        close((int)fd);
        return err;
    }
    perf_thread_event *ev = &self->events[self->n_events++];
    ev->tid = tid;
    ev->fd = (int)fd;
    ev->base = base;
    ev->lost_reported = 0;
    ev->exited = false;
    return 0;
}

/* Releases event i (which the caller then removes from the array).  Lost records the
 * kernel had no room to announce as PERF_RECORD_LOST are picked up from the lost counter
 * of PERF_FORMAT_LOST, so they are not silently dropped when a thread goes away. */
static void perf_release_event(PerfSampler *self, size_t i, bool exited) {
    perf_thread_event *ev = &self->events[i];
    if (self->format_lost) {
        uint64_t vals[2];
        if (read(ev->fd, vals, sizeof vals) == (ssize_t)sizeof vals && vals[1] > ev->lost_reported)
            self->batch.lost += vals[1] - ev->lost_reported;
    }
    munmap(ev->base, self->map_len);
    close(ev->fd);
    if (exited) {
        (void)append_i32(&self->batch.exited, &self->batch.n_exited, &self->batch.cap_exited,
                         ev->tid);  /* out of memory: the tid simply goes unreported */
        if (ev->tid == self->pid) self->batch.target_exited = true;
    }
}

/* ------------------------------------------------------- record handling */

static void perf_on_sample(PerfSampler *self, const uint8_t *rec, size_t size) {
    /* IP | TID | TIME | CALLCHAIN: header, ip, pid, tid, time, nr, ips[nr] */
    perf_batch *b = &self->batch;
    if (size < 40) return;
    uint64_t ip = rd_u64(rec + 8);
    int32_t tid = (int32_t)rd_u32(rec + 20);
    uint64_t time = rd_u64(rec + 24);
    uint64_t nr = rd_u64(rec + 32);
    if (nr > (size - 40) / sizeof(uint64_t)) return;  /* malformed */

    b->samples++;
    if (b->first_time == 0 || time < b->first_time) b->first_time = time;
    if (time > b->last_time) b->last_time = time;

    /* The chain is leaf first and interleaved with context markers (PERF_CONTEXT_USER
     * first); markers and kernel addresses (upper half) are not frames of this process. */
    uint32_t depth = 0;
    const uint8_t *p = rec + 40;
    for (uint64_t i = 0; i < nr; i++) {
        uint64_t a = rd_u64(p + i * 8);
        if (a >= (uint64_t)PERF_CONTEXT_MAX || (int64_t)a < 0) continue;
        self->chain[depth++] = a;
    }
    if (depth == 0) {
        /* No user frames were walked; the sample IP alone still says where we were. */
        if (ip == 0 || (int64_t)ip < 0) return;
        self->chain[depth++] = ip;
    }

    /* Room for announcing the stack is reserved before interning it: an id must never
     * exist without Python learning its frames.  Out of memory, the sample counts as lost. */
    size_t need = b->n_new_stacks + 2 + depth;
    if (!perf_vec_reserve((void **)&b->new_stacks, &b->cap_new_stacks, need, sizeof(uint64_t))) {
        b->lost++;
        return;
    }
    bool is_new;
    uint32_t id = perf_stack_table_intern(&self->stacks, self->chain, depth, &is_new);
    if (id == 0) {
        b->lost++;
        return;
    }
    if (is_new) {
        uint64_t *dst = &b->new_stacks[b->n_new_stacks];
        dst[0] = id;
        dst[1] = depth;
        memcpy(dst + 2, self->chain, (size_t)depth * sizeof(uint64_t));
        b->n_new_stacks = need;
    }
    if (!perf_count_table_add(&b->counts, id, tid, 1)) b->lost++;
}

static void perf_on_fork(PerfSampler *self, const uint8_t *rec, size_t size) {
    /* header, pid, ppid, tid, ptid, time.  A FORK whose pid differs from ours is a child
     * process (fork()): it is not followed. */
    if (size < 32) return;
    int32_t pid = (int32_t)rd_u32(rec + 8);
    int32_t tid = (int32_t)rd_u32(rec + 16);
    if (pid != self->pid || tid == pid || perf_find_event(self, tid) >= 0) return;
    /* ESRCH here just means the thread was already gone: nothing to follow. */
    if (perf_open_thread(self, tid) == 0)
        (void)append_i32(&self->batch.new_threads, &self->batch.n_new_threads,
                         &self->batch.cap_new_threads, tid);
}

static void perf_on_exit(PerfSampler *self, const uint8_t *rec, size_t size) {
    if (size < 32) return;
    int32_t pid = (int32_t)rd_u32(rec + 8);
    int32_t tid = (int32_t)rd_u32(rec + 16);
    if (pid == self->pid && tid == self->pid) self->batch.target_exited = true;
    ssize_t i = perf_find_event(self, tid);
    if (i >= 0) self->events[i].exited = true;  /* closed after its ring is drained */
}

static void perf_on_comm(PerfSampler *self, const uint8_t *rec, size_t size) {
    /* header, pid, tid, comm[] (NUL terminated, padded), sample_id */
    if (size < 17) return;
    int32_t pid = (int32_t)rd_u32(rec + 8);
    if (pid != self->pid) return;
    perf_batch *b = &self->batch;
    if (!perf_vec_reserve((void **)&b->comms, &b->cap_comms, b->n_comms + 1, sizeof(perf_comm)))
        return;
    perf_comm *c = &b->comms[b->n_comms++];
    c->tid = (int32_t)rd_u32(rec + 12);
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
    if (pid != self->pid || !(prot & PROT_EXEC)) return;
    perf_batch *b = &self->batch;
    if (!perf_vec_reserve((void **)&b->mmaps, &b->cap_mmaps, b->n_mmaps + 1, sizeof(perf_mmap)))
        return;
    size_t n = strnlen((const char *)rec + 72, size - 72);
    char *name = malloc(n + 1);
    if (name == NULL) return;
    memcpy(name, rec + 72, n);
    name[n] = '\0';
    perf_mmap *m = &b->mmaps[b->n_mmaps++];
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

static void perf_on_record(PerfSampler *self, size_t ev_index, const uint8_t *rec,
                           const struct perf_event_header *hdr) {
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
        perf_on_comm(self, rec, hdr->size);
        break;
    case PERF_RECORD_MMAP2:
        perf_on_mmap2(self, rec, hdr->size, hdr->misc);
        break;
    case PERF_RECORD_LOST:
        /* header, id, lost, sample_id */
        if (hdr->size >= 24) {
            uint64_t lost = rd_u64(rec + 16);
            self->batch.lost += lost;
            self->events[ev_index].lost_reported += lost;
        }
        break;
    default:
        break;  /* THROTTLE/UNTHROTTLE and friends carry nothing we report */
    }
}

/* Drains the ring of event i.  Lock held.  Handlers may open new events (FORK), which can
 * move self->events, so the ring is addressed through locals, never a cached event pointer. */
static size_t perf_drain_ring(PerfSampler *self, size_t i) {
    struct perf_event_mmap_page *meta = self->events[i].base;
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
        const uint8_t *rec = data + off;
        if (off + hdr.size > size) {
            size_t first = (size_t)(size - off);
            memcpy(self->scratch, data + off, first);
            memcpy(self->scratch + first, data, hdr.size - first);
            rec = self->scratch;
        }
        perf_on_record(self, i, rec, &hdr);
        tail += hdr.size;
        n++;
    }
    /* Release: our reads of the records complete before the kernel may overwrite them. */
    __atomic_store_n(&meta->data_tail, tail, __ATOMIC_RELEASE);
    return n;
}

/* Drains every ring, then retires the threads that exited.  Lock held, no GIL needed. */
static size_t perf_drain_all(PerfSampler *self) {
    size_t n = 0;
    /* n_events may grow while looping (FORK); new events are drained in the same pass. */
    for (size_t i = 0; i < self->n_events; i++) n += perf_drain_ring(self, i);
    for (size_t i = 0; i < self->n_events;) {
        if (!self->events[i].exited) {
            i++;
            continue;
        }
        /* Its EXIT may have been read from another ring after this one was drained. */
        n += perf_drain_ring(self, i);
        perf_release_event(self, i, true);
        memmove(&self->events[i], &self->events[i + 1],
                (self->n_events - i - 1) * sizeof(perf_thread_event));
        self->n_events--;
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
    static char *kwlist[] = {"pid", "freq_hz", "ring_kib", "max_stack", NULL};
    int pid, freq_hz = 99, ring_kib = 128, max_stack = 127;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|iii:PerfSampler", kwlist, &pid, &freq_hz,
                                     &ring_kib, &max_stack))
        return NULL;
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
    self->data_size = data_size;
    self->map_len = data_size + (size_t)page;
    self->format_lost = true;
    self->scratch = malloc(PERF_MAX_RECORD);
    self->chain = malloc(PERF_MAX_CHAIN * sizeof(uint64_t));
    if (self->scratch == NULL || self->chain == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    if (pthread_mutex_init(&self->lock, NULL) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->lock_ready = true;
    return (PyObject *)self;
}

/* Disables and releases every event.  Lock held. */
static void perf_close_locked(PerfSampler *self) {
    if (self->closed) return;
    for (size_t i = 0; i < self->n_events; i++) ioctl(self->events[i].fd, PERF_EVENT_IOC_DISABLE, 0);
    for (size_t i = 0; i < self->n_events; i++) perf_release_event(self, i, false);
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
    perf_stack_table_free(&self->stacks);
    perf_batch_free(&self->batch);
    free(self->scratch);
    free(self->chain);
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
    if (!closed && perf_find_event(self, tid) < 0) err = perf_open_thread(self, tid);
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
    /* A thread that is exiting right now may refuse; its EXIT/HUP retires it anyway. */
    for (size_t i = 0; i < self->n_events; i++) ioctl(self->events[i].fd, PERF_EVENT_IOC_ENABLE, 0);
    self->enabled = true;
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
     * behind a poll.  Matching revents back by (fd, tid) copes with events retired and
     * fds reused while we slept. */
    struct pollfd *pfds = NULL;
    int32_t *tids = NULL;
    size_t n = 0;
    pthread_mutex_lock(&self->lock);
    closed = self->closed;
    if (!closed && self->n_events > 0) {
        n = self->n_events;
        pfds = malloc(n * sizeof(*pfds));
        tids = malloc(n * sizeof(*tids));
        if (pfds == NULL || tids == NULL) {
            nomem = true;
            n = 0;
        } else {
            for (size_t i = 0; i < n; i++) {
                pfds[i].fd = self->events[i].fd;
                pfds[i].events = POLLIN;
                pfds[i].revents = 0;
                tids[i] = self->events[i].tid;
            }
        }
    }
    pthread_mutex_unlock(&self->lock);

    if (!closed && !nomem) {
        if (poll(pfds, (nfds_t)n, timeout_ms) < 0) poll_errno = errno;
        pthread_mutex_lock(&self->lock);
        closed = self->closed;
        if (!closed) {
            /* HUP/ERR: the thread is gone even if its EXIT record was lost. */
            for (size_t k = 0; poll_errno == 0 && k < n; k++) {
                if (!(pfds[k].revents & (POLLHUP | POLLERR))) continue;
                ssize_t i = perf_find_event(self, tids[k]);
                if (i >= 0 && self->events[i].fd == pfds[k].fd) self->events[i].exited = true;
            }
            processed = perf_drain_all(self);
        }
        pthread_mutex_unlock(&self->lock);
    }
    free(pfds);
    free(tids);
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
    PB_MMAPS, PB_TARGET_EXITED, PB_FIRST_TIME_NS, PB_LAST_TIME_NS, PB_NFIELDS
};
static PyStructSequence_Field perf_batch_fields[] = {
    {"samples", "samples read from the rings since the last take()"},
    {"lost", "samples the kernel dropped (PERF_RECORD_LOST)"},
    {"new_stacks", "[(stack_id, (ip, ...)), ...] stacks first seen in this batch"},
    {"counts", "[(stack_id, tid, count), ...]"},
    {"new_threads", "[tid, ...] threads that appeared"},
    {"exited_threads", "[tid, ...] threads that ended"},
    {"comms", "[(tid, name), ...] thread names (PERF_RECORD_COMM)"},
    {"mmaps", "[PerfMmap, ...] executable mappings (PERF_RECORD_MMAP2)"},
    {"target_exited", "the whole target process has exited"},
    {"first_time_ns", "perf clock of the first record in the batch (0: none)"},
    {"last_time_ns", "perf clock of the last record in the batch (0: none)"},
    {NULL, NULL},
};
static PyStructSequence_Desc perf_batch_desc = {
    "rsprof._native.PerfBatch", "What PerfSampler.take() collected since the last call.",
    perf_batch_fields, PB_NFIELDS,
};
static PyStructSequence_Field perf_mmap_fields[] = {
    {"start", "first address"}, {"length", "bytes mapped"}, {"pgoff", "file offset"},
    {"path", "file name as the kernel reports it"}, {"build_id", "GNU build id, or None"},
    {NULL, NULL},
};
static PyStructSequence_Desc perf_mmap_desc = {
    "rsprof._native.PerfMmap", "One executable mapping seen by the kernel.", perf_mmap_fields, 5,
};
static PyTypeObject *PerfBatchType, *PerfMmapType;

static PyObject *perf_batch_to_struct(PerfSampler *self, const perf_batch *b) {
    PyObject *d = PyStructSequence_New(PerfBatchType), *v = NULL;
    if (d == NULL) return NULL;

    /* PyStructSequence_SetItem steals the reference, so v is not cleared after it. */
#define SET_ITEM(key, expr)                                          \
    do {                                                             \
        v = (expr);                                                  \
        if (v == NULL) goto fail;                                    \
        PyStructSequence_SetItem(d, key, v);                         \
        v = NULL;                                                    \
    } while (0)

    SET_ITEM(PB_SAMPLES, PyLong_FromUnsignedLongLong(b->samples));
    SET_ITEM(PB_LOST, PyLong_FromUnsignedLongLong(b->lost));

    /* new_stacks: [(id, (ip, ...)), ...] */
    {
        PyObject *lst = PyList_New(0);
        if (lst == NULL) goto fail;
        v = lst;
        for (size_t off = 0; off < b->n_new_stacks;) {
            uint64_t id = b->new_stacks[off], depth = b->new_stacks[off + 1];
            PyObject *ips = PyTuple_New((Py_ssize_t)depth);
            if (ips == NULL) goto fail;
            for (uint64_t k = 0; k < depth; k++) {
                PyObject *ip = PyLong_FromUnsignedLongLong(b->new_stacks[off + 2 + k]);
                if (ip == NULL) {
                    Py_DECREF(ips);
                    goto fail;
                }
                PyTuple_SET_ITEM(ips, (Py_ssize_t)k, ip);
            }
            PyObject *item = Py_BuildValue("(KN)", (unsigned long long)id, ips);
            if (item == NULL || PyList_Append(lst, item) < 0) {
                Py_XDECREF(item);
                goto fail;
            }
            Py_DECREF(item);
            off += 2 + depth;
        }
        PyStructSequence_SetItem(d, PB_NEW_STACKS, lst);
        v = NULL;
    }

    /* counts: [(stack_id, tid, count), ...] */
    {
        PyObject *lst = PyList_New((Py_ssize_t)b->counts.used);
        if (lst == NULL) goto fail;
        v = lst;
        Py_ssize_t k = 0;
        for (size_t s = 0; s < b->counts.n_slots; s++) {
            const perf_count_slot *c = &b->counts.slots[s];
            if (c->stack_id == 0) continue;
            PyObject *item = Py_BuildValue("(IiK)", (unsigned int)c->stack_id, (int)c->tid,
                                           (unsigned long long)c->count);
            if (item == NULL) goto fail;
            PyList_SET_ITEM(lst, k++, item);
        }
        PyStructSequence_SetItem(d, PB_COUNTS, lst);
        v = NULL;
    }

    /* new_threads / exited_threads: [tid, ...] */
    {
        const int32_t *src[2] = {b->new_threads, b->exited};
        size_t cnt[2] = {b->n_new_threads, b->n_exited};
        const int idx[2] = {PB_NEW_THREADS, PB_EXITED_THREADS};
        for (int j = 0; j < 2; j++) {
            PyObject *lst = PyList_New((Py_ssize_t)cnt[j]);
            if (lst == NULL) goto fail;
            v = lst;
            for (size_t k = 0; k < cnt[j]; k++) {
                PyObject *t = PyLong_FromLong(src[j][k]);
                if (t == NULL) goto fail;
                PyList_SET_ITEM(lst, (Py_ssize_t)k, t);
            }
            PyStructSequence_SetItem(d, idx[j], lst);
            v = NULL;
        }
    }

    /* comms: [(tid, name), ...]; names are bytes in the kernel, decoded leniently */
    {
        PyObject *lst = PyList_New((Py_ssize_t)b->n_comms);
        if (lst == NULL) goto fail;
        v = lst;
        for (size_t k = 0; k < b->n_comms; k++) {
            PyObject *name = PyUnicode_DecodeUTF8(b->comms[k].name,
                                                  (Py_ssize_t)strlen(b->comms[k].name), "replace");
            if (name == NULL) goto fail;
            PyObject *item = Py_BuildValue("(iN)", (int)b->comms[k].tid, name);
            if (item == NULL) goto fail;
            PyList_SET_ITEM(lst, (Py_ssize_t)k, item);
        }
        PyStructSequence_SetItem(d, PB_COMMS, lst);
        v = NULL;
    }

    /* mmaps: [(start, length, pgoff, filename, build_id | None), ...] */
    {
        PyObject *lst = PyList_New((Py_ssize_t)b->n_mmaps);
        if (lst == NULL) goto fail;
        v = lst;
        for (size_t k = 0; k < b->n_mmaps; k++) {
            const perf_mmap *m = &b->mmaps[k];
            PyObject *name = PyUnicode_DecodeFSDefault(m->filename);
            if (name == NULL) goto fail;
            PyObject *bid;
            if (m->build_id_size >= 0) {
                bid = PyBytes_FromStringAndSize((const char *)m->build_id, m->build_id_size);
                if (bid == NULL) {
                    Py_DECREF(name);
                    goto fail;
                }
            } else {
                bid = Py_NewRef(Py_None);
            }
            PyObject *item = PyStructSequence_New(PerfMmapType);
            PyObject *start = PyLong_FromUnsignedLongLong(m->start);
            PyObject *len = PyLong_FromUnsignedLongLong(m->len);
            PyObject *pgoff = PyLong_FromUnsignedLongLong(m->pgoff);
            if (item == NULL || start == NULL || len == NULL || pgoff == NULL) {
                Py_XDECREF(item);
                Py_XDECREF(start);
                Py_XDECREF(len);
                Py_XDECREF(pgoff);
                Py_DECREF(name);
                Py_DECREF(bid);
                goto fail;
            }
            PyStructSequence_SetItem(item, 0, start);
            PyStructSequence_SetItem(item, 1, len);
            PyStructSequence_SetItem(item, 2, pgoff);
            PyStructSequence_SetItem(item, 3, name);
            PyStructSequence_SetItem(item, 4, bid);
            PyList_SET_ITEM(lst, (Py_ssize_t)k, item);
        }
        PyStructSequence_SetItem(d, PB_MMAPS, lst);
        v = NULL;
    }

    SET_ITEM(PB_TARGET_EXITED, PyBool_FromLong(b->target_exited));
    SET_ITEM(PB_FIRST_TIME_NS, PyLong_FromUnsignedLongLong(b->first_time));
    SET_ITEM(PB_LAST_TIME_NS, PyLong_FromUnsignedLongLong(b->last_time));
#undef SET_ITEM
    (void)self;
    return d;

fail:
    Py_XDECREF(v);
    Py_DECREF(d);
    return NULL;
}

static PyObject *PerfSampler_take(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    /* Swap the batch out under the lock; build Python objects after releasing it, so the
     * drain is blocked only for a struct copy. */
    perf_batch b;
    perf_lock(self);
    b = self->batch;
    memset(&self->batch, 0, sizeof(self->batch));
    perf_unlock(self);
    PyObject *d = perf_batch_to_struct(self, &b);
    perf_batch_free(&b);
    return d;
}

static PyObject *PerfSampler_threads(PerfSampler *self, PyObject *Py_UNUSED(ignored)) {
    perf_lock(self);
    size_t n = self->n_events;
    int32_t *tids = n ? malloc(n * sizeof(int32_t)) : NULL;
    if (tids != NULL)
        for (size_t i = 0; i < n; i++) tids[i] = self->events[i].tid;
    perf_unlock(self);
    if (n && tids == NULL) return PyErr_NoMemory();
    PyObject *lst = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; lst != NULL && i < n; i++) {
        PyObject *t = PyLong_FromLong(tids[i]);
        if (t == NULL) Py_CLEAR(lst);
        else PyList_SET_ITEM(lst, (Py_ssize_t)i, t);
    }
    free(tids);
    return lst;
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
    {"poll", (PyCFunction)PerfSampler_poll, METH_O,
     "poll(timeout_ms) -> int\n\nWait (GIL released) up to timeout_ms for ring data, then "
     "drain every ring into the aggregates. Returns the number of records processed."},
    {"take", (PyCFunction)PerfSampler_take, METH_NOARGS,
     "take() -> PerfBatch\n\nReturn and reset everything aggregated since the previous take()."},
    {"threads", (PyCFunction)PerfSampler_threads, METH_NOARGS,
     "threads() -> list[int]\n\nCurrently tracked thread ids."},
    {"close", (PyCFunction)PerfSampler_close, METH_NOARGS,
     "close() -> None\n\nDisable and release every event. Idempotent."},
    {"__enter__", (PyCFunction)PerfSampler_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)PerfSampler_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PerfSampler_getset[] = {
    {"pid", (getter)PerfSampler_get_pid, NULL, "Target process id.", NULL},
    {"closed", (getter)PerfSampler_get_closed, NULL, "True once close() ran.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PerfSamplerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rsprof._native.PerfSampler",
    .tp_basicsize = sizeof(PerfSampler),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PerfSampler(pid, freq_hz=99, ring_kib=128, max_stack=127)\n\n"
              "Frame-pointer CPU sampling of every thread of one process (see docs/native.md).",
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
