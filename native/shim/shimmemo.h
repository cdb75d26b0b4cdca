/* shimmemo.h: the memo of a thread's last walks (native/shim/shimcfi.c), shared with the
 * shim's allocation path (heapshim.c), which checks the predicted way inline before it
 * calls shimcfi_walk (shimcfi_memo_hit below).  Included by those two files only. */
#ifndef RSPROF_SHIMMEMO_H
#define RSPROF_SHIMMEMO_H

#include <stddef.h>
#include <stdint.h>

#include "shimcfi.h"

/* Bumped by every flush of the rules (shimcfi.c). */
extern uint64_t shimcfi_generation;

/* The last walks of this thread, to repeat them without walking.  A walk is a function of
 * the registers it starts from (pc, sp, bp), of the stack words it reads and of the rules
 * (which change only when a dlclose flushes them: shimcfi_generation).  So if the registers are
 * the same and every word it read still holds the same value, the result is the same,
 * exactly.  The check is a handful of independent loads, where the walk is a chain of
 * dependent ones (stack word -> rule -> next stack word), ~5 ns a frame.
 *
 * The memo holds MEMO_WAYS walks, fully associative: a walk is found by its tag (a hash of
 * pc and sp) in one compact array, then checked; the way replaced is chosen by a clock
 * (second chance for ways hit since the hand last passed).  A program often allocates from
 * a cycle of a few dozen call paths (sqlite3 makes ~25 distinct allocations per INSERT): a
 * memo of the last 4 walks replaced in turn hit 5 % of them there; sets of a few ways
 * indexed by hash hit between 77 % and 99.99 % as the paths happened to collide.  The
 * first read of a walk is the return address of its second frame, so a way of another
 * path at the same (pc, sp) is rejected at its first words. */
#define MEMO_WAYS SHIMCFI_WAYS
_Static_assert(MEMO_WAYS == 64, "a way is a bit of a 64-bit mask");
#define MEMO_READS 64
#define MEMO_OUT 48
/* Laid out by cache line: what a hit reads (the header, then the offsets and values of
 * its ~16 reads) is 4 lines, prefetched before the walk that is predicted to hit it
 * (memo_follow). */
typedef struct {
    _Alignas(64) uint64_t generation; /* 0: empty, or being rewritten */
    uint64_t key;        /* 0, or the hash of its first frames (see shimcfi_walk) */
    uintptr_t pc, sp, bp;
    uint32_t serial;     /* the set's serial when written (see memo_set) */
    uint16_t max, n_reads, n_out;
    uint8_t overflow, truncated, used_bp; /* used_bp: the walk depended on the starting rbp */
    _Alignas(64) uint32_t offset[MEMO_READS]; /* stack word read, as its distance above sp */
    uintptr_t value[MEMO_READS]; /* what it held */
    uint64_t out[MEMO_OUT];
} walk_memo;
_Static_assert(offsetof(walk_memo, offset) == 64 && sizeof(walk_memo) == 19 * 64,
               "a way's header is one cache line, its offsets start the next");
_Static_assert(MEMO_READS < 65536 && MEMO_OUT < 65536, "counts fit their fields");

/* A thread's memo lives in the caller's per-thread memory, not in TLS: glibc carves static
 * TLS out of every thread's stack, and 77 KiB of it would cost each thread that much stack.
 * `serial` is bumped when the memory passes to another thread (shimcfi_memo_reset): ways
 * written under an older serial are empty, without touching them (the memory is lazily
 * touched, a page at a time). */
typedef struct {
    uint32_t serial;
    uint32_t hand;             /* the clock's next way */
    uint8_t tag8[MEMO_WAYS];   /* each tag's top byte, compared 16 at a time */
    uint64_t tag[MEMO_WAYS];   /* memo_tag() of each way's walk; 0: none */
    uint8_t used[MEMO_WAYS];   /* hit since the hand last passed */
    /* The way whose walk came right after each way's last time, + 1 (0: none), the one
     * that came after it the time before that (when it differs), and the way of the
     * thread's last walk + 1: a program that allocates from a cycle of paths makes its
     * walks in the same order again and again (see memo_predicted), and where the cycle
     * forks, it mostly takes one of two branches (sqlite3: 9 % of its walks missed the
     * one successor; all but 0.1 % of those were the other). */
    uint8_t next[MEMO_WAYS];
    uint8_t other[MEMO_WAYS];
    uint32_t last;
    uint64_t lookups; /* walks neither way predicted held (shimcfi_memo_lookups) */
    walk_memo way[MEMO_WAYS]; /* 64-aligned (the memo is: shimcfi.h) */
} memo_set;
_Static_assert(sizeof(memo_set) <= sizeof(shimcfi_memo), "SHIMCFI_MEMO_BYTES too small");

/* Every word a memo read was inside this thread's stack when it was read, and the stack
 * of a thread does not move, so reading them again is safe. */
static inline int memo_same_start(const walk_memo *m, uint64_t generation, uint32_t serial,
                                   uintptr_t pc, uintptr_t sp, uintptr_t bp, unsigned max) {
    return m->generation == generation && m->serial == serial && m->pc == pc && m->sp == sp &&
           m->max == max && !(m->used_bp && m->bp != bp);
}

/* The first read of m whose word differs now, or -1: every word the same, the same walk. */
static inline int memo_diverges(const walk_memo *m, uintptr_t sp) {
    for (unsigned i = 0; i < m->n_reads; i++)
        if (*(const uintptr_t *)(sp + m->offset[i]) != m->value[i]) return (int)i;
    return -1;
}

/* Every word m read the same now: memo_diverges(m, sp) < 0 without a branch per word, so
 * the loads of a hit (where every word is read anyway) overlap. */
static inline int memo_same_words(const walk_memo *m, uintptr_t sp) {
    unsigned n = m->n_reads, i = 0;
    uintptr_t d0 = 0, d1 = 0;
    for (; i + 2 <= n; i += 2) {
        d0 |= *(const uintptr_t *)(sp + m->offset[i]) ^ m->value[i];
        d1 |= *(const uintptr_t *)(sp + m->offset[i + 1]) ^ m->value[i + 1];
    }
    if (i < n) d0 |= *(const uintptr_t *)(sp + m->offset[i]) ^ m->value[i];
    return (d0 | d1) == 0;
}

/* The way the thread's next walk will most likely hit: the one that followed way w last
 * time.  Its lines are prefetched now, while the program works until its next allocation,
 * and that walk checks it first (memo_predicted). */
static inline void memo_follow(memo_set *set, int w) {
    uint32_t last = set->last;
    uint8_t now = (uint8_t)(w + 1);
    if (last != 0 && set->next[last - 1] != now) {
        set->other[last - 1] = set->next[last - 1];
        set->next[last - 1] = now;
    }
    set->last = now;
    if (w < 0 || set->next[w] == 0) return;
    const char *m = (const char *)&set->way[set->next[w] - 1];
    /* The header and the first 16 reads' offsets and values (a hit reads ~16). */
    __builtin_prefetch(m, 0, 3);
    __builtin_prefetch(m + offsetof(walk_memo, offset), 0, 3);
    __builtin_prefetch(m + offsetof(walk_memo, value), 0, 3);
    __builtin_prefetch(m + offsetof(walk_memo, value) + 64, 0, 3);
}

/* Way g - 1 (g: a next[] or other[] entry, 0 for none) holds this very walk. */
static inline int memo_holds(const memo_set *set, unsigned g, uint64_t generation,
                             uint32_t serial, uintptr_t pc, uintptr_t sp, uintptr_t bp,
                             unsigned max) {
    if (g == 0) return 0;
    const walk_memo *m = &set->way[g - 1];
    /* A way with no walk (being rewritten, or its walk could not be kept) has generation
     * 0, which memo_same_start rejects. */
    return memo_same_start(m, generation, serial, pc, sp, bp, max) && memo_same_words(m, sp);
}

/* The way predicted for this walk (memo_follow) if it holds this very walk, else -1: the
 * way that followed the thread's last walk last time, or the one that followed it the time
 * before.  Any way whose start and every read match is this walk, exactly, whatever its
 * key: the key (memo_find) only tells where to look.  A cycle of paths through an
 * allocation wrapper (32 % of sqlite3's walks are found by key) is so found without the
 * fork's lookup. */
static inline int memo_predicted(memo_set *set, uint64_t generation, uint32_t serial,
                                 uintptr_t pc, uintptr_t sp, uintptr_t bp, unsigned max) {
    uint32_t last = set->last;
    if (last == 0) return -1;
    unsigned g = set->next[last - 1];
    if (!memo_holds(set, g, generation, serial, pc, sp, bp, max)) {
        g = set->other[last - 1];
        if (!memo_holds(set, g, generation, serial, pc, sp, bp, max)) return -1;
    }
    set->used[g - 1] = 1;
    return (int)g - 1;
}

/* Way w holds this walk: the count shimcfi_walk returns for it, with *way and *hit set and
 * *truncated or'ed (its frames stay in the memo: shimcfi_memo_frames), and w noted as the
 * walk the next one follows (memo_follow). */
static inline unsigned memo_take(memo_set *set, int w, int *truncated, int *way, int *hit) {
    *truncated |= set->way[w].truncated;
    *way = w;
    *hit = 1;
    memo_follow(set, w);
    return 1u + set->way[w].n_out;
}

/* The predicted way (memo_predicted) holds the walk from (ips[0], sp, bp) up to `max`
 * frames: returns the count shimcfi_walk would, with *way and *hit set and *truncated
 * or'ed as it does; else 0, and the caller walks (shimcfi_walk).  A walk made by a
 * nested recording (a signal handler's, without a memo) never comes here. */
static inline unsigned shimcfi_memo_hit(shimcfi_memo *memo, uintptr_t pc, uintptr_t sp,
                                        uintptr_t bp, unsigned max, int *truncated, int *way,
                                        int *hit) {
    memo_set *set = (memo_set *)memo->bytes;
    int w = memo_predicted(set, __atomic_load_n(&shimcfi_generation, __ATOMIC_ACQUIRE),
                           set->serial, pc, sp, bp, max);
    return w < 0 ? 0 : memo_take(set, w, truncated, way, hit);
}

#endif
