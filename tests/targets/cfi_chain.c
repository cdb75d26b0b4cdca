/* A known call chain main -> chain_a -> chain_b -> chain_leaf, built -O2
 * -fomit-frame-pointer by tests/system/test_cfi_stacks.py: only CFI can walk it.  Each function
 * keeps a frame of its own (a volatile local array) so a frame-pointer walk has nothing to
 * follow; chain_leaf also calls through libc's qsort with a slow comparator, so stacks go
 * through libc code and back into the program.  Usage: cfi_chain SECONDS [deep], SECONDS of CPU time so a busy machine only
 * stretches the run, not shrinks the sample count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static int slow_cmp(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    for (int i = 0; i < 200; i++) sink += (x ^ (unsigned long)i) * 2654435761u;
    return (x > y) - (x < y);
}

__attribute__((noinline)) static void chain_leaf(unsigned long seed) {
    volatile unsigned long pad[8];
    unsigned long items[64];
    for (int i = 0; i < 64; i++) {
        seed = seed * 6364136223846793005ul + 1442695040888963407ul;
        items[i] = seed >> 17;
        pad[i & 7] = items[i];
    }
    qsort(items, 64, sizeof items[0], slow_cmp);
    sink += pad[3] + items[5];
}

__attribute__((noinline)) static void chain_b(unsigned long seed) {
    volatile char buf[200];
    memset((char *)buf, (int)seed, sizeof buf);
    chain_leaf(seed + buf[7]);
    sink += buf[100];
}

__attribute__((noinline)) static void chain_a(unsigned long seed) {
    volatile char buf[500];
    memset((char *)buf, (int)seed, sizeof buf);
    chain_b(seed ^ buf[3]);
    sink += buf[400];
}

/* `deep` mode: a recursion far deeper than the stack copy, so the walk must stop at the
 * copy's end (a [truncated] root), never invent callers. */
__attribute__((noinline)) static unsigned long deep(int n, unsigned long seed) {
    volatile unsigned long pad[12];
    pad[n % 12] = seed;
    if (n == 0) {
        for (int i = 0; i < 20000; i++) sink += (seed ^ (unsigned long)i) * 2654435761u;
        return pad[0];
    }
    unsigned long r = deep(n - 1, seed * 3 + 1);
    return r + pad[(n + 1) % 12];
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    int deep_mode = argc > 2 && strcmp(argv[2], "deep") == 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    unsigned long seed = 1;
    do {
        if (deep_mode) sink += deep(3000, seed++);
        else
            for (int i = 0; i < 50; i++) chain_a(seed++);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
    printf("%lu\n", sink & 1);
    return 0;
}
