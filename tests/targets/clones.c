/* GCC clones of one function: work.constprop.N (IPA constant propagation) and work.cold
 * (hot/cold splitting) share work's source lines.  Runs ~argv[1] seconds of CPU. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) static long work(long n, int k) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += (i * k) ^ (s >> 3);
        if (__builtin_expect(s == 42, 0)) {
            fprintf(stderr, "rare %ld\n", s);
            abort();
        }
    }
    return s;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    double end = now() + seconds;
    long total = 0;
    while (now() < end) {
        total += work(200000, 3);
        total += work(100000, 5);
    }
    printf("clones %ld\n", total & 1);
    return 0;
}
