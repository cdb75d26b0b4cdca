/* unwind.c: CFI unwinding of sampled user stacks, x86_64 (see rs_unwind.h, docs/native.md).
 *
 * Design:
 * - A module's CFI (.eh_frame; .debug_frame when there is none, also from a separate debug
 *   file under /usr/lib/debug/.build-id) is parsed ONCE into a compact sorted table: one
 *   16-byte row per address range with the rule for the CFA (rsp or rbp + offset, the
 *   PLT expression, or [rsp + n] in signal trampolines), for the return address and for
 *   rbp.  CFI programs are evaluated while building the table, never per sample, so an
 *   unwound frame costs a mapping lookup and a binary search.
 * - Tables are cached process-wide per file (device, inode, size, mtime), so several
 *   recordings of the same program, or threads sharing libc, parse it once.  The vDSO
 *   exists only in memory: its image is read from the target (/proc/PID/mem) and parsed
 *   like a file, once per address space.
 * - Anything the table cannot express (other DWARF expressions, a register saved in
 *   another register, a read outside the copied stack, a caller outside every executable
 *   mapping) stops the walk and the stack ends with a [truncated] root.  Frame pointers
 *   are used only where there is no CFI at all for the code (JIT or assembly without
 *   CFI), and the result must still land in an executable mapping.
 * - The CIE/FDE parsing and the CFA program interpreter are native/cfi_eval.h, shared with
 *   the heap shim (native/shim/shimcfi.c); the rows, their table and the cache are here.
 */
#define _GNU_SOURCE
#include "rs_unwind.h"

#include "cfi_eval.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ rows */

enum {
    CFA_RSP = CFI_CFA_RSP,      /* cfa = rsp + off */
    CFA_RBP = CFI_CFA_RBP,      /* cfa = rbp + off */
    CFA_PLT = CFI_CFA_PLT,      /* cfa = rsp + 8 + ((rip & 15) >= plt_thr ? 8 : 0): lazy PLT stubs */
    CFA_DEREF = CFI_CFA_DEREF,  /* cfa = [rsp + off]: signal trampolines (ucontext on the stack) */
    CFA_END = 4,      /* return address undefined: the outermost frame (_start, clone) */
    CFA_BAD = 5,      /* a rule the table cannot express: stop, truncated */
    CFA_NONE = 6,     /* no FDE covers this address */
};
enum {
    REG_SAME = CFI_REG_SAME,    /* unchanged (callee-saved and not saved yet) */
    REG_CFA = CFI_REG_CFA,      /* saved at cfa + off */
    REG_RSP = CFI_REG_RSP,      /* saved at rsp + off (signal frames' DW_CFA_expression breg7) */
    REG_UNDEF = CFI_REG_UNDEF,  /* lost: a frame that needs it cannot be unwound */
};

typedef struct {
    uint32_t pc;      /* link-time address - module base */
    int32_t cfa_off;
    int16_t ra_off, bp_off;
    uint8_t cfa, ra, bp;
    uint8_t plt_thr : 5, signal : 1, pad : 2;
} rs_row;

_Static_assert(sizeof(rs_row) == 16, "rows are meant to stay compact");

typedef struct {
    uint64_t offset, vaddr, filesz;
} rs_segment;

typedef struct rs_module {
    /* identity in the global cache */
    dev_t dev;
    ino_t ino;
    off_t size;
    int64_t mtime_ns;
    struct rs_module *next;
    /* content */
    bool has_cfi;
    uint64_t base;           /* rows are relative to this link-time address */
    rs_row *rows;
    size_t n_rows;
    uint64_t *functions;     /* (start, end) pairs, link-time addresses, sorted */
    size_t n_functions;
    rs_segment *segments;    /* PT_LOAD */
    size_t n_segments;
    double build_ms;
} rs_module;

/* ------------------------------------------------------------ helpers */

static bool vec_grow(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t ncap = *cap ? *cap * 2 : 256;
    while (ncap < need) ncap *= 2;
    void *p = realloc(*buf, ncap * elem);
    if (p == NULL) return false;
    *buf = p;
    *cap = ncap;
    return true;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------- CFI -> rows */

typedef struct {
    rs_row *rows;
    size_t n, cap;
    uint64_t *functions;
    size_t n_functions, cap_functions;
    uint64_t base;
    bool oom;
} rs_builder;

static bool cfa_is_rule(uint8_t cfa) {
    return cfa == CFA_RSP || cfa == CFA_RBP || cfa == CFA_PLT || cfa == CFA_DEREF;
}

static void push_row(rs_builder *b, const rs_row *r) {
    if (b->n > 0 && b->rows[b->n - 1].pc == r->pc) {
        b->rows[b->n - 1] = *r;  /* a later rule at the same address wins */
        return;
    }
    if (!vec_grow((void **)&b->rows, &b->cap, b->n + 1, sizeof(rs_row))) {
        b->oom = true;
        return;
    }
    b->rows[b->n++] = *r;
}

/* The row for the rules of cfi_eval.h from pc on.  The extension stops at whatever it
 * cannot evaluate: a CFA in an untracked register or an unknown expression, a return
 * address with a rule that is not a save slot (CFI_REG_LOST), and any row after a rule of
 * the return address or rbp it could not follow until the CFA is defined again
 * (`unfollowed`) make the row CFA_BAD, a [truncated] root. */
static void emit_row(rs_builder *b, uint64_t pc, const cfi_state *s, bool signal) {
    if (pc < b->base || pc - b->base > UINT32_MAX) return;
    rs_row r;
    memset(&r, 0, sizeof r);
    r.pc = (uint32_t)(pc - b->base);
    r.cfa = s->cfa <= CFI_CFA_DEREF ? s->cfa : CFA_BAD;
    r.plt_thr = s->plt_thr;
    r.signal = signal;
    r.ra = s->ra;
    r.bp = s->bp;
    if (s->ra == CFI_REG_LOST) r.ra = REG_UNDEF, r.cfa = CFA_BAD;
    if (s->unfollowed) r.cfa = CFA_BAD;
    if (s->cfa_off < INT32_MIN || s->cfa_off > INT32_MAX || s->ra_off < INT16_MIN ||
        s->ra_off > INT16_MAX || s->bp_off < INT16_MIN || s->bp_off > INT16_MAX) {
        r.cfa = CFA_BAD;
    } else {
        r.cfa_off = (int32_t)s->cfa_off;
        r.ra_off = (int16_t)s->ra_off;
        r.bp_off = (int16_t)s->bp_off;
    }
    if (cfa_is_rule(r.cfa) && r.ra == REG_UNDEF) r.cfa = CFA_END;
    if (cfa_is_rule(r.cfa) && r.ra == REG_SAME) r.cfa = CFA_BAD;
    push_row(b, &r);
}

/* The end of an FDE's range: no rule from pc on (unless another FDE starts there). */
static void emit_none(rs_builder *b, uint64_t pc) {
    if (pc < b->base || pc - b->base > UINT32_MAX) return;
    rs_row r;
    memset(&r, 0, sizeof r);
    r.pc = (uint32_t)(pc - b->base);
    r.cfa = CFA_NONE;
    push_row(b, &r);
}

/* Runs a CIE's initial instructions into *s.  Returns false on malformed input. */
static bool run_cie(const cfi_cie *cie, cfi_state *s, uint64_t pcrel_bias) {
    cfi_program pr;
    cfi_program_init(&pr, cie, cie->insns, cie->insns_end, NULL, 0, pcrel_bias);
    uint64_t delta;
    int st;
    while ((st = cfi_step(&pr, s, &delta)) == CFI_STEP_ADVANCE) pr.loc += delta;
    return st == CFI_STEP_END;
}

/* Runs an FDE's instructions from *loc, emitting a row each time the location advances
 * (up to pc_end).  Returns false on malformed input (*loc: where the rules stopped). */
static bool run_fde(rs_builder *b, const cfi_cie *cie, const uint8_t *p, const uint8_t *end,
                    cfi_state *s, const cfi_state *initial, uint64_t *loc, uint64_t pc_end,
                    uint64_t pcrel_bias) {
    cfi_program pr;
    cfi_program_init(&pr, cie, p, end, initial, *loc, pcrel_bias);
    uint64_t delta;
    int st;
    while ((st = cfi_step(&pr, s, &delta)) == CFI_STEP_ADVANCE) {
        uint64_t nloc = pr.loc + delta;
        if (nloc > pc_end) nloc = pc_end;
        if (nloc > pr.loc) {
            emit_row(b, pr.loc, s, cie->signal);
            pr.loc = nloc;
        }
    }
    *loc = pr.loc;
    return st == CFI_STEP_END;
}


static int cmp_row(const void *a, const void *b) {
    const rs_row *x = a, *y = b;
    if (x->pc != y->pc) return x->pc < y->pc ? -1 : 1;
    /* at one address a real rule wins over the end marker of the previous FDE */
    return (x->cfa == CFA_NONE) - (y->cfa == CFA_NONE);
}

static int cmp_range(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Walks a whole .eh_frame (eh) or .debug_frame section and appends rows and functions. */
static void parse_frames(rs_builder *b, const uint8_t *sec, uint64_t size, uint64_t vaddr, bool eh) {
    const uint8_t *p = sec, *end = sec + size;
    /* a field's link-time address is its address in the image + bias (pcrel encodings) */
    const uint64_t bias = vaddr - (uint64_t)(uintptr_t)sec;
    const uint8_t *memo_at = NULL;  /* one-entry CIE memo: FDEs mostly share a CIE */
    bool memo_ok = false, memo_z = false;
    cfi_cie cie;
    cfi_state cie_state;
    memset(&cie, 0, sizeof cie);
    memset(&cie_state, 0, sizeof cie_state);
    while ((uint64_t)(end - p) >= 4 && !b->oom) {
        cfi_cursor c = {p, end, 0};
        uint64_t len = cfi_fixed(&c, 4);
        bool is64 = false;
        if (len == 0) {
            if (eh) break;  /* .eh_frame terminator */
            p = c.p;
            continue;
        }
        if (len == 0xffffffffu) {
            len = cfi_fixed(&c, 8);
            is64 = true;
        }
        if (c.bad || len > (uint64_t)(end - c.p)) break;
        const uint8_t *body = c.p, *next = c.p + len;
        cfi_cursor h = {body, next, 0};
        uint64_t id = cfi_fixed(&h, is64 ? 8 : 4);
        bool is_cie = eh ? id == 0 : (is64 ? id == UINT64_MAX : id == 0xffffffffu);
        if (h.bad || is_cie) {
            p = next;
            continue;
        }
        const uint8_t *cie_at = eh ? body - id : sec + id;
        if (cie_at < sec || cie_at >= end || (eh && id > (uint64_t)(body - sec))) {
            p = next;
            continue;
        }
        if (cie_at != memo_at) {
            memo_at = cie_at;
            memo_ok = false;
            cfi_cursor cc = {cie_at, end, 0};
            uint64_t clen = cfi_fixed(&cc, 4);
            bool c64 = false;
            if (clen == 0xffffffffu) {
                clen = cfi_fixed(&cc, 8);
                c64 = true;
            }
            if (!cc.bad && clen <= (uint64_t)(end - cc.p)) {
                const uint8_t *cend = cc.p + clen;
                (void)cfi_fixed(&cc, c64 ? 8 : 4);
                if (!cc.bad && cfi_parse_cie(cc.p, cend, bias, &cie)) {
                    /* Before any rule: CFA unknown, return address unknown, rbp unchanged. */
                    memset(&cie_state, 0, sizeof cie_state);
                    cie_state.cfa = CFI_CFA_BAD;
                    cie_state.ra = CFI_REG_SAME;
                    cie_state.bp = CFI_REG_SAME;
                    memo_ok = run_cie(&cie, &cie_state, bias);
                    memo_z = cie.has_z;
                }
            }
        }
        if (!memo_ok) {
            p = next;
            continue;
        }
        uint64_t pc_begin, pc_range;
        if (eh) {
            pc_begin = cfi_encoded(&h, cie.fde_enc, bias, 0);
            pc_range = cfi_encoded(&h, cie.fde_enc & 0x0f, 0, 0);
        } else {
            pc_begin = cfi_fixed(&h, 8);
            pc_range = cfi_fixed(&h, 8);
        }
        if (memo_z) {
            uint64_t alen = cfi_uleb(&h);
            if (!h.bad && alen <= (uint64_t)(h.end - h.p)) h.p += alen;
            else h.bad = 1;
        }
        /* pc_begin 0: an FDE of discarded code (linkers keep some for removed sections) */
        if (h.bad || pc_range == 0 || pc_begin == 0 || pc_begin + pc_range < pc_begin) {
            p = next;
            continue;
        }
        uint64_t pc_end = pc_begin + pc_range;
        if (vec_grow((void **)&b->functions, &b->cap_functions, b->n_functions * 2 + 2,
                     sizeof(uint64_t))) {
            b->functions[b->n_functions * 2] = pc_begin;
            b->functions[b->n_functions * 2 + 1] = pc_end;
            b->n_functions++;
        } else {
            b->oom = true;
        }
        cfi_state s = cie_state;
        uint64_t loc = pc_begin;
        if (!run_fde(b, &cie, h.p, next, &s, &cie_state, &loc, pc_end, bias))
            s.cfa = CFI_CFA_BAD;  /* malformed program: the rest of this function is not walkable */
        if (loc < pc_end) emit_row(b, loc, &s, cie.signal);
        emit_none(b, pc_end);
        p = next;
    }
}

/* Sorts rows, drops duplicates (a real rule beats an end marker at the same address) and
 * merges consecutive rows with the same rule. */
static void finish_rows(rs_builder *b) {
    qsort(b->rows, b->n, sizeof(rs_row), cmp_row);
    size_t w = 0;
    for (size_t r = 0; r < b->n; r++) {
        rs_row row = b->rows[r];
        if (w > 0 && b->rows[w - 1].pc == row.pc) continue;
        if (w > 0) {
            rs_row prev = b->rows[w - 1];
            prev.pc = row.pc;
            if (memcmp(&prev, &row, sizeof row) == 0) continue;
        }
        b->rows[w++] = row;
    }
    b->n = w;
    qsort(b->functions, b->n_functions, 2 * sizeof(uint64_t), cmp_range);
}

/* ------------------------------------------------------------------ ELF */

typedef struct {
    const uint8_t *eh_frame, *debug_frame;
    uint64_t eh_frame_size, eh_frame_vaddr, debug_frame_size;
    uint8_t build_id[64];
    size_t build_id_len;
} rs_elf_sections;

static bool elf_ok(const uint8_t *img, size_t len) {
    if (len < sizeof(Elf64_Ehdr)) return false;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    return memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
           eh->e_ident[EI_DATA] == ELFDATA2LSB && eh->e_machine == EM_X86_64;
}

static void elf_build_id(const uint8_t *note, uint64_t size, rs_elf_sections *out) {
    cfi_cursor c = {note, note + size, 0};
    while (!c.bad && c.end - c.p >= 12) {
        uint32_t namesz = (uint32_t)cfi_fixed(&c, 4), descsz = (uint32_t)cfi_fixed(&c, 4);
        uint32_t type = (uint32_t)cfi_fixed(&c, 4);
        uint64_t nlen = (namesz + 3u) & ~3u, dlen = (descsz + 3u) & ~3u;
        if ((uint64_t)(c.end - c.p) < nlen + dlen) return;
        if (type == NT_GNU_BUILD_ID && namesz == 4 && memcmp(c.p, "GNU", 4) == 0 &&
            descsz <= sizeof out->build_id) {
            memcpy(out->build_id, c.p + nlen, descsz);
            out->build_id_len = descsz;
            return;
        }
        c.p += nlen + dlen;
    }
}

/* Finds the sections that matter.  Section headers are used when present; otherwise
 * PT_GNU_EH_FRAME leads to .eh_frame through .eh_frame_hdr's eh_frame_ptr. */
static void elf_sections(const uint8_t *img, size_t len, rs_elf_sections *out) {
    memset(out, 0, sizeof *out);
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    if (eh->e_shoff && eh->e_shentsize == sizeof(Elf64_Shdr) && eh->e_shnum > 0 &&
        eh->e_shoff <= len && (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) <= len - eh->e_shoff &&
        eh->e_shstrndx < eh->e_shnum) {
        const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
        const Elf64_Shdr *strs = &sh[eh->e_shstrndx];
        if (strs->sh_offset <= len && strs->sh_size <= len - strs->sh_offset) {
            const char *names = (const char *)img + strs->sh_offset;
            for (unsigned i = 0; i < eh->e_shnum; i++) {
                const Elf64_Shdr *s = &sh[i];
                if (s->sh_type == SHT_NOBITS || s->sh_name >= strs->sh_size) continue;
                if (s->sh_offset > len || s->sh_size > len - s->sh_offset) continue;
                const char *name = names + s->sh_name;
                size_t room = strs->sh_size - s->sh_name;
                if (strnlen(name, room) == room) continue;
                const uint8_t *data = img + s->sh_offset;
                if (strcmp(name, ".eh_frame") == 0) {
                    out->eh_frame = data;
                    out->eh_frame_size = s->sh_size;
                    out->eh_frame_vaddr = s->sh_addr;
                } else if (strcmp(name, ".debug_frame") == 0) {
                    out->debug_frame = data;
                    out->debug_frame_size = s->sh_size;
                } else if (s->sh_type == SHT_NOTE && out->build_id_len == 0) {
                    elf_build_id(data, s->sh_size, out);
                }
            }
        }
    }
    if (out->eh_frame != NULL) return;
    if (eh->e_phoff == 0 || eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phoff > len ||
        (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr) > len - eh->e_phoff)
        return;
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(img + eh->e_phoff);
    for (unsigned i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_GNU_EH_FRAME || ph[i].p_offset > len ||
            ph[i].p_filesz > len - ph[i].p_offset || ph[i].p_filesz < 8)
            continue;
        const uint8_t *hdr = img + ph[i].p_offset;
        if (hdr[0] != 1) continue;
        cfi_cursor c = {hdr + 4, hdr + ph[i].p_filesz, 0};
        /* pcrel: the field's link-time address is p_vaddr + its distance from hdr */
        uint64_t eh_vaddr = cfi_encoded(&c, hdr[1], ph[i].p_vaddr - (uint64_t)(uintptr_t)hdr,
                                        ph[i].p_vaddr);
        if (c.bad) continue;
        /* link-time address -> file offset through the PT_LOAD that holds it */
        for (unsigned j = 0; j < eh->e_phnum; j++) {
            const Elf64_Phdr *l = &ph[j];
            if (l->p_type != PT_LOAD || eh_vaddr < l->p_vaddr || eh_vaddr >= l->p_vaddr + l->p_filesz)
                continue;
            uint64_t off = eh_vaddr - l->p_vaddr + l->p_offset;
            uint64_t seg_end = l->p_offset + l->p_filesz;
            if (off >= len || seg_end > len) break;
            out->eh_frame = img + off;
            out->eh_frame_size = seg_end - off;  /* the terminator ends the walk earlier */
            out->eh_frame_vaddr = eh_vaddr;
            break;
        }
    }
}

typedef struct {
    const uint8_t *img;
    size_t len;
} rs_image;

static bool pread_full(int fd, uint8_t *dst, uint64_t len, uint64_t off) {
    while (len > 0) {
        ssize_t got = pread(fd, dst, len > (1u << 30) ? (1u << 30) : (size_t)len, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        dst += got;
        len -= (uint64_t)got;
        off += (uint64_t)got;
    }
    return true;
}

/* Reads what the CFI parser looks at into a file-sized image: headers, section names,
 * notes, .eh_frame, .debug_frame; the rest stays untouched zero pages of a calloc'd (so
 * lazily backed) buffer.  pread, not mmap: a file truncated under us (an in-place upgrade)
 * must give a read error, not SIGBUS in the profiler.  Without section headers the whole
 * file is read (PT_GNU_EH_FRAME then leads to .eh_frame). */
static bool read_file(int fd, rs_image *im) {
    struct stat st;
    im->img = NULL;
    if (fstat(fd, &st) < 0) return false;
    if (st.st_size < (off_t)sizeof(Elf64_Ehdr)) {
        im->img = calloc(1, 1);  /* too small for ELF: a module without CFI, not an error */
        im->len = 0;
        return im->img != NULL;
    }
    uint64_t len = (uint64_t)st.st_size;
    uint8_t *img = calloc(1, (size_t)len);
    if (img == NULL) return false;
    im->img = img;
    im->len = (size_t)len;
    if (!pread_full(fd, img, sizeof(Elf64_Ehdr), 0)) return false;
    if (!elf_ok(img, len)) return true;  /* parsed as "no CFI" */
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    uint64_t ph_len = (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr);
    if (eh->e_phoff < len && ph_len <= len - eh->e_phoff)
        (void)pread_full(fd, img + eh->e_phoff, ph_len, eh->e_phoff);
    uint64_t sh_len = (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr);
    if (eh->e_shoff == 0 || eh->e_shnum == 0 || eh->e_shoff >= len || sh_len > len - eh->e_shoff ||
        eh->e_shstrndx >= eh->e_shnum)
        return pread_full(fd, img, len, 0);
    if (!pread_full(fd, img + eh->e_shoff, sh_len, eh->e_shoff)) return false;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    const Elf64_Shdr *strs = &sh[eh->e_shstrndx];
    if (strs->sh_offset >= len || strs->sh_size > len - strs->sh_offset ||
        !pread_full(fd, img + strs->sh_offset, strs->sh_size, strs->sh_offset))
        return true;
    const char *names = (const char *)img + strs->sh_offset;
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        const Elf64_Shdr *sec = &sh[i];
        if (sec->sh_type == SHT_NOBITS || sec->sh_offset >= len || sec->sh_size > len - sec->sh_offset ||
            sec->sh_name >= strs->sh_size)
            continue;
        const char *name = names + sec->sh_name;
        size_t room = strs->sh_size - sec->sh_name;
        if (strnlen(name, room) == room) continue;
        if (sec->sh_type == SHT_NOTE || strcmp(name, ".eh_frame") == 0 ||
            strcmp(name, ".debug_frame") == 0)
            if (!pread_full(fd, img + sec->sh_offset, sec->sh_size, sec->sh_offset)) return false;
    }
    return true;
}

static void free_image(rs_image *im) {
    free((void *)im->img);
    im->img = NULL;
}

/* Builds a module from an ELF image (a mapped file or the vDSO copied from the target). */
static rs_module *module_build(const uint8_t *img, size_t len) {
    double t0 = now_ms();
    rs_module *m = calloc(1, sizeof *m);
    if (m == NULL) return NULL;
    if (!elf_ok(img, len)) return m;  /* not x86_64 ELF: a module without CFI */
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    uint64_t base = UINT64_MAX;
    if (eh->e_phoff && eh->e_phentsize == sizeof(Elf64_Phdr) && eh->e_phoff <= len &&
        (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr) <= len - eh->e_phoff) {
        const Elf64_Phdr *ph = (const Elf64_Phdr *)(img + eh->e_phoff);
        m->segments = calloc(eh->e_phnum ? eh->e_phnum : 1, sizeof(rs_segment));
        if (m->segments == NULL) return m;
        for (unsigned i = 0; i < eh->e_phnum; i++) {
            if (ph[i].p_type != PT_LOAD) continue;
            rs_segment *s = &m->segments[m->n_segments++];
            s->offset = ph[i].p_offset;
            s->vaddr = ph[i].p_vaddr;
            s->filesz = ph[i].p_filesz;
            if (ph[i].p_vaddr < base) base = ph[i].p_vaddr;
        }
    }
    if (m->n_segments == 0) return m;
    rs_builder b;
    memset(&b, 0, sizeof b);
    b.base = m->base = base;
    rs_elf_sections secs;
    elf_sections(img, len, &secs);
    rs_image debug = {NULL, 0};
    if (secs.eh_frame != NULL && secs.eh_frame_size > 4) {
        parse_frames(&b, secs.eh_frame, secs.eh_frame_size, secs.eh_frame_vaddr, true);
    } else if (secs.debug_frame != NULL) {
        parse_frames(&b, secs.debug_frame, secs.debug_frame_size, 0, false);
    } else if (secs.build_id_len >= 2) {
        /* Separate debug file: /usr/lib/debug/.build-id/ab/cdef....debug */
        char path[256];
        int k = snprintf(path, sizeof path, "/usr/lib/debug/.build-id/%02x/", secs.build_id[0]);
        for (size_t i = 1; i < secs.build_id_len && k < (int)sizeof path - 8; i++)
            k += snprintf(path + k, sizeof path - (size_t)k, "%02x", secs.build_id[i]);
        snprintf(path + k, sizeof path - (size_t)k, ".debug");
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            if (read_file(fd, &debug) && elf_ok(debug.img, debug.len)) {
                rs_elf_sections dsecs;
                elf_sections(debug.img, debug.len, &dsecs);
                if (dsecs.debug_frame != NULL)
                    parse_frames(&b, dsecs.debug_frame, dsecs.debug_frame_size, 0, false);
                else if (dsecs.eh_frame != NULL)
                    parse_frames(&b, dsecs.eh_frame, dsecs.eh_frame_size, dsecs.eh_frame_vaddr, true);
            }
            close(fd);
        }
    }
    finish_rows(&b);
    free_image(&debug);
    if (b.oom) {
        free(b.rows);
        free(b.functions);
        return m;
    }
    m->rows = b.rows;
    m->n_rows = b.n;
    m->functions = b.functions;
    m->n_functions = b.n_functions;
    m->has_cfi = b.n > 0;
    m->build_ms = now_ms() - t0;
    return m;
}

static void module_free(rs_module *m) {
    if (m == NULL) return;
    free(m->rows);
    free(m->functions);
    free(m->segments);
    free(m);
}

/* The last row at or before pc (link-time address), or NULL. */
static const rs_row *module_lookup(const rs_module *m, uint64_t pc) {
    if (!m->has_cfi || pc < m->base || pc - m->base > UINT32_MAX) return NULL;
    uint32_t rel = (uint32_t)(pc - m->base);
    size_t lo = 0, hi = m->n_rows;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->rows[mid].pc <= rel) lo = mid + 1;
        else hi = mid;
    }
    return lo == 0 ? NULL : &m->rows[lo - 1];
}

/* -------------------------------------------------- process-wide cache */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static rs_module *cache_head;

/* The module for an open file, parsed on first use. */
static rs_module *module_for_fd(int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0) return NULL;
    int64_t mtime = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    pthread_mutex_lock(&cache_lock);
    rs_module *m;
    for (m = cache_head; m != NULL; m = m->next)
        if (m->dev == st.st_dev && m->ino == st.st_ino && m->size == st.st_size && m->mtime_ns == mtime)
            break;
    if (m == NULL) {
        /* Parsed under the lock: two samplers wanting the same new module wait for one
         * parse instead of doing it twice. */
        rs_image im = {NULL, 0};
        if (read_file(fd, &im)) m = module_build(im.img, im.len);
        free_image(&im);
        if (m != NULL) {
            m->dev = st.st_dev;
            m->ino = st.st_ino;
            m->size = st.st_size;
            m->mtime_ns = mtime;
            m->next = cache_head;
            cache_head = m;
        }
    }
    pthread_mutex_unlock(&cache_lock);
    return m;
}

bool rs_cfi_functions(const char *path, const uint64_t **ranges, size_t *n, size_t *rows,
                      double *build_ms) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    rs_module *m = module_for_fd(fd);
    close(fd);
    if (m == NULL) return false;
    *ranges = m->functions;
    *n = m->n_functions;
    *rows = m->n_rows;
    *build_ms = m->build_ms;
    return true;
}

/* ---------------------------------------------------------- address space */

typedef struct {
    uint64_t start, end, pgoff;
    char *path;
    const rs_module *mod;   /* NULL: no CFI known for this mapping */
    int64_t delta;          /* address + delta = link-time address in mod */
    bool loaded;            /* loading was attempted */
} rs_mapping;

struct rs_space {
    int32_t pid;
    rs_mapping *maps;
    size_t n, cap;
    rs_module *vdso;        /* owned: the vDSO image is per address space */
    uint64_t vdso_start, vdso_end;
    double last_reread_ms;
    rs_unwind_stats stats;
};

rs_space *rs_space_new(int32_t pid) {
    rs_space *s = calloc(1, sizeof *s);
    if (s != NULL) s->pid = pid;
    return s;
}

void rs_space_clear(rs_space *s) {
    for (size_t i = 0; i < s->n; i++) free(s->maps[i].path);
    s->n = 0;
    module_free(s->vdso);
    s->vdso = NULL;
}

void rs_space_free(rs_space *s) {
    if (s == NULL) return;
    rs_space_clear(s);
    free(s->maps);
    free(s);
}

const rs_unwind_stats *rs_space_stats(const rs_space *s) { return &s->stats; }

rs_space *rs_space_clone(const rs_space *src, int32_t pid) {
    rs_space *s = rs_space_new(pid);
    if (s == NULL) return NULL;
    for (size_t i = 0; i < src->n; i++) {
        const rs_mapping *m = &src->maps[i];
        rs_space_add(s, m->start, m->end, m->pgoff, m->path);  /* CFI attached again lazily */
    }
    return s;
}

void rs_space_add(rs_space *s, uint64_t start, uint64_t end, uint64_t pgoff, const char *path) {
    if (end <= start) return;
    /* drop what the new mapping overlaps (munmap/mprotect leave no record: a later mapping
     * at the same place is the only sign the old one is gone) */
    for (size_t r = 0; r < s->n; r++) {
        const rs_mapping *m = &s->maps[r];
        if (m->start == start && m->end == end && m->pgoff == pgoff && strcmp(m->path, path) == 0)
            return;  /* the same mapping again (a re-read of /proc/PID/maps): keep its CFI */
    }
    size_t w = 0;
    for (size_t r = 0; r < s->n; r++) {
        rs_mapping *m = &s->maps[r];
        if (m->end <= start || m->start >= end) s->maps[w++] = *m;
        else free(m->path);
    }
    s->n = w;
    if (!vec_grow((void **)&s->maps, &s->cap, s->n + 1, sizeof(rs_mapping))) return;
    char *copy = strdup(path);
    if (copy == NULL) return;
    size_t i = s->n;
    while (i > 0 && s->maps[i - 1].start > start) {
        s->maps[i] = s->maps[i - 1];
        i--;
    }
    rs_mapping *m = &s->maps[i];
    memset(m, 0, sizeof *m);
    m->start = start;
    m->end = end;
    m->pgoff = pgoff;
    m->path = copy;
    s->n++;
}

bool rs_space_read_proc_maps(rs_space *s) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)s->pid);
    FILE *f = fopen(path, "re");
    if (f == NULL) return false;
    char line[4352];
    while (fgets(line, sizeof line, f) != NULL) {
        uint64_t start, end, off;
        char perms[8];
        int name_at = 0;
        if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %*s %*s %n", &start, &end, perms,
                   &off, &name_at) < 4)
            continue;
        if (strchr(perms, 'x') == NULL) continue;
        char *name = line + name_at;
        name[strcspn(name, "\n")] = '\0';
        if (strcmp(name, "[vsyscall]") == 0) continue;
        rs_space_add(s, start, end, off, name[0] ? name : "[anon]");
    }
    fclose(f);
    return true;
}

static rs_mapping *space_find(rs_space *s, uint64_t addr) {
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->maps[mid].start <= addr) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return NULL;
    rs_mapping *m = &s->maps[lo - 1];
    return addr < m->end ? m : NULL;
}

static const rs_module *load_vdso(rs_space *s, rs_mapping *m) {
    if (s->vdso != NULL && s->vdso_start == m->start && s->vdso_end == m->end) return s->vdso;
    size_t len = (size_t)(m->end - m->start);
    if (len > (16u << 20)) return NULL;
    uint8_t *img = malloc(len);
    if (img == NULL) return NULL;
    struct iovec local = {img, len}, remote = {(void *)(uintptr_t)m->start, len};
    ssize_t got = process_vm_readv(s->pid, &local, 1, &remote, 1, 0);
    if (got != (ssize_t)len) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/mem", (int)s->pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        got = fd >= 0 ? pread(fd, img, len, (off_t)m->start) : -1;
        if (fd >= 0) close(fd);
    }
    rs_module *mod = got == (ssize_t)len ? module_build(img, len) : NULL;
    free(img);
    if (mod == NULL) return NULL;
    module_free(s->vdso);
    s->vdso = mod;
    s->vdso_start = m->start;
    s->vdso_end = m->end;
    return mod;
}

static void load_mapping(rs_space *s, rs_mapping *m) {
    m->loaded = true;
    const rs_module *mod = NULL;
    if (strcmp(m->path, "[vdso]") == 0) {
        mod = load_vdso(s, m);
    } else if (m->path[0] == '/') {
        /* map_files names the very file mapped (also when the path was replaced or is in
         * another mount namespace); it needs privileges, so fall back to the path. */
        char path[4200];
        snprintf(path, sizeof path, "/proc/%d/map_files/%" PRIx64 "-%" PRIx64, (int)s->pid,
                 m->start, m->end);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            snprintf(path, sizeof path, "/proc/%d/root%s", (int)s->pid, m->path);
            fd = open(path, O_RDONLY | O_CLOEXEC);
        }
        if (fd < 0) fd = open(m->path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            mod = module_for_fd(fd);
            close(fd);
        }
    }
    if (mod == NULL || !mod->has_cfi) return;
    /* The PT_LOAD that holds the mapping's first byte gives address -> link-time address
     * (the mapping starts at a page boundary, the segment maybe within that page).  Two
     * segments can share that page: lld packs the read-only segment and .text into one
     * file page (R at offset 0..0x1677c, R+X from 0x16780 at vaddr 0x17780), and the
     * first one would shift every pc of the R+X mapping by a page (Rust binaries walked
     * no further than their leaf).  The mapping starts where its own segment's page
     * starts, so the segment whose page start is highest wins. */
    const rs_segment *best = NULL;
    for (size_t i = 0; i < mod->n_segments; i++) {
        const rs_segment *seg = &mod->segments[i];
        uint64_t page = seg->offset & ~(uint64_t)0xfff;
        if (page <= m->pgoff && m->pgoff < seg->offset + seg->filesz &&
            (best == NULL || page > (best->offset & ~(uint64_t)0xfff)))
            best = seg;
    }
    if (best != NULL) {
        m->delta = (int64_t)(best->vaddr - best->offset) + (int64_t)m->pgoff - (int64_t)m->start;
        m->mod = mod;
        s->stats.modules_loaded++;
    }
}

/* Finds the mapping of addr; on a miss re-reads /proc/PID/maps (at most every 100 ms): the
 * MMAP2 record of a fresh dlopen may sit in another thread's ring not drained yet. */
static rs_mapping *space_find_fresh(rs_space *s, uint64_t addr) {
    rs_mapping *m = space_find(s, addr);
    if (m != NULL) return m;
    double t = now_ms();
    if (t - s->last_reread_ms < 100.0) return NULL;
    s->last_reread_ms = t;
    rs_space_read_proc_maps(s);
    return space_find(s, addr);
}

/* ---------------------------------------------------------------- unwind */

static inline bool stack_read(const uint8_t *stack, uint64_t lo, uint64_t len, uint64_t addr,
                              uint64_t *out) {
    if (addr < lo || addr - lo > len || len - (addr - lo) < 8) return false;
    memcpy(out, stack + (addr - lo), 8);
    return true;
}

uint32_t rs_unwind(rs_space *s, uint64_t ip, uint64_t sp, uint64_t bp, const uint8_t *stack,
                   uint64_t stack_len, uint64_t *out, uint32_t max, bool *truncated) {
    const uint64_t lo = sp;
    uint32_t n = 0;
    bool exact = true;      /* ip is where execution is, not a return address */
    bool bp_known = true;
    *truncated = false;
    if (max < 2) return 0;
    for (;;) {
        if (n + 1 >= max) goto truncate;  /* keep room for the [truncated] root */
        /* A pc interrupted by a signal is reported as pc + 1: the collector resolves every
         * caller at address - 1, and that must land on the interrupted instruction. */
        out[n] = exact && n > 0 ? ip + 1 : ip;
        n++;
        uint64_t pc = exact ? ip : ip - 1;
        rs_mapping *m = space_find_fresh(s, pc);
        if (m == NULL) goto truncate;
        if (!m->loaded) load_mapping(s, m);
        const rs_row *row = m->mod ? module_lookup(m->mod, (uint64_t)((int64_t)pc + m->delta)) : NULL;
        uint64_t cfa, nip, nbp = bp;
        bool nbp_known = bp_known, signal = false;
        if (row == NULL || row->cfa == CFA_NONE) {
            /* No CFI describes this code (JIT, assembly without CFI): frame pointers are the
             * only evidence left.  Justified only if rbp points up the stack.  rbp = 0
             * is the ABI's mark of the outermost frame (_start clears it). */
            if (bp_known && bp == 0) return n;
            if (!bp_known || bp < sp || (bp & 7) != 0) goto truncate;
            if (!stack_read(stack, lo, stack_len, bp, &nbp) ||
                !stack_read(stack, lo, stack_len, bp + 8, &nip))
                goto truncate;
            cfa = bp + 16;
            nbp_known = true;
            s->stats.fp_frames++;
        } else {
            switch (row->cfa) {
            case CFA_END:
                return n;  /* the outermost frame: a complete stack */
            case CFA_RSP: cfa = sp + (uint64_t)(int64_t)row->cfa_off; break;
            case CFA_RBP:
                if (!bp_known) goto truncate;
                cfa = bp + (uint64_t)(int64_t)row->cfa_off;
                break;
            case CFA_PLT: cfa = sp + 8 + ((ip & 15) >= row->plt_thr ? 8 : 0); break;
            case CFA_DEREF:
                if (!stack_read(stack, lo, stack_len, sp + (uint64_t)(int64_t)row->cfa_off, &cfa))
                    goto truncate;
                break;
            default:
                goto truncate;
            }
            uint64_t ra_at = (row->ra == REG_RSP ? sp : cfa) + (uint64_t)(int64_t)row->ra_off;
            if (!stack_read(stack, lo, stack_len, ra_at, &nip)) goto truncate;
            if (row->bp == REG_CFA || row->bp == REG_RSP) {
                uint64_t bp_at = (row->bp == REG_RSP ? sp : cfa) + (uint64_t)(int64_t)row->bp_off;
                if (row->bp == REG_CFA && bp_at < sp) {
                    /* In an epilogue GCC leaves the save rule in place after `pop %rbp`:
                     * a slot below rsp is no longer part of the frame, and the register
                     * already holds the caller's value. */
                } else if (!stack_read(stack, lo, stack_len, bp_at, &nbp)) {
                    goto truncate;
                } else {
                    nbp_known = true;
                }
            } else if (row->bp == REG_UNDEF) {
                nbp_known = false;
            }
            signal = row->signal;
            /* The return address into a signal trampoline was pushed by the kernel, not by a
             * call: glibc starts the FDE one byte early for unwinders looking up ra - 1, but
             * the name belongs to ra itself, so it is reported + 1 like an interrupted pc. */
            if (signal && !exact) out[n - 1] = ip + 1;
            s->stats.frames++;
        }
        if (nip == 0) return n;  /* a zero return address marks the outermost frame */
        /* The caller's frame lies above ours; only a signal frame may switch stacks. */
        if (!signal && cfa <= sp) goto truncate;
        if (space_find_fresh(s, signal ? nip : nip - 1) == NULL) goto truncate;
        ip = nip;
        sp = cfa;
        bp = nbp;
        bp_known = nbp_known;
        exact = signal;
    }
truncate:
    out[n++] = RS_TRUNCATED_ADDRESS;
    *truncated = true;
    s->stats.truncated++;
    return n;
}
