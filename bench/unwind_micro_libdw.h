/* The same samples unwound by elfutils libdw (included by unwind_micro.c with -DWITH_LIBDW),
 * driven the way perf's util/unwind-libdw.c drives it, but with one Dwfl session for all
 * samples instead of one per sample (perf 6.1 builds a Dwfl for every sample; that is not
 * libdw's cost, so it is left out): dwfl_linux_proc_report() reports the target's modules
 * (libdw opens the ELF files and parses their CFI itself, cached per module),
 * dwfl_attach_state() with our thread callbacks, and per sample dwfl_getthread_frames(),
 * whose memory_read serves the stack copy and whose initial registers are the sample's
 * rip, rsp and rbp (the others undefined, as in ours and libunwind's walk). */
#include <elfutils/libdwfl.h>

static const sample *dw_cur;
static char *dw_debuginfo_path;

static pid_t dw_next_thread(Dwfl *dwfl, void *dwfl_arg, void **thread_argp) {
    (void)dwfl;
    if (*thread_argp != NULL) return 0;
    *thread_argp = dwfl_arg;
    return (pid_t)(intptr_t)dwfl_arg;
}

static bool dw_get_thread(Dwfl *dwfl, pid_t tid, void *dwfl_arg, void **thread_argp) {
    (void)dwfl;
    *thread_argp = dwfl_arg;
    return tid == (pid_t)(intptr_t)dwfl_arg;
}

static bool dw_memory_read(Dwfl *dwfl, Dwarf_Addr addr, Dwarf_Word *result, void *dwfl_arg) {
    (void)dwfl;
    (void)dwfl_arg;
    const sample *s = dw_cur;
    if (addr < s->sp || addr + 8 > s->sp + s->len) return false;
    memcpy(result, s->stack + (addr - s->sp), 8);
    return true;
}

static bool dw_set_initial_registers(Dwfl_Thread *thread, void *thread_arg) {
    (void)thread_arg;
    /* DWARF numbering on x86_64: 6 rbp, 7 rsp; the pc apart */
    Dwarf_Word regs[2] = {dw_cur->bp, dw_cur->sp};
    return dwfl_thread_state_registers(thread, 6, 2, regs) &&
           (dwfl_thread_state_register_pc(thread, dw_cur->ip), true);
}

static const Dwfl_Thread_Callbacks dw_thread_callbacks = {
    .next_thread = dw_next_thread,
    .get_thread = dw_get_thread,
    .memory_read = dw_memory_read,
    .set_initial_registers = dw_set_initial_registers,
};

static const Dwfl_Callbacks dw_callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .debuginfo_path = &dw_debuginfo_path,
};

typedef struct {
    size_t frames;
} dw_walk;

static int dw_frame(Dwfl_Frame *state, void *arg) {
    dw_walk *w = arg;
    Dwarf_Addr pc;
    if (!dwfl_frame_pc(state, &pc, NULL)) return DWARF_CB_ABORT;
    return ++w->frames >= 128 ? DWARF_CB_ABORT : DWARF_CB_OK;
}

/* frames walked; *complete when the walk ended at the outermost frame (return 0) */
static size_t dw_unwind_one(Dwfl *dwfl, pid_t pid, const sample *s, int *complete) {
    dw_walk w = {0};
    dw_cur = s;
    int r = dwfl_getthread_frames(dwfl, pid, dw_frame, &w);
    *complete = r == 0;
    return w.frames;
}

static void libdw_bench(int pid, const sample *samples, size_t n, int repeat) {
    double t0 = now_ns();
    Dwfl *dwfl = dwfl_begin(&dw_callbacks);
    if (dwfl == NULL || dwfl_linux_proc_report(dwfl, pid) != 0 ||
        dwfl_report_end(dwfl, NULL, NULL) != 0 ||
        !dwfl_attach_state(dwfl, NULL, pid, &dw_thread_callbacks, (void *)(intptr_t)pid)) {
        fprintf(stderr, "libdw: %s\n", dwfl_errmsg(-1));
        return;
    }
    size_t frames = 0, complete = 0;
    int ok;
    for (size_t i = 0; i < n; i++) {
        frames += dw_unwind_one(dwfl, pid, &samples[i], &ok);
        complete += (size_t)ok;
    }
    double first = now_ns() - t0;
    t0 = now_ns();
    for (int r = 0; r < repeat; r++)
        for (size_t i = 0; i < n; i++) (void)dw_unwind_one(dwfl, pid, &samples[i], &ok);
    double t = (now_ns() - t0) / repeat;
    printf("libdw %zu %zu %.0f %.1f %.1f %.1f\n", n, frames, first, t / (double)n,
           t / (double)frames, 100.0 * (double)complete / (double)n);
    dwfl_end(dwfl);
}
