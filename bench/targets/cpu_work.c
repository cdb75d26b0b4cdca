/* Fixed CPU work on THREADS threads; prints its own elapsed wall time, so the cost of
 * being profiled shows up as a ratio against the same binary run plainly. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t units = 200;

static __attribute__((noinline)) uint64_t leaf_work(uint64_t seed) {
    volatile uint64_t x[1] = {seed | 1};
    for (int i = 0; i < 100000; i++) x[0] = x[0] * 6364136223846793005ull + (uint64_t)i;
    return x[0];
}

static __attribute__((noinline)) uint64_t middle(uint64_t seed) { return leaf_work(seed) ^ 3; }

static void *worker(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    for (uint64_t i = 0; i < units * 10; i++) seed = middle(seed);
    return (void *)(uintptr_t)seed;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (argc > 2) units = strtoull(argv[2], NULL, 10);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pthread_t tids[64];
    for (int t = 0; t < threads && t < 64; t++) pthread_create(&tids[t], NULL, worker, (void *)(uintptr_t)(t + 1));
    for (int t = 0; t < threads && t < 64; t++) pthread_join(tids[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    fprintf(stderr, "elapsed_ms %.1f\n", (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
    /* its own CPU time too: on a busy machine the wall time also counts waiting for a CPU
     * that the profiler's process (or anyone else) holds; CPU time counts what sampling
     * costs the target itself (the sample interrupt and the stack copy run in its time) */
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    fprintf(stderr, "cpu_ms %.1f\n", b.tv_sec * 1e3 + b.tv_nsec / 1e6);
    return 0;
}
