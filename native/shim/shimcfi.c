/* shimcfi.c: call stacks by CFI inside the heap shim, x86_64 (see shimcfi.h).
 *
 * The shim records a call stack inside every malloc.  Debian's libc, libstdc++, Rust's std
 * and any -O2 code are built without frame pointers, so only the CFI (.eh_frame) that every
 * module carries for exceptions tells where a frame's caller is.  Here, inside the target:
 *
 * - A return address is mapped to its module by glibc's _dl_find_object (2.35+), made for
 *   unwinders: lock-free (it never takes the loader lock, which dlopen holds while it calls
 *   malloc), async-signal-safe, no allocation.  It gives the module's .eh_frame_hdr.
 * - The FDE is found by binary search in .eh_frame_hdr's sorted table, and the CIE's and
 *   FDE's CFA programs are run up to the address once.  The result is a compact rule
 *   (CFA = rsp or rbp + k, or [rsp + k] in a signal trampoline; the return address and the
 *   saved rbp at CFA or rsp + k) packed in 64 bits.
 * - Rules are cached per return address in a fixed-size lock-free hash table mapped once
 *   at init: a slot is claimed with a CAS, written, then published by a release store of its
 *   key, and never changes afterwards (until a dlclose flushes the table).  A repeated call
 *   site costs one hash probe per frame.
 * - Reads are bounded: stack words only within the thread's stack [lo, hi); ELF headers,
 *   .eh_frame_hdr and .eh_frame only within the module's readable PT_LOAD segments (from
 *   its program headers in memory).  Malformed CFI gives "no rule", never a wild read.
 * - Code without CFI (JIT code, assembly without directives) or with a rule the compact
 *   form cannot hold (DWARF expressions such as the PLT's) is stepped by its frame record
 *   at rbp, checked like the frame-pointer walk (inside the stack, strictly upwards).  JIT
 *   code keeps frame pointers; a caller that is garbage lands outside every executable
 *   mapping, and the recorder, which knows them, cuts the stack there ([truncated]).
 * - The CIE/FDE parsing and the CFA program interpreter are native/cfi_eval.h, shared with
 *   the extension's table builder (native/unwind.c); what is the shim's own is here: the
 *   bounds of the module in memory, the .eh_frame_hdr search, the packed rule, its cache.
 */
#define _GNU_SOURCE
#include "shimcfi.h"
#include "shimmemo.h"

#include "cfi_eval.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* glibc's struct dl_find_object on x86_64 (no eh_dbase, no eh_count), declared here so the
 * shim builds against any glibc and finds the function at run time. */
struct shim_dlfo {
    unsigned long long flags;
    void *map_start, *map_end;
    struct link_map *link_map;
    void *eh_frame;
    unsigned long long reserved[7];
};
static int (*g_find_object)(void *, struct shim_dlfo *);

/* ------------------------------------------------------------------ rules */

/* A rule in 64 bits:
 *   bits 0-2   kind
 *   bit  3     signal frame (the return address it yields is an interrupted pc)
 *   bit  4     return address saved relative to rsp (signal frames) instead of the CFA
 *   bits 5-6   rbp: BP_SAME, BP_CFA (saved at CFA + off), BP_RSP (at rsp + off), BP_UNDEF
 *   bits 8-23  return address offset (int16)
 *   bits 24-39 rbp offset (int16)
 *   bits 40-63 CFA offset (int24: frames up to 8 MiB; larger ones use the fallback) */
enum {
    K_NONE = 0,    /* never stored: "not computed" */
    K_RSP = 1,     /* cfa = rsp + off */
    K_RBP = 2,     /* cfa = rbp + off */
    K_DEREF = 3,   /* cfa = [rsp + off] (signal trampoline: the interrupted rsp) */
    K_END = 4,     /* return address undefined: outermost frame (_start, thread start) */
    K_FP = 5,      /* in a module, but no usable rule: frame-pointer fallback */
    K_UNKNOWN = 6, /* in no loaded module (JIT code, or not code at all) */
};
enum { BP_SAME = 0, BP_CFA = 1, BP_RSP = 2, BP_UNDEF = 3 };

#define RULE_KIND(r) ((unsigned)((r) & 7u))
#define RULE_SIGNAL(r) (((r) >> 3) & 1u)
#define RULE_RA_RSP(r) (((r) >> 4) & 1u)
#define RULE_BP(r) ((unsigned)(((r) >> 5) & 3u))
#define RULE_RA_OFF(r) ((int64_t)(int16_t)(uint16_t)((r) >> 8))
#define RULE_BP_OFF(r) ((int64_t)(int16_t)(uint16_t)((r) >> 24))
#define RULE_CFA_OFF(r) ((int64_t)(r) >> 40)

/* The rule from cfi_eval.h's state.  The shim steps by rbp what the packed form cannot hold
 * (a CFA in another register or from an expression, the PLT's included; a return address
 * without a save slot), and keeps walking with rbp unknown when only rbp's rule is lost
 * (it ignores `unfollowed`: the register rules say what was lost). */
static uint64_t pack_rule(const cfi_state *s, int signal) {
    if (s->ra == CFI_REG_UNDEF) return K_END;
    if (s->cfa != CFI_CFA_RSP && s->cfa != CFI_CFA_RBP && s->cfa != CFI_CFA_DEREF) return K_FP;
    if (s->ra != CFI_REG_CFA && s->ra != CFI_REG_RSP) return K_FP;
    if (s->cfa_off < -(1 << 23) || s->cfa_off >= (1 << 23) || s->ra_off < INT16_MIN ||
        s->ra_off > INT16_MAX || s->bp_off < INT16_MIN || s->bp_off > INT16_MAX)
        return K_FP;
    unsigned bp = s->bp; /* rbp is never CFI_REG_LOST: a rule it cannot follow is UNDEF */
    uint64_t r = s->cfa == CFI_CFA_RSP ? K_RSP : s->cfa == CFI_CFA_RBP ? K_RBP : K_DEREF;
    r |= (uint64_t)(signal != 0) << 3;
    r |= (uint64_t)(s->ra == CFI_REG_RSP) << 4;
    r |= (uint64_t)(bp & 3u) << 5;
    r |= (uint64_t)(uint16_t)(int16_t)s->ra_off << 8;
    r |= (uint64_t)(uint16_t)(int16_t)s->bp_off << 24;
    r |= (uint64_t)s->cfa_off << 40;
    return r;
}

/* ------------------------------------------------------------------ bounded reads */

/* A module's readable PT_LOAD segments: every read of its headers, .eh_frame_hdr and
 * .eh_frame must fall inside one of them (the gaps between segments may be PROT_NONE). */
#define MAX_SEGS 8
typedef struct {
    uintptr_t start[MAX_SEGS], end[MAX_SEGS];
    unsigned n;
} module_segs;

/* The end of the readable segment holding [p, p + len), or 0. */
static uintptr_t seg_end(const module_segs *m, uintptr_t p, uintptr_t len) {
    for (unsigned i = 0; i < m->n; i++)
        if (p >= m->start[i] && p < m->end[i] && m->end[i] - p >= len) return m->end[i];
    return 0;
}

/* ------------------------------------------------------------------ modules */

/* The module's readable segments, from its ELF and program headers in memory.  The ELF
 * header sits at the start of the first mapping (first PT_LOAD at file offset 0) and the
 * program headers must lie in that first page, which is always mapped. */
static int module_segments(const struct shim_dlfo *fo, module_segs *m) {
    uintptr_t base = (uintptr_t)fo->map_start;
    if (fo->link_map == NULL || base == 0 || (base & 4095)) return 0;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)base;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phoff < sizeof(Elf64_Ehdr) ||
        eh->e_phoff > 4096 || (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr) > 4096 - eh->e_phoff)
        return 0;
    uintptr_t bias = fo->link_map->l_addr;
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(base + eh->e_phoff);
    m->n = 0;
    for (unsigned i = 0; i < eh->e_phnum && m->n < MAX_SEGS; i++) {
        if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_R) || ph[i].p_memsz == 0) continue;
        uintptr_t s = bias + ph[i].p_vaddr, e = s + ph[i].p_memsz;
        if (e <= s) continue;
        m->start[m->n] = s;
        m->end[m->n] = e;
        m->n++;
    }
    return m->n > 0;
}

/* ------------------------------------------------------------------ CFA programs */

/* Parses the CIE at `at` (its length field); it must lie within one readable segment. */
static int parse_cie(const module_segs *m, uintptr_t at, cfi_cie *cie) {
    uintptr_t end = seg_end(m, at, 4);
    if (end == 0) return 0;
    cfi_cursor c = {(const uint8_t *)at, (const uint8_t *)end, 0};
    uint64_t len = cfi_fixed(&c, 4); /* 64-bit lengths (0xffffffff) are never emitted */
    if (c.bad || len < 4 || len == 0xffffffffu || len > (uint64_t)(c.end - c.p)) return 0;
    c.end = c.p + len;
    if (cfi_fixed(&c, 4) != 0) return 0; /* not a CIE */
    return cfi_parse_cie(c.p, c.end, 0, cie);
}

/* The rules at `pc`: the CIE's initial instructions, then the FDE's until the location
 * passes pc.  Returns 0 on malformed input. */
/* A rule's computation works in here, not on the target's stack (it is 600 bytes). */
typedef struct {
    struct shim_dlfo fo;
    module_segs m;
    cfi_cie cie;
    cfi_program pr;
    cfi_state init;
} rule_work;
_Static_assert(sizeof(rule_work) <= sizeof(shimcfi_scratch), "SHIMCFI_SCRATCH_BYTES too small");

static int rules_at(rule_work *w, const uint8_t *p, const uint8_t *end, uintptr_t begin,
                    uintptr_t pc, cfi_state *s) {
    const cfi_cie *cie = &w->cie;
    cfi_program *pr = &w->pr;
    uint64_t delta;
    int st;
    /* The CIE's advances (none in practice) do not move the location. */
    cfi_program_init(pr, cie, cie->insns, cie->insns_end, NULL, begin, 0);
    while ((st = cfi_step(pr, s, &delta)) == CFI_STEP_ADVANCE) {
    }
    if (st != CFI_STEP_END) return 0;
    w->init = *s;
    cfi_program_init(pr, cie, p, end, &w->init, begin, 0);
    while ((st = cfi_step(pr, s, &delta)) == CFI_STEP_ADVANCE) {
        if (delta > pc - pr->loc) return 1; /* the next row starts past pc */
        pr->loc += delta;
    }
    return st == CFI_STEP_END;
}

/* The rule for `pc` (an address inside the instruction that made the call, or an
 * interrupted pc).  Never reads outside the module's readable segments. */
static uint64_t compute_rule(uintptr_t pc, shimcfi_scratch *scratch) {
    rule_work *w = (rule_work *)scratch->bytes;
    struct shim_dlfo *fo = &w->fo;
    memset(fo, 0, sizeof *fo);
    if (g_find_object((void *)pc, fo) != 0) return K_UNKNOWN;
    module_segs *m = &w->m;
    if (fo->eh_frame == NULL || !module_segments(fo, m)) return K_FP;
    /* .eh_frame_hdr: version 1, eh_frame_ptr_enc, fde_count_enc, table_enc, then the
     * encoded eh_frame_ptr and fde_count and a table of (initial_loc, fde) sdata4 pairs
     * relative to the header, sorted by initial_loc. */
    uintptr_t hdr = (uintptr_t)fo->eh_frame;
    uintptr_t hend = seg_end(m, hdr, 4);
    if (hend == 0) return K_FP;
    const uint8_t *h = (const uint8_t *)hdr;
    if (h[0] != 1 || h[3] != 0x3b) return K_FP;
    cfi_cursor c = {h + 4, (const uint8_t *)hend, 0};
    (void)cfi_encoded(&c, h[1], 0, hdr);
    uint64_t count = cfi_encoded(&c, h[2], 0, hdr);
    if (c.bad || count == 0 || count > (uint64_t)(c.end - c.p) / 8) return K_FP;
    const int32_t *table = (const int32_t *)c.p;
    int64_t rel = (int64_t)(pc - hdr);
    if (table[0] > rel) return K_FP; /* before the first function */
    size_t lo = 0, hi = count; /* largest i with table[2i] <= rel */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (table[2 * mid] <= rel) lo = mid;
        else hi = mid;
    }
    uintptr_t fde = hdr + (uintptr_t)(intptr_t)table[2 * lo + 1];
    /* FDE: length, CIE pointer (distance back from this field), pc_begin, pc_range,
     * augmentation data, instructions. */
    uintptr_t fend = seg_end(m, fde, 8);
    if (fend == 0) return K_FP;
    cfi_cursor f = {(const uint8_t *)fde, (const uint8_t *)fend, 0};
    uint64_t len = cfi_fixed(&f, 4);
    if (len == 0 || len == 0xffffffffu || len > (uint64_t)(f.end - f.p)) return K_FP;
    f.end = f.p + len;
    uintptr_t id_at = (uintptr_t)f.p;
    uint64_t id = cfi_fixed(&f, 4);
    if (f.bad || id == 0 || id > id_at) return K_FP;
    cfi_cie *cie = &w->cie;
    if (!parse_cie(m, id_at - id, cie)) return K_FP;
    uintptr_t begin = cfi_encoded(&f, cie->fde_enc, 0, 0);
    uintptr_t range = cfi_encoded(&f, cie->fde_enc & 0x0f, 0, 0);
    if (cie->has_z) {
        uint64_t zlen = cfi_uleb(&f);
        if (f.bad || zlen > (uint64_t)(f.end - f.p)) return K_FP;
        f.p += zlen;
    }
    if (f.bad || pc < begin || pc - begin >= range) return K_FP; /* no FDE covers pc */
    /* Before any rule: no CFA, no return address, rbp unchanged. */
    cfi_state s = {CFI_CFA_BAD, CFI_REG_SAME, CFI_REG_SAME, 0, 0, 0, 0};
    if (!rules_at(w, f.p, f.end, begin, pc, &s)) return K_FP;
    return pack_rule(&s, cie->signal);
}

/* ------------------------------------------------------------------ rule cache */

#define CACHE_BITS 17 /* 128 Ki slots, 2 MiB of lazily touched memory */
#define CACHE_WINDOW 16
#define KEY_CLAIMED 1u

typedef struct {
    uint64_t key; /* 0 empty, 1 being written, else the address */
    uint64_t rule;
} cache_slot;

static cache_slot *g_cache;
static uint64_t g_computed, g_uncached, g_fp_frames;

static inline uint64_t rule_for(uintptr_t key, shimcfi_scratch *scratch) {
    cache_slot *t = g_cache;
    size_t home = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> (64 - CACHE_BITS));
    for (unsigned i = 0; i < CACHE_WINDOW; i++) {
        cache_slot *s = &t[(home + i) & ((1u << CACHE_BITS) - 1)];
        uint64_t k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
        if (LIKELY(k == key)) {
            uint64_t r = __atomic_load_n(&s->rule, __ATOMIC_RELAXED);
            if (LIKELY(r != K_NONE)) return r;
            break; /* flushed under us: compute */
        }
        if (k == 0) {
            uint64_t r = compute_rule(key, scratch);
            __atomic_fetch_add(&g_computed, 1, __ATOMIC_RELAXED);
            /* "In no module" is not cached: a later dlopen may map code there. */
            if (r == K_UNKNOWN) return r;
            uint64_t expected = 0;
            if (__atomic_compare_exchange_n(&s->key, &expected, KEY_CLAIMED, 0,
                                            __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
                __atomic_store_n(&s->rule, r, __ATOMIC_RELAXED);
                __atomic_store_n(&s->key, key, __ATOMIC_RELEASE);
            }
            return r;
        }
    }
    __atomic_fetch_add(&g_uncached, 1, __ATOMIC_RELAXED);
    return compute_rule(key, scratch);
}

int shimcfi_init(void) {
    void *f = dlsym(RTLD_DEFAULT, "_dl_find_object");
    if (f == NULL) return 0;
    void *t = mmap(NULL, sizeof(cache_slot) << CACHE_BITS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (t == MAP_FAILED) return 0;
    g_find_object = (int (*)(void *, struct shim_dlfo *))f;
    g_cache = t;
    return 1;
}

/* Bumped by every flush: a thread's memo of its last walk (below) is only valid for the
 * rules of its generation. */
uint64_t shimcfi_generation = 1; /* 0 in a memo means "empty" */

void shimcfi_flush(void) {
    /* Private anonymous memory: DONTNEED gives back zero pages (empty slots). */
    if (g_cache) madvise(g_cache, sizeof(cache_slot) << CACHE_BITS, MADV_DONTNEED);
    __atomic_add_fetch(&shimcfi_generation, 1, __ATOMIC_RELEASE);
}

void shimcfi_get_stats(shimcfi_stats *out) {
    out->computed = __atomic_load_n(&g_computed, __ATOMIC_RELAXED);
    out->uncached = __atomic_load_n(&g_uncached, __ATOMIC_RELAXED);
    out->fp_frames = __atomic_load_n(&g_fp_frames, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------ walk */

/* A stack word at `a` can be read: 8 bytes inside [lo, hi). */
static inline int stack_ok(uintptr_t a, uintptr_t lo, uintptr_t hi) {
    return a >= lo && a < hi && hi - a >= 8;
}

void shimcfi_memo_reset(shimcfi_memo *memo) {
    memo_set *set = (memo_set *)memo->bytes;
    set->serial++;
    set->lookups = 0;
}

/* The tag of walks from (pc or key, sp): never 0, the tag of no walk. */
static inline uint64_t memo_tag(uint64_t pc_or_key, uintptr_t sp) {
    return (((uint64_t)pc_or_key ^ ((uint64_t)sp << 21) ^ ((uint64_t)sp >> 3)) *
            0x9E3779B97F4A7C15ULL) | 1;
}

/* m == NULL: a walk nested in another one (malloc in a signal handler that interrupted
 * the shim), which must not touch the memo being written. */
static inline void memo_log(walk_memo *m, uintptr_t addr, uintptr_t v) {
    if (m == NULL) return;
    uintptr_t off = addr - m->sp; /* every word a walk reads lies above its starting sp */
    if (LIKELY(m->n_reads < MEMO_READS && off <= UINT32_MAX)) {
        m->offset[m->n_reads] = (uint32_t)off;
        m->value[m->n_reads++] = v;
    } else {
        m->overflow = 1;
    }
}

static inline uintptr_t memo_load(walk_memo *m, uintptr_t addr) {
    uintptr_t v = *(const uintptr_t *)addr;
    memo_log(m, addr, v);
    return v;
}

static unsigned walk(walk_memo *m, shimcfi_scratch *scratch, uint64_t *ips, unsigned n,
                     unsigned max, uintptr_t sp, uintptr_t bp, uintptr_t lo, uintptr_t hi,
                     int *truncated) {
    uintptr_t pc = ips[n - 1];
    int exact = 0;   /* pc is an interrupted pc (after a signal frame), not a return address */
    /* Code without frame pointers uses rbp as a plain register, so the starting rbp and
     * the rbp values saved in frames differ from call to call: the memo checks them only
     * when the walk used them.  bp_initial: bp is still the starting value; bp_from: else
     * the stack word it was loaded from (0: none, e.g. undefined). */
    int bp_initial = 1;
    uintptr_t bp_from = 0;
    for (;;) {
        uint64_t r = rule_for(exact ? pc : pc - 1, scratch);
        unsigned kind = RULE_KIND(r);
        uintptr_t cfa, ra, nbp = bp, next_bp_from = 0;
        int next_exact = 0, next_bp_set = 0;
        if (kind == K_END) break;
        /* In no module: JIT code (V8, CPython's perf trampolines: they keep frame
         * pointers, stepped below), or garbage found by the fallback, which the recorder
         * cuts as [truncated] (it knows the executable mappings; we cannot read
         * /proc/self/maps in here).  Not repeatable: a dlopen may map code there. */
        if (UNLIKELY(kind == K_UNKNOWN) && m) m->overflow = 1;
        if (LIKELY(kind <= K_DEREF)) {
            int64_t off = RULE_CFA_OFF(r);
            if (kind == K_DEREF) {
                uintptr_t slot = sp + (uintptr_t)off;
                if (!stack_ok(slot, lo, hi)) break;
                cfa = memo_load(m, slot);
            } else {
                if (kind == K_RBP) {
                    if (bp_initial && m) m->used_bp = 1;
                    else if (bp_from) memo_log(m, bp_from, bp);
                }
                cfa = (kind == K_RSP ? sp : bp) + (uintptr_t)off;
            }
            /* The caller's frame is above this one, inside the stack. */
            if (cfa <= sp || cfa > hi) break;
            uintptr_t ra_at = (RULE_RA_RSP(r) ? sp : cfa) + (uintptr_t)RULE_RA_OFF(r);
            if (!stack_ok(ra_at, lo, hi)) break;
            ra = memo_load(m, ra_at);
            unsigned bp_rule = RULE_BP(r);
            if (bp_rule == BP_CFA || bp_rule == BP_RSP) {
                uintptr_t at = (bp_rule == BP_CFA ? cfa : sp) + (uintptr_t)RULE_BP_OFF(r);
                int ok = stack_ok(at, lo, hi);
                nbp = ok ? *(const uintptr_t *)at : 0;
                next_bp_from = ok ? at : 0;
                next_bp_set = 1;
            } else if (bp_rule == BP_UNDEF) {
                nbp = 0;
                next_bp_from = 0;
                next_bp_set = 1;
            }
            next_exact = RULE_SIGNAL(r);
        } else {
            /* No rule: the frame record at rbp, if it is one, holds the caller. */
            if (bp_initial && m) m->used_bp = 1;
            else if (bp_from) memo_log(m, bp_from, bp);
            if (bp < sp || (bp & 7) || bp >= hi || hi - bp < 16) break;
            ra = memo_load(m, bp + 8);
            nbp = *(const uintptr_t *)bp;
            next_bp_from = bp;
            next_bp_set = 1;
            cfa = bp + 16;
            __atomic_fetch_add(&g_fp_frames, 1, __ATOMIC_RELAXED);
        }
        if (ra < 4096) break;
        if (n >= max) {
            *truncated = 1;
            break;
        }
        /* An interrupted pc is stored as pc + 1: readers resolve every entry at - 1. */
        ips[n++] = next_exact ? ra + 1 : ra;
        pc = ra;
        sp = cfa;
        bp = nbp;
        if (next_bp_set) {
            bp_initial = 0;
            bp_from = next_bp_from;
        }
        exact = next_exact;
    }
    return n;
}

/* Where this walk leaves a walk of the same pc and sp (shimcfi_walk): read `index` of way
 * `way`, at `offset` above sp, now holds `word`. */
typedef struct {
    int way, index;
    uint32_t offset;
    uintptr_t word;
} memo_fork;

/* Looks the walk up among the ways of that tag and key; the way found, or -1.  With key 0,
 * *fork receives the first way that starts like this walk (same pc, sp, bp where used) and
 * where it departs from it (way -1: none). */
static inline int memo_find(memo_set *set, uint64_t tag, uint64_t key, uint64_t generation,
                            uint32_t serial, const uint64_t *ips, uintptr_t sp, uintptr_t bp,
                            unsigned max, memo_fork *fork) {
    /* The ways whose tag's top byte is this one's (1/256 of the others on average). */
    uint64_t candidates = 0;
#if defined(__SSE2__)
    __m128i t8 = _mm_set1_epi8((char)(tag >> 56));
    for (unsigned i = 0; i < MEMO_WAYS; i += 16) {
        __m128i row = _mm_loadu_si128((const __m128i *)&set->tag8[i]);
        candidates |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(row, t8)) << i;
    }
#else
    for (unsigned i = 0; i < MEMO_WAYS; i++)
        candidates |= (uint64_t)(set->tag8[i] == (uint8_t)(tag >> 56)) << i;
#endif
    for (; candidates; candidates &= candidates - 1) {
        unsigned w = (unsigned)__builtin_ctzll(candidates);
        if (set->tag[w] != tag) continue;
        const walk_memo *m = &set->way[w];
        if (m->key != key || !memo_same_start(m, generation, serial, ips[0], sp, bp, max))
            continue;
        int at = memo_diverges(m, sp);
        if (at < 0) {
            set->used[w] = 1;
            return (int)w;
        }
        if (fork != NULL && fork->way < 0) {
            fork->way = (int)w;
            fork->index = at;
            fork->offset = m->offset[at];
            fork->word = *(const uintptr_t *)(sp + m->offset[at]);
        }
    }
    return -1;
}

unsigned shimcfi_walk(uint64_t *ips, unsigned n, unsigned max, uintptr_t sp, uintptr_t bp,
                      uintptr_t lo, uintptr_t hi, int *truncated, shimcfi_memo *memo,
                      shimcfi_scratch *scratch, int *way, int *hit) {
    /* The caller passes the memo only to the outermost walk of a thread: a signal handler
     * that allocates while this thread is in here walks on its own, leaving it alone. */
    if (memo == NULL || n != 1) return walk(NULL, scratch, ips, n, max, sp, bp, lo, hi, truncated);
    *way = -1, *hit = 0;
    memo_set *set = (memo_set *)memo->bytes;
    uint64_t generation = __atomic_load_n(&shimcfi_generation, __ATOMIC_ACQUIRE);
    uint32_t serial = set->serial;
    uintptr_t pc = ips[0];
    uint64_t key = 0;
    /* The predicted ways were checked by the caller (shimcfi_memo_hit, shimmemo.h). */
    set->lookups++;
    /* By (pc, sp): a call site reached by one path at a time (or a few) hits here. */
    uint64_t tag = memo_tag(pc, sp);
    memo_fork fork = {-1, 0, 0, 0};
    int w = memo_find(set, tag, 0, generation, serial, ips, sp, bp, max, &fork);
    if (w < 0 && fork.way >= 0) {
        /* Allocation wrappers (sqlite3Malloc, xmalloc, a program's own pool) call malloc
         * from one pc at one sp for many paths.  A walk is deterministic: until it reads a
         * word that differs, it reads where the walk of the way it started like (its fork)
         * read.  So where it departs from that way (which read, at which offset, holding
         * what) tells the paths apart, at no cost, and they are looked up by that key.  The
         * way stays in the memo as long as its paths are looked up through it. */
        set->used[fork.way] = 1;
        key = (((uint64_t)(unsigned)fork.way << 40 ^ (uint64_t)fork.index << 32 ^ fork.offset) *
                   0x9E3779B97F4A7C15ULL ^
               fork.word) | 1; /* never 0, the key of the ways by (pc, sp) */
        tag = memo_tag(key, sp);
        w = memo_find(set, tag, key, generation, serial, ips, sp, bp, max, NULL);
    }
    /* The frames stay in the memo: the caller takes them if it needs them
     * (shimcfi_memo_frames); a stack its reader knows is sent without them. */
    if (w >= 0) return memo_take(set, w, truncated, way, hit);
    /* The clock: ways hit since the hand last passed get a second chance. */
    unsigned k = set->hand % MEMO_WAYS;
    while (set->used[k]) {
        set->used[k] = 0;
        k = (k + 1) % MEMO_WAYS;
    }
    set->hand = k + 1;
    walk_memo *m = &set->way[k];
    set->tag[k] = 0;
    m->generation = 0; /* invalid while it is rewritten */
    m->sp = sp;
    m->n_reads = 0;
    m->overflow = 0;
    m->used_bp = 0;
    int trunc = 0;
    unsigned got = walk(m, scratch, ips, n, max, sp, bp, lo, hi, &trunc);
    *truncated |= trunc;
    if (!m->overflow && got - 1 <= MEMO_OUT) {
        m->key = key;
        m->pc = pc;
        m->bp = bp;
        m->max = max;
        m->n_out = got - 1;
        m->truncated = trunc;
        memcpy(m->out, ips + 1, (size_t)(got - 1) * sizeof *ips);
        m->serial = serial;
        m->generation = generation;
        set->tag[k] = tag;
        set->tag8[k] = (uint8_t)(tag >> 56);
        *way = (int)k;
    }
    memo_follow(set, *way);
    return got;
}

uint64_t shimcfi_memo_lookups(const shimcfi_memo *memo) {
    return ((const memo_set *)memo->bytes)->lookups;
}

const uint64_t *shimcfi_memo_frames(const shimcfi_memo *memo, int way) {
    return ((const memo_set *)memo->bytes)->way[way].out;
}
