/* A 3:1 split through libc's qsort, built -O2 -fomit-frame-pointer by
 * tests/system/test_cfi_targets.py: heavy() sorts each round's array three times, light() once,
 * the same input with the same slow comparator, so their work is exactly 3:1 and every
 * comparison is called from libc code (qsort_r, msort_with_tmp), which has CFI but no
 * frame pointers. Rounds have random sizes: a fixed-length round aliases with cpu-clock's
 * fixed sampling period (see split.c). Usage: cfi_qsort SECONDS (of CPU time). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static int slow_cmp(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    for (int i = 0; i < 64; i++) sink += (x ^ (unsigned long)i) * 2654435761u;
    return (x > y) - (x < y);
}

__attribute__((noinline)) static void sort_copy(const unsigned long *input, size_t n) {
    unsigned long items[256];
    memcpy(items, input, n * sizeof items[0]);
    qsort(items, n, sizeof items[0], slow_cmp);
    sink += items[n / 2];
}

__attribute__((noinline)) void heavy(const unsigned long *input, size_t n) {
    for (int i = 0; i < 3; i++) sort_copy(input, n);
    sink++; /* no tail call: heavy stays on the stack of its last sort */
}

__attribute__((noinline)) void light(const unsigned long *input, size_t n) {
    sort_copy(input, n);
    sink++;
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    unsigned long input[256], state = 0x9e3779b97f4a7c15ul;
    double end = cpu_seconds() + seconds;
    do {
        for (int round = 0; round < 20; round++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            size_t n = 64 + state % 192;
            for (size_t i = 0; i < n; i++) input[i] = (state * (i + 1)) >> 11;
            heavy(input, n);
            light(input, n);
        }
    } while (cpu_seconds() < end);
    printf("%lu\n", sink & 1);
    return 0;
}
