/* The same samples unwound by libunwind's remote API (included by unwind_micro.c with
 * -DWITH_LIBUNWIND), the way perf's unwind-libunwind-local.c drives it: our accessors
 * serve the stack copy and, for everything else (.eh_frame_hdr, .eh_frame), a snapshot of
 * the target's readable file mappings taken once, so neither side pays a syscall per read.
 * find_proc_info locates each module's .eh_frame_hdr binary-search table and hands it to
 * dwarf_search_unwind_table; the address space caches globally (UNW_CACHE_GLOBAL). */
#include <elf.h>
#include <fcntl.h>
#include <libunwind.h>
#include <sys/uio.h>

extern int _Ux86_64_dwarf_search_unwind_table(unw_addr_space_t as, unw_word_t ip,
                                              unw_dyn_info_t *di, unw_proc_info_t *pi,
                                              int need_unwind_info, void *arg);

typedef struct {
    uint64_t start, end, pgoff;
    char path[512];
    uint8_t *copy;           /* readable mappings: their bytes */
    int exec;
    uint64_t hdr_addr;       /* exec mappings: .eh_frame_hdr in the target, 0 if none */
    uint64_t fde_count;
} lu_map;

static lu_map lu_maps[1024];
static size_t lu_n;
static const sample *lu_cur;

static lu_map *lu_find(uint64_t addr) {
    for (size_t i = 0; i < lu_n; i++)
        if (addr >= lu_maps[i].start && addr < lu_maps[i].end) return &lu_maps[i];
    return NULL;
}

static int lu_read(uint64_t addr, uint64_t *out) {
    const sample *s = lu_cur;
    if (s != NULL && addr >= s->sp && addr + 8 <= s->sp + s->len) {
        memcpy(out, s->stack + (addr - s->sp), 8);
        return 0;
    }
    lu_map *m = lu_find(addr);
    if (m == NULL || m->copy == NULL || addr + 8 > m->end) return -UNW_EINVAL;
    memcpy(out, m->copy + (addr - m->start), 8);
    return 0;
}

static void lu_locate_hdr(lu_map *m) {
    int fd = open(m->path, O_RDONLY);
    if (fd < 0) return;
    Elf64_Ehdr eh;
    Elf64_Phdr ph[64];
    if (pread(fd, &eh, sizeof eh, 0) != sizeof eh || eh.e_phnum > 64 ||
        pread(fd, ph, eh.e_phnum * sizeof(Elf64_Phdr), (off_t)eh.e_phoff) !=
            (ssize_t)(eh.e_phnum * sizeof(Elf64_Phdr))) {
        close(fd);
        return;
    }
    close(fd);
    uint64_t bias = 0, hdr_vaddr = 0;
    int found = 0;
    for (int i = 0; i < eh.e_phnum; i++) {
        if (ph[i].p_type == PT_LOAD && (ph[i].p_offset & ~0xfffULL) <= m->pgoff &&
            m->pgoff < ph[i].p_offset + ph[i].p_filesz) {
            bias = m->start - m->pgoff + ph[i].p_offset - ph[i].p_vaddr;
            found = 1;
        }
        if (ph[i].p_type == PT_GNU_EH_FRAME) hdr_vaddr = ph[i].p_vaddr;
    }
    if (!found || hdr_vaddr == 0) return;
    uint64_t hdr = bias + hdr_vaddr, word;
    if (lu_read(hdr, &word) != 0) return;
    const uint8_t *b = (const uint8_t *)&word;
    /* version 1, eh_frame_ptr pcrel|sdata4, fde_count udata4, table datarel|sdata4 */
    if (b[0] != 1 || b[1] != 0x1b || b[2] != 0x03 || b[3] != 0x3b) return;
    uint32_t count = (uint32_t)(word >> 32 & 0xffffffff);
    (void)count;
    uint64_t w2;
    if (lu_read(hdr + 8, &w2) != 0) return;
    m->hdr_addr = hdr;
    m->fde_count = (uint32_t)w2;
}

static int lu_find_proc_info(unw_addr_space_t as, unw_word_t ip, unw_proc_info_t *pi,
                             int need_unwind_info, void *arg) {
    lu_map *m = lu_find(ip);
    if (m == NULL || m->hdr_addr == 0) return -UNW_ENOINFO;
    unw_dyn_info_t di;
    memset(&di, 0, sizeof di);
    di.format = UNW_INFO_FORMAT_REMOTE_TABLE;
    di.start_ip = m->start;
    di.end_ip = m->end;
    di.u.rti.segbase = m->hdr_addr;
    di.u.rti.table_data = m->hdr_addr + 12;
    di.u.rti.table_len = m->fde_count * 8 / sizeof(unw_word_t);
    return _Ux86_64_dwarf_search_unwind_table(as, ip, &di, pi, need_unwind_info, arg);
}

static void lu_put_unwind_info(unw_addr_space_t as, unw_proc_info_t *pi, void *arg) {}

static int lu_get_dyn_info_list_addr(unw_addr_space_t as, unw_word_t *addr, void *arg) {
    return -UNW_ENOINFO;
}

static int lu_access_mem(unw_addr_space_t as, unw_word_t addr, unw_word_t *valp, int write,
                         void *arg) {
    if (write) return -UNW_EINVAL;
    uint64_t v;
    int r = lu_read(addr, &v);
    if (r == 0) *valp = v;
    return r;
}

static int lu_access_reg(unw_addr_space_t as, unw_regnum_t reg, unw_word_t *valp, int write,
                         void *arg) {
    if (write) return -UNW_EINVAL;
    switch (reg) {
    case UNW_X86_64_RIP: *valp = lu_cur->ip; return 0;
    case UNW_X86_64_RSP: *valp = lu_cur->sp; return 0;
    case UNW_X86_64_RBP: *valp = lu_cur->bp; return 0;
    default: *valp = 0; return 0;  /* not sampled: only ip/sp/bp drive the walk */
    }
}

static int lu_access_fpreg(unw_addr_space_t as, unw_regnum_t reg, unw_fpreg_t *val, int write,
                           void *arg) {
    return -UNW_EINVAL;
}

static int lu_resume(unw_addr_space_t as, unw_cursor_t *c, void *arg) { return -UNW_EINVAL; }

static int lu_get_proc_name(unw_addr_space_t as, unw_word_t addr, char *buf, size_t len,
                            unw_word_t *offp, void *arg) {
    return -UNW_EINVAL;
}

static unw_accessors_t lu_accessors = {
    .find_proc_info = lu_find_proc_info,
    .put_unwind_info = lu_put_unwind_info,
    .get_dyn_info_list_addr = lu_get_dyn_info_list_addr,
    .access_mem = lu_access_mem,
    .access_reg = lu_access_reg,
    .access_fpreg = lu_access_fpreg,
    .resume = lu_resume,
    .get_proc_name = lu_get_proc_name,
};

static void lu_snapshot(int pid) {
    char path[64], line[4352];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f) && lu_n < 1024) {
        unsigned long long s, e, off;
        char perms[8];
        int at = 0;
        if (sscanf(line, "%llx-%llx %7s %llx %*s %*s %n", &s, &e, perms, &off, &at) < 4) continue;
        char *name = line + at;
        name[strcspn(name, "\n")] = 0;
        if (perms[0] != 'r' || (name[0] != '/' && strcmp(name, "[vdso]") != 0)) continue;
        lu_map *m = &lu_maps[lu_n++];
        memset(m, 0, sizeof *m);
        m->start = s;
        m->end = e;
        m->pgoff = off;
        m->exec = perms[2] == 'x';
        snprintf(m->path, sizeof m->path, "%s", name);
        m->copy = malloc(e - s);
        struct iovec l = {m->copy, e - s}, r = {(void *)(uintptr_t)s, e - s};
        if (process_vm_readv(pid, &l, 1, &r, 1, 0) != (ssize_t)(e - s)) {
            free(m->copy);
            m->copy = NULL;
        }
    }
    if (f) fclose(f);
    for (size_t i = 0; i < lu_n; i++)
        if (lu_maps[i].exec && lu_maps[i].path[0] == '/') lu_locate_hdr(&lu_maps[i]);
}

static size_t lu_unwind_one(unw_addr_space_t as, const sample *s, int *complete) {
    unw_cursor_t c;
    lu_cur = s;
    *complete = 0;
    if (unw_init_remote(&c, as, NULL) < 0) return 0;
    size_t frames = 1;
    for (;;) {
        int r = unw_step(&c);
        if (r == 0) {
            *complete = 1;
            break;
        }
        if (r < 0 || frames >= 128) break;
        unw_word_t ip;
        unw_get_reg(&c, UNW_REG_IP, &ip);
        frames++;
    }
    return frames;
}

static void libunwind_bench(int pid, const sample *samples, size_t n, int repeat) {
    lu_snapshot(pid);
    unw_addr_space_t as = unw_create_addr_space(&lu_accessors, 0);
    unw_set_caching_policy(as, UNW_CACHE_GLOBAL);
    size_t frames = 0, complete = 0;
    int ok;
    double t0 = now_ns();
    for (size_t i = 0; i < n; i++) {
        frames += lu_unwind_one(as, &samples[i], &ok);
        complete += (size_t)ok;
    }
    double first = now_ns() - t0;
    t0 = now_ns();
    for (int r = 0; r < repeat; r++)
        for (size_t i = 0; i < n; i++) (void)lu_unwind_one(as, &samples[i], &ok);
    double t = (now_ns() - t0) / repeat;
    printf("libunwind %zu %zu %.0f %.1f %.1f %.1f\n", n, frames, first, t / (double)n,
           t / (double)frames, 100.0 * (double)complete / (double)n);
}
