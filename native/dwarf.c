/* DWARF reader for the symbolizer (collector/symbols): the hot part of turning addresses into
 * file:line and inline chains. pyelftools needs ~8 s for libpython's line table; this decodes only
 * the compile units a query touches, straight from the section buffers, in milliseconds.
 *
 * Python API (rsprof._native.DwarfReader), see collector/symbols/dwarf.py for the caller:
 *   DwarfReader(sections: dict[str, buffer])   keys: "info", "abbrev", "line", "str", "line_str",
 *                                               "ranges", "rnglists", "addr", "str_offsets", "aranges"
 *   .units() -> list[int]                      offsets of compile/partial units in .debug_info
 *   .aranges() -> list[tuple[lo, hi, unit]]    from .debug_aranges
 *   .unit_ranges(unit) -> list[tuple[lo, hi]]  from the unit DIE (when aranges lacks the unit)
 *   .line_table(unit) -> (addrs, files, lines, names) | None
 *        addrs: bytes of uint64, files/lines: bytes of uint32, sorted by address, sequences
 *        concatenated; a row with file == 0xFFFFFFFF ends a sequence (no code after it);
 *        names: list[str | None], indexed by the DWARF file number.
 *   .inline_chains(unit, addrs: sorted list[int]) -> list[tuple[frame, ...]]
 *        per address, innermost scope first, ending with the DW_TAG_subprogram;
 *        frame = (name | None, linkage_name | None, call_file, call_line, name_die | None)
 *        name_die: the DIE the name came from (following abstract_origin/specification)
 *   .die(offset) -> (tag, name, linkage, parent, type, origin, decl_line, decl_column,
 *                    artificial, language, producer)   one DIE, for C++ qualified names
 *   .children(offset) -> list[int]             its children's offsets
 *
 * Everything is bounds-checked: a corrupt file yields errors or empty results, never a crash.
 * Only little-endian files on a little-endian host (the Python side checks). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "leb128.h"

/* ---- section access ---------------------------------------------------------------------- */

enum { S_INFO, S_ABBREV, S_LINE, S_STR, S_LINE_STR, S_RANGES, S_RNGLISTS, S_ADDR, S_STR_OFFSETS,
       S_ARANGES, S_COUNT };
static const char *const SECTION_KEYS[S_COUNT] = {
    "info", "abbrev", "line", "str", "line_str", "ranges", "rnglists", "addr", "str_offsets",
    "aranges"};

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
    int err;
} Rd;

/* A reader of [base + off, base + size).  A missing section (base NULL: a key the caller did
 * not pass) or an offset past the end gives an empty reader with err set.  Never arithmetic on
 * a NULL base (NULL + size is undefined, even for size 0), nor an empty reader at NULL (the
 * readers subtract and compare its pointers, and memchr it): a missing section's reader is
 * empty at a static byte. */
static inline Rd rd_at(const uint8_t *base, size_t size, uint64_t off) {
    static const uint8_t nothing[1];
    Rd r;
    if (base == NULL) {
        r.p = r.end = nothing;
        r.err = 1;
    } else if (off > size) {
        r.p = r.end = base + size;
        r.err = 1;
    } else {
        r.p = base + off;
        r.end = base + size;
        r.err = 0;
    }
    return r;
}

static inline int rd_need(Rd *r, size_t n) {
    if ((size_t)(r->end - r->p) < n) {
        r->err = 1;
        r->p = r->end;
        return 0;
    }
    return 1;
}

static inline uint64_t rd_uint(Rd *r, unsigned n) {
    uint64_t v = 0;
    if (n > 8 || !rd_need(r, n)) return 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    return v;
}
static inline uint8_t rd_u8(Rd *r) { return (uint8_t)rd_uint(r, 1); }
static inline uint16_t rd_u16(Rd *r) { return (uint16_t)rd_uint(r, 2); }
static inline uint32_t rd_u32(Rd *r) { return (uint32_t)rd_uint(r, 4); }
static inline uint64_t rd_u64(Rd *r) { return rd_uint(r, 8); }

/* LEB128: native/leb128.h (shared with the CFI interpreter).  A truncated number sets err,
 * reads 0 and leaves the reader at its end. */
static inline uint64_t rd_uleb(Rd *r) {
    uint64_t v;
    if (!rs_uleb128(&r->p, r->end, &v)) r->err = 1;
    return v;
}

static inline int64_t rd_sleb(Rd *r) {
    int64_t v;
    if (!rs_sleb128(&r->p, r->end, &v)) r->err = 1;
    return v;
}

static inline void rd_skip(Rd *r, uint64_t n) {
    if ((uint64_t)(r->end - r->p) < n) {
        r->err = 1;
        r->p = r->end;
    } else {
        r->p += n;
    }
}

/* A NUL-terminated string inside the reader's bounds, or NULL. */
static inline const char *rd_cstr(Rd *r) {
    const uint8_t *nul = memchr(r->p, 0, (size_t)(r->end - r->p));
    if (nul == NULL) {
        r->err = 1;
        r->p = r->end;
        return NULL;
    }
    const char *s = (const char *)r->p;
    r->p = nul + 1;
    return s;
}

/* Reads an initial length; sets *off_size to 4 or 8 and returns the unit's length. */
static inline uint64_t rd_initial_length(Rd *r, unsigned *off_size) {
    uint64_t len = rd_u32(r);
    *off_size = 4;
    if (len == 0xffffffffu) {
        len = rd_u64(r);
        *off_size = 8;
    }
    return len;
}

/* ---- abbreviations ----------------------------------------------------------------------- */

typedef struct {
    uint32_t name;
    uint32_t form;
    int64_t implicit_const;
} AttrSpec;

typedef struct {
    uint64_t code;
    uint32_t tag;
    uint8_t children;
    uint32_t first; /* index into specs */
    uint32_t count;
} Abbrev;

typedef struct {
    Abbrev *abbrevs;
    size_t nabbrevs;
    AttrSpec *specs;
    size_t nspecs;
    Abbrev **dense; /* indexed by code when codes are small, else NULL (binary search) */
    uint64_t dense_len;
} AbbrevTable;

static void abbrev_free(AbbrevTable *t) {
    if (t == NULL) return;
    free(t->abbrevs);
    free(t->specs);
    free(t->dense);
    free(t);
}

static int abbrev_cmp(const void *a, const void *b) {
    uint64_t x = ((const Abbrev *)a)->code, y = ((const Abbrev *)b)->code;
    return x < y ? -1 : x > y;
}

static AbbrevTable *abbrev_parse(const uint8_t *base, size_t size, uint64_t off) {
    Rd r = rd_at(base, size, off);
    if (r.err) return NULL;
    AbbrevTable *t = calloc(1, sizeof *t);
    if (t == NULL) return NULL;
    size_t cap_a = 64, cap_s = 256;
    t->abbrevs = malloc(cap_a * sizeof *t->abbrevs);
    t->specs = malloc(cap_s * sizeof *t->specs);
    if (!t->abbrevs || !t->specs) goto fail;
    uint64_t max_code = 0;
    int sorted = 1;
    for (;;) {
        uint64_t code = rd_uleb(&r);
        if (r.err) goto fail;
        if (code == 0) break;
        if (t->nabbrevs == cap_a) {
            cap_a *= 2;
            Abbrev *n = realloc(t->abbrevs, cap_a * sizeof *n);
            if (!n) goto fail;
            t->abbrevs = n;
        }
        Abbrev *a = &t->abbrevs[t->nabbrevs];
        if (t->nabbrevs && code <= t->abbrevs[t->nabbrevs - 1].code) sorted = 0;
        t->nabbrevs++;
        a->code = code;
        a->tag = (uint32_t)rd_uleb(&r);
        a->children = rd_u8(&r);
        a->first = (uint32_t)t->nspecs;
        a->count = 0;
        if (code > max_code) max_code = code;
        for (;;) {
            uint64_t name = rd_uleb(&r), form = rd_uleb(&r);
            if (r.err) goto fail;
            if (name == 0 && form == 0) break;
            int64_t ic = 0;
            if (form == 0x21) ic = rd_sleb(&r); /* DW_FORM_implicit_const */
            if (t->nspecs == cap_s) {
                cap_s *= 2;
                AttrSpec *n = realloc(t->specs, cap_s * sizeof *n);
                if (!n) goto fail;
                t->specs = n;
            }
            t->specs[t->nspecs].name = (uint32_t)name;
            t->specs[t->nspecs].form = (uint32_t)form;
            t->specs[t->nspecs].implicit_const = ic;
            t->nspecs++;
            a->count++;
        }
    }
    if (!sorted) qsort(t->abbrevs, t->nabbrevs, sizeof *t->abbrevs, abbrev_cmp);
    /* Codes are almost always 1..N: a direct index makes each DIE's lookup O(1). */
    if (max_code <= 4 * (uint64_t)t->nabbrevs + 64) {
        t->dense_len = max_code + 1;
        t->dense = calloc((size_t)t->dense_len, sizeof *t->dense);
        if (!t->dense) goto fail;
        for (size_t i = 0; i < t->nabbrevs; i++) t->dense[t->abbrevs[i].code] = &t->abbrevs[i];
    }
    return t;
fail:
    abbrev_free(t);
    return NULL;
}

static inline const Abbrev *abbrev_find(const AbbrevTable *t, uint64_t code) {
    if (t->dense) return code < t->dense_len ? t->dense[code] : NULL;
    size_t lo = 0, hi = t->nabbrevs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->abbrevs[mid].code < code) lo = mid + 1;
        else hi = mid;
    }
    return (lo < t->nabbrevs && t->abbrevs[lo].code == code) ? &t->abbrevs[lo] : NULL;
}

/* ---- units ------------------------------------------------------------------------------- */

typedef struct {
    uint64_t off, end, die_off, abbrev_off;
    uint16_t version;
    uint8_t unit_type, addr_size, off_size;
    AbbrevTable *abbr; /* lazily parsed */
    int abbr_failed;
    int top_parsed; /* the unit DIE's attributes below are filled */
    int has_low_pc, has_stmt_list, has_ranges, has_high_pc, high_is_offset;
    uint64_t low_pc, high_pc, stmt_list;
    uint64_t str_offsets_base, addr_base, rnglists_base;
    uint32_t ranges_form;
    uint64_t ranges_val;
    const char *name, *comp_dir;
    /* Every DIE of the unit in order, with its parent's offset and the index past its
     * subtree: built on the first die()/children() call (C++ names from the DIE parents). */
    uint64_t *tree_off, *tree_parent;
    uint32_t *tree_end;
    size_t ntree;
    int tree_state; /* 0 not built, 1 built, -1 failed */
} Unit;

typedef struct {
    PyObject_HEAD
    Py_buffer bufs[S_COUNT];
    int have[S_COUNT];
    const uint8_t *sec[S_COUNT];
    size_t size[S_COUNT];
    Unit *units;
    size_t nunits;
} DwarfReader;

typedef struct {
    uint32_t form;
    uint64_t u;       /* constants, offsets, raw indices */
    const uint8_t *ptr; /* DW_FORM_string */
} AttrVal;

enum { DW_TAG_entry_point = 0x03, DW_TAG_lexical_block = 0x0b, DW_TAG_compile_unit = 0x11,
       DW_TAG_inlined_subroutine = 0x1d, DW_TAG_subprogram = 0x2e, DW_TAG_partial_unit = 0x3c,
       DW_TAG_skeleton_unit = 0x4a };
enum { DW_AT_name = 0x03, DW_AT_stmt_list = 0x10, DW_AT_low_pc = 0x11, DW_AT_high_pc = 0x12,
       DW_AT_comp_dir = 0x1b, DW_AT_abstract_origin = 0x31, DW_AT_specification = 0x47,
       DW_AT_ranges = 0x55, DW_AT_call_file = 0x58, DW_AT_call_line = 0x59,
       DW_AT_linkage_name = 0x6e, DW_AT_str_offsets_base = 0x72, DW_AT_addr_base = 0x73,
       DW_AT_rnglists_base = 0x74, DW_AT_MIPS_linkage_name = 0x2007, DW_AT_type = 0x49,
       DW_AT_decl_line = 0x3b, DW_AT_decl_column = 0x39, DW_AT_artificial = 0x34,
       DW_AT_language = 0x13, DW_AT_producer = 0x25,
       DW_AT_GNU_ranges_base = 0x2132, DW_AT_GNU_addr_base = 0x2133 };

/* Reads one attribute value of the given form (DW_FORM_* numbers from DWARF 2-5 + GNU). */
static int read_form(Rd *r, const Unit *u, uint32_t form, int64_t implicit, AttrVal *v) {
    v->form = form;
    v->u = 0;
    v->ptr = NULL;
    switch (form) {
    case 0x01: v->u = rd_uint(r, u->addr_size); break;                 /* addr */
    case 0x03: rd_skip(r, rd_u16(r)); break;                            /* block2 */
    case 0x04: rd_skip(r, rd_u32(r)); break;                            /* block4 */
    case 0x05: v->u = rd_u16(r); break;                                 /* data2 */
    case 0x06: v->u = rd_u32(r); break;                                 /* data4 */
    case 0x07: v->u = rd_u64(r); break;                                 /* data8 */
    case 0x08: v->ptr = (const uint8_t *)rd_cstr(r); break;             /* string */
    case 0x09: case 0x18: rd_skip(r, rd_uleb(r)); break;                /* block, exprloc */
    case 0x0a: rd_skip(r, rd_u8(r)); break;                             /* block1 */
    case 0x0b: case 0x0c: case 0x11: v->u = rd_u8(r); break;            /* data1 flag ref1 */
    case 0x0d: v->u = (uint64_t)rd_sleb(r); break;                      /* sdata */
    case 0x0e: case 0x17: case 0x1f: case 0x1d: case 0x1f21:            /* strp sec_offset ... */
        v->u = rd_uint(r, u->off_size);
        break;
    case 0x10: v->u = rd_uint(r, u->version <= 2 ? u->addr_size : u->off_size); break; /* ref_addr */
    case 0x0f: case 0x15: case 0x1a: case 0x1b: case 0x22: case 0x23:   /* udata ref_udata strx addrx ... */
    case 0x1f01: case 0x1f02:
        v->u = rd_uleb(r);
        break;
    case 0x12: v->u = rd_u16(r); break;                                 /* ref2 */
    case 0x13: case 0x1c: v->u = rd_u32(r); break;                      /* ref4 ref_sup4 */
    case 0x14: case 0x20: case 0x24: v->u = rd_u64(r); break;           /* ref8 ref_sig8 ref_sup8 */
    case 0x16: {                                                         /* indirect */
        uint32_t f = (uint32_t)rd_uleb(r);
        if (f == 0x16 || r->err) return -1;
        int64_t ic = f == 0x21 ? rd_sleb(r) : 0;
        return read_form(r, u, f, ic, v);
    }
    case 0x19: v->u = 1; break;                                         /* flag_present */
    case 0x1e: rd_skip(r, 16); break;                                   /* data16 */
    case 0x21: v->u = (uint64_t)implicit; break;                        /* implicit_const */
    case 0x1f20: v->u = rd_uint(r, u->off_size); break;                 /* GNU_ref_alt */
    case 0x25: case 0x29: v->u = rd_u8(r); break;                       /* strx1 addrx1 */
    case 0x26: case 0x2a: v->u = rd_u16(r); break;                      /* strx2 addrx2 */
    case 0x27: case 0x2b: v->u = rd_uint(r, 3); break;                  /* strx3 addrx3 */
    case 0x28: case 0x2c: v->u = rd_u32(r); break;                      /* strx4 addrx4 */
    default: return -1; /* unknown form: the rest of the unit cannot be decoded */
    }
    return r->err ? -1 : 0;
}

static inline int form_is_strx(uint32_t f) {
    return f == 0x1a || f == 0x1f02 || (f >= 0x25 && f <= 0x28);
}
static inline int form_is_addrx(uint32_t f) {
    return f == 0x1b || f == 0x1f01 || (f >= 0x29 && f <= 0x2c);
}
static inline int form_is_const(uint32_t f) {
    return f == 0x05 || f == 0x06 || f == 0x07 || f == 0x0b || f == 0x0d || f == 0x0f ||
           f == 0x21;
}

static const char *sec_cstr(const DwarfReader *d, int s, uint64_t off) {
    if (!d->have[s] || off >= d->size[s]) return NULL;
    const uint8_t *p = d->sec[s] + off;
    if (memchr(p, 0, d->size[s] - off) == NULL) return NULL;
    return (const char *)p;
}

static const char *attr_str(const DwarfReader *d, const Unit *u, const AttrVal *v) {
    if (v->form == 0x08) return (const char *)v->ptr;
    if (v->form == 0x0e) return sec_cstr(d, S_STR, v->u);
    if (v->form == 0x1f) return sec_cstr(d, S_LINE_STR, v->u);
    if (form_is_strx(v->form)) {
        uint64_t base = u->str_offsets_base ? u->str_offsets_base : 8; /* v5 header size */
        Rd r = rd_at(d->sec[S_STR_OFFSETS], d->size[S_STR_OFFSETS], base + v->u * u->off_size);
        uint64_t off = rd_uint(&r, u->off_size);
        return r.err ? NULL : sec_cstr(d, S_STR, off);
    }
    return NULL;
}

static int attr_addr(const DwarfReader *d, const Unit *u, const AttrVal *v, uint64_t *out) {
    if (v->form == 0x01) {
        *out = v->u;
        return 0;
    }
    if (form_is_addrx(v->form)) {
        uint64_t base = u->addr_base ? u->addr_base : 8;
        Rd r = rd_at(d->sec[S_ADDR], d->size[S_ADDR], base + v->u * u->addr_size);
        *out = rd_uint(&r, u->addr_size);
        return r.err ? -1 : 0;
    }
    return -1;
}

/* Absolute .debug_info offset of a reference attribute, or UINT64_MAX. */
static uint64_t attr_ref(const Unit *u, const AttrVal *v) {
    switch (v->form) {
    case 0x11: case 0x12: case 0x13: case 0x14: case 0x15: return u->off + v->u;
    case 0x10: return v->u;
    default: return UINT64_MAX; /* ref_sig8, supplementary/alternate files: not followed */
    }
}

static int unit_abbrevs(DwarfReader *d, Unit *u) {
    if (u->abbr) return 0;
    if (u->abbr_failed) return -1;
    /* Units often share one table (e.g. rustc): reuse one parsed for a nearby earlier unit. */
    size_t idx = (size_t)(u - d->units);
    for (size_t back = 1; back <= 64 && back <= idx; back++) {
        Unit *o = &d->units[idx - back];
        if (o->abbr && o->abbrev_off == u->abbrev_off) {
            u->abbr = o->abbr; /* shared; freed once (see reader_dealloc) */
            return 0;
        }
    }
    u->abbr = abbrev_parse(d->sec[S_ABBREV], d->size[S_ABBREV], u->abbrev_off);
    if (u->abbr == NULL) {
        u->abbr_failed = 1;
        return -1;
    }
    return 0;
}

/* Reads the unit DIE: name, comp_dir, ranges, line program offset and the DWARF 5 bases. */
static int unit_top(DwarfReader *d, Unit *u) {
    if (u->top_parsed) return u->top_parsed > 0 ? 0 : -1;
    u->top_parsed = -1;
    if (unit_abbrevs(d, u) < 0) return -1;
    Rd r = rd_at(d->sec[S_INFO], (size_t)u->end, u->die_off);
    const Abbrev *a = abbrev_find(u->abbr, rd_uleb(&r));
    if (a == NULL || r.err) return -1;
    /* Strings and addresses may be indexed (strx/addrx) through bases that come later in the
     * same DIE, so resolve them only after every attribute was read. */
    AttrVal name = {0}, comp_dir = {0}, low = {0}, high = {0};
    int has_name = 0, has_comp = 0;
    for (uint32_t i = 0; i < a->count; i++) {
        const AttrSpec *s = &u->abbr->specs[a->first + i];
        AttrVal v;
        if (read_form(&r, u, s->form, s->implicit_const, &v) < 0) return -1;
        switch (s->name) {
        case DW_AT_name: name = v; has_name = 1; break;
        case DW_AT_comp_dir: comp_dir = v; has_comp = 1; break;
        case DW_AT_low_pc: low = v; u->has_low_pc = 1; break;
        case DW_AT_high_pc: high = v; u->has_high_pc = 1; break;
        case DW_AT_stmt_list: u->stmt_list = v.u; u->has_stmt_list = 1; break;
        case DW_AT_ranges: u->ranges_form = v.form; u->ranges_val = v.u; u->has_ranges = 1; break;
        case DW_AT_str_offsets_base: u->str_offsets_base = v.u; break;
        case DW_AT_addr_base: case DW_AT_GNU_addr_base: u->addr_base = v.u; break;
        case DW_AT_rnglists_base: case DW_AT_GNU_ranges_base: u->rnglists_base = v.u; break;
        default: break;
        }
    }
    if (has_name) u->name = attr_str(d, u, &name);
    if (has_comp) u->comp_dir = attr_str(d, u, &comp_dir);
    if (u->has_low_pc && attr_addr(d, u, &low, &u->low_pc) < 0) u->has_low_pc = 0;
    if (u->has_high_pc) {
        if (form_is_const(high.form)) {
            u->high_pc = high.u;
            u->high_is_offset = 1;
        } else if (attr_addr(d, u, &high, &u->high_pc) < 0) {
            u->has_high_pc = 0;
        }
    }
    u->top_parsed = 1;
    return 0;
}

/* Finds the unit containing a .debug_info offset (units are sorted by offset). */
static Unit *unit_for_offset(DwarfReader *d, uint64_t off) {
    size_t lo = 0, hi = d->nunits;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (d->units[mid].end <= off) lo = mid + 1;
        else hi = mid;
    }
    if (lo < d->nunits && d->units[lo].off <= off && off < d->units[lo].end) return &d->units[lo];
    return NULL;
}

/* ---- ranges ------------------------------------------------------------------------------ */

typedef struct {
    uint64_t lo, hi;
} Range;

typedef struct {
    Range *v;
    size_t n, cap;
} Ranges;

static int ranges_push(Ranges *rs, uint64_t lo, uint64_t hi) {
    if (hi <= lo) return 0;
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 8;
        Range *n = realloc(rs->v, cap * sizeof *n);
        if (!n) return -1;
        rs->v = n;
        rs->cap = cap;
    }
    rs->v[rs->n].lo = lo;
    rs->v[rs->n].hi = hi;
    rs->n++;
    return 0;
}

/* Appends the ranges of a DW_AT_ranges value (DWARF 5 .debug_rnglists or DWARF <=4 .debug_ranges). */
static int read_ranges(DwarfReader *d, Unit *u, uint32_t form, uint64_t val, Ranges *out) {
    uint64_t base = u->has_low_pc ? u->low_pc : 0;
    uint64_t tomb = u->addr_size == 4 ? 0xffffffffu : UINT64_MAX;
    if (u->version >= 5) {
        uint64_t off = val;
        if (form == 0x23) { /* rnglistx: index into the offset table at rnglists_base */
            Rd t = rd_at(d->sec[S_RNGLISTS], d->size[S_RNGLISTS],
                         u->rnglists_base + val * u->off_size);
            off = u->rnglists_base + rd_uint(&t, u->off_size);
            if (t.err) return -1;
        }
        Rd r = rd_at(d->sec[S_RNGLISTS], d->size[S_RNGLISTS], off);
        while (!r.err) {
            uint8_t kind = rd_u8(&r);
            uint64_t a, b;
            AttrVal v = {0};
            switch (kind) {
            case 0: return 0; /* end_of_list */
            case 1:           /* base_addressx */
                v.form = 0x1b;
                v.u = rd_uleb(&r);
                if (attr_addr(d, u, &v, &base) < 0) return -1;
                break;
            case 2: /* startx_endx */
                v.form = 0x1b;
                v.u = rd_uleb(&r);
                if (attr_addr(d, u, &v, &a) < 0) return -1;
                v.u = rd_uleb(&r);
                if (attr_addr(d, u, &v, &b) < 0) return -1;
                if (ranges_push(out, a, b) < 0) return -1;
                break;
            case 3: /* startx_length */
                v.form = 0x1b;
                v.u = rd_uleb(&r);
                if (attr_addr(d, u, &v, &a) < 0) return -1;
                b = rd_uleb(&r);
                if (ranges_push(out, a, a + b) < 0) return -1;
                break;
            case 4: /* offset_pair */
                a = rd_uleb(&r);
                b = rd_uleb(&r);
                if (ranges_push(out, base + a, base + b) < 0) return -1;
                break;
            case 5: base = rd_uint(&r, u->addr_size); break; /* base_address */
            case 6:                                            /* start_end */
                a = rd_uint(&r, u->addr_size);
                b = rd_uint(&r, u->addr_size);
                if (ranges_push(out, a, b) < 0) return -1;
                break;
            case 7: /* start_length */
                a = rd_uint(&r, u->addr_size);
                b = rd_uleb(&r);
                if (ranges_push(out, a, a + b) < 0) return -1;
                break;
            default: return -1;
            }
        }
        return -1;
    }
    Rd r = rd_at(d->sec[S_RANGES], d->size[S_RANGES], val);
    while (!r.err) {
        uint64_t a = rd_uint(&r, u->addr_size), b = rd_uint(&r, u->addr_size);
        if (r.err) return -1;
        if (a == 0 && b == 0) return 0;
        if (a == tomb) {
            base = b; /* base address selection entry */
            continue;
        }
        if (ranges_push(out, base + a, base + b) < 0) return -1;
    }
    return -1;
}

/* ---- DwarfReader type -------------------------------------------------------------------- */

static void reader_dealloc(DwarfReader *self) {
    if (self->units) {
        for (size_t i = 0; i < self->nunits; i++) {
            free(self->units[i].tree_off);
            free(self->units[i].tree_parent);
            free(self->units[i].tree_end);
        }
        for (size_t i = 0; i < self->nunits; i++) {
            AbbrevTable *t = self->units[i].abbr;
            if (t == NULL) continue;
            /* Tables can be shared between units: clear every alias before freeing. */
            for (size_t j = i; j < self->nunits; j++)
                if (self->units[j].abbr == t) self->units[j].abbr = NULL;
            abbrev_free(t);
        }
        free(self->units);
    }
    for (int i = 0; i < S_COUNT; i++)
        if (self->have[i]) PyBuffer_Release(&self->bufs[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Walks the unit headers of .debug_info once; units are then found by offset or index. */
static int scan_units(DwarfReader *d) {
    size_t cap = 64;
    d->units = calloc(cap, sizeof *d->units);
    if (!d->units) return -1;
    uint64_t off = 0;
    while (d->have[S_INFO] && off + 11 <= d->size[S_INFO]) {
        Rd r = rd_at(d->sec[S_INFO], d->size[S_INFO], off);
        unsigned off_size;
        uint64_t len = rd_initial_length(&r, &off_size);
        uint64_t end = (uint64_t)(r.p - d->sec[S_INFO]) + len;
        if (r.err || len == 0 || end > d->size[S_INFO] || end <= off) break;
        Unit u;
        memset(&u, 0, sizeof u);
        u.off = off;
        u.end = end;
        u.off_size = (uint8_t)off_size;
        u.version = rd_u16(&r);
        if (u.version >= 5) {
            u.unit_type = rd_u8(&r);
            u.addr_size = rd_u8(&r);
            u.abbrev_off = rd_uint(&r, off_size);
            if (u.unit_type == 4 || u.unit_type == 5) rd_skip(&r, 8);         /* skeleton, split */
            if (u.unit_type == 2 || u.unit_type == 6) rd_skip(&r, 8 + off_size); /* type units */
        } else {
            u.unit_type = 1;
            u.abbrev_off = rd_uint(&r, off_size);
            u.addr_size = rd_u8(&r);
        }
        u.die_off = (uint64_t)(r.p - d->sec[S_INFO]);
        off = end;
        /* Type units carry no code; addresses of 1/2/4/8 bytes only. */
        if (r.err || u.version < 2 || u.version > 5 || u.unit_type == 2 || u.unit_type == 6 ||
            !(u.addr_size == 4 || u.addr_size == 8))
            continue;
        if (d->nunits == cap) {
            cap *= 2;
            Unit *n = realloc(d->units, cap * sizeof *n);
            if (!n) return -1;
            d->units = n;
        }
        d->units[d->nunits++] = u;
    }
    return 0;
}

static int reader_init(DwarfReader *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"sections", NULL};
    PyObject *sections;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", kwlist, &PyDict_Type, &sections)) return -1;
    if (self->units) {
        PyErr_SetString(PyExc_RuntimeError, "DwarfReader already initialized");
        return -1;
    }
    for (int i = 0; i < S_COUNT; i++) {
        PyObject *obj = PyDict_GetItemString(sections, SECTION_KEYS[i]);
        if (obj == NULL || obj == Py_None) continue;
        if (PyObject_GetBuffer(obj, &self->bufs[i], PyBUF_SIMPLE) < 0) return -1;
        self->have[i] = 1;
        self->sec[i] = self->bufs[i].buf;
        self->size[i] = (size_t)self->bufs[i].len;
    }
    if (scan_units(self) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static Unit *get_unit(DwarfReader *d, PyObject *arg) {
    unsigned long long off = PyLong_AsUnsignedLongLong(arg);
    if (off == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Unit *u = unit_for_offset(d, off);
    if (u == NULL || u->off != off) {
        PyErr_Format(PyExc_KeyError, "no compile unit at offset %llu", off);
        return NULL;
    }
    return u;
}

static PyObject *reader_units(DwarfReader *self, PyObject *unused) {
    PyObject *list = PyList_New((Py_ssize_t)self->nunits);
    if (!list) return NULL;
    for (size_t i = 0; i < self->nunits; i++) {
        PyObject *o = PyLong_FromUnsignedLongLong(self->units[i].off);
        if (!o) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, o);
    }
    return list;
}

static PyObject *reader_aranges(DwarfReader *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (!list || !self->have[S_ARANGES]) return list;
    const uint8_t *base = self->sec[S_ARANGES];
    size_t size = self->size[S_ARANGES];
    uint64_t off = 0;
    while (off + 4 <= size) {
        Rd r = rd_at(base, size, off);
        unsigned off_size;
        uint64_t len = rd_initial_length(&r, &off_size);
        uint64_t end = (uint64_t)(r.p - base) + len;
        if (r.err || len == 0 || end > size) break;
        rd_u16(&r); /* version */
        uint64_t cu = rd_uint(&r, off_size);
        uint8_t asz = rd_u8(&r), seg = rd_u8(&r);
        if (r.err || !(asz == 4 || asz == 8) || seg != 0) {
            off = end;
            continue;
        }
        /* Tuples are aligned to twice the address size from the set's start. */
        uint64_t pos = (uint64_t)(r.p - base), tup = 2u * asz;
        pos = off + ((pos - off + tup - 1) / tup) * tup;
        r = rd_at(base, (size_t)end, pos);
        while (!r.err) {
            uint64_t a = rd_uint(&r, asz), l = rd_uint(&r, asz);
            if (r.err || (a == 0 && l == 0)) break;
            if (l == 0) continue;
            PyObject *t = Py_BuildValue("(KKK)", (unsigned long long)a,
                                        (unsigned long long)(a + l), (unsigned long long)cu);
            if (!t || PyList_Append(list, t) < 0) {
                Py_XDECREF(t);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(t);
        }
        off = end;
    }
    return list;
}

static PyObject *ranges_to_list(const Ranges *rs) {
    PyObject *list = PyList_New((Py_ssize_t)rs->n);
    if (!list) return NULL;
    for (size_t i = 0; i < rs->n; i++) {
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)rs->v[i].lo,
                                    (unsigned long long)rs->v[i].hi);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

static PyObject *reader_unit_ranges(DwarfReader *self, PyObject *arg) {
    Unit *u = get_unit(self, arg);
    if (!u) return NULL;
    Ranges rs = {0};
    if (unit_top(self, u) == 0) {
        if (u->has_ranges) {
            read_ranges(self, u, u->ranges_form, u->ranges_val, &rs);
        } else if (u->has_low_pc && u->has_high_pc) {
            ranges_push(&rs, u->low_pc, u->high_is_offset ? u->low_pc + u->high_pc : u->high_pc);
        }
    }
    PyObject *list = ranges_to_list(&rs);
    free(rs.v);
    return list;
}

/* ---- line programs ----------------------------------------------------------------------- */

typedef struct {
    uint64_t addr;
    uint32_t file, line;
} Row;

typedef struct {
    size_t start, count; /* rows[start .. start+count), the last one is the end_sequence row */
    uint64_t lo;
} Seq;

static int seq_cmp(const void *a, const void *b) {
    const Seq *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

static PyObject *decode_str(const char *s) {
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static int is_abs(const char *s) { return s && s[0] == '/'; }

/* dir/file the way binutils joins them: relative directories hang off the unit's comp_dir. */
static PyObject *join_path(const char *comp_dir, const char *dir, const char *file) {
    if (file == NULL) Py_RETURN_NONE;
    if (is_abs(file)) return decode_str(file);
    const char *parts[3];
    int n = 0;
    if (dir && *dir) {
        if (!is_abs(dir) && comp_dir && *comp_dir) parts[n++] = comp_dir;
        parts[n++] = dir;
    } else if (comp_dir && *comp_dir) {
        parts[n++] = comp_dir;
    }
    parts[n++] = file;
    size_t len = 0;
    for (int i = 0; i < n; i++) len += strlen(parts[i]) + 1;
    char *buf = malloc(len + 1);
    if (!buf) return PyErr_NoMemory();
    char *w = buf;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(parts[i]);
        memcpy(w, parts[i], l);
        w += l;
        if (i + 1 < n && l && parts[i][l - 1] != '/') *w++ = '/';
    }
    *w = 0;
    PyObject *s = decode_str(buf);
    free(buf);
    return s;
}

/* Reads a DWARF 5 directory/file entry list; fills paths[] (strings) and dirs[] (indices). */
static int read_v5_entries(DwarfReader *d, Unit *u, Rd *r, unsigned off_size, const char ***paths,
                           uint64_t **dirs, uint64_t *count) {
    uint8_t nfmt = rd_u8(r);
    uint64_t fmt[64][2];
    if (nfmt > 64) return -1;
    for (unsigned i = 0; i < nfmt; i++) {
        fmt[i][0] = rd_uleb(r);
        fmt[i][1] = rd_uleb(r);
    }
    uint64_t n = rd_uleb(r);
    if (r->err || n > (uint64_t)(r->end - r->p)) return -1; /* each entry takes >= 1 byte */
    *paths = calloc((size_t)n + 1, sizeof **paths);
    *dirs = calloc((size_t)n + 1, sizeof **dirs);
    if (!*paths || !*dirs) return -1;
    *count = n;
    /* Forms are read with the line table's offset size, not the unit's. */
    Unit lu = *u;
    lu.off_size = (uint8_t)off_size;
    for (uint64_t i = 0; i < n; i++) {
        for (unsigned k = 0; k < nfmt; k++) {
            AttrVal v;
            if (read_form(r, &lu, (uint32_t)fmt[k][1], 0, &v) < 0) return -1;
            if (fmt[k][0] == 1) (*paths)[i] = attr_str(d, &lu, &v); /* DW_LNCT_path */
            else if (fmt[k][0] == 2) (*dirs)[i] = v.u;              /* DW_LNCT_directory_index */
        }
    }
    return r->err ? -1 : 0;
}

typedef struct {
    Row *rows;
    size_t n, cap;
    Seq *seqs;
    size_t nseq, capseq;
} RowBuf;

static int rows_push(RowBuf *b, uint64_t addr, uint32_t file, uint32_t line) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        Row *n = realloc(b->rows, cap * sizeof *n);
        if (!n) return -1;
        b->rows = n;
        b->cap = cap;
    }
    b->rows[b->n].addr = addr;
    b->rows[b->n].file = file;
    b->rows[b->n].line = line;
    b->n++;
    return 0;
}

static PyObject *reader_line_table(DwarfReader *self, PyObject *arg) {
    Unit *u = get_unit(self, arg);
    if (!u) return NULL;
    if (unit_top(self, u) < 0 || !u->has_stmt_list || !self->have[S_LINE]) Py_RETURN_NONE;
    const uint8_t *base = self->sec[S_LINE];
    size_t size = self->size[S_LINE];
    Rd r = rd_at(base, size, u->stmt_list);
    unsigned off_size;
    uint64_t len = rd_initial_length(&r, &off_size);
    if (r.err || len > (uint64_t)(r.end - r.p)) Py_RETURN_NONE;
    const uint8_t *prog_end = r.p + len;
    r.end = prog_end;
    uint16_t version = rd_u16(&r);
    if (version < 2 || version > 5) Py_RETURN_NONE;
    if (version >= 5) {
        rd_u8(&r); /* address_size */
        rd_u8(&r); /* segment_selector_size */
    }
    uint64_t hlen = rd_uint(&r, off_size);
    if (r.err || hlen > (uint64_t)(r.end - r.p)) Py_RETURN_NONE;
    const uint8_t *prog = r.p + hlen;
    uint8_t min_inst = rd_u8(&r);
    if (version >= 4) rd_u8(&r); /* maximum_operations_per_instruction: VLIW only */
    uint8_t default_stmt = rd_u8(&r);
    (void)default_stmt;
    int8_t line_base = (int8_t)rd_u8(&r);
    uint8_t line_range = rd_u8(&r);
    uint8_t opcode_base = rd_u8(&r);
    uint8_t std_len[256] = {0};
    for (unsigned i = 1; i < opcode_base; i++) std_len[i] = rd_u8(&r);
    if (r.err || line_range == 0) Py_RETURN_NONE;

    const char **dpaths = NULL, **fpaths = NULL;
    uint64_t *ddirs = NULL, *fdirs = NULL, ndirs = 0, nfiles = 0;
    PyObject *names = NULL, *result = NULL;
    RowBuf b = {0};
    int ok = 0;
    if (version >= 5) {
        if (read_v5_entries(self, u, &r, off_size, &dpaths, &ddirs, &ndirs) < 0) goto done;
        if (read_v5_entries(self, u, &r, off_size, &fpaths, &fdirs, &nfiles) < 0) goto done;
    } else {
        /* Directory 0 is the compilation directory; files are numbered from 1. */
        size_t cap = 16;
        dpaths = calloc(cap, sizeof *dpaths);
        if (!dpaths) goto done;
        dpaths[ndirs++] = u->comp_dir;
        for (;;) {
            const char *s = rd_cstr(&r);
            if (r.err) goto done;
            if (!*s) break;
            if (ndirs == cap) {
                cap *= 2;
                const char **n = realloc(dpaths, cap * sizeof *n);
                if (!n) goto done;
                dpaths = n;
            }
            dpaths[ndirs++] = s;
        }
        cap = 16;
        fpaths = calloc(cap, sizeof *fpaths);
        fdirs = calloc(cap, sizeof *fdirs);
        if (!fpaths || !fdirs) goto done;
        fpaths[0] = u->name; /* no file 0 before DWARF 5: the unit's own name stands in */
        nfiles = 1;
        for (;;) {
            const char *s = rd_cstr(&r);
            if (r.err) goto done;
            if (!*s) break;
            if (nfiles == cap) {
                cap *= 2;
                const char **n = realloc(fpaths, cap * sizeof *n);
                uint64_t *m = realloc(fdirs, cap * sizeof *m);
                if (n) fpaths = n;
                if (m) fdirs = m;
                if (!n || !m) goto done;
            }
            fpaths[nfiles] = s;
            fdirs[nfiles] = rd_uleb(&r);
            rd_uleb(&r); /* mtime */
            rd_uleb(&r); /* length */
            nfiles++;
        }
    }
    names = PyList_New(0);
    if (!names) goto done;
    for (uint64_t i = 0; i < nfiles; i++) {
        const char *dir = fdirs[i] < ndirs ? dpaths[fdirs[i]] : NULL;
        PyObject *p = join_path(u->comp_dir, dir, fpaths[i]);
        if (!p || PyList_Append(names, p) < 0) {
            Py_XDECREF(p);
            goto done;
        }
        Py_DECREF(p);
    }

    /* The state machine (DWARF 5 section 6.2.5). VLIW op_index is ignored (x86, arm64). */
    r = rd_at(base, (size_t)(prog_end - base), (uint64_t)(prog - base));
    uint64_t addr = 0;
    uint32_t file = 1, line = 1;
    size_t seq_start = 0;
    int in_seq = 0;
    while (r.p < r.end && !r.err) {
        uint8_t op = rd_u8(&r);
        int emit = 0, end_seq = 0;
        if (op >= opcode_base) {
            unsigned adj = op - opcode_base;
            addr += (uint64_t)(adj / line_range) * min_inst;
            line += (uint32_t)(line_base + (int)(adj % line_range));
            emit = 1;
        } else if (op == 0) {
            uint64_t elen = rd_uleb(&r);
            if (elen == 0 || elen > (uint64_t)(r.end - r.p)) break;
            const uint8_t *next = r.p + elen;
            uint8_t sub = rd_u8(&r);
            if (sub == 1) {
                emit = end_seq = 1;
            } else if (sub == 2) {
                addr = rd_uint(&r, (unsigned)(elen - 1));
            } else if (sub == 3) { /* DW_LNE_define_file (DWARF <= 4) */
                const char *s = rd_cstr(&r);
                uint64_t di = rd_uleb(&r);
                PyObject *p = join_path(u->comp_dir, di < ndirs ? dpaths[di] : NULL, s);
                if (!p || PyList_Append(names, p) < 0) {
                    Py_XDECREF(p);
                    goto done;
                }
                Py_DECREF(p);
            }
            r.p = next;
        } else {
            switch (op) {
            case 1: emit = 1; break;                                      /* copy */
            case 2: addr += rd_uleb(&r) * min_inst; break;                /* advance_pc */
            case 3: line += (uint32_t)rd_sleb(&r); break;                 /* advance_line */
            case 4: file = (uint32_t)rd_uleb(&r); break;                  /* set_file */
            case 8: addr += (uint64_t)((255 - opcode_base) / line_range) * min_inst; break;
            case 9: addr += rd_u16(&r); break;                            /* fixed_advance_pc */
            default:
                for (unsigned i = 0; i < std_len[op]; i++) rd_uleb(&r);   /* column, isa, ... */
                break;
            }
        }
        if (!emit) continue;
        if (!in_seq) {
            seq_start = b.n;
            in_seq = 1;
        }
        /* Several rows at one address: the last one describes the code there (as binutils). */
        if (b.n > seq_start && b.rows[b.n - 1].addr == addr && !end_seq) {
            b.rows[b.n - 1].file = file;
            b.rows[b.n - 1].line = line;
        } else if (rows_push(&b, addr, end_seq ? 0xffffffffu : file, line) < 0) {
            goto done;
        }
        if (end_seq) {
            if (b.nseq == b.capseq) {
                size_t cap = b.capseq ? b.capseq * 2 : 64;
                Seq *n = realloc(b.seqs, cap * sizeof *n);
                if (!n) goto done;
                b.seqs = n;
                b.capseq = cap;
            }
            b.seqs[b.nseq].start = seq_start;
            b.seqs[b.nseq].count = b.n - seq_start;
            b.seqs[b.nseq].lo = b.rows[seq_start].addr;
            b.nseq++;
            in_seq = 0;
            addr = 0;
            file = 1;
            line = 1;
        }
    }
    if (in_seq) b.n = seq_start; /* an unterminated sequence has no known end: drop it */

    /* Sequences come in object order; sort them by address and drop empty or overlapping ones
     * (the linker leaves discarded functions' sequences at address 0). */
    if (b.nseq > 1) qsort(b.seqs, b.nseq, sizeof *b.seqs, seq_cmp);
    size_t total = 0;
    uint64_t covered = 0;
    for (size_t i = 0; i < b.nseq; i++) {
        Seq *s = &b.seqs[i];
        uint64_t hi = b.rows[s->start + s->count - 1].addr;
        if (s->count < 2 || hi <= s->lo || (total && s->lo < covered) || s->lo == 0) {
            s->count = 0;
            continue;
        }
        covered = hi;
        total += s->count;
    }
    PyObject *ab = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * 8));
    PyObject *fb = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * 4));
    PyObject *lb = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * 4));
    if (!ab || !fb || !lb) {
        Py_XDECREF(ab);
        Py_XDECREF(fb);
        Py_XDECREF(lb);
        goto done;
    }
    uint64_t *ap = (uint64_t *)PyBytes_AS_STRING(ab);
    uint32_t *fp = (uint32_t *)PyBytes_AS_STRING(fb), *lp = (uint32_t *)PyBytes_AS_STRING(lb);
    size_t k = 0;
    for (size_t i = 0; i < b.nseq; i++) {
        for (size_t j = 0; j < b.seqs[i].count; j++, k++) {
            const Row *row = &b.rows[b.seqs[i].start + j];
            ap[k] = row->addr;
            fp[k] = row->file;
            lp[k] = row->line;
        }
    }
    result = PyTuple_Pack(4, ab, fb, lb, names);
    Py_DECREF(ab);
    Py_DECREF(fb);
    Py_DECREF(lb);
    ok = 1;
done:
    free(dpaths);
    free(ddirs);
    free(fpaths);
    free(fdirs);
    free(b.rows);
    free(b.seqs);
    Py_XDECREF(names);
    if (!ok && !PyErr_Occurred()) Py_RETURN_NONE;
    return result;
}

/* ---- inline chains ----------------------------------------------------------------------- */

typedef struct {
    int32_t parent;  /* enclosing matched scope, or -1 */
    uint8_t is_subprogram;
    uint64_t die;    /* offset of the scope's DIE, for its name */
    uint64_t call_file, call_line;
} Scope;

/* Follows abstract_origin/specification until both names are known (or the chain ends). */
static int resolve_names(DwarfReader *d, uint64_t die, const char **name, const char **linkage,
                         uint64_t *name_die) {
    *name = *linkage = NULL;
    *name_die = UINT64_MAX;
    for (int hop = 0; hop < 16 && die != UINT64_MAX; hop++) {
        Unit *u = unit_for_offset(d, die);
        if (u == NULL || unit_abbrevs(d, u) < 0 || unit_top(d, u) < 0) return -1;
        Rd r = rd_at(d->sec[S_INFO], (size_t)u->end, die);
        const Abbrev *a = abbrev_find(u->abbr, rd_uleb(&r));
        if (a == NULL || r.err) return -1;
        uint64_t origin = UINT64_MAX, spec = UINT64_MAX;
        for (uint32_t i = 0; i < a->count; i++) {
            const AttrSpec *s = &u->abbr->specs[a->first + i];
            AttrVal v;
            if (read_form(&r, u, s->form, s->implicit_const, &v) < 0) return -1;
            switch (s->name) {
            case DW_AT_name:
                if (!*name) {
                    *name = attr_str(d, u, &v);
                    if (*name) *name_die = die;
                }
                break;
            case DW_AT_linkage_name: case DW_AT_MIPS_linkage_name:
                if (!*linkage) *linkage = attr_str(d, u, &v);
                break;
            case DW_AT_abstract_origin: origin = attr_ref(u, &v); break;
            case DW_AT_specification: spec = attr_ref(u, &v); break;
            default: break;
            }
        }
        if (*name && *linkage) return 0;
        die = origin != UINT64_MAX ? origin : spec;
    }
    return 0;
}

static PyObject *str_or_none(const char *s) {
    if (s == NULL) Py_RETURN_NONE;
    return decode_str(s);
}

/* Returns a new reference to the (name, linkage, name_die) of a DIE, memoized per call. */
static PyObject *scope_names(DwarfReader *d, uint64_t die, PyObject *memo) {
    PyObject *key = PyLong_FromUnsignedLongLong(die);
    if (!key) return NULL;
    PyObject *hit = PyDict_GetItemWithError(memo, key);
    if (hit) {
        Py_DECREF(key);
        Py_INCREF(hit);
        return hit;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    const char *name, *linkage;
    uint64_t name_die;
    resolve_names(d, die, &name, &linkage, &name_die);
    PyObject *n = str_or_none(name), *l = n ? str_or_none(linkage) : NULL;
    PyObject *o = l ? (name_die == UINT64_MAX ? (Py_INCREF(Py_None), Py_None)
                                              : PyLong_FromUnsignedLongLong(name_die))
                    : NULL;
    PyObject *pair = (n && l && o) ? PyTuple_Pack(3, n, l, o) : NULL;
    Py_XDECREF(n);
    Py_XDECREF(l);
    Py_XDECREF(o);
    if (pair && PyDict_SetItem(memo, key, pair) < 0) Py_CLEAR(pair);
    Py_DECREF(key);
    return pair;
}

#define MAX_DEPTH 256

static PyObject *reader_inline_chains(DwarfReader *self, PyObject *args) {
    PyObject *unit_obj, *addr_list;
    if (!PyArg_ParseTuple(args, "OO!", &unit_obj, &PyList_Type, &addr_list)) return NULL;
    Unit *u = get_unit(self, unit_obj);
    if (!u) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(addr_list);
    uint64_t *addrs = malloc(((size_t)n + 1) * sizeof *addrs);
    int32_t *deepest = malloc(((size_t)n + 1) * sizeof *deepest);
    Scope *scopes = NULL;
    size_t nscopes = 0, capscopes = 0;
    Ranges rs = {0};
    PyObject *result = NULL, *memo = NULL;
    if (!addrs || !deepest) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        addrs[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(addr_list, i));
        if (PyErr_Occurred()) goto done;
        if (i && addrs[i] < addrs[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "addresses must be sorted");
            goto done;
        }
        deepest[i] = -1;
    }
    if (unit_top(self, u) < 0) goto build; /* undecodable unit: no chains, not an error */

    /* One pass over the unit's DIE tree. stack[depth] is the innermost matched scope that
     * encloses the DIEs at that depth; DFS order means the last match for an address is its
     * innermost scope. */
    int32_t stack[MAX_DEPTH + 1];
    int depth = 0;
    stack[0] = -1;
    Rd r = rd_at(self->sec[S_INFO], (size_t)u->end, u->die_off);
    while (r.p < r.end && !r.err) {
        uint64_t die = (uint64_t)(r.p - self->sec[S_INFO]);
        uint64_t code = rd_uleb(&r);
        if (code == 0) {
            if (--depth <= 0) break; /* end of the unit DIE's children */
            continue;
        }
        const Abbrev *a = abbrev_find(u->abbr, code);
        if (a == NULL) break;
        int interesting = a->tag == DW_TAG_subprogram || a->tag == DW_TAG_inlined_subroutine ||
                          a->tag == DW_TAG_entry_point;
        int has_low = 0, has_high = 0, high_off = 0, has_ranges = 0;
        AttrVal low = {0}, high = {0};
        uint64_t call_file = 0, call_line = 0, ranges_val = 0;
        uint32_t ranges_form = 0;
        const AttrSpec *s = &u->abbr->specs[a->first];
        for (uint32_t i = 0; i < a->count; i++, s++) {
            AttrVal v;
            if (read_form(&r, u, s->form, s->implicit_const, &v) < 0) goto build;
            if (!interesting) continue;
            switch (s->name) {
            case DW_AT_low_pc: low = v; has_low = 1; break;
            case DW_AT_high_pc:
                high = v;
                has_high = 1;
                high_off = form_is_const(v.form);
                break;
            case DW_AT_ranges: ranges_form = v.form; ranges_val = v.u; has_ranges = 1; break;
            case DW_AT_call_file: call_file = v.u; break;
            case DW_AT_call_line: call_line = v.u; break;
            default: break;
            }
        }
        int32_t me = -1;
        if (interesting && n > 0) {
            rs.n = 0;
            if (has_ranges) {
                read_ranges(self, u, ranges_form, ranges_val, &rs);
            } else if (has_low && has_high) {
                uint64_t lo, hi = 0;
                if (attr_addr(self, u, &low, &lo) == 0 &&
                    (high_off ? (hi = lo + high.u, 1) : attr_addr(self, u, &high, &hi) == 0))
                    ranges_push(&rs, lo, hi);
            }
            for (size_t k = 0; k < rs.n; k++) {
                /* First query address >= lo, then every one below hi. */
                size_t lo = 0, hi = (size_t)n;
                while (lo < hi) {
                    size_t mid = (lo + hi) / 2;
                    if (addrs[mid] < rs.v[k].lo) lo = mid + 1;
                    else hi = mid;
                }
                for (size_t j = lo; j < (size_t)n && addrs[j] < rs.v[k].hi; j++) {
                    if (me < 0) {
                        if (nscopes == capscopes) {
                            size_t cap = capscopes ? capscopes * 2 : 64;
                            Scope *ns = realloc(scopes, cap * sizeof *ns);
                            if (!ns) {
                                PyErr_NoMemory();
                                goto done;
                            }
                            scopes = ns;
                            capscopes = cap;
                        }
                        me = (int32_t)nscopes++;
                        scopes[me].parent = stack[depth < MAX_DEPTH ? depth : MAX_DEPTH];
                        scopes[me].is_subprogram = a->tag != DW_TAG_inlined_subroutine;
                        scopes[me].die = die;
                        scopes[me].call_file = call_file;
                        scopes[me].call_line = call_line;
                    }
                    deepest[j] = me;
                }
            }
        }
        if (a->children) {
            int32_t parent = stack[depth < MAX_DEPTH ? depth : MAX_DEPTH];
            depth++;
            if (depth <= MAX_DEPTH) stack[depth] = me >= 0 ? me : parent;
        }
    }
build:
    PyErr_Clear(); /* decoding problems end the walk; what was matched stays valid */
    memo = PyDict_New();
    result = PyList_New(n);
    if (!memo || !result) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        int cnt = 0;
        for (int32_t s = deepest[i]; s >= 0 && cnt < MAX_DEPTH; s = scopes[s].parent) {
            cnt++;
            if (scopes[s].is_subprogram) break;
        }
        PyObject *chain = PyTuple_New(cnt);
        if (!chain) goto fail;
        PyList_SET_ITEM(result, i, chain);
        int32_t s = deepest[i];
        for (int k = 0; k < cnt; k++, s = scopes[s].parent) {
            PyObject *names = scope_names(self, scopes[s].die, memo);
            if (!names) goto fail;
            PyObject *f = Py_BuildValue("(OOKKO)", PyTuple_GET_ITEM(names, 0),
                                        PyTuple_GET_ITEM(names, 1),
                                        (unsigned long long)scopes[s].call_file,
                                        (unsigned long long)scopes[s].call_line,
                                        PyTuple_GET_ITEM(names, 2));
            Py_DECREF(names);
            if (!f) goto fail;
            PyTuple_SET_ITEM(chain, k, f);
        }
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    Py_XDECREF(memo);
    free(addrs);
    free(deepest);
    free(scopes);
    free(rs.v);
    return result;
}

/* ---- single DIEs (qualified C++ names, collector/symbols/dwarf.py) ------------------------- */

/* Every DIE of the unit with its parent and subtree end, in one walk. */
static int unit_tree(DwarfReader *d, Unit *u) {
    if (u->tree_state) return u->tree_state > 0 ? 0 : -1;
    u->tree_state = -1;
    if (unit_top(d, u) < 0) return -1;
    size_t cap = 1024, n = 0;
    uint64_t *offs = malloc(cap * sizeof *offs), *parents = malloc(cap * sizeof *parents);
    uint32_t *ends = malloc(cap * sizeof *ends);
    size_t open[MAX_DEPTH + 1];
    int depth = 0;
    if (!offs || !parents || !ends) goto fail;
    Rd r = rd_at(d->sec[S_INFO], (size_t)u->end, u->die_off);
    while (r.p < r.end && !r.err) {
        uint64_t die = (uint64_t)(r.p - d->sec[S_INFO]);
        uint64_t code = rd_uleb(&r);
        if (code == 0) {
            if (depth <= 0) break;
            depth--;
            if (depth < MAX_DEPTH) ends[open[depth]] = (uint32_t)n;
            if (depth == 0) break; /* end of the unit DIE's children */
            continue;
        }
        const Abbrev *a = abbrev_find(u->abbr, code);
        if (a == NULL) break;
        const AttrSpec *s = &u->abbr->specs[a->first];
        int bad = 0;
        for (uint32_t i = 0; i < a->count; i++, s++) {
            AttrVal v;
            if (read_form(&r, u, s->form, s->implicit_const, &v) < 0) { bad = 1; break; }
        }
        if (bad) break;
        if (n == cap || n >= UINT32_MAX - 1) {
            if (n >= UINT32_MAX - 1) break;
            cap *= 2;
            uint64_t *no = realloc(offs, cap * sizeof *no);
            if (!no) goto fail;
            offs = no;
            uint64_t *np = realloc(parents, cap * sizeof *np);
            if (!np) goto fail;
            parents = np;
            uint32_t *ne = realloc(ends, cap * sizeof *ne);
            if (!ne) goto fail;
            ends = ne;
        }
        offs[n] = die;
        parents[n] = depth > 0 && depth <= MAX_DEPTH ? offs[open[depth - 1]] : UINT64_MAX;
        ends[n] = (uint32_t)(n + 1);
        if (a->children) {
            if (depth < MAX_DEPTH) open[depth] = n;
            depth++;
        }
        n++;
        if (!a->children && depth == 0) break; /* a unit DIE without children */
    }
    /* Subtrees left open by a truncated unit end at the last DIE read. */
    for (int k = 0; k < depth && k < MAX_DEPTH; k++) ends[open[k]] = (uint32_t)n;
    u->tree_off = offs;
    u->tree_parent = parents;
    u->tree_end = ends;
    u->ntree = n;
    u->tree_state = 1;
    return 0;
fail:
    free(offs);
    free(parents);
    free(ends);
    PyErr_NoMemory();
    return -1;
}

/* The unit and tree index of a DIE offset; NULL with KeyError when there is no such DIE. */
static Unit *find_die(DwarfReader *d, PyObject *arg, uint64_t *off, size_t *index) {
    unsigned long long o = PyLong_AsUnsignedLongLong(arg);
    if (o == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Unit *u = unit_for_offset(d, o);
    if (u != NULL && unit_tree(d, u) == 0) {
        size_t lo = 0, hi = u->ntree;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (u->tree_off[mid] < o) lo = mid + 1;
            else hi = mid;
        }
        if (lo < u->ntree && u->tree_off[lo] == o) {
            *off = o;
            *index = lo;
            return u;
        }
    }
    if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "no DIE at offset %llu", o);
    return NULL;
}

static PyObject *ref_or_none(uint64_t ref) {
    if (ref == UINT64_MAX) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(ref);
}

/* (tag, name, linkage_name, parent, type, origin, decl_line, decl_column, artificial,
 *  language, producer) of one DIE; origin is DW_AT_abstract_origin or DW_AT_specification,
 *  references and strings None when absent, numbers 0. */
static PyObject *reader_die(DwarfReader *self, PyObject *arg) {
    uint64_t off;
    size_t index;
    Unit *u = find_die(self, arg, &off, &index);
    if (u == NULL) return NULL;
    Rd r = rd_at(self->sec[S_INFO], (size_t)u->end, off);
    const Abbrev *a = abbrev_find(u->abbr, rd_uleb(&r));
    if (a == NULL || r.err) return PyErr_Format(PyExc_ValueError, "undecodable DIE");
    const char *name = NULL, *linkage = NULL, *producer = NULL;
    uint64_t type = UINT64_MAX, origin = UINT64_MAX, line = 0, column = 0, language = 0;
    int artificial = 0;
    for (uint32_t i = 0; i < a->count; i++) {
        const AttrSpec *s = &u->abbr->specs[a->first + i];
        AttrVal v;
        if (read_form(&r, u, s->form, s->implicit_const, &v) < 0)
            return PyErr_Format(PyExc_ValueError, "undecodable DIE");
        switch (s->name) {
        case DW_AT_name: name = attr_str(self, u, &v); break;
        case DW_AT_linkage_name: case DW_AT_MIPS_linkage_name:
            linkage = attr_str(self, u, &v);
            break;
        case DW_AT_producer: producer = attr_str(self, u, &v); break;
        case DW_AT_type: type = attr_ref(u, &v); break;
        case DW_AT_abstract_origin: case DW_AT_specification: origin = attr_ref(u, &v); break;
        case DW_AT_decl_line: line = v.u; break;
        case DW_AT_decl_column: column = v.u; break;
        case DW_AT_language: language = v.u; break;
        case DW_AT_artificial: artificial = v.form == 0x19 /* flag_present */ || v.u != 0; break;
        default: break;
        }
    }
    PyObject *n = str_or_none(name), *l = str_or_none(linkage), *p = str_or_none(producer);
    PyObject *par = ref_or_none(u->tree_parent[index]), *t = ref_or_none(type);
    PyObject *o = ref_or_none(origin);
    PyObject *out = NULL;
    if (n && l && p && par && t && o)
        out = Py_BuildValue("(IOOOOOKKiKO)", a->tag, n, l, par, t, o, (unsigned long long)line,
                            (unsigned long long)column, artificial,
                            (unsigned long long)language, p);
    Py_XDECREF(n);
    Py_XDECREF(l);
    Py_XDECREF(p);
    Py_XDECREF(par);
    Py_XDECREF(t);
    Py_XDECREF(o);
    return out;
}

/* Offsets of a DIE's direct children, in order. */
static PyObject *reader_children(DwarfReader *self, PyObject *arg) {
    uint64_t off;
    size_t index;
    Unit *u = find_die(self, arg, &off, &index);
    if (u == NULL) return NULL;
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (size_t k = index + 1; k < u->tree_end[index] && k < u->ntree; k = u->tree_end[k]) {
        PyObject *v = PyLong_FromUnsignedLongLong(u->tree_off[k]);
        if (!v || PyList_Append(list, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(v);
        if (u->tree_end[k] <= k) break; /* never loop on a corrupt tree */
    }
    return list;
}

static PyMethodDef reader_methods[] = {
    {"units", (PyCFunction)reader_units, METH_NOARGS, "Offsets of the compile units."},
    {"aranges", (PyCFunction)reader_aranges, METH_NOARGS, "(lo, hi, unit) from .debug_aranges."},
    {"unit_ranges", (PyCFunction)reader_unit_ranges, METH_O, "Address ranges of a unit's DIE."},
    {"line_table", (PyCFunction)reader_line_table, METH_O, "Decoded line table of a unit."},
    {"inline_chains", (PyCFunction)reader_inline_chains, METH_VARARGS,
     "Scope chains (innermost first) for sorted addresses inside one unit."},
    {"die", (PyCFunction)reader_die, METH_O, "Attributes and parent of one DIE."},
    {"children", (PyCFunction)reader_children, METH_O, "Offsets of a DIE's children."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DwarfReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rsprof._native.DwarfReader",
    .tp_basicsize = sizeof(DwarfReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decodes DWARF line tables and inline scopes from section buffers.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
};

int rsprof_dwarf_register(PyObject *module) {
    if (PyType_Ready(&DwarfReaderType) < 0) return -1;
    Py_INCREF(&DwarfReaderType);
    if (PyModule_AddObject(module, "DwarfReader", (PyObject *)&DwarfReaderType) < 0) {
        Py_DECREF(&DwarfReaderType);
        return -1;
    }
    return 0;
}
