/* alloc_storm: an allocation storm for bench/bench_heap.py.
 *
 * N malloc/free pairs (default 20 M) of pseudo-random sizes (fixed seed), with a few
 * thousand blocks live at any time: each step frees a random slot and refills it.
 * Prints the loop's own wall time ("loop_s=...") so the driver can compare the storm
 * itself, without process start-up.  With "--wait", reads one line from stdin before
 * starting (the driver attaches its reader first).
 *
 * Usage: alloc_storm [pairs] [--wait]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOTS 4096

static void *slots[SLOTS];
static uint64_t rng = 0x9E3779B97F4A7C15ULL;

static inline uint64_t next_rand(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1DULL;
}

/* Mostly small blocks, some medium, a few large: roughly what real programs do. */
static inline size_t pick_size(uint64_t r) {
    unsigned bucket = (unsigned)(r & 0xff);
    r >>= 8;
    if (bucket < 200) return 8 + (size_t)(r % 248);    /* 78%: 8..255 */
    if (bucket < 250) return 256 + (size_t)(r % 3840); /* 20%: 256..4095 */
    return 4096 + (size_t)(r % 61440);                 /*  2%: 4 KiB..64 KiB */
}

__attribute__((noinline)) static void *storm_alloc(size_t n) {
    char *p = malloc(n);
    if (p) p[0] = 1;
    return p;
}

__attribute__((noinline)) static void storm_step(void) {
    uint64_t r = next_rand();
    unsigned i = (unsigned)(r >> 52) % SLOTS;
    free(slots[i]);
    slots[i] = storm_alloc(pick_size(r));
}

__attribute__((noinline)) static void storm(long pairs) {
    for (long k = 0; k < pairs; k++) storm_step();
}

int main(int argc, char **argv) {
    long pairs = 20000000;
    int wait = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--wait") == 0)
            wait = 1;
        else
            pairs = atol(argv[i]);
    }
    if (wait) {
        char line[16];
        if (fgets(line, sizeof line, stdin) == NULL) return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    storm(pairs);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (unsigned i = 0; i < SLOTS; i++) free(slots[i]);
    printf("loop_s=%.6f\n", (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
