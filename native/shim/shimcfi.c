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
 */
#define _GNU_SOURCE
#include "shimcfi.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

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

typedef struct {
    uint8_t cfa;      /* K_RSP, K_RBP, K_DEREF, or K_FP when not expressible */
    uint8_t ra, bp;   /* RA: 0 CFA-relative, 1 rsp-relative, 2 undefined, 3 unknown */
    int64_t cfa_off, ra_off, bp_off;
} cfa_state;
enum { RA_CFA = 0, RA_RSP = 1, RA_UNDEF = 2, RA_UNKNOWN = 3 };

static uint64_t pack_rule(const cfa_state *s, int signal) {
    if (s->ra == RA_UNDEF) return K_END;
    if (s->cfa == K_FP || s->ra == RA_UNKNOWN) return K_FP;
    if (s->cfa_off < -(1 << 23) || s->cfa_off >= (1 << 23) || s->ra_off < INT16_MIN ||
        s->ra_off > INT16_MAX || s->bp_off < INT16_MIN || s->bp_off > INT16_MAX)
        return K_FP;
    uint64_t r = s->cfa;
    r |= (uint64_t)(signal != 0) << 3;
    r |= (uint64_t)(s->ra == RA_RSP) << 4;
    r |= (uint64_t)(s->bp & 3u) << 5;
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

typedef struct {
    uintptr_t p, end;
    int bad;
} cursor;

static uint64_t rd_fixed(cursor *c, unsigned n) {
    if (c->end - c->p < n || c->p > c->end) {
        c->bad = 1;
        c->p = c->end;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, (const void *)c->p, n);
    c->p += n;
    return v;
}

static uint64_t rd_uleb(cursor *c) {
    uint64_t v = 0;
    unsigned shift = 0;
    for (;;) {
        uint8_t b = (uint8_t)rd_fixed(c, 1);
        if (c->bad) return 0;
        if (shift < 64) v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) return v;
    }
}

static int64_t rd_sleb(cursor *c) {
    int64_t v = 0;
    unsigned shift = 0;
    uint8_t b;
    do {
        b = (uint8_t)rd_fixed(c, 1);
        if (c->bad) return 0;
        if (shift < 64) v |= (int64_t)((uint64_t)(b & 0x7f) << shift);
        shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) v |= -((int64_t)1 << shift);
    return v;
}

/* A DW_EH_PE-encoded pointer read from memory: pcrel is relative to the field's own
 * run-time address, datarel to `data` (.eh_frame_hdr).  absptr/udata values are absolute
 * (position-dependent code), textrel/funcrel/indirect are not used on x86_64. */
static uintptr_t rd_encoded(cursor *c, uint8_t enc, uintptr_t data) {
    if (enc == 0xff) return 0;
    uintptr_t field = c->p;
    uint64_t v;
    switch (enc & 0x0f) {
    case 0x00: v = rd_fixed(c, 8); break;
    case 0x01: v = rd_uleb(c); break;
    case 0x02: v = rd_fixed(c, 2); break;
    case 0x03: v = rd_fixed(c, 4); break;
    case 0x04: v = rd_fixed(c, 8); break;
    case 0x09: v = (uint64_t)rd_sleb(c); break;
    case 0x0a: v = (uint64_t)(int64_t)(int16_t)rd_fixed(c, 2); break;
    case 0x0b: v = (uint64_t)(int64_t)(int32_t)rd_fixed(c, 4); break;
    case 0x0c: v = rd_fixed(c, 8); break;
    default: c->bad = 1; return 0;
    }
    switch (enc & 0x70) {
    case 0x00: break;
    case 0x10: v += field; break;
    case 0x30: v += data; break;
    default: c->bad = 1; return 0;
    }
    if (enc & 0x80) c->bad = 1;
    return (uintptr_t)v;
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

#define DW_RBP 6
#define DW_RSP 7
#define STATE_STACK 8

typedef struct {
    uint64_t code_align;
    int64_t data_align;
    uint64_t ra_reg;
    uint8_t fde_enc;
    int signal, has_z;
    uintptr_t insns, insns_end;
} cie_info;

static void set_reg(cfa_state *s, uint64_t reg, uint64_t ra_reg, uint8_t rule, int64_t off) {
    if (reg == ra_reg) {
        s->ra = rule;
        s->ra_off = off;
    } else if (reg == DW_RBP) {
        s->bp = rule == RA_CFA ? BP_CFA : rule == RA_RSP ? BP_RSP : BP_UNDEF;
        s->bp_off = off;
    } else if (reg == DW_RSP) {
        s->cfa = K_FP; /* rsp restored from memory: not the CFA, beyond the compact form */
    }
}

/* DW_CFA_def_cfa_expression: only a signal trampoline's "breg7 n; deref" is kept. */
static void cfa_expr(uintptr_t e, uint64_t len, cfa_state *s) {
    s->cfa = K_FP;
    const uint8_t *b = (const uint8_t *)e;
    if (len >= 3 && b[0] == 0x77 && b[len - 1] == 0x06) {
        cursor c = {e + 1, e + len - 1, 0};
        int64_t n = rd_sleb(&c);
        if (!c.bad && c.p == c.end) {
            s->cfa = K_DEREF;
            s->cfa_off = n;
        }
    }
}

/* Runs a CFA program until the location passes `pc` (initial == NULL: a CIE's initial
 * instructions, run to the end).  Returns 0 on malformed input. */
static int run_cfa(const cie_info *cie, uintptr_t p, uintptr_t end, cfa_state *s,
                   const cfa_state *initial, uintptr_t loc, uintptr_t pc) {
    cfa_state stack[STATE_STACK];
    int depth = 0;
    cursor c = {p, end, 0};
    while (c.p < c.end && !c.bad) {
        uint8_t op = (uint8_t)rd_fixed(&c, 1);
        uint8_t hi = op & 0xc0, lo = op & 0x3f;
        uint64_t reg, delta = 0;
        int advance = 0;
        if (hi == 0x40) {
            delta = lo * cie->code_align;
            advance = 1;
        } else if (hi == 0x80) {
            set_reg(s, lo, cie->ra_reg, RA_CFA, (int64_t)rd_uleb(&c) * cie->data_align);
        } else if (hi == 0xc0) {
            if (initial == NULL) return 0;
            if (lo == cie->ra_reg) {
                s->ra = initial->ra;
                s->ra_off = initial->ra_off;
            } else if (lo == DW_RBP) {
                s->bp = initial->bp;
                s->bp_off = initial->bp_off;
            }
        } else {
            switch (op) {
            case 0x00: break;
            case 0x01: { /* set_loc */
                uintptr_t nloc = rd_encoded(&c, cie->fde_enc, 0);
                if (nloc < loc) return 0;
                delta = nloc - loc;
                advance = 1;
                break;
            }
            case 0x02: delta = rd_fixed(&c, 1) * cie->code_align; advance = 1; break;
            case 0x03: delta = rd_fixed(&c, 2) * cie->code_align; advance = 1; break;
            case 0x04: delta = rd_fixed(&c, 4) * cie->code_align; advance = 1; break;
            case 0x05:
                reg = rd_uleb(&c);
                set_reg(s, reg, cie->ra_reg, RA_CFA, (int64_t)rd_uleb(&c) * cie->data_align);
                break;
            case 0x06:
                reg = rd_uleb(&c);
                if (initial == NULL) return 0;
                if (reg == cie->ra_reg) {
                    s->ra = initial->ra;
                    s->ra_off = initial->ra_off;
                } else if (reg == DW_RBP) {
                    s->bp = initial->bp;
                    s->bp_off = initial->bp_off;
                }
                break;
            case 0x07: /* undefined */
                reg = rd_uleb(&c);
                if (reg == cie->ra_reg) s->ra = RA_UNDEF;
                else set_reg(s, reg, cie->ra_reg, RA_UNDEF, 0);
                break;
            case 0x08: /* same_value */
                reg = rd_uleb(&c);
                if (reg == DW_RBP) s->bp = BP_SAME;
                else if (reg == cie->ra_reg) s->ra = RA_UNKNOWN;
                break;
            case 0x09: /* register: saved in another register, not tracked */
                reg = rd_uleb(&c);
                (void)rd_uleb(&c);
                if (reg == cie->ra_reg) s->ra = RA_UNKNOWN;
                else if (reg == DW_RBP) s->bp = BP_UNDEF;
                break;
            case 0x0a:
                if (depth >= STATE_STACK) return 0;
                stack[depth++] = *s;
                break;
            case 0x0b:
                if (depth == 0) return 0;
                *s = stack[--depth];
                break;
            case 0x0c:
                reg = rd_uleb(&c);
                s->cfa_off = (int64_t)rd_uleb(&c);
                s->cfa = reg == DW_RSP ? K_RSP : reg == DW_RBP ? K_RBP : K_FP;
                break;
            case 0x0d:
                reg = rd_uleb(&c);
                if (s->cfa == K_RSP || s->cfa == K_RBP)
                    s->cfa = reg == DW_RSP ? K_RSP : reg == DW_RBP ? K_RBP : K_FP;
                else
                    s->cfa = K_FP;
                break;
            case 0x0e:
                s->cfa_off = (int64_t)rd_uleb(&c);
                if (s->cfa != K_RSP && s->cfa != K_RBP) s->cfa = K_FP;
                break;
            case 0x0f: {
                uint64_t len = rd_uleb(&c);
                if (c.bad || c.end - c.p < len) return 0;
                cfa_expr(c.p, len, s);
                c.p += len;
                break;
            }
            case 0x10: { /* expression: only "breg7 n" (saved at rsp + n, signal frames) */
                reg = rd_uleb(&c);
                uint64_t len = rd_uleb(&c);
                if (c.bad || c.end - c.p < len) return 0;
                if (reg == cie->ra_reg || reg == DW_RBP) {
                    cursor e = {c.p + 1, c.p + len, 0};
                    int64_t off = len >= 2 && *(const uint8_t *)c.p == 0x77 ? rd_sleb(&e) : 0;
                    if (len >= 2 && *(const uint8_t *)c.p == 0x77 && !e.bad && e.p == e.end)
                        set_reg(s, reg, cie->ra_reg, RA_RSP, off);
                    else if (reg == cie->ra_reg)
                        s->ra = RA_UNKNOWN;
                    else
                        s->bp = BP_UNDEF;
                }
                c.p += len;
                break;
            }
            case 0x11:
                reg = rd_uleb(&c);
                set_reg(s, reg, cie->ra_reg, RA_CFA, rd_sleb(&c) * cie->data_align);
                break;
            case 0x12:
                reg = rd_uleb(&c);
                s->cfa_off = rd_sleb(&c) * cie->data_align;
                s->cfa = reg == DW_RSP ? K_RSP : reg == DW_RBP ? K_RBP : K_FP;
                break;
            case 0x13:
                s->cfa_off = rd_sleb(&c) * cie->data_align;
                if (s->cfa != K_RSP && s->cfa != K_RBP) s->cfa = K_FP;
                break;
            case 0x14:
            case 0x15: /* val_offset: a value, not a save slot */
                reg = rd_uleb(&c);
                if (op == 0x14) (void)rd_uleb(&c);
                else (void)rd_sleb(&c);
                if (reg == cie->ra_reg) s->ra = RA_UNKNOWN;
                else if (reg == DW_RBP) s->bp = BP_UNDEF;
                break;
            case 0x16: { /* val_expression */
                reg = rd_uleb(&c);
                uint64_t len = rd_uleb(&c);
                if (c.bad || c.end - c.p < len) return 0;
                c.p += len;
                if (reg == cie->ra_reg) s->ra = RA_UNKNOWN;
                else if (reg == DW_RBP) s->bp = BP_UNDEF;
                break;
            }
            case 0x2e: (void)rd_uleb(&c); break; /* GNU_args_size */
            case 0x2f:                            /* GNU_negative_offset_extended */
                reg = rd_uleb(&c);
                set_reg(s, reg, cie->ra_reg, RA_CFA, -(int64_t)rd_uleb(&c) * cie->data_align);
                break;
            default:
                return 0; /* unknown opcode: its operand length is unknown */
            }
        }
        if (c.bad) return 0;
        if (advance && initial != NULL) {
            if (delta > pc - loc) return 1; /* the next row starts past pc */
            loc += delta;
        }
    }
    return !c.bad;
}

/* Parses the CIE at `at` (its length field); its end must stay within one segment. */
static int parse_cie(const module_segs *m, uintptr_t at, cie_info *cie) {
    uintptr_t end = seg_end(m, at, 4);
    if (end == 0) return 0;
    cursor c = {at, end, 0};
    uint64_t len = rd_fixed(&c, 4); /* 64-bit lengths (0xffffffff) are never emitted */
    if (c.bad || len < 4 || len == 0xffffffffu || len > c.end - c.p) return 0;
    c.end = c.p + len;
    if (rd_fixed(&c, 4) != 0) return 0; /* not a CIE */
    memset(cie, 0, sizeof *cie);
    uint8_t version = (uint8_t)rd_fixed(&c, 1);
    if (version != 1 && version != 3) return 0;
    const char *aug = (const char *)c.p;
    size_t room = c.end - c.p, alen = strnlen(aug, room);
    if (alen == room) return 0;
    c.p += alen + 1;
    cie->code_align = rd_uleb(&c);
    cie->data_align = rd_sleb(&c);
    cie->ra_reg = version == 1 ? rd_fixed(&c, 1) : rd_uleb(&c);
    if (aug[0] == 'z') {
        cie->has_z = 1;
        uint64_t zlen = rd_uleb(&c);
        if (c.bad || zlen > c.end - c.p) return 0;
        uintptr_t zend = c.p + zlen;
        for (size_t i = 1; i < alen && !c.bad; i++) {
            switch (aug[i]) {
            case 'L': (void)rd_fixed(&c, 1); break;
            case 'R': cie->fde_enc = (uint8_t)rd_fixed(&c, 1); break;
            case 'S': cie->signal = 1; break;
            case 'B': break;
            case 'P': {
                uint8_t enc = (uint8_t)rd_fixed(&c, 1);
                (void)rd_encoded(&c, enc & 0x7f, 0); /* the personality is not needed */
                c.bad = 0;
                break;
            }
            default: i = alen; break; /* unknown: the 'z' length skips the rest */
            }
        }
        c.p = zend;
    } else if (alen != 0) {
        return 0;
    }
    if (c.bad || c.p > c.end) return 0;
    cie->insns = c.p;
    cie->insns_end = c.end;
    return 1;
}

/* The rule for `pc` (an address inside the instruction that made the call, or an
 * interrupted pc).  Never reads outside the module's readable segments. */
static uint64_t compute_rule(uintptr_t pc) {
    struct shim_dlfo fo;
    memset(&fo, 0, sizeof fo);
    if (g_find_object((void *)pc, &fo) != 0) return K_UNKNOWN;
    module_segs m;
    if (fo.eh_frame == NULL || !module_segments(&fo, &m)) return K_FP;
    /* .eh_frame_hdr: version 1, eh_frame_ptr_enc, fde_count_enc, table_enc, then the
     * encoded eh_frame_ptr and fde_count and a table of (initial_loc, fde) sdata4 pairs
     * relative to the header, sorted by initial_loc. */
    uintptr_t hdr = (uintptr_t)fo.eh_frame;
    uintptr_t hend = seg_end(&m, hdr, 4);
    if (hend == 0) return K_FP;
    const uint8_t *h = (const uint8_t *)hdr;
    if (h[0] != 1 || h[3] != 0x3b) return K_FP;
    cursor c = {hdr + 4, hend, 0};
    (void)rd_encoded(&c, h[1], hdr);
    uint64_t count = rd_encoded(&c, h[2], hdr);
    if (c.bad || count == 0 || count > (hend - c.p) / 8) return K_FP;
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
    uintptr_t fend = seg_end(&m, fde, 8);
    if (fend == 0) return K_FP;
    cursor f = {fde, fend, 0};
    uint64_t len = rd_fixed(&f, 4);
    if (len == 0 || len == 0xffffffffu || len > f.end - f.p) return K_FP;
    f.end = f.p + len;
    uintptr_t id_at = f.p;
    uint64_t id = rd_fixed(&f, 4);
    if (f.bad || id == 0 || id > id_at) return K_FP;
    cie_info cie;
    if (!parse_cie(&m, id_at - id, &cie)) return K_FP;
    uintptr_t begin = rd_encoded(&f, cie.fde_enc, 0);
    uintptr_t range = rd_encoded(&f, cie.fde_enc & 0x0f, 0);
    if (cie.has_z) {
        uint64_t zlen = rd_uleb(&f);
        if (f.bad || zlen > f.end - f.p) return K_FP;
        f.p += zlen;
    }
    if (f.bad || pc < begin || pc - begin >= range) return K_FP; /* no FDE covers pc */
    cfa_state init = {K_FP, RA_UNKNOWN, BP_SAME, 0, 0, 0};
    if (!run_cfa(&cie, cie.insns, cie.insns_end, &init, NULL, begin, pc)) return K_FP;
    cfa_state s = init;
    if (!run_cfa(&cie, f.p, f.end, &s, &init, begin, pc)) return K_FP;
    return pack_rule(&s, cie.signal);
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

static inline uint64_t rule_for(uintptr_t key) {
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
            uint64_t r = compute_rule(key);
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
    return compute_rule(key);
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
static uint64_t g_generation = 1; /* 0 in a memo means "empty" */

void shimcfi_flush(void) {
    /* Private anonymous memory: DONTNEED gives back zero pages (empty slots). */
    if (g_cache) madvise(g_cache, sizeof(cache_slot) << CACHE_BITS, MADV_DONTNEED);
    __atomic_add_fetch(&g_generation, 1, __ATOMIC_RELEASE);
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

/* The last walks of this thread, to repeat them without walking.  A walk is a function of
 * the registers it starts from (pc, sp, bp), of the stack words it reads and of the rules
 * (which change only when a dlclose flushes them: g_generation).  So if the registers are
 * the same and every word it read still holds the same value, the result is the same,
 * exactly.  The check is a handful of independent loads, where the walk is a chain of
 * dependent ones (stack word -> rule -> next stack word), ~5 ns a frame.  A loop that
 * allocates from a few places hits it; MEMO_WAYS walks are kept because one call site is
 * often reached by a few paths (GCC duplicates calls when it unrolls or tail-duplicates).
 * The first read of a walk is the return address of its second frame, so a way of another
 * path is rejected at its first word. */
#define MEMO_WAYS 4
#define MEMO_READS 64
#define MEMO_OUT 48
typedef struct {
    uint64_t generation; /* 0: empty, or being rewritten */
    uintptr_t pc, sp, bp;
    unsigned max, n_reads, n_out, overflow;
    int truncated, used_bp; /* used_bp: the walk depended on the starting rbp */
    uint32_t offset[MEMO_READS]; /* stack word read, as its distance above sp */
    uintptr_t value[MEMO_READS]; /* what it held */
    uint64_t out[MEMO_OUT];
} walk_memo;

static __thread walk_memo t_memo[MEMO_WAYS] __attribute__((tls_model("initial-exec")));
static __thread unsigned t_memo_next __attribute__((tls_model("initial-exec")));
static __thread int t_walking __attribute__((tls_model("initial-exec")));

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

static unsigned walk(walk_memo *m, uint64_t *ips, unsigned n, unsigned max, uintptr_t sp,
                     uintptr_t bp, uintptr_t lo, uintptr_t hi, int *truncated) {
    uintptr_t pc = ips[n - 1];
    int exact = 0;   /* pc is an interrupted pc (after a signal frame), not a return address */
    /* Code without frame pointers uses rbp as a plain register, so the starting rbp and
     * the rbp values saved in frames differ from call to call: the memo checks them only
     * when the walk used them.  bp_initial: bp is still the starting value; bp_from: else
     * the stack word it was loaded from (0: none, e.g. undefined). */
    int bp_initial = 1;
    uintptr_t bp_from = 0;
    for (;;) {
        uint64_t r = rule_for(exact ? pc : pc - 1);
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

/* Every word a memo read was inside this thread's stack when it was read, and the stack
 * of a thread does not move, so reading them again is safe. */
static inline int memo_matches(const walk_memo *m, uint64_t generation, uintptr_t pc,
                               uintptr_t sp, uintptr_t bp, unsigned max) {
    if (m->generation != generation || m->pc != pc || m->sp != sp || m->max != max ||
        (m->used_bp && m->bp != bp))
        return 0;
    for (unsigned i = 0; i < m->n_reads; i++)
        if (*(const uintptr_t *)(sp + m->offset[i]) != m->value[i]) return 0;
    return 1;
}

unsigned shimcfi_walk(uint64_t *ips, unsigned n, unsigned max, uintptr_t sp, uintptr_t bp,
                      uintptr_t lo, uintptr_t hi, int *truncated) {
    /* A signal handler that allocates while this thread is in here walks on its own,
     * leaving the memo alone. */
    if (UNLIKELY(t_walking) || n != 1) return walk(NULL, ips, n, max, sp, bp, lo, hi, truncated);
    t_walking = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    uint64_t generation = __atomic_load_n(&g_generation, __ATOMIC_ACQUIRE);
    unsigned got;
    for (unsigned w = 0; w < MEMO_WAYS; w++) {
        const walk_memo *m = &t_memo[w];
        if (memo_matches(m, generation, ips[0], sp, bp, max)) {
            memcpy(ips + 1, m->out, (size_t)m->n_out * sizeof *ips);
            *truncated |= m->truncated;
            got = 1 + m->n_out;
            goto out;
        }
    }
    walk_memo *m = &t_memo[t_memo_next++ % MEMO_WAYS];
    m->generation = 0; /* invalid while it is rewritten */
    m->sp = sp;
    m->n_reads = 0;
    m->overflow = 0;
    m->used_bp = 0;
    int trunc = 0;
    got = walk(m, ips, n, max, sp, bp, lo, hi, &trunc);
    *truncated |= trunc;
    if (!m->overflow && got - 1 <= MEMO_OUT) {
        m->pc = ips[0];
        m->bp = bp;
        m->max = max;
        m->n_out = got - 1;
        m->truncated = trunc;
        memcpy(m->out, ips + 1, (size_t)(got - 1) * sizeof *ips);
        m->generation = generation;
    }
out:
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    t_walking = 0;
    return got;
}
