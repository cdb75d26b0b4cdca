/* Known CPU split for rsprof's end-to-end tests.
 *
 * main thread ("split-main"): work() calls heavy() and light(); heavy spins 3 units for
 *   every 1 unit of light, so self time is 3:1 and work()'s total covers both.
 * thread "split-busy" (started before attach): other_busy() spins all the time.
 * thread "split-late" (started LATE_MS after start, i.e. after the recorder attached):
 *   late_worker() spins until the end.
 * Usage: split SECONDS [LATE_MS] [cpu]
 *   SECONDS of wall time, or with `cpu` of the main thread's CPU time: on a machine so busy
 *   that the main thread gets 1 % of a CPU, 1.5 s of wall time is 15 samples, too few to
 *   judge a split.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;
static volatile int done;

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* Burns a fixed amount of CPU work, so shares do not depend on scheduling. The volatile
 * local gives this leaf a stack frame: GCC 12 omits the frame pointer setup of leaf
 * functions that need no stack, which would hide the caller from a frame-pointer walk. */
static __attribute__((noinline)) void spin(uint64_t iterations) {
    volatile uint64_t x[1] = {sink | 1};
    for (uint64_t i = 0; i < iterations; i++) x[0] = x[0] * 6364136223846793005ull + i;
    sink = x[0];
}

#ifndef UNIT_ITERS
#define UNIT_ITERS 100000 /* one unit: ~0.1 ms of CPU */
#endif
/* The length of one unit of this round, drawn from [UNIT/2, 3 UNIT/2). cpu-clock samples a
 * thread every 1001 us of its CPU time exactly (the kernel turns a frequency into a fixed
 * period for software events), so a work() cycle of fixed length aliases with it: where
 * the cycle divides the period (C = 1001 us or 500.5 us: a matter of the CPU's speed), every
 * sample lands at nearly the same phase of the cycle and the 3:1 split read 0.66 to 0.76
 * over ~1250 samples (0.698 once in CI). Rounds of random length spread the phases;
 * heavy and light share each round's unit, so the work stays exactly 3:1. */
/* A macro, not a function: tests assert work()'s callees are exactly heavy and light, and a
 * function of its own (even inlined: rsprof reports inline frames) got a sample now and then. */
#define ROUND_UNIT(state)                                                                    \
    ((state) ^= (state) << 13, (state) ^= (state) >> 7, (state) ^= (state) << 17, /* xorshift64 */ \
     UNIT_ITERS / 2 + (state) % UNIT_ITERS)

#ifndef HEAVY_UNITS
#define HEAVY_UNITS 3 /* -DHEAVY_UNITS=N builds a variant with another split, for diffs */
#endif
__attribute__((noinline)) void heavy(uint64_t unit) { spin(HEAVY_UNITS * unit); }
__attribute__((noinline)) void light(uint64_t unit) { spin(unit); }
__attribute__((noinline)) void work(void) {
    static uint64_t state = 0x9e3779b97f4a7c15ull;
    uint64_t unit = ROUND_UNIT(state);
    heavy(unit);
    light(unit);
}
__attribute__((noinline)) void other_busy(void) { spin(2 * UNIT_ITERS); }
__attribute__((noinline)) void late_worker(void) { spin(2 * UNIT_ITERS); }

static void *busy_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "split-busy");
    while (!done) other_busy();
    return NULL;
}

static void *late_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "split-late");
    while (!done) late_worker();
    return NULL;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    long late_ms = argc > 2 ? atol(argv[2]) : 1000;
    clockid_t run_clock = argc > 3 && strcmp(argv[3], "cpu") == 0 ? CLOCK_THREAD_CPUTIME_ID
                                                                   : CLOCK_MONOTONIC;
    pthread_setname_np(pthread_self(), "split-main");
    pthread_t busy, late;
    int late_started = 0;
    pthread_create(&busy, NULL, busy_main, NULL);
    printf("ready %d\n", getpid());
    fflush(stdout);
    uint64_t start = now_ns(), run_start = clock_ns(run_clock);
    while ((clock_ns(run_clock) - run_start) / 1e9 < seconds) {
        if (!late_started && (now_ns() - start) / 1000000 >= (uint64_t)late_ms) {
            pthread_create(&late, NULL, late_main, NULL);
            late_started = 1;
        }
        work();
    }
    done = 1;
    pthread_join(busy, NULL);
    if (late_started) pthread_join(late, NULL);
    return 0;
}
