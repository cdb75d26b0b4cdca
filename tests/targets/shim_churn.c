/* shim_churn: two threads (churn-a, churn-b) that do nothing but malloc and free in
 * churn_worker() for SECONDS (default 2), so under `rsprof run` a large share of their CPU
 * samples lands inside the heap shim. Prints "ready <pid>" first (for `rsprof -p`).
 * Usage: shim_churn [SECONDS] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static double seconds = 2;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

__attribute__((noinline)) static void churn_worker(void) {
    double end = now() + seconds;
    void *keep[64] = {0};
    unsigned i = 0;
    while (now() < end) {
        for (int k = 0; k < 1000; k++, i++) {
            unsigned slot = i & 63;
            free(keep[slot]);
            keep[slot] = malloc(16 + (i * 37) % 2000);
            memset(keep[slot], (int)i, 16);
            sink += ((unsigned char *)keep[slot])[3];
        }
    }
    for (int k = 0; k < 64; k++) free(keep[k]);
}

static void *start(void *name) {
    pthread_setname_np(pthread_self(), name);
    churn_worker();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) seconds = atof(argv[1]);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    pthread_t t[2];
    pthread_create(&t[0], NULL, start, "churn-a");
    pthread_create(&t[1], NULL, start, "churn-b");
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    return 0;
}
