/* heap_thread_leaks: two threads leak known byte counts at one shared call site, and one
 * frees blocks the other allocated, so per-thread heap numbers are exactly known:
 *   thread A: A_BLOCKS x A_SIZE at leak_site; thread B later frees A_FREED of them
 *             (charged to A, the allocating thread) -> A live = (A_BLOCKS - A_FREED) x A_SIZE;
 *   thread B: B_BLOCKS x B_SIZE at leak_site, plus CHURN x 777 bytes at churn_site, freed.
 * Prints "tid A <tid>" and "tid B <tid>"; spreads the work over ~0.6 s (several checkpoints).
 * Usage: heap_thread_leaks */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/syscall.h>
#include "heap_common.h"

#define A_BLOCKS 300
#define A_SIZE 1000
#define A_FREED 100
#define B_BLOCKS 50
#define B_SIZE 2048
#define CHURN 100

static void *a_blocks[A_BLOCKS];
static pthread_barrier_t barrier;

__attribute__((noinline)) void *leak_site(size_t n) { return malloc(n); }
__attribute__((noinline)) void churn_site(void) { void *p = malloc(777); heap_sink = p; free(p); }

static void nap_ms(long ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void *thread_a(void *arg) {
    (void)arg;
    say("tid A %ld\n", (long)syscall(SYS_gettid));
    for (int i = 0; i < A_BLOCKS; i++) {
        a_blocks[i] = leak_site(A_SIZE);
        if (i % 100 == 99) nap_ms(100);
    }
    pthread_barrier_wait(&barrier);
    return NULL;
}

static void *thread_b(void *arg) {
    (void)arg;
    say("tid B %ld\n", (long)syscall(SYS_gettid));
    for (int i = 0; i < B_BLOCKS; i++) heap_sink = leak_site(B_SIZE);
    for (int i = 0; i < CHURN; i++) churn_site();
    pthread_barrier_wait(&barrier);
    for (int i = 0; i < A_FREED; i++) free(a_blocks[2 * i]);
    nap_ms(200);
    return NULL;
}

int main(void) {
    pthread_t a, b;
    pthread_barrier_init(&barrier, NULL, 2);
    if (pthread_create(&a, NULL, thread_a, NULL) != 0) return 6;
    if (pthread_create(&b, NULL, thread_b, NULL) != 0) return 6;
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    say("done\n");
    return 0;
}
