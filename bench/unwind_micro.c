/* unwind_micro.c: the unwinder alone, per frame and per sample (bench/bench_unwind.py).
 *
 * Samples a running target with PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER for a while,
 * keeps the raw samples in memory, stops the target (SIGSTOP, so its mappings stay put),
 * then unwinds every sample REPEAT times with native/unwind.c and prints
 *   samples frames first_pass_ns ns_per_sample ns_per_frame reach_percent
 * first_pass_ns is the first walk over all samples (CFI tables built on the way, unless
 * another run in this process built them).  With -DWITH_LIBUNWIND the same samples are also
 * unwound by libunwind's remote API (our own memory accessors over the stack copy), side by
 * side, and with -DWITH_LIBDW by elfutils libdw (dwfl_getthread_frames over the stack copy).
 *
 *   cc -O2 -Inative bench/unwind_micro.c native/unwind.c -lpthread
 *      [-DWITH_LIBUNWIND -lunwind -lunwind-x86_64] [-DWITH_LIBDW -ldw -lelf]
 *   ./unwind_micro PID SECONDS STACK_BYTES REPEAT
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "rs_unwind.h"

typedef struct {
    uint64_t ip, sp, bp, len;
    uint8_t *stack;
} sample;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#ifdef WITH_LIBUNWIND
#include "unwind_micro_libunwind.h"
#endif
#ifdef WITH_LIBDW
#include "unwind_micro_libdw.h"
#endif

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s PID SECONDS STACK_BYTES REPEAT\n", argv[0]);
        return 2;
    }
    int pid = atoi(argv[1]);
    double seconds = atof(argv[2]);
    int stack_bytes = atoi(argv[3]), repeat = atoi(argv[4]);
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    attr.freq = 1;
    attr.sample_freq = 999;
    attr.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_REGS_USER |
                       PERF_SAMPLE_STACK_USER;
    attr.sample_regs_user = (1ULL << 6) | (1ULL << 7) | (1ULL << 8);
    attr.sample_stack_user = (uint32_t)stack_bytes;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    int fd = (int)syscall(SYS_perf_event_open, &attr, pid, -1, -1, 0);
    if (fd < 0) {
        perror("perf_event_open");
        return 1;
    }
    size_t pages = 1024, page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *base = mmap(NULL, (pages + 1) * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    struct perf_event_mmap_page *meta = (void *)base;
    uint8_t *data = base + page;
    uint64_t size = pages * page;
    sample *samples = NULL;
    size_t n = 0, cap = 0;
    uint8_t *rec = malloc(65536);
    double end = now_ns() + seconds * 1e9;
    while (now_ns() < end) {
        usleep(20000);
        uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE), tail = meta->data_tail;
        while (tail < head) {
            struct perf_event_header h;
            size_t off = tail & (size - 1);
            memcpy(&h, data + off, sizeof h);
            for (size_t i = 0; i < h.size; i++) rec[i] = data[(off + i) & (size - 1)];
            if (h.type == PERF_RECORD_SAMPLE && h.size > 80) {
                uint64_t abi, regs[3], len, dyn;
                memcpy(&abi, rec + 32, 8);
                memcpy(regs, rec + 40, 24);
                memcpy(&len, rec + 64, 8);
                memcpy(&dyn, rec + 72 + len, 8);
                if (abi != 0 && len > 0) {
                    if (n == cap) {
                        cap = cap ? cap * 2 : 1024;
                        samples = realloc(samples, cap * sizeof *samples);
                    }
                    sample *s = &samples[n++];
                    s->bp = regs[0];
                    s->sp = regs[1];
                    s->ip = regs[2];
                    s->len = dyn < len ? dyn : len;
                    s->stack = malloc(s->len ? s->len : 1);
                    memcpy(s->stack, rec + 72, s->len);
                }
            }
            tail += h.size;
        }
        __atomic_store_n(&meta->data_tail, tail, __ATOMIC_RELEASE);
    }
    close(fd);
    kill(pid, SIGSTOP);  /* mappings stay put while we unwind */

    rs_space *space = rs_space_new(pid);
    rs_space_read_proc_maps(space);
    uint64_t out[256];
    size_t frames = 0, complete = 0;
    bool truncated;
    double t0 = now_ns();
    for (size_t i = 0; i < n; i++) {
        frames += rs_unwind(space, samples[i].ip, samples[i].sp, samples[i].bp, samples[i].stack,
                            samples[i].len, out, 128, &truncated);
        complete += !truncated;
    }
    double first = now_ns() - t0;
    t0 = now_ns();
    for (int r = 0; r < repeat; r++)
        for (size_t i = 0; i < n; i++)
            (void)rs_unwind(space, samples[i].ip, samples[i].sp, samples[i].bp, samples[i].stack,
                            samples[i].len, out, 128, &truncated);
    double t = (now_ns() - t0) / repeat;
    printf("rsprof %zu %zu %.0f %.1f %.1f %.1f\n", n, frames, first, t / (double)n,
           t / (double)frames, 100.0 * (double)complete / (double)n);
#ifdef WITH_LIBUNWIND
    libunwind_bench(pid, samples, n, repeat);
#endif
#ifdef WITH_LIBDW
    libdw_bench(pid, samples, n, repeat);
#endif
    kill(pid, SIGCONT);
    rs_space_free(space);
    return 0;
}
