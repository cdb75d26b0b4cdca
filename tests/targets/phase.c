/* One program, two builds with the same layout: -DPHASE=alpha spins in alpha_spin, then
 * (given a path) execs it; -DPHASE=beta spins in beta_spin. Both spin for CPU time, so the
 * shares hold on a busy machine. Usage: phase MS [NEXT_PROGRAM MS]. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifndef PHASE
#define PHASE alpha
#endif
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define SPIN CAT(PHASE, _spin)

static volatile uint64_t sink;

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void SPIN(double ms) {
    volatile uint64_t x[1] = {sink | 1};
    double end = cpu_seconds() + ms / 1000.0;
    while (cpu_seconds() < end)
        for (int i = 0; i < 20000; i++) x[0] = x[0] * 6364136223846793005ull + (uint64_t)i;
    sink = x[0];
}

int main(int argc, char **argv) {
    SPIN(argc > 1 ? atof(argv[1]) : 300);
    if (argc > 3) {
        execl(argv[2], argv[2], argv[3], (char *)NULL);
        return 127;
    }
    return 0;
}
