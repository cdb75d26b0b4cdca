/* perf_tables.h: the C-side aggregation structures behind PerfSampler.
 *
 * Samples are never turned into Python objects one by one: the drain loop folds every
 * call chain into a de-duplicated stack table (stable ids 1, 2, 3, ...) and bumps a
 * per-(stack id, tid) counter.  Python only ever sees whole batches through take().
 *
 * Everything here is plain C with no Python API, so it can run with the GIL released.
 * None of it is thread safe on its own: perf.c serialises access with its mutex.
 * Allocation failures are reported by return value (never abort): the drain loop has
 * no way to raise, so it accounts such samples as lost instead.
 */
#ifndef RSPROF_PERF_TABLES_H
#define RSPROF_PERF_TABLES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- hashing */

static inline uint64_t perf_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* xxhash64-style round over the 64-bit words of a call chain, finished with the
 * murmur3 avalanche so that the low bits used for slot selection are well mixed
 * (return addresses share most of their high bits). */
static inline uint64_t perf_hash_ips(const uint64_t *ips, uint32_t n) {
    uint64_t h = 0x27D4EB2F165667C5ULL ^ ((uint64_t)n * 0x9E3779B97F4A7C15ULL);
    for (uint32_t i = 0; i < n; i++) {
        h ^= perf_rotl64(ips[i] * 0xC2B2AE3D27D4EB4FULL, 31) * 0x9E3779B97F4A7C15ULL;
        h = perf_rotl64(h, 27) * 0x9E3779B97F4A7C15ULL + 0x85EBCA77C2B2AE63ULL;
    }
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

/* ------------------------------------------------------- growable vectors */

/* Grows *buf so that it can hold at least `need` elements of `elem` bytes. */
static inline bool perf_vec_reserve(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elem) return false;
        ncap *= 2;
    }
    void *p = realloc(*buf, ncap * elem);
    if (p == NULL) return false;
    *buf = p;
    *cap = ncap;
    return true;
}

/* ------------------------------------------------------------ stack table */

typedef struct {
    uint64_t hash;
    uint64_t off;    /* index of the first ip in perf_stack_table.ips */
    uint32_t depth;
} perf_stack_entry;

/* Stack id i lives in entries[i - 1]; slots[] holds entry index + 1 (0 = empty).
 * The table only grows: ids must stay valid for the sampler's whole lifetime. */
typedef struct {
    perf_stack_entry *entries;
    size_t n_entries, cap_entries;
    uint64_t *ips;
    size_t n_ips, cap_ips;
    uint32_t *slots;
    size_t n_slots;   /* power of two, or 0 before the first insert */
} perf_stack_table;

static inline void perf_stack_table_free(perf_stack_table *t) {
    free(t->entries);
    free(t->ips);
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static inline bool perf_stack_table_rehash(perf_stack_table *t, size_t n_slots) {
    uint32_t *slots = calloc(n_slots, sizeof(uint32_t));
    if (slots == NULL) return false;
    size_t mask = n_slots - 1;
    for (size_t i = 0; i < t->n_entries; i++) {
        size_t s = (size_t)t->entries[i].hash & mask;
        while (slots[s] != 0) s = (s + 1) & mask;
        slots[s] = (uint32_t)(i + 1);
    }
    free(t->slots);
    t->slots = slots;
    t->n_slots = n_slots;
    return true;
}

/* Returns the id of the stack ips[0..n), inserting it if new (*is_new set accordingly).
 * Returns 0 on allocation failure or id-space exhaustion. */
static inline uint32_t perf_stack_table_intern(perf_stack_table *t, const uint64_t *ips,
                                               uint32_t n, bool *is_new) {
    *is_new = false;
    /* Keep the load factor at or below 1/2 so linear probing stays short. */
    if ((t->n_entries + 1) * 2 > t->n_slots) {
        if (!perf_stack_table_rehash(t, t->n_slots ? t->n_slots * 2 : 1024)) return 0;
    }
    uint64_t h = perf_hash_ips(ips, n);
    size_t mask = t->n_slots - 1;
    size_t s = (size_t)h & mask;
    for (; t->slots[s] != 0; s = (s + 1) & mask) {
        const perf_stack_entry *e = &t->entries[t->slots[s] - 1];
        if (e->hash == h && e->depth == n &&
            memcmp(&t->ips[e->off], ips, (size_t)n * sizeof(uint64_t)) == 0)
            return t->slots[s];
    }
    if (t->n_entries >= UINT32_MAX - 1) return 0;
    if (!perf_vec_reserve((void **)&t->entries, &t->cap_entries, t->n_entries + 1,
                          sizeof(perf_stack_entry)))
        return 0;
    if (!perf_vec_reserve((void **)&t->ips, &t->cap_ips, t->n_ips + n, sizeof(uint64_t)))
        return 0;
    perf_stack_entry *e = &t->entries[t->n_entries];
    e->hash = h;
    e->off = t->n_ips;
    e->depth = n;
    memcpy(&t->ips[t->n_ips], ips, (size_t)n * sizeof(uint64_t));
    t->n_ips += n;
    t->n_entries++;
    t->slots[s] = (uint32_t)t->n_entries;
    *is_new = true;
    return (uint32_t)t->n_entries;
}

/* ------------------------------------------------------------ count table */

typedef struct {
    uint32_t stack_id;   /* 0 = empty slot (stack ids start at 1) */
    int32_t tid;
    uint64_t count;
} perf_count_slot;

/* (stack id, tid) -> count; emptied wholesale by take(), so no deletion is needed. */
typedef struct {
    perf_count_slot *slots;
    size_t n_slots;   /* power of two, or 0 before the first insert */
    size_t used;
} perf_count_table;

static inline void perf_count_table_free(perf_count_table *t) {
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static inline size_t perf_count_slot_of(uint32_t stack_id, int32_t tid, size_t mask) {
    uint64_t k = ((uint64_t)stack_id << 32) | (uint32_t)tid;
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDULL;
    k ^= k >> 33;
    return (size_t)k & mask;
}

static inline bool perf_count_table_grow(perf_count_table *t) {
    size_t n_slots = t->n_slots ? t->n_slots * 2 : 256;
    perf_count_slot *slots = calloc(n_slots, sizeof(perf_count_slot));
    if (slots == NULL) return false;
    size_t mask = n_slots - 1;
    for (size_t i = 0; i < t->n_slots; i++) {
        const perf_count_slot *o = &t->slots[i];
        if (o->stack_id == 0) continue;
        size_t s = perf_count_slot_of(o->stack_id, o->tid, mask);
        while (slots[s].stack_id != 0) s = (s + 1) & mask;
        slots[s] = *o;
    }
    free(t->slots);
    t->slots = slots;
    t->n_slots = n_slots;
    return true;
}

static inline bool perf_count_table_add(perf_count_table *t, uint32_t stack_id, int32_t tid,
                                        uint64_t n) {
    if ((t->used + 1) * 2 > t->n_slots && !perf_count_table_grow(t)) return false;
    size_t mask = t->n_slots - 1;
    size_t s = perf_count_slot_of(stack_id, tid, mask);
    for (; t->slots[s].stack_id != 0; s = (s + 1) & mask) {
        if (t->slots[s].stack_id == stack_id && t->slots[s].tid == tid) {
            t->slots[s].count += n;
            return true;
        }
    }
    t->slots[s].stack_id = stack_id;
    t->slots[s].tid = tid;
    t->slots[s].count = n;
    t->used++;
    return true;
}

#endif /* RSPROF_PERF_TABLES_H */
