/* heapring.h: the shared-memory ring between the heap shim (native/shim/heapshim.c, inside
 * the target) and its single reader (native/heapreader.c, inside the profiler).
 * docs/heap-ring.md describes the format and the protocol in prose; this file is the truth.
 *
 * File: /dev/shm/rsprof-heap.<pid>.<16 hex digits> = one header page followed by the data
 * area.  The suffix is 64 random bits drawn at creation, so nobody can squat the name of a
 * ring before it exists, and an exec'd image's ring never collides with the next image's
 * (same pid): readers find a pid's rings by listing /dev/shm and reading their headers.
 *
 *   [0, RSPROF_HEAP_HEADER_SIZE)                    struct rsprof_heap_header
 *   [RSPROF_HEAP_HEADER_SIZE, + ring_size)          data area, ring_size a power of two
 *
 * Data area: a ring of 8-byte words.  Positions (write_pos, read_pos, a record's position)
 * are byte offsets that only ever grow; word i of the ring lives at ((pos >> 3) + i) &
 * (ring_size / 8 - 1), so a record may wrap around the end of the area, word by word.
 *
 * Record = one commit word followed by its body:
 *
 *   word 0  commit word: kind (bits 0-7) | depth (8-15) | flags (16-31) | tid (32-63).
 *           Zero means "reserved but not written yet".  The writer stores it last, with
 *           release ordering; the reader loads it with acquire ordering.
 *   word 1  address of the block
 *   ALLOC only:
 *   word 2  size in bytes as requested by the caller (pvalloc: rounded up to a page)
 *   word 3+ depth return addresses, leaf first (word 3 is the return address in the
 *           function that called malloc & co.)
 *   ALLOC with flag PYTHON only (the allocating thread held the GIL and ran Python code):
 *   word 3+depth       n, the number of Python frames (1 .. RSPROF_HEAP_MAX_PY_FRAMES)
 *   then n pairs, innermost frame first:
 *           code object address | entry (bit 0: the frame was entered from C, i.e. it is
 *           the outermost Python frame of one _PyEval_EvalFrameDefault call)
 *           instruction index (low 32 bits, signed; -1 unknown) | tag << 32, where tag =
 *           rsprof_heap_py_tag() of the code object's qualname, filename and location
 *           table pointers and first line when the frame was captured: the reader decodes
 *           the code object later, and only if it still carries the same tag.
 *
 *   FREE records are 2 words (16 bytes); ALLOC records 3 + depth words (+ 1 + 2 n with
 *   Python frames); ALLOC_AGAIN records 3 words.
 *
 * Short records, for the two events that make most of the traffic (a free, an allocation
 * with a stack its thread named before); the shim writes the long form when a value does
 * not fit:
 *   FREE_SHORT   1 word, the commit word itself: kind | address << 8 (an address below
 *                2^56).  No tid, no flags: a free needs neither.
 *   AGAIN_SHORT  2 words: commit word kind | size << 8 (a size below 2^16) | (way + 1) << 24
 *                | tid << 32, then the address.  No flags (informational only).
 * sqlite3's 150,000 INSERTs (3.3 M allocations, as many frees) write 24 bytes a pair
 * instead of 40.
 *
 * Ways (the shim's memo of each thread's last walks): an ALLOC record without Python frames
 * may name a way w (RSPROF_HEAP_HEAD_WAY(head) = w + 1): "this stack is now way w of
 * thread tid".  A later ALLOC_AGAIN record of the same thread with way w (head, address,
 * size: no stack) is an allocation with that same stack.  Records of one thread are in
 * program order in the ring, so the naming record always comes first.  A new reader bumps
 * reader_epoch when it attaches: the shim then names its ways again, since records the
 * previous reader consumed are gone (an ALLOC_AGAIN written in that moment, whose way the
 * new reader never saw, is dropped and counted by it).
 *
 * Protocol (multi-producer, single consumer, lossy):
 *   writer: CAS write_pos from w to w + len as long as w + len - read_pos <= ring_size,
 *           otherwise drop the event and add it to lost_events / lost_bytes.  Then write
 *           the body, then the commit word (release).
 *   reader: at read position r, acquire-load the commit word; zero = stop (not written
 *           yet); otherwise parse the record, zero all its words, advance r, and from time
 *           to time store read_pos = r (release).  Zeroing is what makes "commit word != 0"
 *           an exact test: every reserved byte was zeroed by the reader before read_pos
 *           moved past it (or is fresh, zero-filled shared memory).
 *   Order: the shim reserves a FREE record before it hands the block back to the real
 *           free (or realloc), and an ALLOC record after the real allocator returned the
 *           block, so for any one address the ring order is the true alloc/free order,
 *           even across threads.
 *
 * The numeric values below are part of the format: a change bumps RSPROF_HEAP_VERSION.
 */
#ifndef RSPROF_HEAPRING_H
#define RSPROF_HEAPRING_H

#include <stddef.h>
#include <stdint.h>

#define RSPROF_HEAP_MAGIC 0x3150414548505352ULL /* "RSPHEAP1", little-endian */
#define RSPROF_HEAP_VERSION 6u /* 2: Python frames in ALLOC records; 3: ways, ALLOC_AGAIN;
                                  4: 64 ways, the way in flags bits 8-15; 5: lap jumps (the
                                  reader may move both cursors to the next lap's start, the
                                  shim allocates pages in every lap); 6: FREE_SHORT and
                                  AGAIN_SHORT records */
#define RSPROF_HEAP_HEADER_SIZE 4096u
#define RSPROF_HEAP_MAX_DEPTH 64u
/* shm_open() name prefix; the file is /dev/shm/rsprof-heap.<pid>.<suffix>, the suffix
 * RSPROF_HEAP_SUFFIX_HEX lowercase hex digits of a random number. */
#define RSPROF_HEAP_NAME_PREFIX "rsprof-heap." /* the name in /dev/shm */
#define RSPROF_HEAP_SHM_PREFIX "/" RSPROF_HEAP_NAME_PREFIX
#define RSPROF_HEAP_PATH_PREFIX "/dev/shm/" RSPROF_HEAP_NAME_PREFIX
#define RSPROF_HEAP_SUFFIX_HEX 16u
/* Ring size bounds (bytes).  The shim rounds the configured size up to a power of two. */
#define RSPROF_HEAP_MIN_RING (64u * 1024u)
#define RSPROF_HEAP_MAX_RING (1024ull * 1024u * 1024u)
#define RSPROF_HEAP_DEFAULT_RING_MB 16u
/* Python frames one ALLOC record carries at most (a deeper chain is recorded native only). */
#define RSPROF_HEAP_MAX_PY_FRAMES 128u

/* Record kinds (commit word bits 0-7). */
enum {
    RSPROF_HEAP_REC_ALLOC = 1,
    RSPROF_HEAP_REC_FREE = 2,
    RSPROF_HEAP_REC_ALLOC_AGAIN = 3, /* an allocation with the stack of a named way */
    RSPROF_HEAP_REC_FREE_SHORT = 4,  /* a FREE in its commit word */
    RSPROF_HEAP_REC_AGAIN_SHORT = 5, /* an ALLOC_AGAIN with its size in its commit word */
};
/* Ways a thread may name (RSPROF_HEAP_HEAD_WAY is 1 .. this, 0 for none). */
#define RSPROF_HEAP_MAX_WAYS 64u

/* Record flags (commit word bits 16-31): informational, the reader needs none of them. */
enum {
    RSPROF_HEAP_RF_REALLOC = 1u << 0,   /* half of a realloc (FREE of old / ALLOC of new) */
    RSPROF_HEAP_RF_CALLOC = 1u << 1,
    RSPROF_HEAP_RF_ALIGNED = 1u << 2,   /* posix_memalign, aligned_alloc, memalign, valloc */
    RSPROF_HEAP_RF_TRUNCATED = 1u << 3, /* the stack had more frames than max_depth */
    RSPROF_HEAP_RF_FAILED_REALLOC = 1u << 4, /* realloc failed: old block re-announced */
    RSPROF_HEAP_RF_PYTHON = 1u << 5,    /* Python frames follow the return addresses */
    /* bits 8-15: the way (+ 1) an ALLOC record names or an ALLOC_AGAIN record repeats;
     * the reader needs these */
};
#define RSPROF_HEAP_RF_WAY(way) ((unsigned)((way) + 1) << 8)

/* Header flags (rsprof_heap_header.flags). */
enum {
    RSPROF_HEAP_HF_EXITED = 1u << 0,    /* the process left (exit, _exit or exec) */
    RSPROF_HEAP_HF_EXECED = 1u << 1,    /* ...by exec: a new ring with the same pid follows */
    RSPROF_HEAP_HF_SAMPLED = 1u << 2,   /* sample_bytes > 0 */
    RSPROF_HEAP_HF_ALL_FREES = 1u << 3, /* sampled mode, the shim's set of sampled addresses
                                           overflowed: from now on every free is recorded
                                           (the reader ignores frees of unknown addresses) */
    RSPROF_HEAP_HF_PYTHON = 1u << 4,    /* the shim found a CPython it reads frames of: ALLOC
                                           records may carry Python frames */
    RSPROF_HEAP_HF_MALLOC_ELSEWHERE = 1u << 5, /* the process's malloc (or free, calloc,
                                           realloc) is not the shim's: the executable or a
                                           library loaded before the shim defines it, and
                                           allocations through it are not seen */
    RSPROF_HEAP_HF_ALLOC_API = 1u << 6, /* jemalloc's mallocx family or tcmalloc's tc_*
                                           functions are loaded: the program may call them
                                           directly, and those calls are not seen */
    RSPROF_HEAP_HF_NO_GROWTH = 1u << 7, /* growing the ring's tmpfs pages failed once (a full
                                           /dev/shm): events beyond them are lost (counted),
                                           growth is never tried again */
};

/* Commit word helpers. */
#define RSPROF_HEAP_HEAD(kind, depth, flags, tid)                                            \
    ((uint64_t)(uint8_t)(kind) | ((uint64_t)(uint8_t)(depth) << 8) |                         \
     ((uint64_t)(uint16_t)(flags) << 16) | ((uint64_t)(uint32_t)(tid) << 32))
#define RSPROF_HEAP_HEAD_KIND(h) ((unsigned)((h) & 0xffu))
#define RSPROF_HEAP_HEAD_DEPTH(h) ((unsigned)(((h) >> 8) & 0xffu))
#define RSPROF_HEAP_HEAD_FLAGS(h) ((unsigned)(((h) >> 16) & 0xffffu))
#define RSPROF_HEAP_HEAD_TID(h) ((uint32_t)((h) >> 32))
#define RSPROF_HEAP_HEAD_WAY(h) ((unsigned)(((h) >> 24) & 0xffu)) /* way + 1; 0: none */
#define RSPROF_HEAP_AGAIN_WORDS 3u
#define RSPROF_HEAP_FREE_WORDS 2u
/* Short records (see the top of this file). */
#define RSPROF_HEAP_FREE_SHORT_WORDS 1u
#define RSPROF_HEAP_AGAIN_SHORT_WORDS 2u
#define RSPROF_HEAP_SHORT_ADDR_LIMIT (1ull << 56)
#define RSPROF_HEAP_SHORT_SIZE_LIMIT (1ull << 16)
#define RSPROF_HEAP_FREE_SHORT(addr)                                                         \
    ((uint64_t)RSPROF_HEAP_REC_FREE_SHORT | ((uint64_t)(addr) << 8))
#define RSPROF_HEAP_FREE_SHORT_ADDR(h) ((uint64_t)(h) >> 8)
#define RSPROF_HEAP_AGAIN_SHORT(size, way, tid)                                              \
    ((uint64_t)RSPROF_HEAP_REC_AGAIN_SHORT | ((uint64_t)(uint16_t)(size) << 8) |             \
     ((uint64_t)(uint8_t)((way) + 1) << 24) | ((uint64_t)(uint32_t)(tid) << 32))
#define RSPROF_HEAP_AGAIN_SHORT_SIZE(h) ((unsigned)(((h) >> 8) & 0xffffu))
#define RSPROF_HEAP_ALLOC_WORDS(depth) (3u + (unsigned)(depth))
#define RSPROF_HEAP_PY_WORDS(n) (1u + 2u * (unsigned)(n))

/* A code object's identity as the shim saw it: its qualname, filename and location table
 * objects and first line (the same pointers mean the same text; a code object freed and
 * replaced by another at the same address almost surely differs in one of them). */
static inline uint32_t rsprof_heap_py_tag(uint64_t qualname, uint64_t filename,
                                          uint64_t linetable, int32_t first_line) {
    uint64_t h = (qualname ^ (filename << 17) ^ (filename >> 47)) * 0x9E3779B97F4A7C15ULL;
    h = (h ^ linetable ^ (uint64_t)(uint32_t)first_line) * 0xC2B2AE3D27D4EB4FULL;
    return (uint32_t)(h >> 32) | 1u; /* never 0 */
}

/* The header.  Fields written once at creation come first; the fields that change are
 * on cache lines of their own so that writers bumping write_pos do not also bounce the
 * line the reader writes (read_pos).  Accessed with __atomic builtins on both sides
 * (plain integer types keep the layout identical for C and for tests reading it from
 * Python with struct).  Offsets are fixed by the static asserts below. */
struct rsprof_heap_header {
    /* 0: written once by the shim before `magic`, which is stored last (release). */
    uint64_t magic;        /* RSPROF_HEAP_MAGIC; 0 while the shim is still filling this in */
    uint32_t version;      /* RSPROF_HEAP_VERSION */
    uint32_t header_size;  /* RSPROF_HEAP_HEADER_SIZE: the data area starts here */
    uint64_t ring_size;    /* data area bytes, a power of two */
    int32_t pid;           /* the process that created the ring (== the pid in the name) */
    uint32_t uid;          /* its effective uid (must also own the file) */
    uint64_t start_time;   /* field 22 of /proc/<pid>/stat (clock ticks after boot): tells
                              a reused pid, and the same process after exec, apart */
    uint64_t pidns;        /* inode of /proc/self/ns/pid, 0 if unknown */
    uint64_t sample_bytes; /* 0 = every event; N = Poisson sampling, mean N bytes */
    uint32_t max_depth;    /* stack depth limit in effect (<= RSPROF_HEAP_MAX_DEPTH) */
    uint32_t reserved0;
    uint64_t created_ns;   /* CLOCK_REALTIME at creation */
    uint64_t created_mono_ns; /* CLOCK_MONOTONIC at creation (perf's clock: tells which
                                 image of the pid made the ring), 0 if unknown */
    uint64_t session_start; /* start time of session_pid's process when the ring was made
                               (heapring_start_time): that session is alive while
                               /proc/<session_pid> still has it; 0 if unknown */
    uint8_t pad0[40];      /* keep the next group on its own cache line (offset 128) */

    /* 128: changing, rarely written. */
    uint32_t flags;        /* RSPROF_HEAP_HF_* (atomic or) */
    int32_t reader_pid;    /* pid of the attached reader, 0 if none (reader CASes it) */
    uint64_t lost_events;  /* events dropped because the ring was full (atomic add) */
    uint64_t lost_bytes;   /* their size in ring bytes */
    uint32_t reader_epoch; /* bumped by every reader that attaches (see "Ways") */
    int32_t session_pid;   /* the rsprof that reads this process's rings: the one whose `run`
                              started the process tree (RSPROF_HEAP_WAIT_PPID), or the reader
                              of the ring of the image before an exec or of the fork parent;
                              0 if none.  That recorder reads every ring of its session, one
                              left behind at exit or exec included */
    uint8_t pad1[64 - 32];

    /* 192: the writers' reservation cursor (CAS). */
    uint64_t write_pos;
    uint8_t pad2[64 - 8];

    /* 256: the reader's cursor; only the reader stores it. */
    uint64_t read_pos;
    uint8_t pad3[64 - 8];
};

#define RSPROF_HEAP_OFF_FLAGS 128u
#define RSPROF_HEAP_OFF_READER_PID 132u
#define RSPROF_HEAP_OFF_LOST_EVENTS 136u
#define RSPROF_HEAP_OFF_LOST_BYTES 144u
#define RSPROF_HEAP_OFF_READER_EPOCH 152u
#define RSPROF_HEAP_OFF_SESSION_PID 156u
#define RSPROF_HEAP_OFF_WRITE_POS 192u
#define RSPROF_HEAP_OFF_READ_POS 256u

_Static_assert(offsetof(struct rsprof_heap_header, magic) == 0, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, version) == 8, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, header_size) == 12, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, ring_size) == 16, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, pid) == 24, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, uid) == 28, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, start_time) == 32, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, pidns) == 40, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, sample_bytes) == 48, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, max_depth) == 56, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, created_ns) == 64, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, created_mono_ns) == 72, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, session_start) == 80, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, flags) == RSPROF_HEAP_OFF_FLAGS, "layout");
_Static_assert(offsetof(struct rsprof_heap_header, reader_pid) == RSPROF_HEAP_OFF_READER_PID,
               "layout");
_Static_assert(offsetof(struct rsprof_heap_header, lost_events) == RSPROF_HEAP_OFF_LOST_EVENTS,
               "layout");
_Static_assert(offsetof(struct rsprof_heap_header, lost_bytes) == RSPROF_HEAP_OFF_LOST_BYTES,
               "layout");
_Static_assert(offsetof(struct rsprof_heap_header, reader_epoch) == RSPROF_HEAP_OFF_READER_EPOCH,
               "layout");
_Static_assert(offsetof(struct rsprof_heap_header, session_pid) == RSPROF_HEAP_OFF_SESSION_PID,
               "layout");
_Static_assert(offsetof(struct rsprof_heap_header, write_pos) == RSPROF_HEAP_OFF_WRITE_POS,
               "layout");
_Static_assert(offsetof(struct rsprof_heap_header, read_pos) == RSPROF_HEAP_OFF_READ_POS,
               "layout");
_Static_assert(sizeof(struct rsprof_heap_header) <= RSPROF_HEAP_HEADER_SIZE, "layout");


/* Shared by the shim and the reader: both must agree on a ring owner's identity. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Field 22 of /proc/<pid>/stat (start time in clock ticks after boot), 0 if there is no
 * such process; pid 0 means this process. Equal for a process before and after exec,
 * different for two processes that shared a pid. */
static inline uint64_t heapring_start_time(int pid) {
    char path[64], buf[1024];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* comm may contain spaces and parentheses */
    if (p == NULL) return 0;
    p++;
    for (int field = 2; field < 22 && *p; p++)
        if (*p == ' ') field++;
    uint64_t v = 0;
    while (*p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
    return v;
}

/* Is the session (the rsprof that will read this ring, see session_pid) still alive?  The
 * same process, not merely the same pid: its start time must be the one recorded. */
static inline int heapring_session_alive(int32_t session_pid, uint64_t session_start) {
    if (session_pid <= 0) return 0;
    uint64_t now = heapring_start_time(session_pid);
    return now != 0 && (session_start == 0 || now == session_start);
}

/* The pid in a ring's name "rsprof-heap.<pid>.<suffix>", 0 if the name is not one. */
static inline long heapring_name_pid(const char *name) {
    size_t plen = sizeof RSPROF_HEAP_NAME_PREFIX - 1;
    if (strncmp(name, RSPROF_HEAP_NAME_PREFIX, plen) != 0) return 0;
    const char *p = name + plen;
    long pid = 0;
    while (*p >= '0' && *p <= '9' && pid <= 0x7fffffffL) pid = pid * 10 + (*p++ - '0');
    if (*p++ != '.' || pid <= 0 || pid > 0x7fffffffL) return 0;
    unsigned n = 0;
    for (; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); p++) n++;
    return *p == 0 && n == RSPROF_HEAP_SUFFIX_HEX ? pid : 0;
}

#endif /* RSPROF_HEAPRING_H */
