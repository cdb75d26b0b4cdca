/* Target for frame line lookups (tests/system/test_frames_lines.py): an address that is both a
 * sampled leaf and a return address, and a heap call site whose next instruction is on the
 * next line.  spin() calls step() as the last instruction of its line, so the instruction
 * after the call (step's return address) is on the next line: a sample interrupted there
 * is at that next line, while step's caller frame is at the call's line.
 * Usage: frames_lines SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static void *volatile keep;

__attribute__((noinline)) unsigned long step(unsigned long x) {
    return (x * 2654435761u) ^ (x >> 7);
}

__attribute__((noinline)) unsigned long spin(unsigned long n) {
    unsigned long acc = 1;
    for (unsigned long i = 0; i < n; i++) {
        acc = step(acc);
        acc += i * 3;
    }
    return acc;
}

__attribute__((noinline)) void *grab(size_t n) {
    void *p = malloc(n);
    keep = p;
    return p;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    printf("ready %d\n", getpid());
    fflush(stdout);
    double end = now() + seconds;
    for (int round = 0; now() < end; round++) {
        sink = spin(200000);
        if (round < 100) grab(1000 + (size_t)round);
    }
    return 0;
}
