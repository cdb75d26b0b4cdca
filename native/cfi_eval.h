/* cfi_eval.h: the DWARF CFI interpreter shared by the extension's table builder
 * (native/unwind.c, offline, one row per address range) and the heap shim's rule for one
 * return address (native/shim/shimcfi.c, inside malloc), x86_64 only.
 *
 * What is here: bounded byte cursors (fixed, uleb, sleb, DW_EH_PE pointers), the CIE
 * parser (augmentation 'z' L R S B P, old "eh"), and the CFA program evaluator (every
 * DW_CFA_* opcode, remember/restore state, the two DWARF expressions that matter on x86_64:
 * the lazy PLT's CFA and a signal frame's "breg7 n").  What is not: where the CFI comes
 * from, how a program's result is stored (rows of a table; a packed 64-bit rule) and how
 * rules each side cannot use are reported: each caller maps the state below to its own.
 *
 * The shim's constraints hold for everything here: static inline, no allocation, no lock,
 * no libc beyond memcpy/memcmp/strnlen, and every read goes through a cursor bounded by
 * `end` (a malformed input sets `bad` and reads nothing more).
 */
#ifndef RSPROF_CFI_EVAL_H
#define RSPROF_CFI_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "leb128.h"

/* ------------------------------------------------------------------ cursors */

typedef struct {
    const uint8_t *p, *end;
    int bad;
} cfi_cursor;

/* n bytes, little endian (x86_64).  p > end counts as exhausted: a cursor whose p was moved
 * past end by a caller (skipping an operand) must not read on (the unsigned difference
 * alone would let it). */
static inline uint64_t cfi_fixed(cfi_cursor *c, size_t n) {
    if (c->p > c->end || (size_t)(c->end - c->p) < n) {
        c->bad = 1;
        c->p = c->end;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, c->p, n);
    c->p += n;
    return v;
}

static inline uint8_t cfi_u8(cfi_cursor *c) {
    if (c->p >= c->end) {
        c->bad = 1;
        return 0;
    }
    return *c->p++;
}

/* LEB128 numbers: native/leb128.h (shared with the DWARF reader).  A truncated one sets
 * `bad` and reads 0, as does a read from a cursor already bad. */
static inline uint64_t cfi_uleb(cfi_cursor *c) {
    uint64_t v;
    if (c->bad || !rs_uleb128(&c->p, c->end, &v)) {
        c->bad = 1;
        return 0;
    }
    return v;
}

static inline int64_t cfi_sleb(cfi_cursor *c) {
    int64_t v;
    if (c->bad || !rs_sleb128(&c->p, c->end, &v)) {
        c->bad = 1;
        return 0;
    }
    return v;
}

/* A DW_EH_PE-encoded pointer.  pcrel is relative to the field's address: the address of
 * the field in memory plus `pcrel_bias` (unwind.c reads a file image and wants link-time
 * addresses: bias = section vaddr - section image; the shim reads the mapped module and
 * wants run-time addresses: bias 0).  datarel is relative to `data` (.eh_frame_hdr).
 * textrel/funcrel/aligned and indirect are not used on x86_64: bad. */
static inline uint64_t cfi_encoded(cfi_cursor *c, uint8_t enc, uint64_t pcrel_bias,
                                   uint64_t data) {
    if (enc == 0xff) return 0; /* DW_EH_PE_omit */
    uint64_t field = (uint64_t)(uintptr_t)c->p + pcrel_bias;
    uint64_t v;
    switch (enc & 0x0f) {
    case 0x00: v = cfi_fixed(c, 8); break;
    case 0x01: v = cfi_uleb(c); break;
    case 0x02: v = cfi_fixed(c, 2); break;
    case 0x03: v = cfi_fixed(c, 4); break;
    case 0x04: v = cfi_fixed(c, 8); break;
    case 0x09: v = (uint64_t)cfi_sleb(c); break;
    case 0x0a: v = (uint64_t)(int64_t)(int16_t)cfi_fixed(c, 2); break;
    case 0x0b: v = (uint64_t)(int64_t)(int32_t)cfi_fixed(c, 4); break;
    case 0x0c: v = cfi_fixed(c, 8); break;
    default: c->bad = 1; return 0;
    }
    switch (enc & 0x70) {
    case 0x00: break;
    case 0x10: v += field; break;
    case 0x30: v += data; break;
    default: c->bad = 1; return 0;
    }
    if (enc & 0x80) c->bad = 1; /* indirect: a pointer to the value, not the value */
    return v;
}

/* ------------------------------------------------------------------ CIE */

typedef struct {
    uint64_t code_align;
    int64_t data_align;
    uint64_t ra_reg;
    uint8_t fde_enc;  /* DW_EH_PE of the FDEs' addresses ('R'; absptr without) */
    uint8_t signal;   /* 'S': the FDEs describe signal trampolines */
    uint8_t has_z;    /* 'z': FDEs carry an augmentation length */
    const uint8_t *insns, *insns_end;
} cfi_cie;

/* Parses a CIE's body: `p` just past its id, `end` the end of the entry.  Versions 1 and 3
 * (.eh_frame, .debug_frame) and 4 (.debug_frame with address and segment sizes: 8 and
 * any).  `pcrel_bias` as for cfi_encoded (the personality pointer is read, not used).
 * Returns 0 when the CIE cannot be used. */
static inline int cfi_parse_cie(const uint8_t *p, const uint8_t *end, uint64_t pcrel_bias,
                                cfi_cie *cie) {
    cfi_cursor c = {p, end, 0};
    memset(cie, 0, sizeof *cie);
    uint8_t version = cfi_u8(&c);
    if (c.bad || (version != 1 && version != 3 && version != 4)) return 0;
    const char *aug = (const char *)c.p;
    size_t room = (size_t)(c.end - c.p), aug_len = strnlen(aug, room);
    if (aug_len == room) return 0;
    c.p += aug_len + 1;
    if (version == 4) {
        uint8_t addr_size = cfi_u8(&c);
        (void)cfi_u8(&c); /* segment selector size */
        if (addr_size != 8) return 0;
    }
    cie->code_align = cfi_uleb(&c);
    cie->data_align = cfi_sleb(&c);
    cie->ra_reg = version == 1 ? cfi_u8(&c) : cfi_uleb(&c);
    if (aug[0] == 'z') {
        cie->has_z = 1;
        uint64_t len = cfi_uleb(&c);
        if (c.bad || (uint64_t)(c.end - c.p) < len) return 0;
        const uint8_t *aug_end = c.p + len;
        for (size_t i = 1; i < aug_len && !c.bad; i++) {
            switch (aug[i]) {
            case 'L': (void)cfi_u8(&c); break;
            case 'R': cie->fde_enc = cfi_u8(&c); break;
            case 'S': cie->signal = 1; break;
            case 'B': break;
            case 'P': {
                uint8_t enc = cfi_u8(&c);
                (void)cfi_encoded(&c, enc & 0x7f, pcrel_bias, 0);
                c.bad = 0; /* the personality routine's address is not needed */
                break;
            }
            default: i = aug_len; break; /* unknown: the 'z' length skips the rest */
            }
        }
        c.p = aug_end;
    } else if (aug_len != 0) {
        if (strcmp(aug, "eh") != 0) return 0; /* unknown augmentation without 'z' */
        c.p += 8;                             /* old GCC: an eh pointer follows */
    }
    if (c.bad || c.p > c.end) return 0;
    cie->insns = c.p;
    cie->insns_end = end;
    return 1;
}

/* ------------------------------------------------------------------ rules */

#define CFI_DW_RBP 6
#define CFI_DW_RSP 7

/* The CFA rule.  Values 0-3 are what both callers can evaluate (the shim has no PLT: it
 * steps those frames by rbp). */
enum {
    CFI_CFA_RSP = 0,   /* cfa = rsp + off */
    CFI_CFA_RBP = 1,   /* cfa = rbp + off */
    CFI_CFA_PLT = 2,   /* cfa = rsp + 8 + ((rip & 15) >= plt_thr ? 8 : 0): lazy PLT stubs */
    CFI_CFA_DEREF = 3, /* cfa = [rsp + off]: signal trampolines (ucontext on the stack) */
    CFI_CFA_BAD = 4,   /* no rule, another register (not tracked), another expression, or
                        * rsp itself restored from memory */
};

/* The rule of the return address and of rbp.  Values 0-3 are those of unwind.c's rows and
 * of the shim's packed rbp rule. */
enum {
    CFI_REG_SAME = 0,  /* unchanged (for the return address: no rule, unusable) */
    CFI_REG_CFA = 1,   /* saved at cfa + off */
    CFI_REG_RSP = 2,   /* saved at rsp + off (a signal frame's DW_CFA_expression breg7 n) */
    CFI_REG_UNDEF = 3, /* undefined (return address: the outermost frame); for rbp also a
                        * rule that is not a save slot: lost to the caller */
    CFI_REG_LOST = 4,  /* return address only: a rule that is not a save slot (in another
                        * register, val_offset, val_expression, any expression but breg7 n).
                        * Not undefined: that would claim the outermost frame. */
};

typedef struct {
    uint8_t cfa, ra, bp, plt_thr;
    /* Set when a rule of the return address or rbp could not be followed, cleared when the
     * CFA rule is next set (def_cfa*, def_cfa_expression; restore_state restores it).
     * unwind.c stops on rows in between (its rule since it was written: the rows after such
     * a rule describe code it cannot vouch for); the shim ignores it and goes by the
     * register rules, which say exactly what was lost. */
    uint8_t unfollowed;
    int64_t cfa_off, ra_off, bp_off;
} cfi_state;

/* Recognises the two CFA expressions that matter on x86_64: GNU ld's lazy PLT CFA
 * (breg7 8; breg16 0; lit15; and; lit11|lit10; ge; lit3; shl; plus) and a signal
 * trampoline's CFA ([rsp + n]: breg7 n; deref).  Anything else: CFI_CFA_BAD. */
static inline void cfi_cfa_expr(const uint8_t *e, uint64_t len, cfi_state *s) {
    static const uint8_t plt_head[] = {0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a};
    static const uint8_t plt_tail[] = {0x2a, 0x33, 0x24, 0x22};
    s->cfa = CFI_CFA_BAD;
    if (len == 11 && memcmp(e, plt_head, 6) == 0 && memcmp(e + 7, plt_tail, 4) == 0 &&
        e[6] >= 0x30 && e[6] <= 0x3f) {
        s->cfa = CFI_CFA_PLT;
        s->cfa_off = 8;
        s->plt_thr = (uint8_t)(e[6] - 0x30);
        return;
    }
    if (len >= 3 && e[0] == 0x77 && e[len - 1] == 0x06) {
        cfi_cursor c = {e + 1, e + len - 1, 0};
        int64_t n = cfi_sleb(&c);
        if (!c.bad && c.p == c.end) {
            s->cfa = CFI_CFA_DEREF;
            s->cfa_off = n;
        }
    }
}

/* factor * data_align as the CFI means it, without the undefined behaviour of a signed
 * multiplication (or negation) that overflows: malformed CFI can hold any factor, and the
 * product is computed modulo 2^64 (its two's complement bits), a garbage offset that the
 * callers' range checks then refuse. */
static inline int64_t cfi_scaled(uint64_t factor, int64_t data_align) {
    return (int64_t)(factor * (uint64_t)data_align);
}

/* A register rule.  rsp given any rule but same_value: the caller's rsp is not the CFA,
 * which neither caller can follow. */
static inline void cfi_set_reg(cfi_state *s, uint64_t reg, uint64_t ra_reg, uint8_t rule,
                               int64_t off) {
    if (reg == ra_reg) {
        s->ra = rule;
        s->ra_off = off;
    } else if (reg == CFI_DW_RBP) {
        s->bp = rule;
        s->bp_off = off;
    } else if (reg == CFI_DW_RSP && rule != CFI_REG_SAME) {
        s->cfa = CFI_CFA_BAD;
    }
}

/* A rule of the return address or rbp that cannot be followed (see CFI_REG_LOST).  Before
 * this file the two interpreters differed here: unwind.c marked the CFA bad (and left a
 * val_offset rbp rule in place), the shim marked the return address unknown / rbp undefined.
 * Both are kept, in their stricter form: the register's own rule says it is lost (so no
 * later row reads rbp from a slot the program replaced) and `unfollowed` lets unwind.c stop
 * as it did. */
static inline void cfi_lost(cfi_state *s, uint64_t reg, uint64_t ra_reg) {
    if (reg == ra_reg) s->ra = CFI_REG_LOST, s->ra_off = 0, s->unfollowed = 1;
    else if (reg == CFI_DW_RBP) s->bp = CFI_REG_UNDEF, s->bp_off = 0, s->unfollowed = 1;
}

static inline uint8_t cfi_cfa_reg(uint64_t reg) {
    return reg == CFI_DW_RSP ? CFI_CFA_RSP : reg == CFI_DW_RBP ? CFI_CFA_RBP : CFI_CFA_BAD;
}

/* remember_state depth.  Compilers nest it once or twice; the states live on the stack of
 * whatever thread calls malloc (maybe a small signal stack), so the shim's 8 is kept. */
#define CFI_STATE_STACK 8

/* One CFA program (a CIE's initial instructions or an FDE's), run step by step: cfi_step
 * returns at each advance of the location, and the caller decides what the state up to
 * there means (a row to emit; or, past its pc, the answer). */
typedef struct {
    const cfi_cie *cie;
    cfi_cursor c;
    const cfi_state *initial; /* the CIE's state, for restore; NULL while running the CIE */
    uint64_t loc;             /* the current location: DW_CFA_set_loc is relative to it */
    uint64_t pcrel_bias;      /* for set_loc's pcrel addresses, as in cfi_encoded */
    int depth;
    cfi_state stack[CFI_STATE_STACK];
} cfi_program;

static inline void cfi_program_init(cfi_program *pr, const cfi_cie *cie, const uint8_t *p,
                                    const uint8_t *end, const cfi_state *initial,
                                    uint64_t loc, uint64_t pcrel_bias) {
    pr->cie = cie;
    pr->c.p = p;
    pr->c.end = end;
    pr->c.bad = 0;
    pr->initial = initial;
    pr->loc = loc;
    pr->pcrel_bias = pcrel_bias;
    pr->depth = 0;
}

enum { CFI_STEP_ERROR = -1, CFI_STEP_END = 0, CFI_STEP_ADVANCE = 1 };

/* Runs instructions into *s until the location advances (CFI_STEP_ADVANCE, *delta: by how
 * much; pr->loc is the caller's to move) or the program ends (CFI_STEP_END).
 * CFI_STEP_ERROR on malformed input: an unknown opcode (its operand length is unknown),
 * restore without a CIE state, a state stack over- or underflow, a set_loc backwards, a
 * read past the end.  *s then holds the rules up to the error. */
/* Always inlined: each caller runs it in a loop, one call per row; out of line (GCC's choice
 * for a function this size) the shim's rule for a new return address took ~10% longer. */
static inline __attribute__((always_inline)) int cfi_step(cfi_program *pr, cfi_state *s,
                                                          uint64_t *delta) {
    const cfi_cie *cie = pr->cie;
    cfi_cursor *c = &pr->c;
    while (c->p < c->end && !c->bad) {
        uint8_t op = cfi_u8(c);
        uint8_t hi = op & 0xc0, lo = op & 0x3f;
        uint64_t reg, len;
        int advance = 0;
        *delta = 0;
        if (hi == 0x40) { /* advance_loc */
            *delta = lo * cie->code_align;
            advance = 1;
        } else if (hi == 0x80) { /* offset */
            cfi_set_reg(s, lo, cie->ra_reg, CFI_REG_CFA, cfi_scaled(cfi_uleb(c), cie->data_align));
        } else if (hi == 0xc0 || op == 0x06) { /* restore, restore_extended */
            reg = hi == 0xc0 ? lo : cfi_uleb(c);
            if (pr->initial == NULL) return CFI_STEP_ERROR;
            if (reg == cie->ra_reg) {
                s->ra = pr->initial->ra;
                s->ra_off = pr->initial->ra_off;
            } else if (reg == CFI_DW_RBP) {
                s->bp = pr->initial->bp;
                s->bp_off = pr->initial->bp_off;
            }
        } else {
            switch (op) {
            case 0x00: break; /* nop */
            case 0x01: {      /* set_loc */
                uint64_t nloc = cfi_encoded(c, cie->fde_enc, pr->pcrel_bias, 0);
                if (c->bad || nloc < pr->loc) return CFI_STEP_ERROR;
                *delta = nloc - pr->loc;
                advance = 1;
                break;
            }
            case 0x02: *delta = cfi_fixed(c, 1) * cie->code_align; advance = 1; break;
            case 0x03: *delta = cfi_fixed(c, 2) * cie->code_align; advance = 1; break;
            case 0x04: *delta = cfi_fixed(c, 4) * cie->code_align; advance = 1; break;
            case 0x05: /* offset_extended */
                reg = cfi_uleb(c);
                cfi_set_reg(s, reg, cie->ra_reg, CFI_REG_CFA,
                            cfi_scaled(cfi_uleb(c), cie->data_align));
                break;
            case 0x07: cfi_set_reg(s, cfi_uleb(c), cie->ra_reg, CFI_REG_UNDEF, 0); break;
            case 0x08: cfi_set_reg(s, cfi_uleb(c), cie->ra_reg, CFI_REG_SAME, 0); break;
            case 0x09: /* register: saved in another register, which is not tracked */
                reg = cfi_uleb(c);
                (void)cfi_uleb(c);
                /* The return address in a register is not the end of the stack (as
                 * undefined would say): lost.  rbp: undefined for the caller. */
                if (reg == cie->ra_reg) s->ra = CFI_REG_LOST, s->unfollowed = 1;
                else if (reg == CFI_DW_RBP) s->bp = CFI_REG_UNDEF;
                break;
            case 0x0a: /* remember_state */
                if (pr->depth >= CFI_STATE_STACK) return CFI_STEP_ERROR;
                pr->stack[pr->depth++] = *s;
                break;
            case 0x0b: /* restore_state: the register rules and, as every unwinder does,
                        * the CFA rule too */
                if (pr->depth == 0) return CFI_STEP_ERROR;
                *s = pr->stack[--pr->depth];
                break;
            case 0x0c: /* def_cfa */
                reg = cfi_uleb(c);
                s->cfa_off = (int64_t)cfi_uleb(c);
                s->cfa = cfi_cfa_reg(reg);
                s->unfollowed = 0;
                break;
            case 0x0d: /* def_cfa_register: keeps the offset last set.  DWARF allows it only
                        * after a register rule; libgcc (what C++ exceptions, so the CFI's
                        * authors, rely on) also takes it after another expression, and
                        * hand-written epilogues use that (libgcrypt: breg7 536; deref;
                        * plus_uconst 56, then def_cfa_register rsp with offset 56).  The
                        * extension always did; the shim stepped such code by rbp, which
                        * there is no frame pointer.  Not after the PLT or [rsp + n] forms,
                        * whose offset is the expression's own. */
                reg = cfi_uleb(c);
                if (s->cfa == CFI_CFA_PLT || s->cfa == CFI_CFA_DEREF) s->cfa = CFI_CFA_BAD;
                else s->cfa = cfi_cfa_reg(reg);
                s->unfollowed = 0;
                break;
            case 0x0e: /* def_cfa_offset */
                s->cfa_off = (int64_t)cfi_uleb(c);
                if (s->cfa != CFI_CFA_RSP && s->cfa != CFI_CFA_RBP) s->cfa = CFI_CFA_BAD;
                break;
            case 0x0f: /* def_cfa_expression */
                len = cfi_uleb(c);
                if (c->bad || (uint64_t)(c->end - c->p) < len) return CFI_STEP_ERROR;
                cfi_cfa_expr(c->p, len, s);
                s->unfollowed = 0;
                c->p += len;
                break;
            case 0x10: /* expression: only "breg7 n" (saved at rsp + n, signal frames) */
                reg = cfi_uleb(c);
                len = cfi_uleb(c);
                if (c->bad || (uint64_t)(c->end - c->p) < len) return CFI_STEP_ERROR;
                if (reg == cie->ra_reg || reg == CFI_DW_RBP) {
                    cfi_cursor e = {c->p + 1, c->p + len, 0};
                    int64_t off = len >= 2 && c->p[0] == 0x77 ? cfi_sleb(&e) : 0;
                    int ok = len >= 2 && c->p[0] == 0x77 && !e.bad && e.p == e.end;
                    if (ok) cfi_set_reg(s, reg, cie->ra_reg, CFI_REG_RSP, off);
                    else cfi_lost(s, reg, cie->ra_reg);
                }
                c->p += len;
                break;
            case 0x11: /* offset_extended_sf */
                reg = cfi_uleb(c);
                cfi_set_reg(s, reg, cie->ra_reg, CFI_REG_CFA,
                            cfi_scaled((uint64_t)cfi_sleb(c), cie->data_align));
                break;
            case 0x12: /* def_cfa_sf */
                reg = cfi_uleb(c);
                s->cfa_off = cfi_scaled((uint64_t)cfi_sleb(c), cie->data_align);
                s->cfa = cfi_cfa_reg(reg);
                s->unfollowed = 0;
                break;
            case 0x13: /* def_cfa_offset_sf */
                s->cfa_off = cfi_scaled((uint64_t)cfi_sleb(c), cie->data_align);
                if (s->cfa != CFI_CFA_RSP && s->cfa != CFI_CFA_RBP) s->cfa = CFI_CFA_BAD;
                break;
            case 0x14: case 0x15: /* val_offset(_sf): the value cfa + n, not a save slot */
                reg = cfi_uleb(c);
                if (op == 0x14) (void)cfi_uleb(c);
                else (void)cfi_sleb(c);
                cfi_lost(s, reg, cie->ra_reg);
                break;
            case 0x16: /* val_expression */
                reg = cfi_uleb(c);
                len = cfi_uleb(c);
                if (c->bad || (uint64_t)(c->end - c->p) < len) return CFI_STEP_ERROR;
                c->p += len;
                cfi_lost(s, reg, cie->ra_reg);
                break;
            case 0x2e: (void)cfi_uleb(c); break; /* GNU_args_size */
            case 0x2f:                            /* GNU_negative_offset_extended */
                reg = cfi_uleb(c);
                cfi_set_reg(s, reg, cie->ra_reg, CFI_REG_CFA,
                            cfi_scaled(0 - cfi_uleb(c), cie->data_align));
                break;
            default:
                return CFI_STEP_ERROR; /* unknown opcode: its operand length is unknown */
            }
        }
        if (c->bad) return CFI_STEP_ERROR;
        if (advance) return CFI_STEP_ADVANCE;
    }
    return c->bad ? CFI_STEP_ERROR : CFI_STEP_END;
}

#endif
