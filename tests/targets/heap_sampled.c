/* heap_sampled: a known workload for checking the sampled-mode estimates.
 * CHURN allocations of 1..4096 bytes freed at once, and KEEP blocks of 512..2048 bytes
 * kept live; sizes from a fixed-seed PRNG.  The kept blocks start at 512 bytes because the
 * count estimate weighs a sampled block of n bytes by 1/(1 - exp(-n/S)): with 20000 blocks
 * of 1..2048 bytes its standard deviation was 3.9 %, so the test's 10 % was 2.6 sigma and
 * failed about 1 run in 25; from 512 bytes it is 1.9 % (10 % = 5 sigma).  Prints the exact totals:
 *   "done <alloc_bytes> <alloc_count> <live_bytes> <live_count>"
 * Usage: heap_sampled <dir>: "ready <pid>", waits for <dir>/go, runs, "done ...",
 * waits for <dir>/exit. */
#include <stdint.h>
#include "heap_common.h"

#define CHURN 1000000
#define KEEP 20000

static uint64_t rng = 88172645463325252ULL;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void *volatile kept[KEEP]; /* volatile: keeps GCC from dropping them */

__attribute__((noinline)) static void churn_site(size_t n) {
    heap_sink = malloc(n);
    free(heap_sink);
}

__attribute__((noinline)) static void *keep_site(size_t n) { return malloc(n); }

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *dir = argv[1];
    say("ready %d\n", (int)getpid());
    wait_for(dir, "go");
    unsigned long long alloc_bytes = 0, alloc_count = 0, live_bytes = 0;
    for (int i = 0; i < CHURN; i++) {
        size_t n = 1 + next_rand() % 4096;
        churn_site(n);
        alloc_bytes += n;
        alloc_count++;
        if (i % (CHURN / KEEP) == 0) {
            size_t k = 512 + next_rand() % 1537;
            kept[i / (CHURN / KEEP)] = keep_site(k);
            alloc_bytes += k;
            alloc_count++;
            live_bytes += k;
        }
    }
    say("done %llu %llu %llu %d\n", alloc_bytes, alloc_count, live_bytes, KEEP);
    wait_for(dir, "exit");
    return 0;
}
