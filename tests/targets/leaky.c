/* Heap target with exactly known numbers, for rsprof's end-to-end heap tests.
 * Every tick: leak_site() leaks 4000 bytes, churn_site() allocates 777 and frees them at
 * once, and each worker thread's thread_leak() leaks 64 bytes. keep_site() holds one
 * block of exactly 123457 bytes for the whole run.
 * Usage: leaky TICKS TICK_MS THREADS */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long ticks, tick_ms;
static void *volatile sink; /* a volatile pointer: keeps malloc+free pairs real */

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

__attribute__((noinline)) void *leak_site(void) { return malloc(4000); }
__attribute__((noinline)) void churn_site(void) { void *p = malloc(777); sink = p; free(p); }
__attribute__((noinline)) void *keep_site(void) { return malloc(123457); }
__attribute__((noinline)) void *thread_leak(void) { return malloc(64); }

static void *worker(void *arg) {
    (void)arg;
    for (long i = 0; i < ticks; i++) {
        sink = thread_leak();
        sleep_ms(tick_ms);
    }
    return NULL;
}

int main(int argc, char **argv) {
    ticks = argc > 1 ? atol(argv[1]) : 40;
    tick_ms = argc > 2 ? atol(argv[2]) : 25;
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    printf("ready %d\n", getpid());
    fflush(stdout);
    void *kept = keep_site();
    pthread_t tids[16];
    for (int t = 0; t < threads && t < 16; t++) pthread_create(&tids[t], NULL, worker, NULL);
    for (long i = 0; i < ticks; i++) {
        sink = leak_site();
        churn_site();
        sleep_ms(tick_ms);
    }
    for (int t = 0; t < threads && t < 16; t++) pthread_join(tids[t], NULL);
    sink = kept;
    return 0;
}
