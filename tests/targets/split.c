/* Known CPU split for rsprof's end-to-end tests.
 *
 * main thread ("split-main"): work() calls heavy() and light(); heavy spins 3 units for
 *   every 1 unit of light, so self time is 3:1 and work()'s total covers both.
 * thread "split-busy" (started before attach): other_busy() spins all the time.
 * thread "split-late" (started LATE_MS after start, i.e. after the recorder attached):
 *   late_worker() spins until the end.
 * Usage: split SECONDS [LATE_MS]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;
static volatile int done;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Burns a fixed amount of CPU work, so shares do not depend on scheduling. The volatile
 * local gives this leaf a stack frame: GCC 12 omits the frame pointer setup of leaf
 * functions that need no stack, which would hide the caller from a frame-pointer walk. */
static __attribute__((noinline)) void spin(uint64_t units) {
    volatile uint64_t x[1] = {sink | 1};
    for (uint64_t i = 0; i < units * 100000; i++) x[0] = x[0] * 6364136223846793005ull + i;
    sink = x[0];
}

#ifndef HEAVY_UNITS
#define HEAVY_UNITS 3 /* -DHEAVY_UNITS=N builds a variant with another split, for diffs */
#endif
__attribute__((noinline)) void heavy(void) { spin(HEAVY_UNITS); }
__attribute__((noinline)) void light(void) { spin(1); }
__attribute__((noinline)) void work(void) { heavy(); light(); }
__attribute__((noinline)) void other_busy(void) { spin(2); }
__attribute__((noinline)) void late_worker(void) { spin(2); }

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
    pthread_setname_np(pthread_self(), "split-main");
    pthread_t busy, late;
    int late_started = 0;
    pthread_create(&busy, NULL, busy_main, NULL);
    printf("ready %d\n", getpid());
    fflush(stdout);
    uint64_t start = now_ns();
    while ((now_ns() - start) / 1e9 < seconds) {
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
