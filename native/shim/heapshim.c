/* heapshim.c: rsprof's LD_PRELOAD heap shim (librsprof_heap.so).
 *
 * Wraps the glibc allocator entry points, and for every allocation writes an ALLOC record
 * (address, size, frame-pointer call stack) and for every free a FREE record (address
 * only) into a lock-free shared-memory ring, /dev/shm/rsprof-heap.<pid>.<random>, that the
 * profiler drains (native/heapreader.c).  The ring format lives in native/heapring.h,
 * the behaviour is described in docs/heap-ring.md.
 *
 * Constraints that shape this file:
 * - No Python, no libc allocation on any recording path, no locks on the hot path: the
 *   target's threads reserve ring space with one CAS and never wait for the reader.
 *   A full ring drops the event and counts it in the header.
 * - malloc can be called before our constructor (by libc or other constructors) and by
 *   dlsym() while we are still resolving the real functions: initialisation is lazy,
 *   and the thread doing it is served from a static bump arena until dlsym is done.
 * - Anything we call that may allocate (dlsym, pthread_getattr_np, atexit-like
 *   registration) runs with a thread-local re-entrancy guard set, so the nested calls go
 *   straight to the real allocator and are not recorded.
 * - Stack walking must never crash on garbage frame pointers (libraries built without
 *   them): every frame pointer is checked against the thread's stack bounds.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "heapring.h"
#include "shimcfi.h"
#include "shimmemo.h"
#include "shimpy.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define NOINLINE __attribute__((noinline))
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Set by ld.so: the initial stack pointer of the main thread, i.e. just above the
 * highest frame the main thread can have. */
extern void *__libc_stack_end;

/* ------------------------------------------------------------------ real functions */

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void *(*real_valloc)(size_t);
static void *(*real_pvalloc)(size_t);
static size_t (*real_malloc_usable_size)(void *);
static void (*real__exit)(int);

/* ------------------------------------------------------------------ global state */

enum { ST_UNINIT = 0, ST_INITING = 1, ST_READY = 2 };
static int g_state; /* ST_*, atomic */

/* Configuration, read once from the environment at init (a fork child inherits it). */
static uint64_t g_ring_bytes;   /* power of two */
static uint64_t g_ring_mask;    /* ring_bytes / 8 - 1: word index mask */
static uint64_t g_sample_bytes; /* 0 = record every event */
static unsigned g_max_depth;
static unsigned g_exit_wait_ms;
static uint64_t g_wait_ppid; /* RSPROF_HEAP_WAIT_PPID: see finish_ring */
static int g_debug;
static size_t g_page;
static int g_cfi; /* stacks by CFI (shimcfi.c); 0: frame pointers and the gap scan */
static int g_py;  /* a CPython whose frames ALLOC records carry (shimpy.c); 0 for others */

/* The current ring: g_hdr is published (release) after everything else is set, and is
 * NULL while there is no ring (tracking disabled, or a fork child that has not
 * allocated yet).  g_ring_pid is the pid whose name the ring carries: only that process
 * marks it exited and unlinks it. */
static struct rsprof_heap_header *g_hdr;
static uint64_t *g_data;
static size_t g_map_len;
/* tmpfs pages of the data area allocated so far (bytes from its start, only grows, atomic):
 * a ring is allocated as it fills, not all at creation (see ring_grow). */
static uint64_t g_alloc_bytes;
#define RING_FIRST_ALLOC (256u * 1024u)
/* Growth needs no fd where the kernel has MADV_POPULATE_WRITE (5.14+): the fd is closed
 * once the ring is mapped, so the program's fd table holds nothing of ours.  Otherwise
 * (g_ring_fd >= 0) it is kept, moved high (F_DUPFD_CLOEXEC from RING_FD_FLOOR) and
 * close-on-exec, and its identity (g_ring_dev, g_ring_ino) is checked before each use:
 * a program that closes its fds and opens its own file at that number gets it back
 * untouched, and the shim never uses or closes that fd again (ring_fd_ours). */
static int g_ring_fd = -1;
static dev_t g_ring_dev;
static ino_t g_ring_ino;
#define RING_FD_FLOOR 512
static int g_grow_fd;   /* RSPROF_HEAP_GROW_FD=1: grow by the fd even with MADV_POPULATE_WRITE */
static int g_no_growth; /* growth failed once (or the fd is not ours): never tried again */
static char g_ring_name[64]; /* shm_open name of the current ring */
/* The rsprof that reads this process's rings (header session_pid): RSPROF_HEAP_WAIT_PPID,
 * or inherited from the fork parent's ring or from the pre-exec image's ring. */
static int32_t g_session_pid;
static uint64_t g_session_start;
static int32_t g_parent_reader; /* fork child: the reader of the parent's ring at fork */
static pid_t g_ring_pid;
static int g_unlinked;
static int g_disabled;  /* no ring in this process (image), for good */
static int g_ring_lock; /* spin lock serialising ring creation (rare, never on hot path) */

/* Sampled mode: set of sampled live addresses (see "sampled set" below). */
static uint64_t *g_set;
static uint8_t *g_filter;
static int g_frees_all;

/* ------------------------------------------------------------------ thread state */

/* volatile: GCC dropped a ++/-- pair around a lone dlsym call (it assumed dlsym cannot
 * reach this static), and dlsym's own allocations were recorded. */
static TLS volatile int t_guard; /* > 0: inside the shim, do not record */
static TLS int t_in_init;        /* this thread runs the one-time init */
static TLS uint32_t t_tid;       /* 0 = thread state not initialised yet */
static TLS uintptr_t t_stack_lo; /* frame pointers must stay within [lo, hi) */
static TLS uintptr_t t_stack_hi;
static TLS int t_bounds_known;   /* t_stack_lo/hi set (possibly to "unknown": 0, 0) */
static TLS uint64_t t_read_pos;  /* last read_pos seen: it only grows, so stale is safe */
static TLS int64_t t_countdown;  /* sampled mode: bytes left until the next sample */
static TLS uint64_t t_rng;       /* xorshift64* state, 0 = not seeded */
/* Ways (docs/heap-ring.md): bit w set once an ALLOC record named the stack now in memo way
 * w to the reader of epoch t_epoch; then that stack is sent again as 3 words. */
_Static_assert(SHIMCFI_WAYS <= RSPROF_HEAP_MAX_WAYS, "a way must fit its record field");
static TLS uint64_t t_named_ways;
static TLS uint32_t t_epoch;
static TLS int t_recording;      /* > 0: inside record_alloc (a signal may nest another) */

/* A recording's working memory: the walk's return addresses, the Python frames, the CFI
 * rule computation and the memo of the last walks.  Not on the target's stack (12 KiB of
 * locals and TLS made a thread with a 16 KiB stack crash inside malloc: glibc carves static
 * TLS out of each thread's stack too), but mapped once per thread, on its first recorded
 * allocation, with mmap (never malloc).  Two levels: the outermost recording and one
 * nested in it (a signal handler that allocates while its thread is in record_alloc); a
 * deeper one, or a thread without an area, records its direct caller only. */
typedef struct {
    uint64_t ips[RSPROF_HEAP_MAX_DEPTH];
    uint64_t py[2 * RSPROF_HEAP_MAX_PY_FRAMES];
    shimcfi_scratch cfi;
} record_level;
typedef struct {
    record_level level[2];
    shimcfi_memo memo; /* used by the outermost level only */
} thread_area;
#define AREA_DEAD ((thread_area *)1) /* released at thread exit: no more areas */
static TLS thread_area *t_area;
/* An area may be mapped for this thread: its exit releases it (a pthread started through our
 * wrapper: the key's destructor), or it never exits before the process (the main thread).
 * Others (raw clone) record their direct caller only, as they do without stack bounds. */
static TLS int t_area_ok;
static pthread_key_t g_area_key;
static int g_area_key_ok;

/* ------------------------------------------------------------------ small helpers */

static void shim_log(const char *msg) {
    if (!g_debug) return;
    static const char prefix[] = "rsprof-heap: ";
    ssize_t r = write(2, prefix, sizeof prefix - 1);
    r = write(2, msg, strlen(msg));
    r = write(2, "\n", 1);
    (void)r;
}

/* Unsigned decimal into buf (no stdio: it may allocate). Returns the length. */
static size_t fmt_u64(char *buf, uint64_t v) {
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
    buf[n] = 0;
    return n;
}

/* "/rsprof-heap.<pid>.<16 hex digits of rnd>" into buf (64 bytes). */
static void ring_name(char *buf, pid_t pid, uint64_t rnd) {
    size_t n = sizeof RSPROF_HEAP_SHM_PREFIX - 1;
    memcpy(buf, RSPROF_HEAP_SHM_PREFIX, n);
    n += fmt_u64(buf + n, (uint64_t)pid);
    buf[n++] = '.';
    for (int i = (int)RSPROF_HEAP_SUFFIX_HEX - 1; i >= 0; i--)
        buf[n++] = "0123456789abcdef"[(rnd >> (4 * i)) & 15];
    buf[n] = 0;
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *s = getenv(name);
    if (s == NULL || *s == 0) return dflt;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != 0) return dflt;
    return (uint64_t)v;
}


static uint64_t self_pidns(void) {
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0) return 0;
    return (uint64_t)st.st_ino;
}

static void spin_lock(int *l) {
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) sched_yield();
}
static void spin_unlock(int *l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }

/* ------------------------------------------------------------------ bootstrap arena */

/* While the init thread is inside dlsym() the real allocator is unknown; dlsym (via
 * dlerror bookkeeping) may call malloc/calloc.  Those calls are served from here.  Each
 * block has a 16-byte prefix holding its size (for realloc); blocks are never reused. */
#define BOOT_SIZE (64u * 1024u)
static _Alignas(64) unsigned char g_boot[BOOT_SIZE];
static size_t g_boot_used;

static ALWAYS_INLINE int is_boot(const void *p) {
    return (uintptr_t)p - (uintptr_t)g_boot < BOOT_SIZE;
}

static void *boot_alloc(size_t n, size_t align) {
    if (align < 16) align = 16;
    size_t used = __atomic_load_n(&g_boot_used, __ATOMIC_RELAXED);
    for (;;) {
        size_t start = (used + 16 + align - 1) & ~(align - 1);
        if (start > BOOT_SIZE || n > BOOT_SIZE - start) {
            errno = ENOMEM;
            return NULL;
        }
        if (__atomic_compare_exchange_n(&g_boot_used, &used, start + n, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            ((size_t *)(g_boot + start))[-1] = n;
            return g_boot + start; /* static storage: already zero (calloc) */
        }
    }
}

static size_t boot_size(const void *p) { return ((const size_t *)p)[-1]; }

/* ------------------------------------------------------------------ sampled set */

/* In sampled mode only frees of sampled addresses matter.  Recording all frees would
 * cost a ring write per free (most of full capture's price), so the shim remembers the
 * sampled live addresses:
 *  - g_filter: 64 Ki saturating byte counters indexed by the address hash.  A free whose
 *    counter is 0 (nearly all of them) costs one load from a 64 KiB table and returns.
 *  - g_set: 1 Mi slots (8 MiB of lazily touched, never-reserved memory), lock-free open
 *    addressing, CAS insert into the first empty or deleted slot within a window of
 *    SET_WINDOW slots from the home slot, CAS delete to a tombstone.  An address is live
 *    at most once at a time (it is removed before the real free), so reusing tombstones
 *    cannot create duplicates; empty slots never come back, so a lookup stops at one.
 * If an insert finds no slot in its window the shim stops trusting the set, records every
 * free from then on (RSPROF_HEAP_HF_ALL_FREES) and the reader drops unknown addresses. */
#define SET_BITS 20
#define SET_WINDOW 32
#define FILTER_BITS 16
#define SET_TOMB UINT64_MAX

static ALWAYS_INLINE uint64_t addr_hash(const void *p) {
    return (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ULL;
}

static void filter_add(uint64_t h, int delta) {
    uint8_t *c = &g_filter[h >> (64 - FILTER_BITS)];
    uint8_t v = __atomic_load_n(c, __ATOMIC_RELAXED);
    for (;;) {
        if (v == 255) return; /* saturated: stays "maybe" forever */
        if (delta < 0 && v == 0) return;
        uint8_t nv = (uint8_t)(v + delta);
        if (__atomic_compare_exchange_n(c, &v, nv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return;
    }
}

static int set_insert(const void *p) {
    uint64_t h = addr_hash(p);
    uint64_t key = (uint64_t)(uintptr_t)p;
    size_t home = (size_t)(h >> (64 - SET_BITS));
    filter_add(h, +1); /* before the address can be freed (malloc has not returned yet) */
    for (unsigned i = 0; i < SET_WINDOW; i++) {
        uint64_t *slot = &g_set[(home + i) & ((1u << SET_BITS) - 1)];
        uint64_t v = __atomic_load_n(slot, __ATOMIC_RELAXED);
        while (v == 0 || v == SET_TOMB) {
            if (__atomic_compare_exchange_n(slot, &v, key, 0, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
                return 1;
        }
    }
    filter_add(h, -1);
    return 0;
}

/* Returns 1 when p was a sampled address (and removes it). */
static ALWAYS_INLINE int set_remove(const void *p) {
    uint64_t h = addr_hash(p);
    if (LIKELY(__atomic_load_n(&g_filter[h >> (64 - FILTER_BITS)], __ATOMIC_RELAXED) == 0))
        return 0;
    uint64_t key = (uint64_t)(uintptr_t)p;
    size_t home = (size_t)(h >> (64 - SET_BITS));
    for (unsigned i = 0; i < SET_WINDOW; i++) {
        uint64_t *slot = &g_set[(home + i) & ((1u << SET_BITS) - 1)];
        uint64_t v = __atomic_load_n(slot, __ATOMIC_RELAXED);
        if (v == 0) return 0;
        if (v == key) {
            /* Only the thread freeing p can remove p: a plain store would do, CAS keeps
             * a double free from corrupting a slot that was reused meanwhile. */
            if (!__atomic_compare_exchange_n(slot, &v, SET_TOMB, 0, __ATOMIC_RELAXED,
                                             __ATOMIC_RELAXED))
                return 0;
            filter_add(h, -1);
            return 1;
        }
    }
    return 0;
}

static void set_reset(void) {
    /* Private anonymous memory: DONTNEED gives back zero pages. */
    if (g_set) madvise(g_set, sizeof(uint64_t) << SET_BITS, MADV_DONTNEED);
    if (g_filter) madvise(g_filter, (size_t)1 << FILTER_BITS, MADV_DONTNEED);
    g_frees_all = 0;
}

static int set_create(void) {
    size_t set_len = sizeof(uint64_t) << SET_BITS;
    size_t filter_len = (size_t)1 << FILTER_BITS;
    void *s = mmap(NULL, set_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) return 0;
    void *f = mmap(NULL, filter_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (f == MAP_FAILED) {
        munmap(s, set_len);
        return 0;
    }
    g_set = s;
    g_filter = f;
    return 1;
}

/* ------------------------------------------------------------------ sampling PRNG */

static ALWAYS_INLINE uint64_t rng_next(void) {
    uint64_t x = t_rng; /* xorshift64*: fast, plenty for exponential draws */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t_rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Natural log for u in (0, 1] without libm (the shim links only libc): u = m * 2^e with
 * m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh((m-1)/(m+1)) by its series; error < 1e-8. */
static double shim_log_(double u) {
    union { double d; uint64_t u; } b = {.d = u};
    int e = (int)((b.u >> 52) & 0x7ff) - 1023;
    b.u = (b.u & 0x000FFFFFFFFFFFFFULL) | 0x3FF0000000000000ULL; /* m in [1, 2) */
    double m = b.d;
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e++;
    }
    double t = (m - 1.0) / (m + 1.0), t2 = t * t;
    double s = 1.0 + t2 * (1.0 / 3 + t2 * (1.0 / 5 + t2 * (1.0 / 7 + t2 * (1.0 / 9 + t2 / 11))));
    return 2.0 * t * s + (double)e * 0.6931471805599453;
}

/* Bytes until the next sample: exponential with mean g_sample_bytes (a Poisson process
 * over allocated bytes, as in tcmalloc and memray). */
static int64_t draw_countdown(void) {
    double u = (double)((rng_next() >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
    double x = -shim_log_(u) * (double)g_sample_bytes;
    if (x < 1.0) x = 1.0;
    if (x > 4e18) x = 4e18;
    return (int64_t)x;
}

/* ------------------------------------------------------------------ ring creation */

/* 64 bits nobody else can predict, for the ring's name: getrandom (GRND_NONBLOCK: never
 * waits for the entropy pool), else a mix of the time stamp counter, the clock, the pid
 * and the image's AT_RANDOM bytes. */
static uint64_t name_random(void) {
    uint64_t v = 0;
    if (syscall(SYS_getrandom, &v, sizeof v, 1 /* GRND_NONBLOCK */) == (long)sizeof v) return v;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    v = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
#if defined(__x86_64__)
    unsigned lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    v ^= ((uint64_t)hi << 32 | lo) * 0x9E3779B97F4A7C15ULL;
#endif
    const uint64_t *at_random = (const uint64_t *)getauxval(AT_RANDOM);
    if (at_random != NULL) v ^= at_random[0] ^ at_random[1];
    v ^= v >> 33, v *= 0xff51afd7ed558ccdULL, v ^= v >> 33, v *= 0xc4ceb9fe1a85ec53ULL;
    return v ^ (v >> 33);
}

/* Whether an exited ring stays at its name for its session's recorder: events nobody has
 * read, no reader attached, and that recorder (the rsprof that reads this process tree's
 * rings) still alive.  Otherwise the name goes: an attached reader keeps its mapping. */
static int reader_alive(const struct rsprof_heap_header *h);
static int ring_kept_for_session(const struct rsprof_heap_header *h) {
    return !reader_alive(h) &&
           heapring_session_alive(__atomic_load_n(&h->session_pid, __ATOMIC_ACQUIRE),
                                  h->session_start) &&
           __atomic_load_n(&h->read_pos, __ATOMIC_ACQUIRE) <
               __atomic_load_n(&h->write_pos, __ATOMIC_ACQUIRE);
}

/* Rings already named after our pid: made by this very process before it exec'd (same
 * start time), or by a dead process that had our pid.  Either way their writer is gone:
 * mark them exited (+ execed when it was us: an attached reader then looks for our new
 * ring), and unlink them unless their session's recorder will still read them
 * (ring_kept_for_session: a process that execs before the recorder attached its ring
 * loses nothing).  The pre-exec image's reader, or session, becomes ours, so our own ring
 * is kept for it in turn.  Only regular files we own, with one link and a valid header
 * naming our pid in our pid namespace, are opened (never a symlink, never a FIFO);
 * anything else is left alone.  getdents64 and a stack buffer: no allocation. */
static void settle_previous_rings(pid_t pid, uint64_t start, uint64_t pidns) {
    int dir = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return;
    char prefix[32];
    size_t plen = sizeof RSPROF_HEAP_NAME_PREFIX - 1;
    memcpy(prefix, RSPROF_HEAP_NAME_PREFIX, plen);
    plen += fmt_u64(prefix + plen, (uint64_t)pid);
    prefix[plen++] = '.';
    _Alignas(8) char buf[4096];
    for (;;) {
        long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
        if (n <= 0) break;
        for (long off = 0; off < n;) {
            struct {
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *de = (void *)(buf + off);
            off += de->reclen;
            if (strncmp(de->name, prefix, plen) != 0 || heapring_name_pid(de->name) != pid)
                continue;
            struct stat st;
            if (fstatat(dir, de->name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
                st.st_uid != geteuid() || st.st_nlink != 1 ||
                st.st_size < (off_t)RSPROF_HEAP_HEADER_SIZE)
                continue;
            int fd = openat(dir, de->name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            if (fd < 0) continue;
            struct stat fst;
            struct rsprof_heap_header *h = MAP_FAILED;
            if (fstat(fd, &fst) == 0 && fst.st_dev == st.st_dev && fst.st_ino == st.st_ino &&
                fst.st_size >= (off_t)RSPROF_HEAP_HEADER_SIZE)
                h = mmap(NULL, RSPROF_HEAP_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                         0);
            close(fd);
            if (h == MAP_FAILED) continue;
            if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == RSPROF_HEAP_MAGIC &&
                h->version == RSPROF_HEAP_VERSION && h->pid == pid &&
                (h->pidns == 0 || pidns == 0 || h->pidns == pidns)) {
                int mine = start != 0 && h->start_time == start; /* our pre-exec image */
                __atomic_or_fetch(&h->flags,
                                  RSPROF_HEAP_HF_EXITED | (mine ? RSPROF_HEAP_HF_EXECED : 0),
                                  __ATOMIC_RELEASE);
                if (mine && g_session_pid == 0) {
                    int32_t reader = __atomic_load_n(&h->reader_pid, __ATOMIC_ACQUIRE);
                    if (heapring_session_alive(h->session_pid, h->session_start)) {
                        g_session_pid = h->session_pid;
                        g_session_start = h->session_start;
                    } else if (reader > 0 && reader_alive(h)) {
                        g_session_pid = reader;
                        g_session_start = heapring_start_time(reader);
                    }
                }
                if (!ring_kept_for_session(h)) unlinkat(dir, de->name, 0);
            }
            munmap(h, RSPROF_HEAP_HEADER_SIZE);
        }
    }
    close(dir);
}

/* The kept fd (fallback growth) still is our ring: the program may have closed it and
 * opened a file of its own at that number. */
static int ring_fd_ours(void) {
    struct stat st;
    return g_ring_fd >= 0 && fstat(g_ring_fd, &st) == 0 && st.st_dev == g_ring_dev &&
           st.st_ino == g_ring_ino;
}

/* Creates and maps this process's ring, publishes g_hdr.  Called with t_guard set and
 * g_ring_lock held.  On any failure tracking is off for this process. */
static void create_ring(void) {
    char name[64];
    pid_t pid = getpid();
    uint64_t start = heapring_start_time(0);
    uint64_t pidns = self_pidns();
    /* A fork child whose parent's ring had a live reader and that has no live session
     * of its own: that reader (a recorder following the parent) is its session. */
    if (g_parent_reader > 0 && !heapring_session_alive(g_session_pid, g_session_start) &&
        (kill(g_parent_reader, 0) == 0 || errno != ESRCH))
        g_session_pid = g_parent_reader, g_session_start = 0;
    g_parent_reader = 0;
    settle_previous_rings(pid, start, pidns);

    int fd = -1;
    for (int attempt = 0; attempt < 4; attempt++) {
        /* A fresh random name each time. O_EXCL: never opens (let alone follows) anything
         * that already exists; someone guessing 64 random bits only costs a retry. */
        ring_name(name, pid, name_random());
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST) break;
    }
    if (fd < 0) {
        shim_log("cannot create the ring in /dev/shm: heap tracking off");
        g_disabled = 1;
        return;
    }
    size_t len = RSPROF_HEAP_HEADER_SIZE + g_ring_bytes;
    /* Exactly 0600 whatever the umask (a reader of the same uid needs rw). */
    int ok = fchmod(fd, 0600) == 0;
    /* The file has its full size, but only the header and the first RING_FIRST_ALLOC bytes
     * of data get tmpfs pages now; reserve() allocates the rest as the ring fills. A page
     * is always allocated before anyone writes it: a full /dev/shm then costs events
     * (counted as lost), never a SIGBUS in the target. Allocating the whole ring up front
     * (64 MiB under `rsprof run`) cost every process 26 ms of system time: a shell loop
     * of 100 `true; ls` took 5.7 s instead of 0.16 s. */
    uint64_t first = g_ring_bytes < RING_FIRST_ALLOC ? g_ring_bytes : RING_FIRST_ALLOC;
    if (ok) ok = ftruncate(fd, (off_t)len) == 0;
    if (ok) {
        int r = posix_fallocate(fd, 0, (off_t)(RSPROF_HEAP_HEADER_SIZE + first));
        if (r == EOPNOTSUPP || r == EINVAL) first = g_ring_bytes; /* not tmpfs: sparse file */
        else ok = r == 0;
    }
    void *base = MAP_FAILED;
    if (ok) base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        close(fd);
        shim_log("cannot size or map the ring: heap tracking off");
        shm_unlink(name);
        g_disabled = 1;
        return;
    }
    /* Growth by MADV_POPULATE_WRITE on the mapping needs no fd (probed on the first data
     * page, allocated already). RSPROF_HEAP_GROW_FD=1 keeps the fd instead (tests). */
    g_no_growth = 0;
    g_ring_fd = -1;
    if (first < g_ring_bytes &&
        (g_grow_fd ||
         madvise((char *)base + RSPROF_HEAP_HEADER_SIZE, g_page, MADV_POPULATE_WRITE) != 0)) {
        struct rlimit rl;
        int floor = RING_FD_FLOOR;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
            rl.rlim_cur <= (rlim_t)floor + 16)
            floor = rl.rlim_cur > 32 ? (int)rl.rlim_cur - 16 : 3;
        int high = fcntl(fd, F_DUPFD_CLOEXEC, floor);
        struct stat st;
        if (high >= 0) close(fd), fd = high;
        if (fstat(fd, &st) == 0) {
            g_ring_fd = fd, g_ring_dev = st.st_dev, g_ring_ino = st.st_ino;
            fd = -1;
        }
    }
    if (fd >= 0) close(fd);
    __atomic_store_n(&g_alloc_bytes, first, __ATOMIC_RELEASE);
    if (g_session_pid > 0 && g_session_start == 0)
        g_session_start = heapring_start_time(g_session_pid);
    struct rsprof_heap_header *h = base;
    struct timespec ts, mono;
    clock_gettime(CLOCK_REALTIME, &ts);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    h->version = RSPROF_HEAP_VERSION;
    h->header_size = RSPROF_HEAP_HEADER_SIZE;
    h->ring_size = g_ring_bytes;
    h->pid = pid;
    h->uid = geteuid();
    h->start_time = start;
    h->pidns = pidns;
    h->sample_bytes = g_sample_bytes;
    h->max_depth = g_max_depth;
    h->created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    h->created_mono_ns = (uint64_t)mono.tv_sec * 1000000000ull + (uint64_t)mono.tv_nsec;
    h->session_pid = g_session_pid;
    h->session_start = g_session_start;
    h->flags = (g_sample_bytes ? RSPROF_HEAP_HF_SAMPLED : 0) | (g_py ? RSPROF_HEAP_HF_PYTHON : 0);
    __atomic_store_n(&h->magic, RSPROF_HEAP_MAGIC, __ATOMIC_RELEASE); /* header complete */

    g_data = (uint64_t *)((char *)base + RSPROF_HEAP_HEADER_SIZE);
    g_map_len = len;
    memcpy(g_ring_name, name, sizeof g_ring_name);
    g_ring_pid = pid;
    g_unlinked = 0;
    __atomic_store_n(&g_hdr, h, __ATOMIC_RELEASE);
}

/* g_hdr is NULL: either tracking is off, or this is a fork child that has not created its
 * own ring yet (created on its first event, so fork+exec children that never allocate in
 * between cost nothing).  Returns the ring or NULL. */
static NOINLINE struct rsprof_heap_header *ring_slow(void) {
    if (g_disabled || __atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != ST_READY) return NULL;
    t_guard++;
    spin_lock(&g_ring_lock);
    if (__atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE) == NULL && !g_disabled) create_ring();
    spin_unlock(&g_ring_lock);
    t_guard--;
    return __atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE);
}

/* Injected mode (rsprof -p attached to a process started without the shim; see "injected
 * mode" below): each attach creates a ring of its own, and a thread's cached reader
 * position and named ways belong to the ring it last wrote to.  g_ring_gen is bumped before
 * a new ring is published; a thread that sees it change forgets them.  Stays 0 under
 * LD_PRELOAD, where nothing is reset. */
static uint32_t g_ring_gen;
static TLS uint32_t t_ring_gen;
static int g_injected_on; /* an injected session records: its recorder is checked now and then */
static void inject_tick(void);

static NOINLINE void ring_gen_changed(void) {
    t_read_pos = 0;
    t_named_ways = 0;
    t_ring_gen = __atomic_load_n(&g_ring_gen, __ATOMIC_ACQUIRE);
}

static ALWAYS_INLINE struct rsprof_heap_header *ring(void) {
    struct rsprof_heap_header *h = __atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE);
    if (LIKELY(h != NULL)) {
        if (UNLIKELY(__atomic_load_n(&g_injected_on, __ATOMIC_RELAXED))) {
            if (UNLIKELY(t_ring_gen != __atomic_load_n(&g_ring_gen, __ATOMIC_RELAXED)))
                ring_gen_changed();
            inject_tick();
        }
        return h;
    }
    return ring_slow();
}

/* ------------------------------------------------------------------ thread state */

/* Stack bounds of the current thread, for the frame-pointer walk.  Nothing here may take
 * a lock or allocate: thread_init runs inside malloc, and the target may call malloc while
 * holding any lock (Rust's std calls pthread_getattr_np at thread start, which reallocs
 * while glibc holds the thread's lock: calling pthread_getattr_np from in here deadlocked
 * every multi-threaded Rust program).  So:
 *  - the main thread's frames live below __libc_stack_end, down to RLIMIT_STACK;
 *  - threads started through pthread_create get their bounds in thread_trampoline, before
 *    the thread's own code runs (outside any allocator call);
 *  - anything else (raw clone, threads started before the shim, coroutine stacks) has no
 *    known bounds and records only the direct caller. */
static int g_injected; /* this is librsprof_heap_inject.so, loaded by rsprof -p (ptrace) */
static void inject_thread_bounds(uintptr_t here, uintptr_t *lo, uintptr_t *hi);

static NOINLINE void thread_init(void) {
    t_guard++;
    t_tid = (uint32_t)syscall(SYS_gettid);
    if (!t_bounds_known) {
        uintptr_t lo = 0, hi = 0;
        /* Decided by where this frame is, not by tid == pid: in a child forked from another
         * thread, that thread is the child's "main" thread but runs on its pthread stack. */
        struct rlimit rl;
        uint64_t span = 1ull << 30;
        if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
            rl.rlim_cur < span)
            span = rl.rlim_cur;
        uintptr_t main_hi = (uintptr_t)__libc_stack_end;
        uintptr_t main_lo = main_hi > span ? main_hi - span : 0;
        uintptr_t here = (uintptr_t)__builtin_frame_address(0);
        if (here >= main_lo && here < main_hi) {
            lo = main_lo;
            hi = main_hi;
            t_area_ok = 1;
        } else if (g_injected) {
            inject_thread_bounds(here, &lo, &hi);
        }
        t_stack_lo = lo;
        t_stack_hi = hi;
        t_bounds_known = 1;
    }
    t_guard--;
}

/* pthread_create is wrapped so that each new thread learns its stack bounds before it
 * runs any code of its own.  pthread_getattr_np is safe there: the thread holds no lock
 * yet, and the realloc it makes is not recorded (t_guard). */
typedef struct {
    void *(*fn)(void *);
    void *arg;
} thread_start;

static int (*real_pthread_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
                                  void *);

static void *thread_trampoline(void *p) {
    thread_start start = *(thread_start *)p;
    t_guard++;
    real_free(p);
    uintptr_t lo = 0, hi = 0;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        void *addr;
        size_t size;
        if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
            lo = (uintptr_t)addr;
            hi = lo + size;
        }
        pthread_attr_destroy(&attr);
    }
    /* Frames above this one belong to libc's thread start: the walk ends here. */
    uintptr_t top = (uintptr_t)__builtin_frame_address(0) + 16;
    if (hi > top && top > lo) hi = top;
    t_stack_lo = lo;
    t_stack_hi = hi;
    t_bounds_known = 1;
    /* Any non-NULL value: the key's destructor then runs at this thread's exit and unmaps
     * its area.  Set here, outside any allocator call (a key past the first 32 allocates). */
    if (g_area_key_ok && pthread_setspecific(g_area_key, (void *)1) == 0) t_area_ok = 1;
    t_guard--;
    return start.fn(start.arg);
}

static NOINLINE int shim_ready_for_threads(void);

EXPORT int pthread_create(pthread_t *thread, const pthread_attr_t *attr,
                          void *(*fn)(void *), void *arg) {
    if (!shim_ready_for_threads()) return EAGAIN;
    thread_start *start = NULL;
    if (!g_disabled) {
        t_guard++;
        start = real_malloc(sizeof *start);
        t_guard--;
    }
    if (start == NULL) return real_pthread_create(thread, attr, fn, arg);
    start->fn = fn;
    start->arg = arg;
    int r = real_pthread_create(thread, attr, thread_trampoline, start);
    if (r != 0) {
        t_guard++;
        real_free(start);
        t_guard--;
    }
    return r;
}

/* A module unloaded by dlclose may see its addresses reused by the next dlopen: the CFI
 * rules cached for them go too. */
static int (*real_dlclose)(void *);

EXPORT int dlclose(void *handle) {
    if (!shim_ready_for_threads() || real_dlclose == NULL) return -1;
    int r = real_dlclose(handle);
    if (r == 0 && g_cfi) shimcfi_flush();
    return r;
}

/* ------------------------------------------------------------------ code ranges */

/* Debian's libc, libstdc++, libgcc_s and libm are built without frame pointers.  When one
 * of their functions calls malloc (operator new, strdup, fopen, ...), our saved %rbp is
 * that of the nearest frame-pointer ancestor, so the walk skips the function that called
 * into the library: `new T` in f() would read "operator new, <f's caller>".  To recover
 * it, the words between our frame and that ancestor's frame record are scanned for return
 * addresses (see scan_gap), but only when ips[0] is in one of those libraries.  A word
 * counts as a return address if it points into the executable mapping of an object that
 * was loaded at start-up (never unmapped, so the bytes before it can be read safely) and
 * is preceded by a call instruction.  The ranges come from /proc/self/maps, read once
 * with open/read (no allocation, no loader lock) on the first recorded allocation. */
#define MAX_CODE_RANGES 96
#define MAX_FPLESS_RANGES 8
typedef struct {
    uintptr_t start, end;
} code_range;
static code_range g_code[MAX_CODE_RANGES];
static code_range g_fpless[MAX_FPLESS_RANGES];
static unsigned g_ncode, g_nfpless;
static int g_maps_state; /* 0 not read, 1 reading, 2 ready (atomic) */

static int is_fpless_lib(const char *base) {
    static const char *const names[] = {"libc.so", "libstdc++.so", "libgcc_s.so", "libm.so"};
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strncmp(base, names[i], strlen(names[i])) == 0) return 1;
    return 0;
}

static uintptr_t parse_hex(const char **p) {
    uintptr_t v = 0;
    for (;; (*p)++) {
        char c = **p;
        if (c >= '0' && c <= '9') v = v * 16 + (uintptr_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v = v * 16 + (uintptr_t)(c - 'a' + 10);
        else return v;
    }
}

/* One line of /proc/self/maps: "start-end perms offset dev inode   path".  `cut`: the line
 * was longer than read_maps keeps (a long path), so the path is only its first bytes: still
 * a file's code, but the name after its last kept '/' may be any directory's or a part of
 * one ("libc.so-build/..." cut to "libc.so-bu"), so it names no library. */
static void maps_line(const char *line, int cut) {
    const char *p = line;
    uintptr_t start = parse_hex(&p);
    if (*p++ != '-') return;
    uintptr_t end = parse_hex(&p);
    if (*p++ != ' ' || p[0] == 0 || p[1] == 0 || p[2] != 'x') return;
    const char *path = strchr(p, '/');
    if (path == NULL || end <= start) return; /* anonymous (JIT, vdso): not trusted */
    const char *base = strrchr(path, '/') + 1;
    if (g_ncode < MAX_CODE_RANGES) g_code[g_ncode++] = (code_range){start, end};
    if (!cut && is_fpless_lib(base) && g_nfpless < MAX_FPLESS_RANGES)
        g_fpless[g_nfpless++] = (code_range){start, end};
}

static NOINLINE void read_maps(void) {
    int expected = 0;
    if (!__atomic_compare_exchange_n(&g_maps_state, &expected, 1, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return; /* another thread reads them; until then no gap scans */
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        /* Static, not 4.6 KiB of the target's stack: only the thread that won the CAS
         * above is ever in here. */
        static char buf[4096], line[512];
        size_t len = 0;
        int cut = 0; /* this line's bytes past `line` are dropped up to its '\n' */
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0) {
            for (ssize_t i = 0; i < n; i++) {
                if (buf[i] == '\n') {
                    line[len] = 0;
                    maps_line(line, cut);
                    len = 0;
                    cut = 0;
                } else if (len < sizeof line - 1) {
                    line[len++] = buf[i];
                } else {
                    cut = 1;
                }
            }
        }
        close(fd);
    }
    __atomic_store_n(&g_maps_state, 2, __ATOMIC_RELEASE);
}

static ALWAYS_INLINE int in_ranges(const code_range *r, unsigned n, uintptr_t v) {
    for (unsigned i = 0; i < n; i++)
        if (v - r[i].start < r[i].end - r[i].start) return 1;
    return 0;
}

/* v is a return address: the bytes before it encode a call.  Reads v-7 .. v-1, inside
 * the code range that holds v (checked by the caller via code_range_of). */
static int after_call(uintptr_t v, uintptr_t range_start) {
    if (v - range_start < 7) return 0;
    const unsigned char *b = (const unsigned char *)v;
    if (b[-5] == 0xE8) return 1;                                /* call rel32 */
    if (b[-6] == 0xFF && b[-5] == 0x15) return 1;               /* call *disp32(%rip) */
    if (b[-2] == 0xFF && (b[-1] & 0xF8) == 0xD0) return 1;      /* call *%reg */
    if (b[-3] == 0xFF && (b[-2] & 0xF8) == 0x50) return 1;      /* call *disp8(%reg) */
    if (b[-6] == 0xFF && (b[-5] & 0xF8) == 0x90) return 1;      /* call *disp32(%reg) */
    if (b[-3] == 0xFF && b[-2] == 0x14) return 1;                 /* call *(sib) */
    if (b[-4] == 0xFF && b[-3] == 0x54) return 1;                 /* call *disp8(sib) */
    return 0;
}

static int code_return(uintptr_t v) {
    for (unsigned i = 0; i < g_ncode; i++)
        if (v - g_code[i].start < g_code[i].end - g_code[i].start)
            return after_call(v, g_code[i].start);
    return 0;
}

/* A saved frame pointer is followed only if it lies strictly above the current one, is
 * 8-aligned and its whole 16-byte record lies below hi.  Written so that nothing can
 * wrap: code without frame pointers calls malloc with any value in %rbp (binutils: seen
 * 0xfffffffffffffff0, for which `next + 16 <= hi` wraps to 0 and passes). */
static ALWAYS_INLINE int frame_ok(uintptr_t next, uintptr_t fp, uintptr_t hi) {
    return next > fp && !(next & 7) && next < hi && hi - next >= 16;
}

/* ips[0] is inside a frame-pointer-less library.  Scan the stack words between our frame
 * record and the next frame record (at most 64 words, all inside [fp, hi)) for return
 * addresses: those into the same kind of library are further hidden callers, the first
 * one outside them belongs to the function whose frame record comes next, and ends the
 * scan.  If our saved %rbp is no frame pointer at all (the library used %rbp as a plain
 * register), the walk resumes at the first plausible frame record above that return
 * address; *resume receives it (0: continue from our saved %rbp as usual). */
static NOINLINE unsigned scan_gap(uint64_t *ips, unsigned n, uintptr_t fp, uintptr_t hi,
                                  unsigned max, uintptr_t *resume) {
    uintptr_t next = ((const uintptr_t *)fp)[0];
    int chain_ok = frame_ok(next, fp, hi);
    uintptr_t end = fp + 16 + 64 * 8;
    if (chain_ok && next < end) end = next;
    if (end > hi) end = hi;
    *resume = 0;
    for (uintptr_t slot = fp + 16; slot + 8 <= end && n < max; slot += 8) {
        uintptr_t v = *(const uintptr_t *)slot;
        if (!code_return(v)) continue;
        ips[n++] = v;
        if (in_ranges(g_fpless, g_nfpless, v)) continue;
        if (!chain_ok) {
            uintptr_t lim = slot + 8 + 64 * 8;
            for (uintptr_t f = slot + 8; f + 16 <= hi && f < lim; f += 8) {
                const uintptr_t *rec = (const uintptr_t *)f;
                if (frame_ok(rec[0], f, hi) && code_return(rec[1])) {
                    *resume = f;
                    break;
                }
            }
        }
        break;
    }
    return n;
}

/* ------------------------------------------------------------------ stack capture */

/* Walks the frame-pointer chain starting at the wrapper's own frame `fp`.  ips[0] is the
 * wrapper's return address (in the caller of malloc), always valid.  A saved frame
 * pointer is followed only if it lies strictly above the current one, is 8-aligned and
 * the whole 16-byte frame record lies inside this thread's stack; anything else (code
 * without frame pointers leaves arbitrary values in rbp) ends the walk.  A frame
 * outside the known stack (signal alternate stack, coroutine stack) yields 1 frame. */
static ALWAYS_INLINE unsigned capture(uint64_t *ips, uintptr_t fp, unsigned *flags,
                                      shimcfi_memo *memo, shimcfi_scratch *scratch, int *way,
                                      int *hit) {
    const uintptr_t lo = t_stack_lo, hi = t_stack_hi;
    const unsigned max = g_max_depth;
    unsigned n = 0;
    ips[n++] = ((const uintptr_t *)fp)[1];
    if (fp < lo || fp >= hi || hi - fp < 16) return n;
    if (LIKELY(g_cfi)) {
        /* The wrapper's frame record gives the caller's registers at the call: its stack
         * pointer just above the return address, its rbp saved by our prologue. */
        int truncated = 0;
        uintptr_t sp = fp + 16, bp = ((const uintptr_t *)fp)[0];
        unsigned got = memo != NULL ? shimcfi_memo_hit(memo, ips[0], sp, bp, max, &truncated,
                                                       way, hit)
                                    : 0;
        n = LIKELY(got) ? got
                        : shimcfi_walk(ips, n, max, sp, bp, lo, hi, &truncated, memo, scratch,
                                       way, hit);
        if (truncated) *flags |= RSPROF_HEAP_RF_TRUNCATED;
        return n;
    }
    uintptr_t next = 0;
    if (UNLIKELY(__atomic_load_n(&g_maps_state, __ATOMIC_ACQUIRE) != 2)) read_maps();
    else if (UNLIKELY(in_ranges(g_fpless, g_nfpless, ips[0])))
        n = scan_gap(ips, n, fp, hi, max, &next);
    if (next == 0) next = ((const uintptr_t *)fp)[0];
    for (;;) {
        if (!frame_ok(next, fp, hi)) break;
        uintptr_t ret = ((const uintptr_t *)next)[1];
        if (ret < 4096) break; /* end of chain (0) or garbage */
        if (n >= max) {
            *flags |= RSPROF_HEAP_RF_TRUNCATED;
            break;
        }
        ips[n++] = ret;
        fp = next;
        next = ((const uintptr_t *)fp)[0];
    }
    return n;
}

/* This thread's area (see thread_area), mapped on its first recorded allocation; NULL when
 * it has none (mmap failed, a thread whose exit we would not see, or already released). */
/* Areas of exited threads, kept for the next ones (linked through their first word): an
 * mmap and a munmap per thread doubled the cost of a short thread (2000 threads that each
 * malloc once: 0.08 s plain, 0.12 s with the shim, 0.22 s with an area mapped per thread). */
#define AREA_POOL_MAX 64
static thread_area *g_area_pool;
static unsigned g_area_pooled;
static int g_area_lock; /* never held across a call that may allocate or take a lock */

static void area_atfork_child(void) { g_area_lock = 0; } /* its holder is not in the child */

static NOINLINE thread_area *area_slow(void) {
    if (t_area == AREA_DEAD || !t_area_ok) return NULL;
    spin_lock(&g_area_lock);
    thread_area *a = g_area_pool;
    if (a != NULL) {
        g_area_pool = *(thread_area **)a;
        g_area_pooled--;
    }
    spin_unlock(&g_area_lock);
    if (a != NULL) {
        /* The memo is exact whichever thread wrote it (it rechecks every word), but a
         * clean one is cheaper than stale ways that can never hit. */
        shimcfi_memo_reset(&a->memo);
    } else {
        void *m = mmap(NULL, sizeof(thread_area), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            t_area = AREA_DEAD; /* no memory: direct callers only, not a syscall per call */
            return NULL;
        }
        a = m;
    }
    t_area = a;
    return a;
}

static ALWAYS_INLINE thread_area *area(void) {
    thread_area *a = t_area;
    if (LIKELY((uintptr_t)a > (uintptr_t)AREA_DEAD)) return a;
    return area_slow();
}

/* The key's destructor, at the exit of a thread started through our pthread_create (after
 * its C++ thread_local destructors). Later allocations of the thread record their direct
 * caller only. */
static void area_release(void *unused) {
    thread_area *a = t_area;
    t_area = AREA_DEAD; /* first: a signal handler's malloc from here on takes no area */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if ((uintptr_t)a <= (uintptr_t)AREA_DEAD) return;
    spin_lock(&g_area_lock);
    int kept = g_area_pooled < AREA_POOL_MAX;
    if (kept) {
        *(thread_area **)a = g_area_pool;
        g_area_pool = a;
        g_area_pooled++;
    }
    spin_unlock(&g_area_lock);
    if (!kept) munmap(a, sizeof(thread_area));
}

/* ------------------------------------------------------------------ ring writes */

/* The CAS in reserve() is a full barrier: it waits for this thread's earlier stores to
 * reach L1, i.e. for the previous record's cache lines to be owned.  Those lines were last
 * touched a lap ago by the reader (which zeroed them), so each is an L3 or cross-core miss,
 * and without help every event would pay one miss latency at the CAS.  Prefetching the
 * line PREFETCH_AHEAD bytes past the reservation for ownership (PREFETCHW where the CPU has
 * it) starts those misses early so they overlap with the target's own work. */
#define PREFETCH_AHEAD 1024u
static int g_prefetchw; /* CPU has PREFETCHW (CPUID 0x80000001 ECX bit 8) */

static ALWAYS_INLINE void prefetch_ahead(uint64_t pos) {
    const void *a = &g_data[((pos + PREFETCH_AHEAD) >> 3) & g_ring_mask];
#if defined(__x86_64__)
    if (LIKELY(g_prefetchw))
        __asm__ volatile("prefetchw %0" : : "m"(*(const char *)a));
    else
        __builtin_prefetch(a, 1, 3);
#else
    __builtin_prefetch(a, 1, 3);
#endif
}

/* Growth failed (no room in /dev/shm) or its fd is no longer our ring: from now on the
 * events that need more pages are lost (counted), without another try each.  Said once. */
static NOINLINE void stop_growth(struct rsprof_heap_header *h, const char *why, int err,
                                 uint64_t have, uint64_t want) {
    if (__atomic_exchange_n(&g_no_growth, 1, __ATOMIC_ACQ_REL)) return;
    if (h != NULL) __atomic_or_fetch(&h->flags, RSPROF_HEAP_HF_NO_GROWTH, __ATOMIC_RELEASE);
    if (!g_debug) return;
    char line[256], *p = line;
    static const char a[] = " (errno ", b[] = ", allocated ", c[] = ", wanted ";
    size_t n = strlen(why);
    if (n > 150) n = 150;
    memcpy(p, why, n), p += n;
    memcpy(p, a, sizeof a - 1), p += sizeof a - 1, p += fmt_u64(p, (uint64_t)err);
    memcpy(p, b, sizeof b - 1), p += sizeof b - 1, p += fmt_u64(p, have);
    memcpy(p, c, sizeof c - 1), p += sizeof c - 1, p += fmt_u64(p, want);
    *p++ = ')', *p = 0;
    shim_log(line);
}

/* Allocates tmpfs pages for the data area up to byte `upto` (at least), doubling what is
 * allocated so that a ring that fills makes a few dozen calls in all.  No lock: threads
 * that grow at once ask for overlapping ranges, which both ways allow, and the allocated
 * size only moves up.  Async-signal-safe (syscalls and atomics).  0: no more pages, for
 * good (stop_growth): a full /dev/shm must not cost every later event a failing call. */
static NOINLINE int ring_grow(uint64_t upto) {
    uint64_t have = __atomic_load_n(&g_alloc_bytes, __ATOMIC_ACQUIRE);
    if (upto <= have) return 1;
    if (__atomic_load_n(&g_no_growth, __ATOMIC_ACQUIRE)) return 0;
    uint64_t want = have * 2;
    while (want < upto) want *= 2;
    if (want > g_ring_bytes) want = g_ring_bytes;
    struct rsprof_heap_header *h = __atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE);
    int fd = __atomic_load_n(&g_ring_fd, __ATOMIC_ACQUIRE);
    if (fd < 0) {
        /* Faults the pages in through the mapping; EFAULT instead of the SIGBUS a write
         * would get when tmpfs has no room. */
        if (madvise((char *)g_data + have, want - have, MADV_POPULATE_WRITE) != 0) {
            stop_growth(h, "no room in /dev/shm to grow the ring: later events lost", errno,
                        have, want);
            return 0;
        }
    } else if (!ring_fd_ours()) {
        /* Not ours any more: never used, never closed by us again. */
        __atomic_store_n(&g_ring_fd, -1, __ATOMIC_RELEASE);
        stop_growth(h, "the ring's fd was closed or reused by the program: ring not grown", 0,
                    have, want);
        return 0;
    } else {
        int err = posix_fallocate(fd, (off_t)(RSPROF_HEAP_HEADER_SIZE + have),
                                  (off_t)(want - have));
        if (err != 0) {
            stop_growth(h, "no room in /dev/shm to grow the ring: later events lost", err,
                        have, want);
            return 0;
        }
    }
    while (have < want &&
           !__atomic_compare_exchange_n(&g_alloc_bytes, &have, want, 1, __ATOMIC_RELEASE,
                                        __ATOMIC_ACQUIRE)) {
    }
    return 1;
}

/* RSPROF_HEAP_DEBUG=1: the first time the ring is full, the cursors, said once. */
static NOINLINE void note_full(uint64_t w, uint64_t r, uint64_t len) {
    static int said;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) return;
    char line[160], *p = line;
    static const char a[] = "ring full: events lost (write_pos ", b[] = ", read_pos ",
                      c[] = ", record ";
    memcpy(p, a, sizeof a - 1), p += sizeof a - 1, p += fmt_u64(p, w);
    memcpy(p, b, sizeof b - 1), p += sizeof b - 1, p += fmt_u64(p, r);
    memcpy(p, c, sizeof c - 1), p += sizeof c - 1, p += fmt_u64(p, len);
    *p++ = ')', *p = 0;
    shim_log(line);
}

/* Reserves len bytes; returns 0 (and counts the loss) when the ring has no room. */
static ALWAYS_INLINE int reserve(struct rsprof_heap_header *h, uint64_t len, uint64_t *pos) {
    uint64_t w = __atomic_load_n(&h->write_pos, __ATOMIC_RELAXED);
    uint64_t r = t_read_pos;
    unsigned stale_tries = 0;
    for (;;) {
        /* The pages the record lands on must be allocated.  They are a prefix of the data
         * area, and every lap may need more of them: a reader that has read everything
         * moves both cursors to the next lap's start (a lap jump, see heapreader.c), so
         * the ring's untouched tail stays unallocated while the reader keeps up.  A record
         * that wraps around the end needs all of it. */
        uint64_t off = w & (g_ring_bytes - 1);
        if (UNLIKELY(off + len > __atomic_load_n(&g_alloc_bytes, __ATOMIC_ACQUIRE)) &&
            !ring_grow(off + len < g_ring_bytes ? off + len : g_ring_bytes)) {
            __atomic_fetch_add(&h->lost_events, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&h->lost_bytes, len, __ATOMIC_RELAXED);
            return 0;
        }
        if (UNLIKELY(w + len - r > g_ring_bytes)) {
            /* Acquire: the reader zeroed the space before it published read_pos. */
            r = __atomic_load_n(&h->read_pos, __ATOMIC_ACQUIRE);
            t_read_pos = r;
            if (w + len - r > g_ring_bytes) {
                /* w older than read_pos: the reader went past it after w was loaded (a
                 * lap jump moves read_pos up to a lap ahead at once), and w + len - r
                 * wrapped below zero.  Not a full ring: take write_pos again, never behind
                 * the read_pos just loaded (the reader stores write_pos first, and this
                 * load comes after that acquire).  Lost as "full" before: 1 event in ~12
                 * runs of the heap test module beside four hogs.  Bounded: a header
                 * scribbled with a read_pos ahead of write_pos must not hang the target. */
                if ((int64_t)(w - r) < 0 && stale_tries++ < 4) {
                    w = __atomic_load_n(&h->write_pos, __ATOMIC_RELAXED);
                    continue;
                }
                if (UNLIKELY(g_debug)) note_full(w, r, len);
                __atomic_fetch_add(&h->lost_events, 1, __ATOMIC_RELAXED);
                __atomic_fetch_add(&h->lost_bytes, len, __ATOMIC_RELAXED);
                return 0;
            }
        }
        if (LIKELY(__atomic_compare_exchange_n(&h->write_pos, &w, w + len, 1, __ATOMIC_RELAXED,
                                               __ATOMIC_RELAXED))) {
            *pos = w;
            prefetch_ahead(w);
            return 1;
        }
    }
}

/* The data area of the ring a writer reserved in: h's, not g_data, which an injected
 * shim's next attach points at a new ring while a writer that took the previous one is
 * still between its reservation and its commit (it writes into the old mapping, anonymous
 * memory since the stop, instead of over the new ring's first records). */
static ALWAYS_INLINE uint64_t *ring_data(struct rsprof_heap_header *h) {
    return (uint64_t *)((char *)h + RSPROF_HEAP_HEADER_SIZE);
}

/* An allocation whose stack this thread already named as way w: 2 words (AGAIN_SHORT),
 * or 3 for a size of 64 KiB or more. */
static ALWAYS_INLINE int record_again(struct rsprof_heap_header *h, void *p, size_t n,
                                      unsigned flags, int way) {
    uint64_t pos;
    if (LIKELY(n < RSPROF_HEAP_SHORT_SIZE_LIMIT)) {
        if (!reserve(h, RSPROF_HEAP_AGAIN_SHORT_WORDS * 8, &pos)) return 0;
        uint64_t *d = ring_data(h), i = pos >> 3;
        d[(i + 1) & g_ring_mask] = (uint64_t)(uintptr_t)p;
        __atomic_store_n(&d[i & g_ring_mask], RSPROF_HEAP_AGAIN_SHORT(n, way, t_tid),
                         __ATOMIC_RELEASE);
        return 1;
    }
    if (!reserve(h, RSPROF_HEAP_AGAIN_WORDS * 8, &pos)) return 0;
    uint64_t *d = ring_data(h), m = g_ring_mask, i = pos >> 3;
    d[(i + 1) & m] = (uint64_t)(uintptr_t)p;
    d[(i + 2) & m] = (uint64_t)n;
    __atomic_store_n(&d[i & m],
                     RSPROF_HEAP_HEAD(RSPROF_HEAP_REC_ALLOC_AGAIN, 0,
                                      flags | RSPROF_HEAP_RF_WAY(way), t_tid),
                     __ATOMIC_RELEASE);
    return 1;
}

static NOINLINE int record_alloc(void *p, size_t n, unsigned flags, uintptr_t fp) {
    struct rsprof_heap_header *h = ring();
    if (UNLIKELY(h == NULL)) return 0;
    if (UNLIKELY(t_tid == 0)) thread_init();
    /* A signal handler allocating while this thread is between its walk and its record
     * must not rewrite a way the record is about to repeat, nor the buffers it fills:
     * nested, it uses the second level of the area and no ways at all. */
    int way = -1, hit = 0;
    int level = t_recording++;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    /* Only the outermost level maps the area (a nested one mapping it too would leak one). */
    thread_area *a = LIKELY(level == 0) ? area() : level == 1 ? t_area : NULL;
    if (UNLIKELY((uintptr_t)a <= (uintptr_t)AREA_DEAD)) a = NULL;
    uint64_t direct[1];
    uint64_t *ips = direct;
    unsigned depth = 1;
    if (LIKELY(a != NULL)) {
        record_level *lv = &a->level[level];
        ips = lv->ips;
        depth = capture(ips, fp, &flags, level == 0 ? &a->memo : NULL, &lv->cfi, &way, &hit);
    } else {
        direct[0] = ((const uintptr_t *)fp)[1]; /* the return address into malloc's caller */
    }
    if (way >= 0) {
        uint32_t epoch = __atomic_load_n(&h->reader_epoch, __ATOMIC_RELAXED);
        if (UNLIKELY(epoch != t_epoch)) { /* a new reader: it knows none of our ways */
            t_epoch = epoch;
            t_named_ways = 0;
        }
        if (!hit) t_named_ways &= ~(1ull << way); /* the way holds another stack now */
    }
    /* Python frames: only in a CPython (g_py, decided once at init), so other programs
     * pay one predictable branch. Guarded: the thread-state getter may allocate TLS. */
    uint64_t *py = NULL;
    unsigned npy = 0;
    if (UNLIKELY(g_py) && a != NULL) {
        py = a->level[level].py;
        t_guard++;
        npy = shimpy_capture(py, RSPROF_HEAP_MAX_PY_FRAMES, t_tid);
        t_guard--;
        if (npy) flags |= RSPROF_HEAP_RF_PYTHON;
    }
    /* Python frames differ from call to call under the same native stack: those records
     * always carry their whole stack, and name no way. */
    int by_way = npy == 0 && way >= 0;
    int ok;
    if (by_way && (t_named_ways >> way & 1)) {
        ok = record_again(h, p, n, flags, way);
    } else {
        if (by_way) flags |= RSPROF_HEAP_RF_WAY(way);
        /* ips[1 ..), or the memo's copy of them after a hit (not needed for ALLOC_AGAIN). */
        const uint64_t *callers = hit ? shimcfi_memo_frames(&a->memo, way) : ips + 1;
        uint64_t words = RSPROF_HEAP_ALLOC_WORDS(depth) + (npy ? RSPROF_HEAP_PY_WORDS(npy) : 0);
        uint64_t pos;
        ok = reserve(h, words * 8, &pos);
        if (ok) {
            uint64_t *d = ring_data(h), m = g_ring_mask, i = pos >> 3;
            d[(i + 1) & m] = (uint64_t)(uintptr_t)p;
            d[(i + 2) & m] = (uint64_t)n;
            d[(i + 3) & m] = ips[0];
            for (unsigned k = 1; k < depth; k++) d[(i + 3 + k) & m] = callers[k - 1];
            if (npy) {
                d[(i + 3 + depth) & m] = npy;
                for (unsigned k = 0; k < 2 * npy; k++) d[(i + 4 + depth + k) & m] = py[k];
            }
            __atomic_store_n(&d[i & m],
                             RSPROF_HEAP_HEAD(RSPROF_HEAP_REC_ALLOC, depth, flags, t_tid),
                             __ATOMIC_RELEASE);
            /* Named only if the record made it into the ring (not lost to a full one). */
            if (by_way) t_named_ways |= 1ull << way;
        }
    }
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    t_recording--;
    return ok;
}

/* A FREE_SHORT record: its commit word alone (an address below 2^56). */
static ALWAYS_INLINE void record_free_short(struct rsprof_heap_header *h, uint64_t a) {
    uint64_t pos;
    if (!reserve(h, RSPROF_HEAP_FREE_SHORT_WORDS * 8, &pos)) return;
    __atomic_store_n(&ring_data(h)[(pos >> 3) & g_ring_mask], RSPROF_HEAP_FREE_SHORT(a),
                     __ATOMIC_RELEASE);
}

static NOINLINE void record_free_slow(void *p, unsigned flags) {
    struct rsprof_heap_header *h = ring();
    if (UNLIKELY(h == NULL)) return;
    if (UNLIKELY(t_tid == 0)) thread_init();
    uint64_t pos, a = (uint64_t)(uintptr_t)p;
    if (LIKELY(a < RSPROF_HEAP_SHORT_ADDR_LIMIT)) {
        record_free_short(h, a);
        return;
    }
    if (!reserve(h, RSPROF_HEAP_FREE_WORDS * 8, &pos)) return;
    uint64_t *d = ring_data(h), m = g_ring_mask, i = pos >> 3;
    d[(i + 1) & m] = a;
    __atomic_store_n(&d[i & m], RSPROF_HEAP_HEAD(RSPROF_HEAP_REC_FREE, 0, flags, t_tid),
                     __ATOMIC_RELEASE);
}

/* The common case, inline in the wrappers: the ring exists, this thread is known, the
 * address fits a FREE_SHORT; anything else goes the general way.  (A call per free and its
 * register saves: sqlite3's 600,000 INSERTs, 13 M frees, 2.263 -> 2.227 s of target CPU,
 * medians of 7 interleaved rounds.) */
static ALWAYS_INLINE void record_free(void *p, unsigned flags) {
    struct rsprof_heap_header *h = __atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE);
    uint64_t a = (uint64_t)(uintptr_t)p;
    if (UNLIKELY(h == NULL || __atomic_load_n(&g_injected_on, __ATOMIC_RELAXED) ||
                 t_tid == 0 || a >= RSPROF_HEAP_SHORT_ADDR_LIMIT))
        record_free_slow(p, flags);
    else
        record_free_short(h, a);
}

/* Sampled mode, countdown crossed zero (or a new thread): decide and record. */
static NOINLINE void sampled_alloc_slow(void *p, size_t n, unsigned flags, uintptr_t fp) {
    if (t_rng == 0) { /* first allocation of this thread: seed and draw */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (t_tid == 0) thread_init();
        uint64_t seed = ((uint64_t)t_tid << 32) ^ (uint64_t)ts.tv_nsec ^
                        ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)&seed;
        t_rng = seed ? seed : 0x9E3779B97F4A7C15ULL;
        t_countdown = draw_countdown();
        int64_t c = t_countdown - (int64_t)n;
        if (c > 0) {
            t_countdown = c;
            return;
        }
    }
    /* Memoryless: the distance from the end of this block to the next sample point is
     * again exponential, so a fresh draw is exact. */
    t_countdown = draw_countdown();
    if (!record_alloc(p, n, flags, fp)) return;
    if (!__atomic_load_n(&g_frees_all, __ATOMIC_RELAXED) && !set_insert(p)) {
        __atomic_store_n(&g_frees_all, 1, __ATOMIC_RELAXED);
        struct rsprof_heap_header *h = __atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE);
        if (h) __atomic_or_fetch(&h->flags, RSPROF_HEAP_HF_ALL_FREES, __ATOMIC_RELAXED);
    }
}

/* The common case of record_alloc, inline in the wrappers: an outermost recording (no
 * signal handler nested in another one) of a native-only process, whose walk the memo's
 * guess holds (memo_predicted) and whose thread has named that way to this reader: an
 * AGAIN_SHORT record.  Anything else, record_alloc, before the memo is touched beyond the
 * way's `used` bit (so it finds the same way again).  sqlite3: 91 % of its allocations. */
static ALWAYS_INLINE void record_alloc_inline(void *p, size_t n, unsigned flags,
                                              uintptr_t fp) {
    struct rsprof_heap_header *h = __atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE);
    thread_area *a = t_area;
    const uintptr_t lo = t_stack_lo, hi = t_stack_hi;
    if (UNLIKELY(h == NULL || __atomic_load_n(&g_injected_on, __ATOMIC_RELAXED) || g_py ||
                 !g_cfi || t_recording != 0 || (uintptr_t)a <= (uintptr_t)AREA_DEAD ||
                 t_tid == 0 || n >= RSPROF_HEAP_SHORT_SIZE_LIMIT || fp < lo || fp >= hi ||
                 hi - fp < 16)) {
        record_alloc(p, n, flags, fp);
        return;
    }
    t_recording++;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    memo_set *set = (memo_set *)a->memo.bytes;
    const uintptr_t *frame = (const uintptr_t *)fp; /* the wrapper's: saved rbp, return */
    int w = memo_predicted(set, __atomic_load_n(&shimcfi_generation, __ATOMIC_ACQUIRE),
                           set->serial, frame[1], fp + 16, frame[0], g_max_depth);
    int fast = w >= 0 && __atomic_load_n(&h->reader_epoch, __ATOMIC_RELAXED) == t_epoch &&
               (t_named_ways >> w & 1);
    if (fast) {
        memo_follow(set, w); /* the next walk's guesses, and their lines on the way */
        record_again(h, p, n, flags, w);
    }
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    t_recording--;
    if (!fast) record_alloc(p, n, flags, fp);
}

static ALWAYS_INLINE void on_alloc(void *p, size_t n, unsigned flags, uintptr_t fp) {
    if (UNLIKELY(t_guard)) return;
    if (g_sample_bytes) {
        int64_t c = t_countdown - (int64_t)n;
        if (LIKELY(c > 0)) {
            t_countdown = c;
            return;
        }
        sampled_alloc_slow(p, n, flags, fp);
        return;
    }
    record_alloc_inline(p, n, flags, fp);
}

/* Must run BEFORE the block is handed back to the real allocator (see heapring.h). */
static ALWAYS_INLINE void on_free(void *p, unsigned flags) {
    if (UNLIKELY(t_guard)) return;
    if (g_sample_bytes && !__atomic_load_n(&g_frees_all, __ATOMIC_RELAXED) && !set_remove(p))
        return;
    record_free(p, flags);
}

/* ------------------------------------------------------------------ exit, fork */

/* Is the reader recorded in the header alive?  (A reader killed without close() leaves
 * its pid behind; kill(pid, 0) is one syscall and takes no lock.) */
static int reader_alive(const struct rsprof_heap_header *h) {
    int32_t pid = __atomic_load_n(&h->reader_pid, __ATOMIC_ACQUIRE);
    return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
}

/* Marks the ring exited, waits (bounded) for the reader, unlinks the name.  Only the
 * process the ring is named after does this (not a fork child that inherited our state
 * before its own ring exists, nor a vfork child running in our address space).
 *
 * Waiting never happens for a reader that is not there: a process waits for a reader to
 * attach only if rsprof started it (RSPROF_HEAP_WAIT_PPID is its parent: the process
 * `rsprof run` execs, also after further execs), so the programs it starts in turn exit at
 * once; with a live reader attached, any process waits until its events are drained. */
static void finish_ring(void) {
    struct rsprof_heap_header *h = __atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE);
    if (h == NULL || g_unlinked || g_ring_pid != getpid()) return;
    g_unlinked = 1;
    __atomic_or_fetch(&h->flags, RSPROF_HEAP_HF_EXITED, __ATOMIC_RELEASE);
    if (g_exit_wait_ms) {
        int may_wait_for_attach = g_wait_ppid != 0 && (pid_t)g_wait_ppid == getppid();
        struct timespec nap = {0, 1000000};
        for (unsigned waited = 0; waited < g_exit_wait_ms; waited++) {
            int attached = reader_alive(h);
            if (!attached && !may_wait_for_attach) break;
            if (attached && __atomic_load_n(&h->read_pos, __ATOMIC_ACQUIRE) >=
                                __atomic_load_n(&h->write_pos, __ATOMIC_ACQUIRE))
                break;
            nanosleep(&nap, NULL);
        }
    }
    if (g_debug && g_cfi) {
        shimcfi_stats st;
        shimcfi_get_stats(&st);
        char line[200], *p = line;
        static const char a[] = "cfi rules computed ", b[] = ", uncached ", c[] = ", fp frames ",
                          d[] = ", memo lookups of this thread ";
        memcpy(p, a, sizeof a - 1), p += sizeof a - 1, p += fmt_u64(p, st.computed);
        memcpy(p, b, sizeof b - 1), p += sizeof b - 1, p += fmt_u64(p, st.uncached);
        memcpy(p, c, sizeof c - 1), p += sizeof c - 1, p += fmt_u64(p, st.fp_frames);
        thread_area *area_now = t_area;
        if ((uintptr_t)area_now > (uintptr_t)AREA_DEAD) {
            memcpy(p, d, sizeof d - 1), p += sizeof d - 1;
            p += fmt_u64(p, shimcfi_memo_lookups(&area_now->memo));
        }
        *p = 0;
        shim_log(line);
    }
    /* Events nobody has read, in a process whose session's recorder is alive (the rsprof
     * that started the process tree, or that read the fork parent's or pre-exec image's
     * ring): the ring stays at its name for that recorder, which reads it and removes it
     * (a short child, `ls` in a shell script, is often gone before the recorder has seen
     * it, and unlinking took its events with it). No wait: the process exits at once. */
    if (ring_kept_for_session(h)) return;
    shm_unlink(g_ring_name);
    /* The mapping stays: late frees (other destructors) still land in the ring. */
}

/* libstdc++ allocates a 72,704-byte emergency pool for exceptions in a constructor before
 * main and never frees it: every C++ program would show it as its own leak.  It offers
 * __gnu_cxx::__freeres() for leak checkers (valgrind calls it at exit too); after it the
 * pool is gone, which matters only to an exception thrown while malloc fails in a later
 * destructor.  Called at a normal exit of a process with a ring of its own (never in a
 * vfork child, which shares its parent's heap, nor from _exit), so the FREE lands in the
 * ring before it is marked exited. */
static void free_runtime_pools(void) {
    struct rsprof_heap_header *h = __atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE);
    if (h == NULL || g_unlinked || g_ring_pid != getpid()) return;
    t_guard++; /* dlsym may allocate */
    void (*freeres)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "_ZN9__gnu_cxx9__freeresEv");
    t_guard--;
    if (freeres != NULL) freeres();
}

__attribute__((destructor)) static void shim_fini(void) {
    free_runtime_pools();
    finish_ring();
}

EXPORT void _exit(int status) {
    finish_ring();
    if (real__exit) real__exit(status);
    for (;;) syscall(SYS_exit_group, status);
}

EXPORT void _Exit(int status) { _exit(status); }

/* Fork child: never write into the parent's ring, never unlink its name.  Drop the
 * mapping; the child's own ring (named after its pid) is created on its first event. */
static void atfork_child(void) {
    struct rsprof_heap_header *h = g_hdr;
    __atomic_store_n(&g_hdr, NULL, __ATOMIC_RELEASE);
    if (h) {
        /* The parent's reader reads the child's ring too (create_ring): the ring stays at
         * its name for it if the child exits before that recorder attached it. */
        g_parent_reader = __atomic_load_n(&h->reader_pid, __ATOMIC_ACQUIRE);
        munmap(h, g_map_len);
    }
    /* Only an fd proven to be our ring is closed: the program may have put its own file
     * at that number (an inherited copy of it is the child's, untouched). */
    if (ring_fd_ours()) close(g_ring_fd);
    g_ring_fd = -1;
    g_no_growth = 0;
    g_alloc_bytes = 0;
    g_data = NULL;
    g_ring_pid = 0;
    g_unlinked = 0;
    g_ring_lock = 0;
    t_read_pos = 0;
    t_named_ways = 0; /* named to the parent's reader, in the parent's ring */
    t_recording = 0;
    /* The forking thread is the child's only thread, on the same stack: new tid, same
     * bounds (if it never recorded, thread_init runs on its first event as usual). */
    if (t_tid != 0) t_tid = (uint32_t)syscall(SYS_gettid);
    if (g_sample_bytes) set_reset(); /* inherited sampled blocks are unknown to its reader */
    /* Injected (rsprof -p): the recorder reads the attached process only, and nothing
     * would ever remove a child's ring (the injected shim does not wrap _exit). The child
     * keeps the redirected GOT entries (rewriting them here, where another thread of the
     * parent may have held the loader's lock at the fork, could deadlock): pass-through. */
    if (g_injected) {
        __atomic_store_n(&g_disabled, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&g_injected_on, 0, __ATOMIC_RELAXED);
    }
}

/* ------------------------------------------------------------------ initialisation */

static int g_resolved; /* all real_* pointers set (atomic) */
static void resolve_cxx(void);
static void detect_allocator(void);
static uint32_t g_found_flags; /* header flags found at init: HF_MALLOC_ELSEWHERE, _ALLOC_API */

/* dlsym may allocate: while it runs, nested calls see g_resolved == 0 and use the
 * arena.  The pointers are published together so no nested call ever sees a real malloc
 * without the matching real free. */
static void resolve_real(void) {
    void *m = dlsym(RTLD_NEXT, "malloc");
    void *f = dlsym(RTLD_NEXT, "free");
    void *c = dlsym(RTLD_NEXT, "calloc");
    void *r = dlsym(RTLD_NEXT, "realloc");
    void *pm = dlsym(RTLD_NEXT, "posix_memalign");
    void *aa = dlsym(RTLD_NEXT, "aligned_alloc");
    void *ma = dlsym(RTLD_NEXT, "memalign");
    void *va = dlsym(RTLD_NEXT, "valloc");
    void *pv = dlsym(RTLD_NEXT, "pvalloc");
    void *us = dlsym(RTLD_NEXT, "malloc_usable_size");
    void *ex = dlsym(RTLD_NEXT, "_exit");
    void *pc = dlsym(RTLD_NEXT, "pthread_create");
    void *dc = dlsym(RTLD_NEXT, "dlclose");
    if (!m || !f || !c || !r || !pm || !aa || !ma || !va || !pv || !pc) {
        /* Injected into a running process: say so to rsprof, never abort the target. */
        if (g_injected) return;
        static const char msg[] = "rsprof-heap: cannot resolve the real allocator\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        abort();
    }
    real_malloc = (void *(*)(size_t))m;
    real_free = (void (*)(void *))f;
    real_calloc = (void *(*)(size_t, size_t))c;
    real_realloc = (void *(*)(void *, size_t))r;
    real_posix_memalign = (int (*)(void **, size_t, size_t))pm;
    real_aligned_alloc = (void *(*)(size_t, size_t))aa;
    real_memalign = (void *(*)(size_t, size_t))ma;
    real_valloc = (void *(*)(size_t))va;
    real_pvalloc = (void *(*)(size_t))pv;
    real_malloc_usable_size = (size_t(*)(void *))us;
    real__exit = (void (*)(int))ex;
    real_pthread_create =
        (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))pc;
    real_dlclose = (int (*)(void *))dc;
    __atomic_store_n(&g_resolved, 1, __ATOMIC_RELEASE);
}

static void detect_cpu(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u), "c"(0));
    if (a >= 0x80000001u) {
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000001u), "c"(0));
        g_prefetchw = (c >> 8) & 1;
    }
#endif
}

static void read_config(void) {
    detect_cpu();
    g_debug = env_u64("RSPROF_HEAP_DEBUG", 0) != 0;
    long page = sysconf(_SC_PAGESIZE);
    g_page = page > 0 ? (size_t)page : 4096;
    /* Ring size: RSPROF_HEAP_RING_KB wins over RSPROF_HEAP_RING_MB (tests use KB). */
    uint64_t bytes = env_u64("RSPROF_HEAP_RING_KB", 0) * 1024;
    if (bytes == 0) bytes = env_u64("RSPROF_HEAP_RING_MB", RSPROF_HEAP_DEFAULT_RING_MB) << 20;
    if (bytes < RSPROF_HEAP_MIN_RING) bytes = RSPROF_HEAP_MIN_RING;
    if (bytes > RSPROF_HEAP_MAX_RING) bytes = RSPROF_HEAP_MAX_RING;
    uint64_t pow2 = RSPROF_HEAP_MIN_RING;
    while (pow2 < bytes) pow2 <<= 1;
    g_ring_bytes = pow2;
    g_ring_mask = pow2 / 8 - 1;
    g_max_depth = (unsigned)env_u64("RSPROF_HEAP_MAX_DEPTH", RSPROF_HEAP_MAX_DEPTH);
    if (g_max_depth < 1) g_max_depth = 1;
    if (g_max_depth > RSPROF_HEAP_MAX_DEPTH) g_max_depth = RSPROF_HEAP_MAX_DEPTH;
    g_exit_wait_ms = (unsigned)env_u64("RSPROF_HEAP_EXIT_WAIT_MS", 0);
    if (g_exit_wait_ms > 60000) g_exit_wait_ms = 60000;
    g_wait_ppid = env_u64("RSPROF_HEAP_WAIT_PPID", 0);
    if (g_wait_ppid > INT32_MAX) g_wait_ppid = 0; /* no pid: as if unset */
    g_session_pid = (int32_t)g_wait_ppid;
    g_grow_fd = env_u64("RSPROF_HEAP_GROW_FD", 0) != 0;
    /* RSPROF_HEAP_UNWIND=fp: frame pointers only (the benchmark's baseline, and a way out
     * should CFI ever misbehave in a target). */
    const char *unwind = getenv("RSPROF_HEAP_UNWIND");
    g_cfi = !(unwind != NULL && strcmp(unwind, "fp") == 0) && shimcfi_init();
    /* A CPython in the executable or a libpython loaded with it (RSPROF_HEAP_PYTHON=0:
     * native stacks only). One dlsym each, here, never inside a later allocation. */
    g_py = env_u64("RSPROF_HEAP_PYTHON", 1) != 0 && shimpy_init(g_debug);
    g_sample_bytes = env_u64("RSPROF_HEAP_SAMPLE_BYTES", 0);
    if (g_sample_bytes && !set_create()) {
        shim_log("cannot map the sampled-address set: heap tracking off");
        g_disabled = 1;
    }
    if (env_u64("RSPROF_HEAP_DISABLE", 0)) g_disabled = 1;
}

/* Returns 1 when the real functions can be called, 0 when the caller must use the
 * bootstrap arena (a nested call from dlsym during our own initialisation). */
static NOINLINE int slow_init(void) {
    if (t_in_init) return __atomic_load_n(&g_resolved, __ATOMIC_ACQUIRE);
    int expected = ST_UNINIT;
    if (__atomic_compare_exchange_n(&g_state, &expected, ST_INITING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        t_in_init = 1;
        t_guard++;
        resolve_real();
        resolve_cxx();
        read_config();
        detect_allocator();
        pthread_atfork(NULL, NULL, atfork_child);
        /* Unmaps each thread's area at its exit (see thread_area). */
        g_area_key_ok = pthread_key_create(&g_area_key, area_release) == 0;
        pthread_atfork(NULL, NULL, area_atfork_child);
        thread_init();
        if (!g_disabled) create_ring();
        /* After the header is published: the reader reads the flags on every poll. */
        struct rsprof_heap_header *h = __atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE);
        if (h != NULL && g_found_flags != 0)
            __atomic_or_fetch(&h->flags, g_found_flags, __ATOMIC_RELEASE);
        t_guard--;
        t_in_init = 0;
        __atomic_store_n(&g_state, ST_READY, __ATOMIC_RELEASE);
        return 1;
    }
    /* Another thread is initialising (only possible if threads start before our
     * constructor): wait for it, it does not take long. */
    while (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != ST_READY) sched_yield();
    return 1;
}

static ALWAYS_INLINE int ready(void) {
    return LIKELY(__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == ST_READY) || slow_init();
}

static NOINLINE int shim_ready_for_threads(void) {
    return ready() && __atomic_load_n(&g_resolved, __ATOMIC_ACQUIRE);
}

/* Which library this is: librsprof_heap.so (LD_PRELOAD, 0) or librsprof_heap_inject.so
 * (dlopen'ed into a running process by rsprof -p, 1), the same objects linked with
 * native/shim/variant/preload.c or inject.c. */
extern const int rsprof_shim_injected_build;

__attribute__((constructor)) static void shim_init(void) {
    /* Injected: nothing until rsprof calls rsprof_heap_inject_start (nobody calls our
     * wrappers before it rewrites the GOTs: the library is loaded RTLD_LOCAL). */
    if (rsprof_shim_injected_build) {
        g_injected = 1;
        return;
    }
    ready();
}

/* ------------------------------------------------------------------ wrappers */

EXPORT void *malloc(size_t n) {
    if (UNLIKELY(!ready())) return boot_alloc(n, 16);
    void *p = real_malloc(n);
    if (LIKELY(p != NULL)) on_alloc(p, n, 0, (uintptr_t)__builtin_frame_address(0));
    return p;
}

EXPORT void free(void *p) {
    if (p == NULL || UNLIKELY(is_boot(p))) return;
    if (UNLIKELY(!ready())) return; /* unreachable: only the arena exists before init */
    on_free(p, 0);
    real_free(p);
}

EXPORT void *calloc(size_t nmemb, size_t size) {
    if (UNLIKELY(!ready())) {
        size_t total;
        if (__builtin_mul_overflow(nmemb, size, &total)) {
            errno = ENOMEM;
            return NULL;
        }
        return boot_alloc(total, 16);
    }
    void *p = real_calloc(nmemb, size);
    if (LIKELY(p != NULL))
        on_alloc(p, nmemb * size, RSPROF_HEAP_RF_CALLOC, (uintptr_t)__builtin_frame_address(0));
    return p;
}

EXPORT void *realloc(void *old, size_t n) {
    uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
    if (UNLIKELY(!ready())) {
        void *p = boot_alloc(n, 16);
        if (p && old) memcpy(p, old, boot_size(old) < n ? boot_size(old) : n);
        return p;
    }
    if (UNLIKELY(is_boot(old))) { /* grow an arena block into a real one */
        void *p = real_malloc(n ? n : 1);
        if (p) {
            memcpy(p, old, boot_size(old) < n ? boot_size(old) : n);
            on_alloc(p, n, RSPROF_HEAP_RF_REALLOC, fp);
        }
        return p;
    }
    if (old == NULL) {
        void *p = real_realloc(NULL, n);
        if (p) on_alloc(p, n, RSPROF_HEAP_RF_REALLOC, fp);
        return p;
    }
    /* free half first: once realloc returns, another thread may get `old` back */
    on_free(old, RSPROF_HEAP_RF_REALLOC);
    void *p = real_realloc(old, n);
    if (p != NULL) {
        on_alloc(p, n, RSPROF_HEAP_RF_REALLOC, fp);
    } else if (n != 0) {
        /* Failed: `old` is still live.  Announce it again (from this call site, with its
         * usable size: the original request size is not known here). */
        size_t usable = real_malloc_usable_size ? real_malloc_usable_size(old) : 0;
        on_alloc(old, usable, RSPROF_HEAP_RF_REALLOC | RSPROF_HEAP_RF_FAILED_REALLOC, fp);
    } /* n == 0: glibc freed `old` and returned NULL: the FREE stands */
    return p;
}

EXPORT int posix_memalign(void **memptr, size_t align, size_t n) {
    if (UNLIKELY(!ready())) {
        void *p = boot_alloc(n, align);
        if (p == NULL) return ENOMEM;
        *memptr = p;
        return 0;
    }
    int r = real_posix_memalign(memptr, align, n);
    if (r == 0 && *memptr != NULL)
        on_alloc(*memptr, n, RSPROF_HEAP_RF_ALIGNED, (uintptr_t)__builtin_frame_address(0));
    return r;
}

EXPORT void *aligned_alloc(size_t align, size_t n) {
    if (UNLIKELY(!ready())) return boot_alloc(n, align);
    void *p = real_aligned_alloc(align, n);
    if (LIKELY(p != NULL))
        on_alloc(p, n, RSPROF_HEAP_RF_ALIGNED, (uintptr_t)__builtin_frame_address(0));
    return p;
}

EXPORT void *memalign(size_t align, size_t n) {
    if (UNLIKELY(!ready())) return boot_alloc(n, align);
    void *p = real_memalign(align, n);
    if (LIKELY(p != NULL))
        on_alloc(p, n, RSPROF_HEAP_RF_ALIGNED, (uintptr_t)__builtin_frame_address(0));
    return p;
}

EXPORT void *valloc(size_t n) {
    if (UNLIKELY(!ready())) return boot_alloc(n, 4096);
    void *p = real_valloc(n);
    if (LIKELY(p != NULL))
        on_alloc(p, n, RSPROF_HEAP_RF_ALIGNED, (uintptr_t)__builtin_frame_address(0));
    return p;
}

EXPORT void *pvalloc(size_t n) {
    if (UNLIKELY(!ready())) return boot_alloc((n + 4095) & ~(size_t)4095, 4096);
    void *p = real_pvalloc(n);
    /* pvalloc rounds the request up to whole pages and hands out all of it. */
    size_t rounded = n == 0 ? g_page : (n + g_page - 1) & ~(g_page - 1);
    if (LIKELY(p != NULL))
        on_alloc(p, rounded, RSPROF_HEAP_RF_ALIGNED, (uintptr_t)__builtin_frame_address(0));
    return p;
}

EXPORT size_t malloc_usable_size(void *p) {
    if (p == NULL) return 0;
    if (is_boot(p)) return boot_size(p);
    if (UNLIKELY(!ready()) || real_malloc_usable_size == NULL) return 0;
    return real_malloc_usable_size(p);
}

/* ------------------------------------------------------------------ C++ operator new/delete */

/* libstdc++'s (and libc++'s) operator new calls malloc, and operator delete free, through
 * the PLT: they reach the wrappers above.  jemalloc, tcmalloc and mimalloc define operator
 * new and delete themselves and allocate inside, never calling malloc: a C++ program linked
 * with one of them showed a third of its allocations (C's) and none of its leaked strings.
 * So the shim interposes the whole family, each forwarding to the next definition
 * (RTLD_NEXT).  Where that definition lives in the object that also holds the real malloc
 * (the allocator's own), the wrapper records the event itself; elsewhere (libstdc++) the
 * nested malloc or free records it, as before: nothing is counted twice, and the stacks of
 * glibc programs keep their shape (operator new, then its caller). */
enum {
    CXX_NEW, CXX_NEW_A, CXX_NEW_NT, CXX_NEW_A_NT, CXX_NEW_AL, CXX_NEW_A_AL, CXX_NEW_AL_NT,
    CXX_NEW_A_AL_NT, /* operator new, new[]: plain, nothrow, aligned, aligned nothrow */
    CXX_DEL, CXX_DEL_A, CXX_DEL_SZ, CXX_DEL_A_SZ, CXX_DEL_NT, CXX_DEL_A_NT, CXX_DEL_AL,
    CXX_DEL_A_AL, CXX_DEL_SZ_AL, CXX_DEL_A_SZ_AL, CXX_DEL_AL_NT, CXX_DEL_A_AL_NT,
    CXX_COUNT,
};
static const char *const cxx_names[CXX_COUNT] = {
    "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t", "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm",
    "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t", "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t", "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};
static void *g_cxx[CXX_COUNT]; /* the next definitions (atomic: resolved late if need be) */
static uint32_t g_cxx_own;     /* bit i: g_cxx[i] allocates without malloc: record here */


/* No C++ runtime found for a name (a C program that dlopen'ed one RTLD_LOCAL, so RTLD_NEXT
 * cannot see it): the same semantics on top of the real allocator, recorded here.  An
 * exception cannot be thrown from C: a throwing new that fails says so and aborts. */
static void *cxx_fallback_alloc(size_t n, size_t align, int nothrow) {
    void *p = NULL;
    if (n == 0) n = 1;
    if (align > 16) {
        if (real_posix_memalign(&p, align, n) != 0) p = NULL;
    } else {
        p = real_malloc(n);
    }
    if (p == NULL && !nothrow) {
        static const char msg[] = "rsprof-heap: operator new: out of memory\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        abort();
    }
    return p;
}
static void *fb_new(size_t n) { return cxx_fallback_alloc(n, 0, 0); }
static void *fb_new_nt(size_t n, const void *nt) { return cxx_fallback_alloc(n, 0, 1); }
static void *fb_new_al(size_t n, size_t al) { return cxx_fallback_alloc(n, al, 0); }
static void *fb_new_al_nt(size_t n, size_t al, const void *nt) {
    return cxx_fallback_alloc(n, al, 1);
}
static void fb_del(void *p) { real_free(p); }
static void fb_del_sz(void *p, size_t n) { real_free(p); }
static void fb_del_nt(void *p, const void *nt) { real_free(p); }
static void fb_del_sz_al(void *p, size_t n, size_t al) { real_free(p); }
static void *const cxx_fallbacks[CXX_COUNT] = {
    fb_new, fb_new, fb_new_nt, fb_new_nt, fb_new_al, fb_new_al, fb_new_al_nt, fb_new_al_nt,
    fb_del, fb_del, fb_del_sz, fb_del_sz, fb_del_nt, fb_del_nt,
    fb_del_sz /* (p, align): same registers */, fb_del_sz, fb_del_sz_al, fb_del_sz_al,
    fb_del_sz /* (p, align, nothrow): the first two */, fb_del_sz,
};

/* The object a function lives in (its load address), 0 if none.  dladdr takes the loader
 * lock: called at init, or once per name for a runtime found late, never per call. */
static uintptr_t object_of(void *f) {
    Dl_info info;
    if (f == NULL || dladdr(f, &info) == 0) return 0;
    return (uintptr_t)info.dli_fbase;
}

/* Called with t_guard set (dlsym may allocate). */
static void cxx_set(unsigned i, void *f, uintptr_t malloc_object) {
    uint32_t own = 0;
    if (f == NULL) {
        f = cxx_fallbacks[i];
        own = 1;
    } else if (malloc_object != 0 && object_of(f) == malloc_object) {
        own = 1;
    }
    if (own) __atomic_or_fetch(&g_cxx_own, 1u << i, __ATOMIC_RELAXED);
    __atomic_store_n(&g_cxx[i], f, __ATOMIC_RELEASE);
}

/* At init: the next definition of each name; missing ones stay NULL for now (looked up
 * again on first use: a C++ runtime may be loaded later). */
static void resolve_cxx(void) {
    uintptr_t malloc_object = object_of((void *)real_malloc);
    for (unsigned i = 0; i < CXX_COUNT; i++) {
        void *f = dlsym(RTLD_NEXT, cxx_names[i]);
        if (f != NULL) cxx_set(i, f, malloc_object);
    }
}

/* First call of a name that was not found at init. */
static NOINLINE void *cxx_resolve_late(unsigned i) {
    t_guard++;
    void *f = dlsym(RTLD_NEXT, cxx_names[i]);
    static const char *const runtimes[] = {"libstdc++.so.6", "libc++.so.1"};
    for (unsigned k = 0; f == NULL && k < sizeof runtimes / sizeof runtimes[0]; k++) {
        void *h = dlopen(runtimes[k], RTLD_LAZY | RTLD_NOLOAD);
        if (h == NULL) continue;
        f = dlsym(h, cxx_names[i]);
        if (real_dlclose) real_dlclose(h); /* NOLOAD took a reference */
    }
    cxx_set(i, f, object_of((void *)real_malloc));
    t_guard--;
    return __atomic_load_n(&g_cxx[i], __ATOMIC_ACQUIRE);
}

static ALWAYS_INLINE void *cxx_fn(unsigned i) {
    void *f = __atomic_load_n(&g_cxx[i], __ATOMIC_ACQUIRE);
    return LIKELY(f != NULL) ? f : cxx_resolve_late(i);
}

static ALWAYS_INLINE int cxx_own(unsigned i) {
    return UNLIKELY(__atomic_load_n(&g_cxx_own, __ATOMIC_RELAXED) >> i & 1);
}

typedef void *(*new_fn)(size_t);
typedef void *(*new_nt_fn)(size_t, const void *);
typedef void *(*new_al_fn)(size_t, size_t);
typedef void *(*new_al_nt_fn)(size_t, size_t, const void *);
typedef void (*del_fn)(void *);
typedef void (*del_sz_fn)(void *, size_t);
typedef void (*del_nt_fn)(void *, const void *);
typedef void (*del_sz_al_fn)(void *, size_t, size_t);
typedef void (*del_al_nt_fn)(void *, size_t, const void *);

/* Ends a guarded region, also when an exception (bad_alloc) leaves it: the shim is built
 * with -fexceptions, so the cleanup runs while the exception unwinds through the wrapper. */
static ALWAYS_INLINE void guard_end(int *unused) { t_guard--; }
#define GUARDED_REGION int guard_ __attribute__((cleanup(guard_end))) = ++t_guard

/* Each wrapper: the real function; where it is the allocator's own, the event recorded here
 * (an allocation after it returned, a free before the block is handed back, as for malloc
 * and free), and anything the allocator's own calls under the guard (jemalloc's aligned new
 * calls aligned_alloc through the PLT: counted twice without it).  new(0) hands out a
 * 1-byte block, as libstdc++'s does through malloc(1). */
#define CXX_NEW_BODY(idx, type, flags, call)                                                  \
    uintptr_t fp = (uintptr_t)__builtin_frame_address(0);                                     \
    if (UNLIKELY(!ready())) return boot_alloc(n ? n : 1, 16);                                 \
    type real = (type)cxx_fn(idx);                                                            \
    if (LIKELY(!cxx_own(idx))) return call;                                                   \
    void *p;                                                                                  \
    {                                                                                         \
        GUARDED_REGION;                                                                       \
        p = call;                                                                             \
    }                                                                                         \
    if (LIKELY(p != NULL)) on_alloc(p, n ? n : 1, flags, fp);                                 \
    return p;

#define CXX_DEL_BODY(idx, type, call)                                                         \
    if (p == NULL || UNLIKELY(is_boot(p)) || UNLIKELY(!ready())) return;                      \
    type real = (type)cxx_fn(idx);                                                            \
    if (LIKELY(!cxx_own(idx))) {                                                              \
        call;                                                                                 \
        return;                                                                               \
    }                                                                                         \
    on_free(p, 0);                                                                            \
    GUARDED_REGION;                                                                           \
    call;

EXPORT void *_Znwm(size_t n) { CXX_NEW_BODY(CXX_NEW, new_fn, 0, real(n)) }
EXPORT void *_Znam(size_t n) { CXX_NEW_BODY(CXX_NEW_A, new_fn, 0, real(n)) }
EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const void *nt) {
    CXX_NEW_BODY(CXX_NEW_NT, new_nt_fn, 0, real(n, nt))
}
EXPORT void *_ZnamRKSt9nothrow_t(size_t n, const void *nt) {
    CXX_NEW_BODY(CXX_NEW_A_NT, new_nt_fn, 0, real(n, nt))
}
EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t al) {
    CXX_NEW_BODY(CXX_NEW_AL, new_al_fn, RSPROF_HEAP_RF_ALIGNED, real(n, al))
}
EXPORT void *_ZnamSt11align_val_t(size_t n, size_t al) {
    CXX_NEW_BODY(CXX_NEW_A_AL, new_al_fn, RSPROF_HEAP_RF_ALIGNED, real(n, al))
}
EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt) {
    CXX_NEW_BODY(CXX_NEW_AL_NT, new_al_nt_fn, RSPROF_HEAP_RF_ALIGNED, real(n, al, nt))
}
EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt) {
    CXX_NEW_BODY(CXX_NEW_A_AL_NT, new_al_nt_fn, RSPROF_HEAP_RF_ALIGNED, real(n, al, nt))
}

EXPORT void _ZdlPv(void *p) { CXX_DEL_BODY(CXX_DEL, del_fn, real(p)) }
EXPORT void _ZdaPv(void *p) { CXX_DEL_BODY(CXX_DEL_A, del_fn, real(p)) }
EXPORT void _ZdlPvm(void *p, size_t n) { CXX_DEL_BODY(CXX_DEL_SZ, del_sz_fn, real(p, n)) }
EXPORT void _ZdaPvm(void *p, size_t n) { CXX_DEL_BODY(CXX_DEL_A_SZ, del_sz_fn, real(p, n)) }
EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const void *nt) {
    CXX_DEL_BODY(CXX_DEL_NT, del_nt_fn, real(p, nt))
}
EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const void *nt) {
    CXX_DEL_BODY(CXX_DEL_A_NT, del_nt_fn, real(p, nt))
}
EXPORT void _ZdlPvSt11align_val_t(void *p, size_t al) {
    CXX_DEL_BODY(CXX_DEL_AL, del_sz_fn, real(p, al))
}
EXPORT void _ZdaPvSt11align_val_t(void *p, size_t al) {
    CXX_DEL_BODY(CXX_DEL_A_AL, del_sz_fn, real(p, al))
}
EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t al) {
    CXX_DEL_BODY(CXX_DEL_SZ_AL, del_sz_al_fn, real(p, n, al))
}
EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t al) {
    CXX_DEL_BODY(CXX_DEL_A_SZ_AL, del_sz_al_fn, real(p, n, al))
}
EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt) {
    CXX_DEL_BODY(CXX_DEL_AL_NT, del_al_nt_fn, real(p, al, nt))
}
EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt) {
    CXX_DEL_BODY(CXX_DEL_A_AL_NT, del_al_nt_fn, real(p, al, nt))
}

/* ------------------------------------------------------------------ allocator detection */

/* The shim's own definitions, not what the process binds the names to. */
extern __typeof(malloc) shim_self_malloc
    __attribute__((alias("malloc"), visibility("hidden"), copy(malloc)));
extern __typeof(free) shim_self_free
    __attribute__((alias("free"), visibility("hidden"), copy(free)));
extern __typeof(calloc) shim_self_calloc
    __attribute__((alias("calloc"), visibility("hidden"), copy(calloc)));
extern __typeof(realloc) shim_self_realloc
    __attribute__((alias("realloc"), visibility("hidden"), copy(realloc)));

/* At init, with t_guard set: is malloc the shim's?  An executable that defines malloc (its
 * own allocator, or jemalloc linked statically) precedes LD_PRELOAD in symbol lookup, and so
 * does a library preloaded before the shim: then neither the program nor libc ever calls
 * ours, and a recording would read "full" with nothing in it.  The ring says so instead
 * (RSPROF_HEAP_HF_MALLOC_ELSEWHERE), and rsprof warns.  Also noted: jemalloc's mallocx
 * family, tcmalloc's tc_* and mimalloc's mi_* functions, which a program may call directly
 * (those calls are not seen; exporting them from here would make a program that tests for
 * them, `if (&mallocx)`, believe they exist). */
/* Whether the process binds NAME to a definition other than OURS. A non-PIE executable
 * that takes a function's address in its code (GCC's cc1 does with free) exports it as an
 * undefined symbol whose value is its PLT stub: that stub is the function's canonical
 * address, so dlsym returns it, yet it jumps to whatever defines the function, the shim.
 * Only a defined symbol at the address found is another allocator. */
static int defined_elsewhere(const char *name, void *ours) {
    void *found = dlsym(RTLD_DEFAULT, name);
    if (found == ours || found == NULL) return 0;
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (dladdr1(found, &info, (void **)&sym, RTLD_DL_SYMENT) == 0 || sym == NULL) return 1;
    return sym->st_shndx != SHN_UNDEF;
}

static void detect_allocator(void) {
    if (defined_elsewhere("malloc", (void *)shim_self_malloc) ||
        defined_elsewhere("free", (void *)shim_self_free) ||
        defined_elsewhere("calloc", (void *)shim_self_calloc) ||
        defined_elsewhere("realloc", (void *)shim_self_realloc)) {
        g_found_flags |= RSPROF_HEAP_HF_MALLOC_ELSEWHERE;
        shim_log("malloc is defined before the shim (executable or earlier library): "
                 "its allocations are not seen");
    }
    static const char *const apis[] = {"mallocx", "tc_malloc", "mi_malloc"};
    for (unsigned i = 0; i < sizeof apis / sizeof apis[0]; i++)
        if (dlsym(RTLD_DEFAULT, apis[i]) != NULL) g_found_flags |= RSPROF_HEAP_HF_ALLOC_API;
}

/* ------------------------------------------------------------------ injected mode */

/* `rsprof -p PID` on a process started without the shim (docs/heap-ring.md, "Injected
 * mode"): rsprof stops one thread with ptrace at a safe point, makes it call
 * dlopen(librsprof_heap_inject.so) and then rsprof_heap_inject_start(), and detaches.
 * start() creates the ring as under LD_PRELOAD and redirects the allocator calls of every
 * loaded module to the wrappers above by rewriting their GOT entries, as heaptrack's
 * libheaptrack_inject does.  rsprof_heap_inject_stop(), called the same way when the
 * recording ends (or by the shim itself once its recorder is gone), puts them back,
 * removes the ring and leaves the wrappers pass-through for whatever kept their address.
 *
 * Blocks allocated before start() have no ALLOC record: their frees are counted by the
 * reader as unknown frees and never lower the live bytes. */

/* The shim's own definitions (hidden aliases: the library is loaded RTLD_LOCAL, so the
 * plain names would resolve to libc's in our own GOT). */
#define SELF(name) \
    extern __typeof(name) shim_self_##name                                                 \
        __attribute__((alias(#name), visibility("hidden"), copy(name)))
SELF(posix_memalign);
SELF(aligned_alloc);
SELF(memalign);
SELF(valloc);
SELF(pvalloc);
SELF(malloc_usable_size);
SELF(dlclose);
SELF(_Znwm);
SELF(_Znam);
SELF(_ZnwmRKSt9nothrow_t);
SELF(_ZnamRKSt9nothrow_t);
SELF(_ZnwmSt11align_val_t);
SELF(_ZnamSt11align_val_t);
SELF(_ZnwmSt11align_val_tRKSt9nothrow_t);
SELF(_ZnamSt11align_val_tRKSt9nothrow_t);
SELF(_ZdlPv);
SELF(_ZdaPv);
SELF(_ZdlPvm);
SELF(_ZdaPvm);
SELF(_ZdlPvRKSt9nothrow_t);
SELF(_ZdaPvRKSt9nothrow_t);
SELF(_ZdlPvSt11align_val_t);
SELF(_ZdaPvSt11align_val_t);
SELF(_ZdlPvmSt11align_val_t);
SELF(_ZdaPvmSt11align_val_t);
SELF(_ZdlPvSt11align_val_tRKSt9nothrow_t);
SELF(_ZdaPvSt11align_val_tRKSt9nothrow_t);

/* In cxx_names order. */
static void *const cxx_self[CXX_COUNT] = {
    (void *)shim_self__Znwm, (void *)shim_self__Znam, (void *)shim_self__ZnwmRKSt9nothrow_t,
    (void *)shim_self__ZnamRKSt9nothrow_t, (void *)shim_self__ZnwmSt11align_val_t,
    (void *)shim_self__ZnamSt11align_val_t, (void *)shim_self__ZnwmSt11align_val_tRKSt9nothrow_t,
    (void *)shim_self__ZnamSt11align_val_tRKSt9nothrow_t, (void *)shim_self__ZdlPv,
    (void *)shim_self__ZdaPv, (void *)shim_self__ZdlPvm, (void *)shim_self__ZdaPvm,
    (void *)shim_self__ZdlPvRKSt9nothrow_t, (void *)shim_self__ZdaPvRKSt9nothrow_t,
    (void *)shim_self__ZdlPvSt11align_val_t, (void *)shim_self__ZdaPvSt11align_val_t,
    (void *)shim_self__ZdlPvmSt11align_val_t, (void *)shim_self__ZdaPvmSt11align_val_t,
    (void *)shim_self__ZdlPvSt11align_val_tRKSt9nothrow_t,
    (void *)shim_self__ZdaPvSt11align_val_tRKSt9nothrow_t,
};

/* One redirected name: a GOT entry holding `real` (what the process binds the name to) is
 * pointed at `ours`, and back at stop.  Only entries that hold exactly `real` are touched:
 * the wrappers forward to `real`, so a module bound to another allocator (its own, or
 * jemalloc's) is never handed blocks of a different heap. */
typedef struct {
    const char *name;
    void *ours;
    void *real;
    int lazy_ok; /* the process's default binding of name is `real`: a lazy PLT entry not
                    resolved yet would resolve to it, so it may be pointed at ours too */
} inject_hook;
#define INJECT_MAX_HOOKS (8 + CXX_COUNT)
static inject_hook g_hooks[INJECT_MAX_HOOKS];
static unsigned g_nhooks;
static int g_inject_lock;       /* start, stop and the rewrites: one at a time */
static unsigned long long g_adds_seen; /* dlpi_adds when every module was last rewritten */
static uint64_t g_tick_last;    /* CLOCK_MONOTONIC_COARSE ns of the last check (atomic) */
static TLS int t_tick;
#define INJECT_CHECK_NS 200000000ull
#define INJECT_CHECK_EVENTS 256

static void hook_add(const char *name, void *ours, void *real) {
    if (real == NULL || g_nhooks >= INJECT_MAX_HOOKS) return;
    void *dflt = dlsym(RTLD_DEFAULT, name);
    g_hooks[g_nhooks++] = (inject_hook){name, ours, real, dflt == real};
}

/* Called once, with t_guard set, after resolve_real. */
static void hooks_init(void) {
    hook_add("malloc", (void *)shim_self_malloc, (void *)real_malloc);
    hook_add("free", (void *)shim_self_free, (void *)real_free);
    hook_add("calloc", (void *)shim_self_calloc, (void *)real_calloc);
    hook_add("realloc", (void *)shim_self_realloc, (void *)real_realloc);
    hook_add("posix_memalign", (void *)shim_self_posix_memalign, (void *)real_posix_memalign);
    hook_add("aligned_alloc", (void *)shim_self_aligned_alloc, (void *)real_aligned_alloc);
    hook_add("memalign", (void *)shim_self_memalign, (void *)real_memalign);
    hook_add("valloc", (void *)shim_self_valloc, (void *)real_valloc);
    hook_add("pvalloc", (void *)shim_self_pvalloc, (void *)real_pvalloc);
    hook_add("malloc_usable_size", (void *)shim_self_malloc_usable_size,
             (void *)real_malloc_usable_size);
    /* dlclose: the CFI rules cached for an unloaded module go with it (see dlclose). dlopen
     * is not redirected: glibc's dlopen searches the RUNPATH and $ORIGIN of its caller,
     * which would become the shim; modules loaded later are rewritten by inject_tick. */
    hook_add("dlclose", (void *)shim_self_dlclose, (void *)real_dlclose);
    /* operator new/delete: the process's own binding (a C++ runtime loaded by the program,
     * invisible to RTLD_NEXT from a library loaded RTLD_LOCAL) is what the wrappers call. */
    uintptr_t malloc_object = object_of((void *)real_malloc);
    for (unsigned i = 0; i < CXX_COUNT; i++) {
        void *f = dlsym(RTLD_DEFAULT, cxx_names[i]);
        if (f == NULL) continue;
        cxx_set(i, f, malloc_object);
        hook_add(cxx_names[i], cxx_self[i], f);
    }
}

static ALWAYS_INLINE uintptr_t dyn_ptr(const struct dl_phdr_info *info, ElfW(Addr) v) {
    /* In memory ld.so has made most modules' dynamic entries absolute; the vDSO's and
     * read-only dynamic sections keep link-time values. */
    return v < info->dlpi_addr ? info->dlpi_addr + v : v;
}

/* Whether the page holding p is writable, without touching it: process_vm_writev on
 * ourselves obeys the page's protection (EFAULT when read-only); it writes back the value
 * already there, so a concurrent reader never sees anything else. */
static int page_writable(uintptr_t *p) {
    uintptr_t v = __atomic_load_n(p, __ATOMIC_RELAXED);
    struct iovec local = {&v, sizeof v}, remote = {p, sizeof v};
    return syscall(SYS_process_vm_writev, getpid(), &local, 1, &remote, 1, 0) == (long)sizeof v;
}

typedef struct {
    int install;       /* 1: real -> ours; 0: ours -> real */
    unsigned changed;  /* entries rewritten */
    int retry;         /* an entry was left for later (a module still being relocated) */
} patch_walk;

typedef struct {
    const struct dl_phdr_info *info;
    uintptr_t relro_lo, relro_hi; /* pages ld.so made read-only after relocation */
    patch_walk *walk;
} patch_module_ctx;

static int in_module(const struct dl_phdr_info *info, uintptr_t v) {
    for (unsigned i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && v - lo < ph->p_memsz) return 1;
    }
    return 0;
}

static void patch_slot(patch_module_ctx *m, uintptr_t *slot, const inject_hook *h, int lazy) {
    uintptr_t v = __atomic_load_n(slot, __ATOMIC_RELAXED);
    uintptr_t want;
    if (m->walk->install) {
        if (v == (uintptr_t)h->real) want = (uintptr_t)h->ours;
        else if (lazy && h->lazy_ok && v != (uintptr_t)h->ours && in_module(m->info, v))
            want = (uintptr_t)h->ours; /* a PLT entry not bound yet: its stub is in the module */
        else return;
    } else {
        if (v != (uintptr_t)h->ours) return;
        want = (uintptr_t)h->real;
    }
    uintptr_t s = (uintptr_t)slot;
    if (s - m->relro_lo < m->relro_hi - m->relro_lo) {
        if (page_writable(slot)) {
            /* RELRO not protected yet: ld.so is still relocating this module (a dlopen in
             * another thread) and will protect the page itself; next time. */
            m->walk->retry = 1;
            return;
        }
        uintptr_t page = s & ~(uintptr_t)(g_page - 1);
        if (mprotect((void *)page, g_page, PROT_READ | PROT_WRITE) != 0) return;
        __atomic_store_n(slot, want, __ATOMIC_RELEASE);
        mprotect((void *)page, g_page, PROT_READ);
    } else {
        if (!page_writable(slot)) return;
        __atomic_store_n(slot, want, __ATOMIC_RELEASE);
    }
    m->walk->changed++;
}

static const inject_hook *hook_of(const char *name) {
    for (unsigned i = 0; i < g_nhooks; i++)
        if (name[0] == g_hooks[i].name[0] && strcmp(name, g_hooks[i].name) == 0)
            return &g_hooks[i];
    return NULL;
}

static void patch_relocs(patch_module_ctx *m, uintptr_t rela, uint64_t size,
                         const ElfW(Sym) *symtab, const char *strtab, uint64_t strsz) {
    const ElfW(Rela) *r = (const ElfW(Rela) *)rela;
    for (uint64_t i = 0; i < size / sizeof *r; i++) {
        unsigned type = (unsigned)ELF64_R_TYPE(r[i].r_info);
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
        uint64_t sym = ELF64_R_SYM(r[i].r_info);
        if (sym == 0) continue;
        uint64_t off = symtab[sym].st_name;
        if (strsz != 0 && off >= strsz) continue;
        const inject_hook *h = hook_of(strtab + off);
        if (h == NULL) continue;
        patch_slot(m, (uintptr_t *)(m->info->dlpi_addr + r[i].r_offset), h,
                   type == R_X86_64_JUMP_SLOT);
    }
}

static int patch_module(struct dl_phdr_info *info, size_t size, void *data) {
    if (info->dlpi_name != NULL && strncmp(info->dlpi_name, "linux-vdso", 10) == 0) return 0;
    if (in_module(info, (uintptr_t)&patch_module)) return 0; /* our own GOT calls libc */
    patch_module_ctx m = {info, 0, 0, data};
    const ElfW(Dyn) *dyn = NULL;
    for (unsigned i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO) {
            /* ld.so protects whole pages only: the start and the end rounded down. */
            m.relro_lo = (info->dlpi_addr + ph->p_vaddr) & ~(uintptr_t)(g_page - 1);
            m.relro_hi = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz) & ~(uintptr_t)(g_page - 1);
        }
    }
    if (dyn == NULL) return 0;
    uintptr_t symtab = 0, strtab = 0, jmprel = 0, rela = 0;
    uint64_t strsz = 0, pltrelsz = 0, relasz = 0, pltrel = 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_STRSZ: strsz = d->d_un.d_val; break;
        case DT_JMPREL: jmprel = dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: pltrelsz = d->d_un.d_val; break;
        case DT_PLTREL: pltrel = d->d_un.d_val; break;
        case DT_RELA: rela = dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        default: break;
        }
    }
    if (symtab == 0 || strtab == 0) return 0;
    if (jmprel != 0 && pltrel == DT_RELA)
        patch_relocs(&m, jmprel, pltrelsz, (const ElfW(Sym) *)symtab, (const char *)strtab, strsz);
    if (rela != 0)
        patch_relocs(&m, rela, relasz, (const ElfW(Sym) *)symtab, (const char *)strtab, strsz);
    return 0;
}

static int adds_of(struct dl_phdr_info *info, size_t size, void *data) {
    *(unsigned long long *)data = info->dlpi_adds;
    return 1; /* the counter is the same in every entry */
}

/* Rewrites the GOT entries of every loaded module but ours (install), or puts them back.
 * Called with g_inject_lock held and t_guard set.  Returns the entries changed. */
static unsigned patch_all(int install) {
    unsigned long long adds = 0;
    dl_iterate_phdr(adds_of, &adds);
    patch_walk walk = {install, 0, 0};
    dl_iterate_phdr(patch_module, &walk);
    if (install) g_adds_seen = walk.retry ? 0 : adds;
    return walk.changed;
}

/* Stack bounds of a thread that was running before the shim came: the mapping that holds
 * its stack, from /proc/self/maps (read here with a small buffer: no allocation, no lock;
 * once per thread). */
static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static void inject_thread_bounds(uintptr_t here, uintptr_t *lo, uintptr_t *hi) {
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[512];
    uintptr_t a = 0, b = 0;
    int state = 0; /* 0: start address, 1: end address, 2: rest of the line */
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            char c = buf[i];
            if (c == '\n') {
                state = 0, a = 0, b = 0;
                continue;
            }
            if (state == 2) continue;
            int d = hexval(c);
            if (state == 0) {
                if (d >= 0) a = a * 16 + (uintptr_t)d;
                else state = c == '-' ? 1 : 2;
            } else if (d >= 0) {
                b = b * 16 + (uintptr_t)d;
            } else {
                if (here >= a && here < b) {
                    *lo = a, *hi = b;
                    close(fd);
                    /* Its area is released at its exit like a thread we started (the key's
                     * destructor); t_guard is set: a key past the first 32 allocates. */
                    if (g_area_key_ok && pthread_setspecific(g_area_key, (void *)1) == 0)
                        t_area_ok = 1;
                    return;
                }
                state = 2;
            }
        }
    }
    close(fd);
}

/* Stop recording: GOT entries back, ring gone.  With g_inject_lock held.  The ring's
 * mapping is replaced by anonymous memory rather than unmapped: a thread still between
 * ring() and its commit store writes there harmlessly, and the tmpfs pages are freed. */
static unsigned inject_stop_locked(void) {
    t_guard++;
    __atomic_store_n(&g_injected_on, 0, __ATOMIC_RELAXED);
    unsigned restored = patch_all(0);
    __atomic_store_n(&g_disabled, 1, __ATOMIC_RELEASE);
    spin_lock(&g_ring_lock);
    struct rsprof_heap_header *h = __atomic_exchange_n(&g_hdr, NULL, __ATOMIC_ACQ_REL);
    if (h != NULL) {
        __atomic_or_fetch(&h->flags, RSPROF_HEAP_HF_EXITED, __ATOMIC_RELEASE);
        if (!g_unlinked && g_ring_pid == getpid()) shm_unlink(g_ring_name);
        g_unlinked = 1;
        mmap(h, g_map_len, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
    if (ring_fd_ours()) close(g_ring_fd);
    g_ring_fd = -1;
    spin_unlock(&g_ring_lock);
    t_guard--;
    return restored;
}

static int trylock(int *l) { return !__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE); }

/* Every INJECT_CHECK_EVENTS events of a thread, at most every 200 ms in all: is our
 * recorder still there (rsprof killed with -9 never calls stop: the shim stops by itself),
 * and did the program load modules whose GOT still calls libc's allocator directly?
 * Never waits for a lock here: we are inside the program's malloc. */
static NOINLINE void inject_tick(void) {
    if (--t_tick > 0) return;
    t_tick = INJECT_CHECK_EVENTS;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t last = __atomic_load_n(&g_tick_last, __ATOMIC_RELAXED);
    if (now - last < INJECT_CHECK_NS ||
        !__atomic_compare_exchange_n(&g_tick_last, &last, now, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return;
    t_guard++;
    if (!heapring_session_alive(g_session_pid, g_session_start)) {
        if (trylock(&g_inject_lock)) {
            if (__atomic_load_n(&g_injected_on, __ATOMIC_RELAXED)) {
                shim_log("injected: the recording rsprof is gone: recording stopped");
                inject_stop_locked();
            }
            spin_unlock(&g_inject_lock);
        }
    } else {
        unsigned long long adds = 0;
        dl_iterate_phdr(adds_of, &adds);
        if (adds != g_adds_seen && trylock(&g_inject_lock)) {
            if (__atomic_load_n(&g_injected_on, __ATOMIC_RELAXED)) patch_all(1);
            spin_unlock(&g_inject_lock);
        }
    }
    t_guard--;
}

/* Return values of rsprof_heap_inject_start (collector/heapattach.py says them). */
enum {
    INJECT_NOT_INJECTED = -1, /* this is the LD_PRELOAD library */
    INJECT_NO_ALLOCATOR = -2, /* libc's allocator functions not found */
    INJECT_MALLOC_ELSEWHERE = -3, /* the process binds malloc to another allocator */
    INJECT_BUSY = -4,         /* already recording for another session */
    INJECT_NO_RING = -5,      /* the ring could not be created */
};

/* Called by rsprof through ptrace in one stopped thread of the target (at a point where it
 * holds neither the allocator's nor the loader's locks).  Returns the GOT entries
 * redirected (>= 0) or one of the INJECT_* errors. */
EXPORT long rsprof_heap_inject_start(long session_pid, unsigned long ring_bytes,
                                     unsigned long sample_bytes, unsigned long debug) {
    if (!g_injected) return INJECT_NOT_INJECTED;
    spin_lock(&g_inject_lock);
    t_guard++;
    long result;
    if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != ST_READY) {
        t_in_init = 1;
        resolve_real();
        if (!__atomic_load_n(&g_resolved, __ATOMIC_ACQUIRE)) {
            t_in_init = 0;
            result = INJECT_NO_ALLOCATOR;
            goto out;
        }
        read_config();
        pthread_atfork(NULL, NULL, atfork_child);
        g_area_key_ok = pthread_key_create(&g_area_key, area_release) == 0;
        pthread_atfork(NULL, NULL, area_atfork_child);
        hooks_init();
        t_in_init = 0;
        __atomic_store_n(&g_state, ST_READY, __ATOMIC_RELEASE);
    }
    if (defined_elsewhere("malloc", (void *)real_malloc) ||
        defined_elsewhere("free", (void *)real_free) ||
        defined_elsewhere("calloc", (void *)real_calloc) ||
        defined_elsewhere("realloc", (void *)real_realloc)) {
        result = INJECT_MALLOC_ELSEWHERE;
        goto out;
    }
    if (__atomic_load_n(&g_injected_on, __ATOMIC_ACQUIRE) &&
        heapring_session_alive(g_session_pid, g_session_start) &&
        g_session_pid != (int32_t)session_pid) {
        result = INJECT_BUSY;
        goto out;
    }
    if (__atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE) != NULL) inject_stop_locked();
    if (g_debug || debug) g_debug = 1;
    /* Pass-through while the GOT entries are rewritten: the wrappers record nothing until
     * the ring exists (below). */
    __atomic_store_n(&g_disabled, 1, __ATOMIC_RELEASE);
    /* One ring size for the life of the process: a writer that took the previous ring
     * just before a stop writes into that ring's old mapping (anonymous memory now) with
     * the same mask, never past it. */
    if (g_ring_bytes == 0) {
        uint64_t bytes = ring_bytes;
        if (bytes < RSPROF_HEAP_MIN_RING) bytes = RSPROF_HEAP_MIN_RING;
        if (bytes > RSPROF_HEAP_MAX_RING) bytes = RSPROF_HEAP_MAX_RING;
        uint64_t pow2 = RSPROF_HEAP_MIN_RING;
        while (pow2 < bytes) pow2 <<= 1;
        g_ring_bytes = pow2;
        g_ring_mask = pow2 / 8 - 1;
    }
    g_sample_bytes = sample_bytes;
    if (g_sample_bytes) {
        if (g_set == NULL && !set_create()) g_sample_bytes = 0;
        else set_reset();
    }
    g_session_pid = (int32_t)session_pid;
    g_session_start = heapring_start_time((int)session_pid);
    g_exit_wait_ms = 0;
    g_wait_ppid = 0;
    g_parent_reader = 0;
    /* The GOT entries first, the ring last: the ring in /dev/shm is what says "recording"
     * (the recorder attaches it, and a user or a test waiting for it then allocates).
     * Created first, as it once was, every allocation made while the injecting thread was
     * still rewriting GOT entries (preempted there on a loaded machine: 8 CPU hogs on 2
     * cores) went to libc unseen: test_attach_detach_20_times counted 15 of 60 blocks,
     * those of the injecting thread, which allocated only after the call returned. */
    result = (long)patch_all(1);
    /* Before the ring is published (g_hdr, release): a thread that sees it sees these too,
     * checks the generation, and forgets the previous ring's cached reader position and
     * named ways (set after it, a thread could write ALLOC_AGAIN records naming ways of the
     * previous ring, which the new reader drops). */
    __atomic_add_fetch(&g_ring_gen, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&g_tick_last, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_injected_on, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&g_disabled, 0, __ATOMIC_RELEASE);
    spin_lock(&g_ring_lock);
    /* A wrapper may have created it meanwhile (ring_slow, as under LD_PRELOAD). */
    if (__atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE) == NULL) create_ring();
    spin_unlock(&g_ring_lock);
    if (__atomic_load_n(&g_hdr, __ATOMIC_ACQUIRE) == NULL) {
        __atomic_store_n(&g_injected_on, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&g_disabled, 1, __ATOMIC_RELEASE);
        patch_all(0);
        result = INJECT_NO_RING;
        goto out;
    }
out:
    t_guard--;
    spin_unlock(&g_inject_lock);
    return result;
}

/* Called by rsprof through ptrace when the recording ends: the GOT entries it redirected
 * are put back (returns how many), the ring is removed, the wrappers stay pass-through. */
EXPORT long rsprof_heap_inject_stop(void) {
    if (!g_injected) return INJECT_NOT_INJECTED;
    spin_lock(&g_inject_lock);
    long restored = 0;
    if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == ST_READY)
        restored = (long)inject_stop_locked();
    spin_unlock(&g_inject_lock);
    return restored;
}
