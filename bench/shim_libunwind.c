/* shim_libunwind.c: the heap shim's stack walk done by libunwind instead of shimcfi.c, for
 * bench/bench_heap.py only (never installed).  Same interface as native/shim/shimcfi.h;
 * the benchmark links heapshim.c with this file and -lunwind, as heaptrack does
 * (unw_backtrace with a per-thread cache).
 *
 * Build: gcc -O2 -fPIC -shared -fvisibility=hidden -fno-omit-frame-pointer -Inative
 *        native/shim/heapshim.c bench/shim_libunwind.c -lunwind -ldl -lpthread -lrt */
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <string.h>

#include "shim/shimcfi.h"

int shimcfi_init(void) {
    unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
    return 1;
}

void shimcfi_flush(void) { unw_flush_cache(unw_local_addr_space, 0, 0); }

void shimcfi_get_stats(shimcfi_stats *out) { memset(out, 0, sizeof *out); }

/* unw_backtrace starts in this function: the entries up to and including the wrapper's
 * return address (ips[n - 1]) are the shim's own frames and are dropped. */
void shimcfi_memo_reset(shimcfi_memo *memo) { (void)memo; }

/* Never called: this walk reports no memo hits. */
const uint64_t *shimcfi_memo_frames(const shimcfi_memo *memo, int way) {
    (void)way;
    return (const uint64_t *)memo->bytes;
}

unsigned shimcfi_walk(uint64_t *ips, unsigned n, unsigned max, uintptr_t sp, uintptr_t bp,
                      uintptr_t lo, uintptr_t hi, int *truncated, shimcfi_memo *memo,
                      shimcfi_scratch *scratch, int *way, int *hit) {
    (void)sp, (void)bp, (void)lo, (void)hi, (void)memo, (void)scratch;
    if (way != NULL) *way = -1, *hit = 0; /* no memo: every record carries its stack */
    void *buf[96];
    int got = unw_backtrace(buf, 96);
    int k = 0;
    while (k < got && (uint64_t)(uintptr_t)buf[k] != ips[n - 1]) k++;
    for (k++; k < got; k++) {
        if (n >= max) {
            *truncated = 1;
            break;
        }
        ips[n++] = (uint64_t)(uintptr_t)buf[k];
    }
    return n;
}
