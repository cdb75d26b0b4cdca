/* heapreader.c: rsprof._native.HeapReader, the single consumer of a target's heap ring
 * (written by the LD_PRELOAD shim, native/shim/heapshim.c; format in native/heapring.h).
 *
 * Design (Python-facing contract: docs/native.md, "HeapReader"):
 *
 * - All per-event work happens in C: the live-allocation map (address -> stack id, size)
 *   so that every free is charged to the stack that allocated the block, the stack table
 *   (de-duplicated call stacks, ids stable for the reader's lifetime) and per-stack
 *   alloc/free aggregates.  Python sees one dict per take(), never an object per event.
 * - poll() parses with the GIL released.  poll() may run on a background thread while
 *   take() runs on the main thread: all reader state is guarded by `lock`, which is only
 *   ever acquired with the GIL released, and the parser never touches Python, so the two
 *   locks cannot deadlock.
 * - The ring is untrusted input (any process of the same uid can write it): every record
 *   is bounds-checked; a malformed one stops the reader with ValueError.
 * - Memory is bounded by the target: the live map holds one entry per live block the
 *   reader knows about, the stack table one entry per distinct stack.
 * - Sampled mode (header sample_bytes = N > 0): an allocation of s bytes was recorded with
 *   probability p = 1 - exp(-s/N); it stands for s/p bytes and 1/p blocks.  Those
 *   estimates are accumulated in fixed point (16 fractional bits) so that a free subtracts
 *   exactly what its allocation added, and rounded to integers in take().
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "heapring.h"
#include "pyframes.h"
#include "stackwords.h"

#define FP_SHIFT_SAMPLED 16
/* After this many bytes the reader zeroes what it consumed and publishes read_pos, so
 * writers regain space while a long drain is still going on. */
#define PUBLISH_CHUNK (256u * 1024u)
/* A reader that has read everything the writers reserved, at this offset of the data area
 * or past it (at most a quarter of the ring), moves both cursors to the next lap's start:
 * see lap_jump(). */
#define LAP_JUMP_AT (128u * 1024u)
/* A ring file without a valid header whose pid is dead is swept once it is this old
 * (seconds): younger ones may be rings being created in another pid namespace. */
#define SCRIBBLED_RING_AGE_S 10

/* The ring is the target's to write: bounds on what a flooding or hostile target can make
 * the reader hold (docs/native.md, "Bounds").  Events beyond them are dropped and counted
 * (take()["dropped"]); the recording goes on.
 * - live map: 4 Mi blocks (slots at most 50 % full: <= 192 MiB);
 * - stack table: 256 Ki distinct stacks and 8 Mi words in all (64 MiB: return addresses,
 *   and for Python stacks the shim's raw frame words and the decoded ones).
 * Per take(), at most `new_stack_budget` new stacks (set by the recorder, at most 64 Ki)
 * and 512 Ki new announced words: symbolizing them is the checkpoint's work, and its
 * cadence depends on it.  An allocation of one more new stack is not dropped but left in
 * the ring (`deferred`) until the next take(): a real allocation is never thrown away to
 * save time, and only what the ring itself cannot hold meanwhile is lost, counted by the
 * shim (lost_events). */
#define MAX_LIVE_BLOCKS (1u << 22)
#define MAX_STACKS (1u << 18)
#define MAX_STACK_IPS (1u << 23)
#define MAX_NEW_STACKS_PER_TAKE (1u << 16)
#define MAX_NEW_IPS_PER_TAKE (1u << 19)
/* Plausibility limits for values read from the ring: no allocation is larger than the
 * x86-64 user address space (128 TiB), no sampling mean above 1 TiB, no lost counter near
 * 2^63 (it counts events, at most a few hundred million per second). */
#define MAX_ALLOC_SIZE (1ull << 47)
#define MAX_SAMPLE_BYTES (1ull << 40)
#define MAX_LOST_EVENTS (1ull << 56)
/* Words of a stack key: return addresses, then (Python records) a marker and the raw
 * frame words (native/heapring.h). */
#define KEY_MAX (RSPROF_HEAP_MAX_DEPTH + 1 + 2 * RSPROF_HEAP_MAX_PY_FRAMES)
/* Marker before the shim's raw Python words in a stack key (never announced). */
#define PY_RAW_MARK 0xFFFFFFFFFFFFFFF1ULL
/* Decoded Python frames in an announced stack are the CPU sampler's: RS_PY_MARK, then one
 * RS_PY_FRAME word per frame, innermost first (stackwords.h). */

/* ------------------------------------------------------------------ SIGBUS guard */

/* The ring is a shared file mapping the target can truncate: touching a page past the new
 * end raises SIGBUS.  The reader checks the size with fstat before every drain, and every
 * access to the mapping runs inside a guard: a SIGBUS on a guarded thread jumps back out
 * of the access (the ring is then dropped as truncated); any other SIGBUS goes to the
 * handler that was there before (Python's faulthandler, or the default: die). */
static __thread sigjmp_buf *t_bus_jmp __attribute__((tls_model("initial-exec")));
static struct sigaction g_prev_bus;
static pthread_mutex_t g_bus_lock = PTHREAD_MUTEX_INITIALIZER;

static void bus_handler(int sig, siginfo_t *info, void *uc);

static void bus_install(void) {
    pthread_mutex_lock(&g_bus_lock);
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 &&
        !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == bus_handler)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = bus_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &g_prev_bus) != 0) memset(&g_prev_bus, 0, sizeof g_prev_bus);
    }
    pthread_mutex_unlock(&g_bus_lock);
}

static void bus_handler(int sig, siginfo_t *info, void *uc) {
    sigjmp_buf *jb = t_bus_jmp;
    if (jb != NULL) {
        t_bus_jmp = NULL;
        siglongjmp(*jb, 1);
    }
    /* Not a ring access: whatever handled SIGBUS before us does. */
    if (g_prev_bus.sa_flags & SA_SIGINFO) {
        if (g_prev_bus.sa_sigaction != NULL) g_prev_bus.sa_sigaction(sig, info, uc);
        return;
    }
    if (g_prev_bus.sa_handler == SIG_IGN) return;
    if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != NULL) {
        g_prev_bus.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL); /* the faulting access runs again and kills as it would have */
}

/* ------------------------------------------------------------------ live map */

/* Open addressing, linear probing, backward-shift deletion (no tombstones, so lookups of
 * absent addresses stay short however long the target runs).  addr 0 = empty slot; a
 * block at address 0 does not exist. */
typedef struct {
    uint64_t addr;
    uint64_t size;   /* requested size */
    uint32_t stack;  /* allocating stack id */
    uint32_t tid;    /* allocating thread: its free is charged to it too (as heaptrack does) */
} live_entry;

typedef struct {
    live_entry *slots;
    size_t cap;   /* power of two */
    size_t count;
} live_map;

static inline size_t live_home(const live_map *m, uint64_t addr) {
    return (size_t)((addr * 0x9E3779B97F4A7C15ULL) >> 32) & (m->cap - 1);
}

static bool live_init(live_map *m) {
    m->cap = 1u << 16;
    m->count = 0;
    m->slots = calloc(m->cap, sizeof(live_entry));
    return m->slots != NULL;
}

static bool live_grow(live_map *m) {
    size_t old_cap = m->cap;
    live_entry *old = m->slots;
    live_entry *slots = calloc(old_cap * 2, sizeof(live_entry));
    if (slots == NULL) return false;
    m->slots = slots;
    m->cap = old_cap * 2;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].addr == 0) continue;
        size_t j = live_home(m, old[i].addr);
        while (slots[j].addr != 0) j = (j + 1) & (m->cap - 1);
        slots[j] = old[i];
    }
    free(old);
    return true;
}

/* Inserts addr; if it was already live (its free was lost), *had_old is set and *old
 * receives the previous entry, which the caller treats as freed.  Returns 1, 0 when out of
 * memory, -1 when the map holds MAX_LIVE_BLOCKS blocks and addr is not one of them. */
static int live_put(live_map *m, uint64_t addr, uint64_t size, uint32_t stack, uint32_t tid,
                    bool *had_old, live_entry *old) {
    bool full = m->count >= MAX_LIVE_BLOCKS;
    if (!full && (m->count + 1) * 2 > m->cap && !live_grow(m)) return 0;
    size_t j = live_home(m, addr);
    for (;;) {
        live_entry *e = &m->slots[j];
        if (e->addr == 0) {
            if (full) return -1;
            e->addr = addr;
            e->size = size;
            e->stack = stack;
            e->tid = tid;
            m->count++;
            *had_old = false;
            return 1;
        }
        if (e->addr == addr) {
            *old = *e;
            *had_old = true;
            e->size = size;
            e->stack = stack;
            e->tid = tid;
            return 1;
        }
        j = (j + 1) & (m->cap - 1);
    }
}

static bool live_take(live_map *m, uint64_t addr, live_entry *out) {
    size_t mask = m->cap - 1;
    size_t j = live_home(m, addr);
    for (;;) {
        live_entry *e = &m->slots[j];
        if (e->addr == 0) return false;
        if (e->addr == addr) break;
        j = (j + 1) & mask;
    }
    *out = m->slots[j];
    /* Backward shift: pull later entries of the cluster into the hole when that does not
     * move them before their home slot. */
    size_t hole = j;
    for (size_t k = (j + 1) & mask;; k = (k + 1) & mask) {
        live_entry *e = &m->slots[k];
        if (e->addr == 0) break;
        size_t home = live_home(m, e->addr);
        /* e may move to `hole` iff home is not in the cyclic range (hole, k]. */
        bool stays = (hole <= k) ? (home > hole && home <= k) : (home > hole || home <= k);
        if (!stays) {
            m->slots[hole] = *e;
            hole = k;
        }
    }
    m->slots[hole].addr = 0;
    m->count--;
    return true;
}

/* ------------------------------------------------------------------ stack table */

typedef struct {
    uint64_t off;    /* index of the first ip in the ip pool */
    uint32_t depth;
    uint32_t dirty;  /* on the dirty list since the last take() */
    uint64_t ann_off;   /* stacks with Python frames: what take() announces (native ips,  */
    uint32_t ann_depth; /* RS_PY_MARK, decoded frames; or native only), 0 = the key itself */
    uint32_t pad;
    int64_t alloc_bytes, alloc_count, free_bytes, free_count; /* since the last take(), in
                                                                 units (see fp_shift) */
} stack_info;

typedef struct {
    uint64_t hash;
    uint32_t id1; /* stack id + 1; 0 = empty */
    uint32_t pad;
} stack_slot;

typedef struct {
    stack_slot *slots;
    size_t cap;
    stack_info *info;
    size_t count, info_cap;
    uint64_t *ips;
    size_t nips, ips_cap;
    size_t announced; /* words take() announces for all stacks so far (the per-take budget) */
} stack_table;

static uint64_t stack_hash(const uint64_t *ips, unsigned depth) {
    uint64_t h = 0x84222325CBF29CE4ULL ^ depth;
    for (unsigned i = 0; i < depth; i++) {
        h = (h ^ ips[i]) * 0x100000001B3ULL;
        h ^= h >> 29;
    }
    return h;
}

static bool stacks_init(stack_table *t) {
    memset(t, 0, sizeof *t);
    t->cap = 1u << 12;
    t->slots = calloc(t->cap, sizeof(stack_slot));
    t->info_cap = 1u << 10;
    t->info = malloc(t->info_cap * sizeof(stack_info));
    t->ips_cap = 1u << 14;
    t->ips = malloc(t->ips_cap * sizeof(uint64_t));
    return t->slots && t->info && t->ips;
}

static void stacks_free(stack_table *t) {
    free(t->slots);
    free(t->info);
    free(t->ips);
    memset(t, 0, sizeof *t);
}

static bool stacks_grow_slots(stack_table *t) {
    size_t cap = t->cap * 2;
    stack_slot *slots = calloc(cap, sizeof(stack_slot));
    if (slots == NULL) return false;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slots[i].id1 == 0) continue;
        size_t j = (size_t)(t->slots[i].hash >> 20) & (cap - 1);
        while (slots[j].id1 != 0) j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return true;
}

/* stacks_intern() results besides an id: out of memory (retry later), over a memory bound
 * (MAX_STACKS, MAX_STACK_IPS: dropped, counted), over this take's budget (`new_budget` new
 * stacks or MAX_NEW_IPS_PER_TAKE new words since `stacks_at_take` / `ips_at_take`: the
 * record waits in the ring for the next take). */
enum { STACK_NOMEM = -1, STACK_OVER_BOUND = -2, STACK_OVER_BUDGET = -3 };
static bool pool_reserve(stack_table *t, size_t n) {
    if (t->nips + n <= t->ips_cap) return true;
    size_t cap = t->ips_cap;
    while (t->nips + n > cap) cap *= 2;
    uint64_t *ips_pool = realloc(t->ips, cap * sizeof(uint64_t));
    if (ips_pool == NULL) return false;
    t->ips = ips_pool;
    t->ips_cap = cap;
    return true;
}

/* Returns the id of this stack, adding it if new, or one of the STACK_* results above. */
static int64_t stacks_intern(stack_table *t, const uint64_t *ips, unsigned depth,
                             unsigned native, size_t stacks_at_take, size_t ips_at_take,
                             size_t new_budget, bool *created) {
    *created = false;
    uint64_t h = stack_hash(ips, depth);
    size_t mask = t->cap - 1;
    size_t j = (size_t)(h >> 20) & mask;
    for (;;) {
        stack_slot *s = &t->slots[j];
        if (s->id1 == 0) break;
        if (s->hash == h) {
            const stack_info *si = &t->info[s->id1 - 1];
            if (si->depth == depth &&
                memcmp(&t->ips[si->off], ips, depth * sizeof(uint64_t)) == 0)
                return s->id1 - 1;
        }
        j = (j + 1) & mask;
    }
    /* The per-take budget counts what take() will announce (Python stacks: native
     * addresses, a marker, one word per frame), not the shim's raw words in the key. */
    unsigned announce = depth == native ? depth : native + 1 + (depth - native - 1) / 2;
    if (t->count >= MAX_STACKS || t->nips + depth > MAX_STACK_IPS) return STACK_OVER_BOUND;
    if (t->count - stacks_at_take >= new_budget ||
        t->announced + announce - ips_at_take > MAX_NEW_IPS_PER_TAKE)
        return STACK_OVER_BUDGET;
    if (t->count == t->info_cap) {
        stack_info *info = realloc(t->info, t->info_cap * 2 * sizeof(stack_info));
        if (info == NULL) return STACK_NOMEM;
        t->info = info;
        t->info_cap *= 2;
    }
    if (!pool_reserve(t, depth)) return STACK_NOMEM;
    uint32_t id = (uint32_t)t->count++;
    stack_info *si = &t->info[id];
    memset(si, 0, sizeof *si);
    si->off = t->nips;
    si->depth = depth;
    memcpy(&t->ips[t->nips], ips, depth * sizeof(uint64_t));
    t->nips += depth;
    t->slots[j].hash = h;
    t->slots[j].id1 = id + 1;
    t->announced += announce;
    *created = true;
    if (t->count * 2 > t->cap && !stacks_grow_slots(t)) {
        /* The stack is stored and findable (the table is at most half full before the
         * insert); growing again later retries. */
    }
    return id;
}

/* ------------------------------------------------------------------ per-thread deltas */

/* The same deltas as stack_info's, split by the allocating thread: (stack, tid) -> sums
 * since the last take().  Emptied by every take(), so it holds only what one interval
 * touched.  Bounded by MAX_THREAD_SITES entries per take(); past that, activity is charged
 * to tid 0 ("thread unknown"), so the per-thread rows still add up to the per-stack ones. */
#define MAX_THREAD_SITES (1u << 19)

typedef struct {
    uint32_t stack, tid;
    int64_t alloc_bytes, alloc_count, free_bytes, free_count; /* units */
} thread_site;

typedef struct {
    uint32_t *slots;    /* index + 1 into `entries`; 0 = empty */
    size_t cap;         /* power of two, at least twice `count` */
    thread_site *entries;
    size_t count, entries_cap;
} thread_sites;

static inline size_t ts_home(const thread_sites *t, uint32_t stack, uint32_t tid) {
    uint64_t k = ((uint64_t)stack << 32 | tid) * 0x9E3779B97F4A7C15ULL;
    return (size_t)(k >> 32) & (t->cap - 1);
}

static bool ts_grow(thread_sites *t) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    uint32_t *slots = calloc(cap, sizeof(uint32_t));
    if (slots == NULL) return false;
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    for (size_t i = 0; i < t->count; i++) {
        size_t j = ts_home(t, t->entries[i].stack, t->entries[i].tid);
        while (slots[j] != 0) j = (j + 1) & (cap - 1);
        slots[j] = (uint32_t)i + 1;
    }
    return true;
}

/* The entry of (stack, tid), added if new; NULL when out of memory. */
static thread_site *ts_get(thread_sites *t, uint32_t stack, uint32_t tid) {
    if (t->count >= MAX_THREAD_SITES) tid = 0;
    if ((t->count + 1) * 2 > t->cap && !ts_grow(t)) return NULL;
    size_t j = ts_home(t, stack, tid);
    for (;; j = (j + 1) & (t->cap - 1)) {
        uint32_t k = t->slots[j];
        if (k == 0) break;
        thread_site *e = &t->entries[k - 1];
        if (e->stack == stack && e->tid == tid) return e;
    }
    if (t->count == t->entries_cap) {
        size_t cap = t->entries_cap ? t->entries_cap * 2 : 1024;
        thread_site *entries = realloc(t->entries, cap * sizeof(thread_site));
        if (entries == NULL) return NULL;
        t->entries = entries;
        t->entries_cap = cap;
    }
    thread_site *e = &t->entries[t->count];
    memset(e, 0, sizeof *e);
    e->stack = stack;
    e->tid = tid;
    t->slots[j] = (uint32_t)++t->count;
    return e;
}

/* Empties the table after a take(); a table grown by a burst shrinks back. */
static void ts_reset(thread_sites *t) {
    if (t->cap > (1u << 16)) {
        free(t->slots);
        free(t->entries);
        memset(t, 0, sizeof *t);
        return;
    }
    if (t->slots != NULL) memset(t->slots, 0, t->cap * sizeof(uint32_t));
    t->count = 0;
}

static void ts_free(thread_sites *t) {
    free(t->slots);
    free(t->entries);
    memset(t, 0, sizeof *t);
}

/* ------------------------------------------------------------------ ways */

/* The stack each thread's memo ways hold (docs/heap-ring.md, "Ways"): open addressing by
 * tid, with the last thread's entry remembered (an allocating thread writes runs of
 * records).  Entries are never removed: a new thread with a reused tid names its ways
 * before it repeats them. */
#define MAX_WAY_THREADS (1u << 20)
typedef struct {
    uint32_t tid; /* 0: empty */
    uint32_t stack1[RSPROF_HEAP_MAX_WAYS]; /* stack id + 1; 0: not named */
} way_entry;
typedef struct {
    way_entry *entries;
    size_t cap, count, last;
} way_table;

/* The ways of `tid`; NULL when the thread named none (create: out of memory, or over the
 * bound: its ways are then forgotten, and their repeats dropped and counted). */
static uint32_t *ways_of(way_table *t, uint32_t tid, bool create) {
    if (tid == 0) return NULL;
    if (t->cap && t->entries[t->last].tid == tid) return t->entries[t->last].stack1;
    if (t->cap == 0 || (create && (t->count + 1) * 2 > t->cap)) {
        if (!create) return NULL;
        size_t cap = t->cap ? t->cap * 2 : 64;
        if (t->count >= MAX_WAY_THREADS) return NULL;
        way_entry *e = calloc(cap, sizeof *e);
        if (e == NULL) return NULL;
        for (size_t i = 0; i < t->cap; i++) {
            if (t->entries[i].tid == 0) continue;
            size_t j = (t->entries[i].tid * 0x9E3779B1u) & (cap - 1);
            while (e[j].tid != 0) j = (j + 1) & (cap - 1);
            e[j] = t->entries[i];
        }
        free(t->entries);
        t->entries = e;
        t->cap = cap;
        t->last = 0;
    }
    size_t j = (tid * 0x9E3779B1u) & (t->cap - 1);
    for (;; j = (j + 1) & (t->cap - 1)) {
        if (t->entries[j].tid == tid) break;
        if (t->entries[j].tid == 0) {
            if (!create) return NULL;
            t->entries[j].tid = tid;
            t->count++;
            break;
        }
    }
    t->last = j;
    return t->entries[j].stack1;
}

/* ------------------------------------------------------------------ reader object */

#define PY_MEMO 16384
typedef struct {
    uint64_t code_tag; /* code object and tag mixed, | 1; 0 = empty */
    int64_t unit;
    uint32_t function; /* 0: did not decode */
    int32_t line;
} py_memo;

/* RERR_DEFER: the record waits in the ring for the next take() (a new stack over the
 * take's budget); not an error. */
enum { RERR_NONE = 0, RERR_NOMEM, RERR_CORRUPT, RERR_TRUNCATED, RERR_DEFER };

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    bool lock_ready;
    bool closed;
    int pid;
    struct rsprof_heap_header *hdr;
    uint64_t *data;
    size_t map_len;
    uint64_t ring_size;  /* copied at attach: the header is not trusted afterwards */
    uint64_t mask;       /* word mask */
    uint64_t read_pos;
    uint64_t sample_bytes;
    unsigned max_depth;
    int fp_shift;        /* 0 in full mode, FP_SHIFT_SAMPLED in sampled mode */
    uint64_t start_time;
    live_map live;
    stack_table stacks;
    thread_sites by_thread;
    way_table ways;
    uint64_t inode;           /* of the ring file attached (the name may move on) */
    uint64_t created_mono_ns; /* header created_mono_ns: which image of the pid made it */
    char name[64];            /* its name in /dev/shm */
    uint64_t again;           /* ALLOC_AGAIN records read (totals since attach) */
    uint64_t lap_jumps;       /* lap_jump()s made */
    uint32_t *dirty;
    size_t ndirty, dirty_cap;
    uint32_t reported_stacks; /* stacks with id < this were returned by take() */
    size_t new_stack_budget;  /* new stacks one take() announces, 1..MAX_NEW_STACKS_PER_TAKE */
    size_t budget_now;        /* the budget of the drain under way (see drain_records) */
    bool deferred;            /* a record waits in the ring for the next take() */
    size_t reported_ips;      /* stack-table announced words at the last take() */
    uint64_t events;          /* since the last take() */
    uint64_t unknown_frees;   /* since the last take() */
    uint64_t lost_seen;       /* header lost_events at the last take() */
    uint64_t lost_last;       /* header lost_events at the last check (never goes down) */
    uint64_t dropped;         /* events dropped by the reader's bounds since the last take() */
    int fd;                   /* the ring file, kept open to fstat it before every drain */
    const char *error_what;   /* what was wrong (static string) */
    int64_t live_bytes, live_blocks; /* units */
    /* Python frames (set_python): the PyFrameReader of the target, whose function ids the
     * announced stacks carry; decoded when a stack is first seen, in poll(). */
    PyObject *py_obj;
    py_memo *py_memo;         /* PY_MEMO entries, allocated by set_python */
    rs_pyreader *py;
    pthread_mutex_t *py_lock;
    bool py_refused;          /* set_python(None): Python records are kept native only */
    bool py_wanted;           /* a Python record waits for set_python() */
    uint64_t py_decoded, py_partial, py_undecoded; /* new stacks with all / some / none of
                                                        their Python frames */
    int error;                /* RERR_*: sticky */
    uint64_t error_pos;
} HeapReaderObject;

static PyTypeObject HeapReaderType;

/* Weight of one recorded allocation of `size` bytes, in units; false when the size is
 * implausible (the record is then corrupt). */
static inline bool weigh(const HeapReaderObject *r, uint64_t size, int64_t *bytes,
                         int64_t *count) {
    if (size > MAX_ALLOC_SIZE) return false;
    if (r->fp_shift == 0) {
        *bytes = (int64_t)size;
        *count = 1;
        return true;
    }
    if (size == 0) {
        *bytes = 0;
        *count = 1 << FP_SHIFT_SAMPLED;
        return true;
    }
    double p = -expm1(-(double)size / (double)r->sample_bytes);
    if (p < 1e-300) p = 1e-300;
    double one = (double)(1 << FP_SHIFT_SAMPLED);
    double b = (double)size / p * one, c = one / p;
    if (!(b < 0x1p62) || !(c < 0x1p62)) return false;
    *bytes = (int64_t)llround(b);
    *count = (int64_t)llround(c);
    return true;
}

/* a += b; false on overflow (only a hostile ring gets there: the sums are bounded by
 * the memory a process can have). */
static inline bool add_ck(int64_t *a, int64_t b) { return !__builtin_add_overflow(*a, b, a); }

static inline bool mark_dirty(HeapReaderObject *r, uint32_t id) {
    stack_info *si = &r->stacks.info[id];
    if (si->dirty) return true;
    if (r->ndirty == r->dirty_cap) {
        size_t cap = r->dirty_cap ? r->dirty_cap * 2 : 1024;
        uint32_t *d = realloc(r->dirty, cap * sizeof(uint32_t));
        if (d == NULL) return false;
        r->dirty = d;
        r->dirty_cap = cap;
    }
    r->dirty[r->ndirty++] = id;
    si->dirty = 1;
    return true;
}

/* Record handlers: RERR_NONE, RERR_NOMEM (retry later) or RERR_CORRUPT. */
static inline int charge_free(HeapReaderObject *r, const live_entry *e) {
    int64_t b, c;
    if (!weigh(r, e->size, &b, &c)) return RERR_CORRUPT;
    thread_site *ts = ts_get(&r->by_thread, e->stack, e->tid);
    if (ts == NULL) return RERR_NOMEM;
    stack_info *si = &r->stacks.info[e->stack];
    if (!add_ck(&si->free_bytes, b) || !add_ck(&si->free_count, c) ||
        !add_ck(&ts->free_bytes, b) || !add_ck(&ts->free_count, c) ||
        !add_ck(&r->live_bytes, -b) || !add_ck(&r->live_blocks, -c))
        return RERR_CORRUPT;
    return mark_dirty(r, e->stack) ? RERR_NONE : RERR_NOMEM;
}

/* Decoded frames by (code object, tag, instruction): a stack's frames were mostly seen in
 * other stacks already, and a matching tag means the same code object (or an identical
 * one), so its decoding stands without reading the target again. Failures (a code object
 * freed or replaced) are remembered too: freed stays freed. Direct mapped. */

static int py_decode(HeapReaderObject *r, uint64_t code, uint32_t tag, int64_t unit,
                     uint32_t *function, int32_t *line) {
    uint64_t key = (code ^ ((uint64_t)tag << 32) ^ ((uint64_t)tag >> 3)) | 1;
    py_memo *m = NULL;
    if (r->py_memo != NULL) {
        uint64_t h = (key ^ (uint64_t)unit * 0x9E3779B97F4A7C15ULL) * 0xC2B2AE3D27D4EB4FULL;
        m = &r->py_memo[h >> (64 - 14)]; /* PY_MEMO = 2^14 */
        if (m->code_tag == key && m->unit == unit) {
            *function = m->function;
            *line = m->line;
            return m->function ? 0 : -1;
        }
    }
    int rc = rs_pyreader_code(r->py, code, tag, unit, function, line);
    if (rc == RS_PY_NOMEM) return -1; /* not remembered: may work later */
    if (rc != 0 || *function >= (1u << 30)) *function = 0, *line = 0, rc = -1;
    if (m != NULL) *m = (py_memo){key, unit, *function, *line};
    return rc;
}

/* A new stack whose key holds the shim's raw Python words after `native` return
 * addresses: decodes them (code objects read from the target, checked against their tags)
 * into what take() announces; native only when any frame does not decode. */
static int decode_python(HeapReaderObject *r, uint32_t id, unsigned native) {
    stack_table *t = &r->stacks;
    stack_info *si = &t->info[id];
    unsigned npy = (si->depth - native - 1) / 2;
    uint64_t ann[KEY_MAX];
    memcpy(ann, &t->ips[si->off], native * sizeof(uint64_t));
    unsigned n = native;
    /* A frame whose code object is gone (freed since the allocation: the body of a module
     * being imported is freed once the import is done) or replaced keeps its place, as
     * function id 0 ("[python code freed]"), so the frames around it still splice. */
    bool partial = false;
    if (r->py != NULL) {
        ann[n++] = RS_PY_MARK;
        pthread_mutex_lock(r->py_lock);
        for (unsigned k = 0; k < npy; k++) {
            uint64_t w0 = t->ips[si->off + native + 1 + 2 * k];
            uint64_t w1 = t->ips[si->off + native + 2 + 2 * k];
            uint32_t function = 0;
            int32_t line = 0;
            if (py_decode(r, w0 & ~1ull, (uint32_t)(w1 >> 32), (int64_t)(int32_t)(uint32_t)w1,
                          &function, &line) != 0) {
                function = 0;
                line = 0;
                partial = true;
            }
            ann[n++] = RS_PY_FRAME(function, line, w0 & 1);
        }
        pthread_mutex_unlock(r->py_lock);
        if (partial) r->py_partial++;
        else r->py_decoded++;
    } else {
        r->py_undecoded++;
    }
    if (!pool_reserve(t, n)) return RERR_NOMEM;
    si = &t->info[id];
    si->ann_off = t->nips;
    si->ann_depth = n;
    memcpy(&t->ips[t->nips], ann, n * sizeof(uint64_t));
    t->nips += n;
    return RERR_NONE;
}

/* Charges an allocation of b bytes / c blocks (weighed) at addr, by thread tid, to a
 * stack.  Looks the thread's entry up before the block is inserted: running out of memory
 * here leaves the record for a later poll with nothing charged yet. */
static int charge_alloc(HeapReaderObject *r, uint64_t addr, uint64_t size, int64_t b,
                        int64_t c, uint32_t tid, uint32_t id) {
    thread_site *ts = ts_get(&r->by_thread, id, tid);
    if (ts == NULL) return RERR_NOMEM;
    size_t ts_index = (size_t)(ts - r->by_thread.entries);
    bool had_old;
    live_entry old;
    int put = live_put(&r->live, addr, size, id, tid, &had_old, &old);
    if (put == 0) return RERR_NOMEM;
    if (put < 0) {
        r->dropped++;
        return RERR_NONE;
    }
    /* The same address live twice: its free was lost (ring full).  It was certainly
     * freed, so charge that free to the old block's stack. */
    if (had_old) {
        int e = charge_free(r, &old);
        if (e != RERR_NONE) return e;
    }
    ts = &r->by_thread.entries[ts_index]; /* charge_free may have moved the entries */
    stack_info *si = &r->stacks.info[id];
    if (!add_ck(&si->alloc_bytes, b) || !add_ck(&si->alloc_count, c) ||
        !add_ck(&ts->alloc_bytes, b) || !add_ck(&ts->alloc_count, c) ||
        !add_ck(&r->live_bytes, b) || !add_ck(&r->live_blocks, c))
        return RERR_CORRUPT;
    return mark_dirty(r, id) ? RERR_NONE : RERR_NOMEM;
}

/* An ALLOC record; way (1 .. RSPROF_HEAP_MAX_WAYS, 0: none) is the memo way of thread tid
 * that now holds this stack. */
static int on_alloc(HeapReaderObject *r, uint64_t addr, uint64_t size, uint32_t tid,
                    const uint64_t *ips, unsigned depth, unsigned native, unsigned way) {
    int64_t b, c;
    if (addr == 0 || !weigh(r, size, &b, &c)) return RERR_CORRUPT; /* malloc never records NULL */
    bool created;
    int64_t id = stacks_intern(&r->stacks, ips, depth, native, r->reported_stacks,
                               r->reported_ips, r->budget_now, &created);
    if (id == STACK_NOMEM) return RERR_NOMEM;
    /* Before its way is touched: read again after the next take(), the record names it. */
    if (id == STACK_OVER_BUDGET) return RERR_DEFER;
    uint32_t *ways = way ? ways_of(&r->ways, tid, true) : NULL;
    if (ways != NULL) ways[way - 1] = id >= 0 ? (uint32_t)id + 1 : 0; /* 0: repeats dropped */
    if (id == STACK_OVER_BOUND) { /* over a memory bound: dropped, counted */
        r->dropped++;
        return RERR_NONE;
    }
    /* A new stack with Python frames is decoded now, while its code objects most likely
     * still exist (also when a first try ran out of memory: ann_depth is still 0). */
    (void)created;
    if (depth > native && r->stacks.info[id].ann_depth == 0) {
        int e = decode_python(r, (uint32_t)id, native);
        if (e != RERR_NONE) return e;
    }
    return charge_alloc(r, addr, size, b, c, tid, (uint32_t)id);
}

/* An ALLOC_AGAIN record: the stack of thread tid's way (1 .. RSPROF_HEAP_MAX_WAYS). */
static int on_again(HeapReaderObject *r, uint64_t addr, uint64_t size, uint32_t tid,
                    unsigned way) {
    int64_t b, c;
    if (addr == 0 || !weigh(r, size, &b, &c)) return RERR_CORRUPT;
    const uint32_t *ways = ways_of(&r->ways, tid, false);
    if (ways == NULL || ways[way - 1] == 0) { /* named to a reader before us, or dropped */
        r->dropped++;
        return RERR_NONE;
    }
    int e = charge_alloc(r, addr, size, b, c, tid, ways[way - 1] - 1);
    if (e == RERR_NONE) r->again++;
    return e;
}

static int on_free(HeapReaderObject *r, uint64_t addr) {
    live_entry e;
    if (!live_take(&r->live, addr, &e)) {
        r->unknown_frees++;
        return RERR_NONE;
    }
    return charge_free(r, &e);
}

/* Zeroes ring bytes [from, to) (positions), wrapping around the end of the data area. */
static void zero_range(HeapReaderObject *r, uint64_t from, uint64_t to) {
    while (from < to) {
        uint64_t off = from & (r->ring_size - 1);
        uint64_t n = to - from;
        if (n > r->ring_size - off) n = r->ring_size - off;
        memset((char *)r->data + off, 0, n);
        from += n;
    }
}

/* Zeroes what was consumed since `published` and hands it back to the writers. */
static void publish(HeapReaderObject *r, uint64_t *published) {
    if (r->read_pos == *published) return;
    zero_range(r, *published, r->read_pos);
    __atomic_store_n(&r->hdr->read_pos, r->read_pos, __ATOMIC_RELEASE);
    *published = r->read_pos;
}

static void set_error(HeapReaderObject *r, int error, uint64_t pos, const char *what) {
    r->error = error;
    r->error_pos = pos;
    r->error_what = what;
}

/* A lap jump: the reader has read everything up to `pos` and no writer has reserved past
 * it (write_pos == pos): both cursors move to the next lap's start, so the writers go on
 * at data offset 0 instead of in the ring's tail.  The shim allocates the ring's tmpfs
 * pages as the writers reach them (a prefix of the data area), so while the reader keeps
 * up the target reuses its first pages again and again instead of allocating and mapping
 * every page of a 64 MiB ring (sqlite3's 3.3 M allocations: ~45 ms of the target's system
 * time).  Nothing is lost for it: the positions jumped over were never reserved, hold
 * zeros (or no page yet) and are never read or zeroed, and once read_pos is stored the
 * writers have the whole ring again, as without the jump.  What was read is published
 * (zeroed, read_pos stored) before the CAS: between the CAS and the store of the new
 * read_pos, writers reserve in the new lap below the offset of the published one, at least
 * lap_jump_at() bytes (published first, the room left in that moment would be the offset
 * of the previous publication, possibly nothing: events lost).  The CAS fails when a writer
 * has reserved meanwhile.  True when it jumped (read_pos and *published are the next lap's
 * start). */
static uint64_t lap_jump_at(const HeapReaderObject *r) {
    return r->ring_size / 4 < LAP_JUMP_AT ? r->ring_size / 4 : LAP_JUMP_AT;
}
static bool lap_jump(HeapReaderObject *r, uint64_t pos, uint64_t *published) {
    uint64_t off = pos & (r->ring_size - 1);
    if (off < lap_jump_at(r) || r->read_pos != pos) return false;
    publish(r, published);
    uint64_t expect = pos, next = pos - off + r->ring_size;
    if (!__atomic_compare_exchange_n(&r->hdr->write_pos, &expect, next, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return false;
    r->read_pos = next;
    __atomic_store_n(&r->hdr->read_pos, next, __ATOMIC_RELEASE);
    *published = next;
    r->lap_jumps++;
    return true;
}

/* Tries of lap_jump() per poll: a writer that reserves between the reader's look at the
 * next commit word and its CAS makes it fail; the reader reads on and tries again. */
#define LAP_JUMP_TRIES 8

/* Drains committed records, at most one lap.  Runs inside the SIGBUS guard (drain()).
 * Returns the number of events processed. */
static uint64_t drain_records(HeapReaderObject *r) {
    uint64_t *d = r->data;
    const uint64_t m = r->mask;
    uint64_t pos = r->read_pos, published = pos, limit = pos + r->ring_size, n = 0;
    uint64_t ips[KEY_MAX];
    /* A process that has marked its ring exited writes no more and waits at exit until it
     * is read (RSPROF_HEAP_EXIT_WAIT_MS): its ring is read as fast as before budgets, so it
     * exits as soon as it did (a shell script's short children), within the per-take
     * bounds. */
    bool exited =
        (__atomic_load_n(&r->hdr->flags, __ATOMIC_ACQUIRE) & RSPROF_HEAP_HF_EXITED) != 0;
    unsigned jump_tries = exited ? LAP_JUMP_TRIES : 0; /* an exited ring gets no more records */
    r->budget_now = exited ? MAX_NEW_STACKS_PER_TAKE : r->new_stack_budget;
    while (pos < limit) {
        uint64_t i = pos >> 3;
        uint64_t head = __atomic_load_n(&d[i & m], __ATOMIC_ACQUIRE);
        if (head == 0) { /* not committed yet */
            if (jump_tries < LAP_JUMP_TRIES && r->error == RERR_NONE &&
                (pos & (r->ring_size - 1)) >= lap_jump_at(r)) {
                if (lap_jump(r, pos, &published)) break;
                jump_tries++;
                continue; /* a writer reserved meanwhile: read its record when committed */
            }
            break;
        }
        unsigned kind = RSPROF_HEAP_HEAD_KIND(head);
        unsigned words;
        int err;
        if (kind == RSPROF_HEAP_REC_FREE_SHORT) {
            words = RSPROF_HEAP_FREE_SHORT_WORDS;
            err = on_free(r, RSPROF_HEAP_FREE_SHORT_ADDR(head));
        } else if (kind == RSPROF_HEAP_REC_FREE) {
            words = RSPROF_HEAP_FREE_WORDS;
            err = on_free(r, d[(i + 1) & m]);
        } else if (kind == RSPROF_HEAP_REC_ALLOC) {
            unsigned depth = RSPROF_HEAP_HEAD_DEPTH(head);
            if (depth == 0 || depth > r->max_depth) {
                set_error(r, RERR_CORRUPT, pos, "bad stack depth");
                break;
            }
            words = RSPROF_HEAP_ALLOC_WORDS(depth);
            uint64_t addr = d[(i + 1) & m], size = d[(i + 2) & m];
            for (unsigned k = 0; k < depth; k++) ips[k] = d[(i + 3 + k) & m];
            unsigned key = depth;
            if (RSPROF_HEAP_HEAD_FLAGS(head) & RSPROF_HEAP_RF_PYTHON) {
                uint64_t npy = d[(i + 3 + depth) & m];
                if (npy == 0 || npy > RSPROF_HEAP_MAX_PY_FRAMES) {
                    set_error(r, RERR_CORRUPT, pos, "bad Python frame count");
                    break;
                }
                if (r->py == NULL && !r->py_refused) {
                    r->py_wanted = true; /* the caller sets a reader (or None) first */
                    break;
                }
                words += RSPROF_HEAP_PY_WORDS(npy);
                if (r->py != NULL) {
                    ips[key++] = PY_RAW_MARK;
                    for (unsigned k = 0; k < 2 * npy; k++) ips[key++] = d[(i + 4 + depth + k) & m];
                } else {
                    r->py_undecoded++;
                }
            }
            unsigned way = RSPROF_HEAP_HEAD_WAY(head);
            if (way > RSPROF_HEAP_MAX_WAYS ||
                (way && (RSPROF_HEAP_HEAD_FLAGS(head) & RSPROF_HEAP_RF_PYTHON))) {
                set_error(r, RERR_CORRUPT, pos, "bad way");
                break;
            }
            err = on_alloc(r, addr, size, RSPROF_HEAP_HEAD_TID(head), ips, key, depth, way);
        } else if (kind == RSPROF_HEAP_REC_ALLOC_AGAIN || kind == RSPROF_HEAP_REC_AGAIN_SHORT) {
            unsigned way = RSPROF_HEAP_HEAD_WAY(head);
            if (way == 0 || way > RSPROF_HEAP_MAX_WAYS) {
                set_error(r, RERR_CORRUPT, pos, "bad way");
                break;
            }
            bool in_head = kind == RSPROF_HEAP_REC_AGAIN_SHORT; /* the size */
            words = in_head ? RSPROF_HEAP_AGAIN_SHORT_WORDS : RSPROF_HEAP_AGAIN_WORDS;
            uint64_t size = in_head ? RSPROF_HEAP_AGAIN_SHORT_SIZE(head) : d[(i + 2) & m];
            err = on_again(r, d[(i + 1) & m], size, RSPROF_HEAP_HEAD_TID(head), way);
        } else {
            set_error(r, RERR_CORRUPT, pos, "bad record kind");
            break;
        }
        if (err == RERR_NOMEM) { /* out of memory: leave this record for a later poll */
            r->error = RERR_NOMEM;
            break;
        }
        if (err == RERR_DEFER) { /* the take's budget is spent: read it after the take */
            r->deferred = true;
            break;
        }
        if (err == RERR_CORRUPT) {
            set_error(r, RERR_CORRUPT, pos, "implausible size, address or total");
            break;
        }
        pos += (uint64_t)words * 8;
        r->read_pos = pos;
        n++;
        if (pos - published >= PUBLISH_CHUNK) publish(r, &published);
    }
    publish(r, &published);
    r->events += n;
    if (r->error == RERR_NONE) {
        /* The lost counter only grows (atomic adds by the shim): anything else is a
         * scribbled header, not a number to report. */
        uint64_t lost = __atomic_load_n(&r->hdr->lost_events, __ATOMIC_ACQUIRE);
        if (lost < r->lost_last || lost > MAX_LOST_EVENTS)
            set_error(r, RERR_CORRUPT, pos, "lost-event counter went backwards or out of range");
        else
            r->lost_last = lost;
    }
    return n;
}

/* The ring file still has the size it had at attach (a target may truncate it). */
static bool ring_size_ok(HeapReaderObject *r) {
    struct stat st;
    return fstat(r->fd, &st) == 0 && (uint64_t)st.st_size >= r->map_len;
}

/* Drains with the ring size checked first and every access to the mapping guarded against
 * SIGBUS (the target truncating its ring between the check and the access).  Called with
 * `lock` held and the GIL released. */
static uint64_t drain(HeapReaderObject *r) {
    if (r->error != RERR_NONE || r->deferred) return 0;
    if (!ring_size_ok(r)) {
        set_error(r, RERR_TRUNCATED, r->read_pos, "the ring file was truncated");
        return 0;
    }
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        set_error(r, RERR_TRUNCATED, r->read_pos, "the ring file was truncated (SIGBUS)");
        return 0;
    }
    t_bus_jmp = &jb;
    uint64_t n = drain_records(r);
    t_bus_jmp = NULL;
    return n;
}

/* After a corrupt record: hands everything written so far back to the writers unread
 * (zeroed), so the target neither fills its ring nor waits at exit for a reader that has
 * stopped reading.  Returns the bytes skipped. */
static uint64_t discard_all(HeapReaderObject *r) {
    if (r->error == RERR_TRUNCATED || !ring_size_ok(r)) return 0;
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        set_error(r, RERR_TRUNCATED, r->read_pos, "the ring file was truncated (SIGBUS)");
        return 0;
    }
    t_bus_jmp = &jb;
    uint64_t w = __atomic_load_n(&r->hdr->write_pos, __ATOMIC_ACQUIRE), skipped = 0;
    if (w > r->read_pos) {
        skipped = w - r->read_pos;
        zero_range(r, skipped > r->ring_size ? w - r->ring_size : r->read_pos, w);
        r->read_pos = w;
        __atomic_store_n(&r->hdr->read_pos, w, __ATOMIC_RELEASE);
    }
    t_bus_jmp = NULL;
    return skipped;
}

/* Header flags, read under the same guard; 0 once the ring is in error. */
static uint32_t read_flags(HeapReaderObject *r) {
    if (r->error != RERR_NONE || !ring_size_ok(r)) return 0;
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        set_error(r, RERR_TRUNCATED, r->read_pos, "the ring file was truncated (SIGBUS)");
        return 0;
    }
    t_bus_jmp = &jb;
    uint32_t flags = __atomic_load_n(&r->hdr->flags, __ATOMIC_ACQUIRE);
    t_bus_jmp = NULL;
    return flags;
}

/* Has everything the writer committed been read?  Called after the header flags were
 * loaded: the shim marks its ring exited after its last event, so the write position
 * loaded now covers every event before the mark.  A writer that can write no more (its
 * process is gone or exec'd) may have left a record reserved but never committed: nothing
 * past it will ever be readable, so the ring counts as read.  Same guard as read_flags. */
static bool read_to_end(HeapReaderObject *r, bool writer_gone) {
    if (r->error != RERR_NONE || !ring_size_ok(r)) return true;
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        set_error(r, RERR_TRUNCATED, r->read_pos, "the ring file was truncated (SIGBUS)");
        return true;
    }
    t_bus_jmp = &jb;
    uint64_t w = __atomic_load_n(&r->hdr->write_pos, __ATOMIC_ACQUIRE);
    bool done = r->read_pos >= w ||
                (writer_gone &&
                 __atomic_load_n(&r->data[(r->read_pos >> 3) & r->mask], __ATOMIC_ACQUIRE) == 0);
    t_bus_jmp = NULL;
    return done;
}

/* ------------------------------------------------------------------ helpers */


static uint64_t self_pidns(void) {
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0) return 0;
    return (uint64_t)st.st_ino;
}

static bool pid_alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

/* Locks `lock` without holding the GIL (see the design note at the top). */
static void lock_nogil(HeapReaderObject *r) {
    if (pthread_mutex_trylock(&r->lock) == 0) return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->lock);
    Py_END_ALLOW_THREADS
}

/* Gives the reader slot back, unless the ring was truncated under us (SIGBUS-guarded). */
static void give_back_slot(HeapReaderObject *r) {
    if (r->error == RERR_TRUNCATED || r->fd < 0 || !ring_size_ok(r)) return;
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) return;
    t_bus_jmp = &jb;
    int32_t me = (int32_t)getpid();
    __atomic_compare_exchange_n(&r->hdr->reader_pid, &me, 0, 0, __ATOMIC_RELEASE,
                                __ATOMIC_RELAXED);
    t_bus_jmp = NULL;
}

static void release_mapping(HeapReaderObject *r) {
    if (r->hdr != NULL) {
        give_back_slot(r);
        munmap(r->hdr, r->map_len);
        r->hdr = NULL;
        r->data = NULL;
    }
    if (r->fd >= 0) {
        close(r->fd);
        r->fd = -1;
    }
    live_entry *slots = r->live.slots;
    r->live.slots = NULL;
    free(slots);
    stacks_free(&r->stacks);
    ts_free(&r->by_thread);
    free(r->ways.entries);
    memset(&r->ways, 0, sizeof r->ways);
    free(r->dirty);
    r->dirty = NULL;
    r->ndirty = r->dirty_cap = 0;
    r->closed = true;
}

/* ------------------------------------------------------------------ attach */

/* Maps and validates the ring `name` (in /dev/shm) of `pid`; on failure sets a Python
 * exception. */
static int do_attach(HeapReaderObject *r, int pid, const char *name) {
    char path[96];
    if (heapring_name_pid(name) != pid) {
        PyErr_Format(PyExc_ValueError, "%s is not the name of a heap ring of pid %d", name, pid);
        return -1;
    }
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    /* O_NONBLOCK: never wait in open() on a FIFO planted under the ring's name. */
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path); /* FileNotFoundError */
            return -1;
        }
        /* ELOOP (a symlink), EISDIR (a directory), ENXIO, EACCES...: not a ring we use. */
        PyErr_Format(PyExc_ValueError, "%s is not a heap ring (%s)", path,
                     errno == ELOOP ? "a symbolic link" : strerror(errno));
        return -1;
    }
    struct stat st;
    /* The shim creates the file, then sizes it, then fills the header and stores magic
     * last: a ring caught while being created gets up to 200 ms to become complete. */
    for (int i = 0;; i++) {
        if (fstat(fd, &st) != 0) {
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
            close(fd);
            return -1;
        }
        if (!S_ISREG(st.st_mode) || st.st_size >= (off_t)RSPROF_HEAP_HEADER_SIZE || i == 200)
            break;
        Py_BEGIN_ALLOW_THREADS
        usleep(1000);
        Py_END_ALLOW_THREADS
    }
    if (!S_ISREG(st.st_mode) || st.st_size < (off_t)RSPROF_HEAP_HEADER_SIZE) {
        close(fd);
        PyErr_Format(PyExc_ValueError, "%s is not a heap ring", path);
        return -1;
    }
    /* The ring must belong to the user the process runs as (a ring planted by someone
     * else under that name is refused).  If the process is gone already, to us. */
    struct stat pst;
    char proc_path[64];
    snprintf(proc_path, sizeof proc_path, "/proc/%d", pid);
    uid_t want = stat(proc_path, &pst) == 0 ? pst.st_uid : geteuid();
    if (st.st_uid != want) {
        close(fd);
        PyErr_Format(PyExc_ValueError, "%s is owned by uid %u, the process runs as uid %u",
                     path, (unsigned)st.st_uid, (unsigned)want);
        return -1;
    }
    /* The shim creates it 0600: a ring others may write is not one to trust. */
    if ((st.st_mode & 077) != 0) {
        close(fd);
        PyErr_Format(PyExc_ValueError, "%s has mode %03o, not 0600", path,
                     (unsigned)(st.st_mode & 0777));
        return -1;
    }
    /* The header is read with pread, not through a mapping: a file truncated meanwhile
     * gives a short read, never SIGBUS. */
    struct rsprof_heap_header hc;
    memset(&hc, 0, sizeof hc);
    for (int i = 0; i < 200; i++) {
        if (pread(fd, &hc, sizeof hc, 0) != (ssize_t)sizeof hc) {
            memset(&hc, 0, sizeof hc);
            break;
        }
        if (hc.magic != 0) break;
        Py_BEGIN_ALLOW_THREADS
        usleep(1000);
        Py_END_ALLOW_THREADS
    }
    const char *bad = NULL;
    if (hc.magic != RSPROF_HEAP_MAGIC)
        bad = "bad magic";
    else if (hc.version != RSPROF_HEAP_VERSION)
        bad = "unsupported ring version";
    else if (hc.header_size != RSPROF_HEAP_HEADER_SIZE)
        bad = "bad header size";
    else if (hc.ring_size < RSPROF_HEAP_MIN_RING || hc.ring_size > RSPROF_HEAP_MAX_RING ||
             (hc.ring_size & (hc.ring_size - 1)) != 0)
        bad = "bad ring size";
    else if ((uint64_t)st.st_size != RSPROF_HEAP_HEADER_SIZE + hc.ring_size)
        bad = "file size does not match the ring size";
    else if (hc.pid != pid)
        bad = "ring belongs to another pid";
    else if (hc.uid != st.st_uid)
        bad = "ring uid does not match the file owner";
    else if (hc.max_depth == 0 || hc.max_depth > RSPROF_HEAP_MAX_DEPTH)
        bad = "bad max depth";
    else if (hc.sample_bytes > MAX_SAMPLE_BYTES)
        bad = "sampling mean above 1 TiB";
    if (bad != NULL) {
        close(fd);
        PyErr_Format(PyExc_ValueError, "%s: %s", path, bad);
        return -1;
    }
    size_t len = RSPROF_HEAP_HEADER_SIZE + hc.ring_size;
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        close(fd);
        return -1;
    }
    struct rsprof_heap_header *hdr = base;
    bus_install();
    /* One reader per ring: two would each see half the events. */
    int32_t me = (int32_t)getpid(), cur = 0;
    volatile int read_ok = 0;
    volatile uint64_t read_pos = 0;
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) == 0) {
        t_bus_jmp = &jb;
        for (;;) {
            if (__atomic_compare_exchange_n(&hdr->reader_pid, &cur, me, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                read_pos = __atomic_load_n(&hdr->read_pos, __ATOMIC_ACQUIRE);
                /* The shim's threads name their ways again to us (docs/heap-ring.md). */
                __atomic_add_fetch(&hdr->reader_epoch, 1, __ATOMIC_ACQ_REL);
                read_ok = 1;
                break;
            }
            if (cur == me || pid_alive(cur)) break;
            /* the previous reader died: take over (cur holds its pid for the next CAS) */
        }
        t_bus_jmp = NULL;
    } else {
        cur = 0; /* SIGBUS: truncated under us */
    }
    if (!read_ok) {
        munmap(base, len);
        close(fd);
        if (cur != 0)
            PyErr_Format(PyExc_ValueError, "%s already has a reader (pid %d)", path, (int)cur);
        else
            PyErr_Format(PyExc_ValueError, "%s: truncated while attaching", path);
        return -1;
    }
    r->fd = fd; /* kept: drain() fstats it before touching the mapping */
    r->inode = (uint64_t)st.st_ino;
    r->hdr = hdr;
    r->data = (uint64_t *)((char *)base + RSPROF_HEAP_HEADER_SIZE);
    r->map_len = len;
    r->ring_size = hc.ring_size;
    r->mask = hc.ring_size / 8 - 1;
    r->read_pos = read_pos;
    r->sample_bytes = hc.sample_bytes;
    r->fp_shift = hc.sample_bytes ? FP_SHIFT_SAMPLED : 0;
    r->max_depth = hc.max_depth;
    r->start_time = hc.start_time;
    r->created_mono_ns = hc.created_mono_ns;
    snprintf(r->name, sizeof r->name, "%s", name);
    r->pid = pid;
    return 0;
}

static int ring_header_at(int dir, const char *name, long pid, uid_t uid, struct stat *st,
                          struct rsprof_heap_header *hc);

/* The name of pid's ring in /dev/shm, for attach(pid): of the regular files owned by the
 * process's user whose valid header names pid, the newest one not marked exited, else the
 * newest (an exec'd image's ring, left for its reader).  1: found; 0: none yet, but a
 * file of that user at such a name has no valid header yet (a ring being created: the
 * magic is stored last); -1: none. */
static int find_ring(int pid, char *out, size_t outlen) {
    struct stat pst;
    char proc_path[64];
    snprintf(proc_path, sizeof proc_path, "/proc/%d", pid);
    uid_t uid = stat(proc_path, &pst) == 0 ? pst.st_uid : geteuid();
    DIR *dir = opendir("/dev/shm");
    if (dir == NULL) return 0;
    uint64_t best_created = 0;
    bool best_live = false, found = false, pending = false;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        if (heapring_name_pid(de->d_name) != pid) continue;
        struct stat st;
        struct rsprof_heap_header hc;
        int got = ring_header_at(dirfd(dir), de->d_name, pid, uid, &st, &hc);
        if (got == 0) pending = true;
        if (got != 1) continue;
        bool live = !(hc.flags & RSPROF_HEAP_HF_EXITED);
        if (found && (best_live && !live)) continue;
        if (found && best_live == live && hc.created_mono_ns < best_created) continue;
        found = true;
        best_live = live;
        best_created = hc.created_mono_ns;
        snprintf(out, outlen, "%s", de->d_name);
    }
    closedir(dir);
    return found ? 1 : pending ? 0 : -1;
}

static PyObject *HeapReader_attach(PyObject *cls, PyObject *args) {
    int pid;
    const char *given = NULL;
    if (!PyArg_ParseTuple(args, "i|z:attach", &pid, &given)) return NULL;
    if (pid <= 0) {
        PyErr_SetString(PyExc_ValueError, "pid must be positive");
        return NULL;
    }
    char name[64];
    if (given != NULL) {
        snprintf(name, sizeof name, "%s", given);
    } else {
        /* A ring caught while the shim is still creating it gets up to 200 ms. */
        int found = find_ring(pid, name, sizeof name);
        for (int i = 0; found == 0 && i < 200; i++) {
            Py_BEGIN_ALLOW_THREADS
            usleep(1000);
            Py_END_ALLOW_THREADS
            found = find_ring(pid, name, sizeof name);
        }
        if (found != 1) {
            errno = ENOENT;
            char path[96];
            snprintf(path, sizeof path, RSPROF_HEAP_PATH_PREFIX "%d.*", pid);
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path); /* FileNotFoundError */
            return NULL;
        }
    }
    HeapReaderObject *r = PyObject_New(HeapReaderObject, &HeapReaderType);
    if (r == NULL) return NULL;
    /* Everything zero so that dealloc is safe whatever fails below. */
    memset((char *)r + sizeof(PyObject), 0, sizeof *r - sizeof(PyObject));
    r->fd = -1;
    r->closed = true;
    if (pthread_mutex_init(&r->lock, NULL) != 0) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    r->lock_ready = true;
    r->new_stack_budget = MAX_NEW_STACKS_PER_TAKE;
    if (!live_init(&r->live) || !stacks_init(&r->stacks)) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    if (do_attach(r, pid, name) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    r->closed = false;
    return (PyObject *)r;
}

static void HeapReader_dealloc(HeapReaderObject *r) {
    release_mapping(r);
    Py_CLEAR(r->py_obj);
    free(r->py_memo);
    r->py_memo = NULL;
    if (r->lock_ready) pthread_mutex_destroy(&r->lock);
    PyObject_Free(r);
}

/* ------------------------------------------------------------------ methods */

static PyObject *closed_error(void) {
    PyErr_SetString(PyExc_ValueError, "HeapReader is closed");
    return NULL;
}

static PyObject *raise_error(HeapReaderObject *r) {
    if (r->error == RERR_NOMEM) {
        r->error = RERR_NONE; /* transient: a later poll retries the record */
        return PyErr_NoMemory();
    }
    PyErr_Format(PyExc_ValueError, "%s heap ring of pid %d at position %llu: %s",
                 r->error == RERR_TRUNCATED ? "truncated" : "corrupt", r->pid,
                 (unsigned long long)r->error_pos, r->error_what ? r->error_what : "bad record");
    return NULL;
}

static PyObject *HeapReader_poll(HeapReaderObject *r, PyObject *noargs) {
    uint64_t n = 0;
    int error;
    bool closed;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->lock);
    closed = r->closed;
    if (!closed) n = drain(r);
    error = r->error;
    pthread_mutex_unlock(&r->lock);
    Py_END_ALLOW_THREADS
    if (closed) return closed_error();
    if (error != RERR_NONE) {
        lock_nogil(r);
        PyObject *e = raise_error(r);
        pthread_mutex_unlock(&r->lock);
        return e;
    }
    return PyLong_FromUnsignedLongLong(n);
}

/* set_python(reader): Python frames of ALLOC records are decoded by `reader` (the target's
 * PyFrameReader; announced stacks carry its function ids); None: kept native only. */
static PyObject *HeapReader_set_python(HeapReaderObject *r, PyObject *reader) {
    rs_pyreader *core = NULL;
    pthread_mutex_t *lock = NULL;
    if (reader != Py_None && rs_pyreader_from_object(reader, &core, &lock) < 0) {
        PyErr_SetString(PyExc_TypeError, "set_python: reader must be a PyFrameReader or None");
        return NULL;
    }
    py_memo *memo = reader == Py_None ? NULL : calloc(PY_MEMO, sizeof(py_memo));
    Py_INCREF(reader);
    lock_nogil(r);
    free(r->py_memo); /* decodings of another reader's ids are no use */
    r->py_memo = memo;
    PyObject *old = r->py_obj;
    r->py_obj = reader == Py_None ? NULL : reader;
    if (reader == Py_None) Py_DECREF(reader);
    r->py = core;
    r->py_lock = lock;
    r->py_refused = reader == Py_None;
    r->py_wanted = false;
    pthread_mutex_unlock(&r->lock);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyObject *HeapReader_get_python_wanted(HeapReaderObject *r, void *c) {
    lock_nogil(r);
    bool v = r->py_wanted;
    pthread_mutex_unlock(&r->lock);
    return PyBool_FromLong(v);
}

static PyObject *HeapReader_get_shim_flags(HeapReaderObject *r, void *c) {
    lock_nogil(r);
    uint32_t flags = r->closed ? 0 : read_flags(r);
    pthread_mutex_unlock(&r->lock);
    return PyLong_FromUnsignedLong(flags);
}

static PyObject *HeapReader_python_stats(HeapReaderObject *r, PyObject *noargs) {
    lock_nogil(r);
    uint64_t decoded = r->py_decoded, partial = r->py_partial, undecoded = r->py_undecoded;
    uint32_t flags = r->closed ? 0 : read_flags(r);
    pthread_mutex_unlock(&r->lock);
    return Py_BuildValue("{sKsKsKsO}", "decoded", (unsigned long long)decoded, "partial",
                         (unsigned long long)partial, "undecoded",
                         (unsigned long long)undecoded, "shim",
                         (flags & RSPROF_HEAP_HF_PYTHON) ? Py_True : Py_False);
}

static PyObject *HeapReader_discard(HeapReaderObject *r, PyObject *noargs) {
    uint64_t n = 0;
    bool closed;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->lock);
    closed = r->closed;
    if (!closed) n = discard_all(r);
    pthread_mutex_unlock(&r->lock);
    Py_END_ALLOW_THREADS
    if (closed) return closed_error();
    return PyLong_FromUnsignedLongLong(n);
}

static inline PyObject *units(const HeapReaderObject *r, int64_t v) {
    if (r->fp_shift == 0) return PyLong_FromLongLong(v);
    /* round half away from zero */
    int64_t half = (int64_t)1 << (r->fp_shift - 1);
    int64_t q = v >= 0 ? (v + half) >> r->fp_shift : -((-v + half) >> r->fp_shift);
    return PyLong_FromLongLong(q);
}

/* What take() returns: a struct sequence typed in rsprof/_native.pyi. */
enum { HB_NFIELDS = 12 };
static PyStructSequence_Field heap_batch_fields[] = {
    {"events", "ring records read since the last take()"},
    {"lost", "records the shim dropped because the ring was full"},
    {"new_stacks", "[(stack_id, (ip, ...)), ...] call sites first seen in this batch"},
    {"sites", "[(stack_id, alloc_bytes, alloc_count, free_bytes, free_count), ...] deltas"},
    {"unknown_frees", "frees of blocks allocated before tracking began"},
    {"live_bytes", "bytes allocated and not yet freed"},
    {"live_blocks", "blocks allocated and not yet freed"},
    {"exited", "the target has exited"},
    {"execed", "the target called exec (the shim's ring ends there)"},
    {"sample_bytes", "sampling interval in bytes; 0 = every allocation"},
    {"dropped", "allocations the reader dropped because a bound was reached (a flood)"},
    {"thread_sites", "[(stack_id, tid, alloc_bytes, alloc_count, free_bytes, free_count), ...]: "
                     "`sites` split by the allocating thread (a free is charged to it)"},
    {NULL, NULL},
};
static PyStructSequence_Desc heap_batch_desc = {
    "rsprof._native.HeapBatch", "What HeapReader.take() collected since the last call.",
    heap_batch_fields, HB_NFIELDS,
};
static PyTypeObject *HeapBatchType;

static PyObject *build_take(HeapReaderObject *r) {
    PyObject *result = NULL, *new_stacks = NULL, *sites = NULL, *thread_rows = NULL;
    new_stacks = PyList_New(0);
    sites = PyList_New(0);
    thread_rows = PyList_New(0);
    if (new_stacks == NULL || sites == NULL || thread_rows == NULL) goto fail;
    stack_table *t = &r->stacks;
    for (size_t id = r->reported_stacks; id < t->count; id++) {
        const stack_info *si = &t->info[id];
        uint64_t off = si->ann_depth ? si->ann_off : si->off;
        uint32_t depth = si->ann_depth ? si->ann_depth : si->depth;
        PyObject *ips = PyTuple_New(depth);
        if (ips == NULL) goto fail;
        for (uint32_t k = 0; k < depth; k++) {
            PyObject *v = PyLong_FromUnsignedLongLong(t->ips[off + k]);
            if (v == NULL) {
                Py_DECREF(ips);
                goto fail;
            }
            PyTuple_SET_ITEM(ips, k, v);
        }
        PyObject *item = Py_BuildValue("(nN)", (Py_ssize_t)id + 1, ips); /* ids from 1 */
        if (item == NULL || PyList_Append(new_stacks, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    for (size_t k = 0; k < r->ndirty; k++) {
        uint32_t id = r->dirty[k];
        const stack_info *si = &t->info[id];
        PyObject *item = Py_BuildValue("(nNNNN)", (Py_ssize_t)id + 1, units(r, si->alloc_bytes),
                                       units(r, si->alloc_count), units(r, si->free_bytes),
                                       units(r, si->free_count));
        if (item == NULL || PyList_Append(sites, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    for (size_t k = 0; k < r->by_thread.count; k++) {
        const thread_site *e = &r->by_thread.entries[k];
        if (e->alloc_count == 0 && e->free_count == 0) continue;
        PyObject *item = Py_BuildValue("(nINNNN)", (Py_ssize_t)e->stack + 1, (unsigned)e->tid,
                                       units(r, e->alloc_bytes), units(r, e->alloc_count),
                                       units(r, e->free_bytes), units(r, e->free_count));
        if (item == NULL || PyList_Append(thread_rows, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    uint64_t lost = r->lost_last; /* checked by drain(): never below lost_seen */
    uint32_t flags = read_flags(r);
    /* Exited: the shim said so, or the process is gone (killed: no chance to say so). */
    bool gone = r->start_time != 0 ? heapring_start_time(r->pid) != r->start_time
                                   : !pid_alive(r->pid);
    /* Only once its last events are read: a checkpoint that came while the process waited
     * at exit for the drain used to close the ring with them unread (a short child lost
     * its last 30-60 ms of allocations). */
    bool exited = ((flags & RSPROF_HEAP_HF_EXITED) || gone) &&
                  read_to_end(r, gone || (flags & RSPROF_HEAP_HF_EXECED));
    PyObject *vals[HB_NFIELDS] = {
        PyLong_FromUnsignedLongLong(r->events),
        PyLong_FromUnsignedLongLong(lost - r->lost_seen),
        Py_NewRef(new_stacks),
        Py_NewRef(sites),
        PyLong_FromUnsignedLongLong(r->unknown_frees),
        units(r, r->live_bytes),
        units(r, r->live_blocks),
        PyBool_FromLong(exited),
        PyBool_FromLong(exited && (flags & RSPROF_HEAP_HF_EXECED) != 0),
        PyLong_FromUnsignedLongLong(r->sample_bytes),
        PyLong_FromUnsignedLongLong(r->dropped),
        Py_NewRef(thread_rows),
    };
    result = PyStructSequence_New(HeapBatchType);
    for (int k = 0; k < HB_NFIELDS; k++) {
        if (result == NULL || vals[k] == NULL) Py_CLEAR(result);
    }
    if (result == NULL) {
        for (int k = 0; k < HB_NFIELDS; k++) Py_XDECREF(vals[k]);
    } else {
        for (int k = 0; k < HB_NFIELDS; k++) PyStructSequence_SetItem(result, k, vals[k]);
    }
    if (result == NULL) goto fail;
    Py_DECREF(new_stacks);
    Py_DECREF(sites);
    Py_DECREF(thread_rows);
    /* Committed: reset the batch. */
    r->reported_stacks = (uint32_t)t->count;
    r->reported_ips = t->announced;
    r->deferred = false; /* a new budget: the next poll reads on */
    r->dropped = 0;
    for (size_t k = 0; k < r->ndirty; k++) {
        stack_info *si = &t->info[r->dirty[k]];
        si->alloc_bytes = si->alloc_count = si->free_bytes = si->free_count = 0;
        si->dirty = 0;
    }
    r->ndirty = 0;
    ts_reset(&r->by_thread);
    r->events = 0;
    r->unknown_frees = 0;
    r->lost_seen = lost;
    return result;
fail:
    Py_XDECREF(new_stacks);
    Py_XDECREF(sites);
    Py_XDECREF(thread_rows);
    return NULL;
}

static PyObject *HeapReader_take(HeapReaderObject *r, PyObject *noargs) {
    lock_nogil(r);
    PyObject *result = r->closed ? closed_error() : build_take(r);
    pthread_mutex_unlock(&r->lock);
    return result;
}

static PyObject *HeapReader_close(HeapReaderObject *r, PyObject *noargs) {
    lock_nogil(r);
    if (!r->closed) release_mapping(r);
    pthread_mutex_unlock(&r->lock);
    Py_RETURN_NONE;
}

static PyObject *HeapReader_enter(HeapReaderObject *r, PyObject *noargs) {
    return Py_NewRef((PyObject *)r);
}

static PyObject *HeapReader_exit(HeapReaderObject *r, PyObject *args) {
    return HeapReader_close(r, NULL);
}

/* Reads the header of the ring file `name` (relative to dir, or a path with AT_FDCWD) as
 * every look at someone else's /dev/shm name must: O_NONBLOCK, so a FIFO planted there does
 * not hang us in open(); O_NOFOLLOW, so a symlink is never followed (ELOOP); and only a
 * regular file owned by `uid` counts (FIFOs, directories, devices, other users' files do
 * not).  -1: no such file; 0: one, *st set, but no valid header naming pid (scribbled, or a
 * ring still being created: magic is stored last); 1: *st and *hc set. */
static int ring_header_at(int dir, const char *name, long pid, uid_t uid, struct stat *st,
                          struct rsprof_heap_header *hc) {
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    int got = -1;
    if (fstat(fd, st) == 0 && S_ISREG(st->st_mode) && st->st_uid == uid)
        got = pread(fd, hc, sizeof *hc, 0) == (ssize_t)sizeof *hc &&
              hc->magic == RSPROF_HEAP_MAGIC && hc->pid == (int32_t)pid;
    close(fd);
    return got;
}

/* Removes rings left behind that nobody will read: of processes that died without exiting
 * normally (SIGKILL, crash), and exited or exec'd images' rings whose session is gone.
 * Regular files we own, with a valid header, in our pid namespace. */
static PyObject *HeapReader_sweep_stale(PyObject *cls, PyObject *noargs) {
    PyObject *removed = PyList_New(0);
    if (removed == NULL) return NULL;
    DIR *dir = opendir("/dev/shm");
    if (dir == NULL) return removed;
    uint64_t my_ns = self_pidns();
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        long pid = heapring_name_pid(de->d_name);
        if (pid == 0) continue;
        /* Anything that is not a regular file of ours is skipped silently. */
        struct stat st;
        struct rsprof_heap_header hc;
        int got = ring_header_at(dirfd(dir), de->d_name, pid, geteuid(), &st, &hc);
        bool stale = false;
        if (got == 1) {
            if (hc.pidns == 0 || my_ns == 0 || hc.pidns == my_ns) {
                uint64_t now = heapring_start_time((int)pid);
                stale = hc.start_time != 0 ? now != hc.start_time : !pid_alive((int)pid);
                /* Exited, or exec'd (its pid lives on in a newer image): nobody writes it.
                 * (A reader that has it mapped keeps reading after the unlink.) */
                if (hc.flags & RSPROF_HEAP_HF_EXITED) stale = true;
                /* Left for the recorder of another live session: its to read (unless
                 * that pid now names another process than the one recorded). */
                if (hc.version == RSPROF_HEAP_VERSION && hc.session_pid > 0 &&
                    hc.session_pid != (int32_t)getpid() &&
                    heapring_session_alive(hc.session_pid, hc.session_start))
                    stale = false;
            }
        } else if (got == 0) {
            /* No valid header.  Swept only when the pid in its name is dead and the file
             * has not been written for a while (mtime), so a ring being created right now
             * (in this or another pid namespace) is never taken. */
            stale = !pid_alive((int)pid) && time(NULL) - st.st_mtime > SCRIBBLED_RING_AGE_S;
        }
        if (stale && unlinkat(dirfd(dir), de->d_name, 0) == 0) {
            PyObject *v = PyLong_FromLong(pid);
            if (v == NULL || PyList_Append(removed, v) < 0) {
                Py_XDECREF(v);
                closedir(dir);
                Py_DECREF(removed);
                return NULL;
            }
            Py_DECREF(v);
        }
    }
    closedir(dir);
    return removed;
}

/* session_of(name) -> int: the session (rsprof pid) named in the header of the ring `name`
 * in /dev/shm, 0 for none, -1 when there is no valid ring of ours at the name (yet: the
 * magic is stored last). */
static PyObject *HeapReader_session_of(PyObject *cls, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s:session_of", &name)) return NULL;
    long pid = heapring_name_pid(name);
    if (pid == 0) return PyLong_FromLong(-1);
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    struct stat st;
    struct rsprof_heap_header hc;
    if (ring_header_at(AT_FDCWD, path, pid, geteuid(), &st, &hc) != 1 ||
        hc.version != RSPROF_HEAP_VERSION)
        return PyLong_FromLong(-1);
    return PyLong_FromLong(hc.session_pid > 0 ? hc.session_pid : 0);
}

static PyObject *HeapReader_get_pid(HeapReaderObject *r, void *c) {
    return PyLong_FromLong(r->pid);
}
static PyObject *HeapReader_get_ring_bytes(HeapReaderObject *r, void *c) {
    return PyLong_FromUnsignedLongLong(r->ring_size);
}
static PyObject *HeapReader_get_sample_bytes(HeapReaderObject *r, void *c) {
    return PyLong_FromUnsignedLongLong(r->sample_bytes);
}
static PyObject *HeapReader_get_inode(HeapReaderObject *r, void *c) {
    return PyLong_FromUnsignedLongLong(r->inode);
}
static PyObject *HeapReader_get_repeated(HeapReaderObject *r, void *c) {
    return PyLong_FromUnsignedLongLong(r->again);
}
static PyObject *HeapReader_get_lap_jumps(HeapReaderObject *r, void *c) {
    return PyLong_FromUnsignedLongLong(r->lap_jumps);
}
static PyObject *HeapReader_get_new_stack_budget(HeapReaderObject *r, void *c) {
    lock_nogil(r);
    size_t v = r->new_stack_budget;
    pthread_mutex_unlock(&r->lock);
    return PyLong_FromSize_t(v);
}
/* The recorder sizes it to the work a checkpoint can do in its interval; clamped to
 * 1 .. MAX_NEW_STACKS_PER_TAKE (at least one new stack per take: the ring always moves). */
static int HeapReader_set_new_stack_budget(HeapReaderObject *r, PyObject *value, void *c) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "new_stack_budget cannot be deleted");
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 1) v = 1;
    if (v > MAX_NEW_STACKS_PER_TAKE) v = MAX_NEW_STACKS_PER_TAKE;
    lock_nogil(r);
    r->new_stack_budget = (size_t)v;
    pthread_mutex_unlock(&r->lock);
    return 0;
}
static PyObject *HeapReader_get_deferred(HeapReaderObject *r, void *c) {
    lock_nogil(r);
    bool v = r->deferred;
    pthread_mutex_unlock(&r->lock);
    return PyBool_FromLong(v);
}
/* The writers' reservation cursor now (0 once closed or in error): every record reserved
 * before it lies below it, committed or about to be. */
static PyObject *HeapReader_get_write_pos(HeapReaderObject *r, void *c) {
    lock_nogil(r);
    volatile uint64_t w = 0;
    if (!r->closed && r->hdr != NULL && r->error == RERR_NONE && ring_size_ok(r)) {
        sigjmp_buf jb;
        if (sigsetjmp(jb, 1) != 0) {
            set_error(r, RERR_TRUNCATED, r->read_pos, "the ring file was truncated (SIGBUS)");
            w = 0;
        } else {
            t_bus_jmp = &jb;
            w = __atomic_load_n(&r->hdr->write_pos, __ATOMIC_ACQUIRE);
        }
        t_bus_jmp = NULL;
    }
    pthread_mutex_unlock(&r->lock);
    return PyLong_FromUnsignedLongLong(w);
}
static PyObject *HeapReader_get_read_pos(HeapReaderObject *r, void *c) {
    lock_nogil(r);
    uint64_t v = r->read_pos;
    pthread_mutex_unlock(&r->lock);
    return PyLong_FromUnsignedLongLong(v);
}
static PyObject *HeapReader_get_created_ns(HeapReaderObject *r, void *c) {
    return PyLong_FromUnsignedLongLong(r->created_mono_ns);
}
static PyObject *HeapReader_get_name(HeapReaderObject *r, void *c) {
    return PyUnicode_FromString(r->name);
}
static PyObject *HeapReader_get_closed(HeapReaderObject *r, void *c) {
    return PyBool_FromLong(r->closed);
}

static PyMethodDef HeapReader_methods[] = {
    {"attach", (PyCFunction)HeapReader_attach, METH_VARARGS | METH_CLASS,
     "attach(pid, name=None) -> HeapReader: map pid's ring /dev/shm/<name> (default: its "
     "newest ring, rsprof-heap.<pid>.<suffix>)."},
    {"poll", (PyCFunction)HeapReader_poll, METH_NOARGS,
     "poll() -> int: drain the events available now; returns how many."},
    {"discard", (PyCFunction)HeapReader_discard, METH_NOARGS,
     "discard() -> int: after poll() raised ValueError, hand everything written so far back "
     "to the target unread; returns the bytes skipped."},
    {"take", (PyCFunction)HeapReader_take, METH_NOARGS,
     "take() -> HeapBatch: aggregates since the previous take(), then reset them."},
    {"close", (PyCFunction)HeapReader_close, METH_NOARGS, "close(): unmap the ring."},
    {"sweep_stale", (PyCFunction)HeapReader_sweep_stale, METH_NOARGS | METH_STATIC,
     "sweep_stale() -> list[int]: remove rings of dead processes; returns their pids."},
    {"session_of", (PyCFunction)HeapReader_session_of, METH_VARARGS | METH_STATIC,
     "session_of(name) -> int: the rsprof session (pid) named by the ring name, 0 if none, -1 "
     "if there is no valid ring at the name."},
    {"set_python", (PyCFunction)HeapReader_set_python, METH_O,
     "set_python(reader) -> None: decode the Python frames of allocations with `reader` (a "
     "PyFrameReader of the target); None: keep their native stacks only."},
    {"python_stats", (PyCFunction)HeapReader_python_stats, METH_NOARGS,
     "python_stats() -> dict: new stacks with all (decoded), some (partial: a code object "
     "freed before it was read) and none (undecoded: no reader) of their Python frames; "
     "shim: the shim reads Python frames."},
    {"__enter__", (PyCFunction)HeapReader_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)HeapReader_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef HeapReader_getset[] = {
    {"pid", (getter)HeapReader_get_pid, NULL, "target pid", NULL},
    {"ring_bytes", (getter)HeapReader_get_ring_bytes, NULL, "data area size in bytes", NULL},
    {"sample_bytes", (getter)HeapReader_get_sample_bytes, NULL, "0 = full capture", NULL},
    {"closed", (getter)HeapReader_get_closed, NULL, "close() was called", NULL},
    {"created_ns", (getter)HeapReader_get_created_ns, NULL,
     "CLOCK_MONOTONIC time the ring was created (0: unknown)", NULL},
    {"name", (getter)HeapReader_get_name, NULL, "the ring's name in /dev/shm", NULL},
    {"inode", (getter)HeapReader_get_inode, NULL,
     "inode of the ring file attached (another process may own the name by now)", NULL},
    {"repeated", (getter)HeapReader_get_repeated, NULL,
     "allocations read as a repeat of a stack the same thread sent before (ALLOC_AGAIN)",
     NULL},
    {"lap_jumps", (getter)HeapReader_get_lap_jumps, NULL,
     "times the reader, having read everything reserved, moved both cursors to the next "
     "lap's start (docs/heap-ring.md, Protocol)", NULL},
    {"new_stack_budget", (getter)HeapReader_get_new_stack_budget,
     (setter)HeapReader_set_new_stack_budget,
     "new stacks one take() announces at most (1 .. 65536); the allocations of further new "
     "stacks wait in the ring for the next take()", NULL},
    {"write_pos", (getter)HeapReader_get_write_pos, NULL,
     "the writers' reservation cursor now, in ring bytes (0 once closed)", NULL},
    {"read_pos", (getter)HeapReader_get_read_pos, NULL,
     "bytes of the ring read so far (a record reserved but not committed stops the reader)",
     NULL},
    {"deferred", (getter)HeapReader_get_deferred, NULL,
     "the take's budget is spent: polls read nothing until the next take()", NULL},
    {"python_wanted", (getter)HeapReader_get_python_wanted, NULL,
     "an allocation with Python frames waits for set_python()", NULL},
    {"shim_flags", (getter)HeapReader_get_shim_flags, NULL,
     "the ring header's flags (RSPROF_HEAP_HF_*), 0 once closed or in error", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HeapReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rsprof._native.HeapReader",
    .tp_doc = "Reader of a target's heap-shim ring (see docs/native.md).",
    .tp_basicsize = sizeof(HeapReaderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)HeapReader_dealloc,
    .tp_methods = HeapReader_methods,
    .tp_getset = HeapReader_getset,
    /* no tp_new: instances come from HeapReader.attach() */
};

int rsprof_heap_register(PyObject *module) {
    if (PyType_Ready(&HeapReaderType) < 0) return -1;
    HeapBatchType = PyStructSequence_NewType(&heap_batch_desc);
    if (HeapBatchType == NULL) return -1;
    if (PyModule_AddObjectRef(module, "HeapBatch", (PyObject *)HeapBatchType) < 0) return -1;
    /* The ring format's numbers and names, for Python (one definition: heapring.h). */
    if (PyModule_AddIntConstant(module, "HEAP_RING_VERSION", RSPROF_HEAP_VERSION) < 0 ||
        PyModule_AddIntConstant(module, "HEAP_RING_HEADER_SIZE", RSPROF_HEAP_HEADER_SIZE) < 0 ||
        PyModule_AddStringConstant(module, "HEAP_RING_NAME_PREFIX", RSPROF_HEAP_NAME_PREFIX) < 0 ||
        PyModule_AddIntConstant(module, "HEAP_RING_SUFFIX_HEX", RSPROF_HEAP_SUFFIX_HEX) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "HeapReader", (PyObject *)&HeapReaderType);
}
