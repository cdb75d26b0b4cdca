/* Calls a tiny libc function through its PLT stub in a hot loop, so CPU samples land in the
 * stub (tests/system/test_symbols.py: stubs are named `name@plt`). Built with -fno-builtin so the
 * call stays a call.  Usage: plt_calls SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static volatile long sink;

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long total = 0;
    do {
        for (int i = 1; i < 1000000; i++) total += ffs(i) + labs(-i);
        sink = total;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9 <
             seconds);
    return 0;
}
