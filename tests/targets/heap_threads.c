/* heap_threads: many threads allocating and freeing at once, including frees of blocks
 * allocated by other threads and a producer/consumer hand-off (heavy address reuse across
 * threads, which is what the ring's ordering rule exists for).
 *   phase 1: THREADS threads x PER_THREAD blocks from thread_alloc_site, size
 *            ((i * 7 + t) % 97 + 1) * 8; then each thread frees the odd-indexed blocks of
 *            thread (t + 1) % THREADS.
 *   phase 2: PAIRS producer/consumer pairs: the producer allocates ITEMS blocks of
 *            PC_SIZE bytes at pc_site, the consumer frees them.
 * Usage: heap_threads <dir>: "ready <pid>", waits for <dir>/go, runs, "done", waits for
 * <dir>/exit. */
#include <pthread.h>
#include "heap_common.h"

#define THREADS 8
#define PER_THREAD 20000
#define PAIRS 4
#define ITEMS 50000
#define PC_SIZE 48
#define QCAP 256

static void *blocks[THREADS][PER_THREAD];
static pthread_barrier_t barrier;

__attribute__((noinline)) static void *thread_alloc_site(size_t n) { return malloc(n); }

static void *phase1(void *arg) {
    int t = (int)(long)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        size_t n = (size_t)(((i * 7 + t) % 97) + 1) * 8;
        blocks[t][i] = thread_alloc_site(n);
    }
    pthread_barrier_wait(&barrier);
    int victim = (t + 1) % THREADS;
    for (int i = 1; i < PER_THREAD; i += 2) free(blocks[victim][i]);
    return NULL;
}

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    void *items[QCAP];
    int head, count;
} queue;

static queue queues[PAIRS];

__attribute__((noinline)) static void *pc_site(void) { return malloc(PC_SIZE); }

static void *producer(void *arg) {
    queue *q = arg;
    for (int i = 0; i < ITEMS; i++) {
        void *p = pc_site();
        pthread_mutex_lock(&q->lock);
        while (q->count == QCAP) pthread_cond_wait(&q->cond, &q->lock);
        q->items[(q->head + q->count) % QCAP] = p;
        q->count++;
        pthread_cond_broadcast(&q->cond);
        pthread_mutex_unlock(&q->lock);
    }
    return NULL;
}

static void *consumer(void *arg) {
    queue *q = arg;
    for (int i = 0; i < ITEMS; i++) {
        pthread_mutex_lock(&q->lock);
        while (q->count == 0) pthread_cond_wait(&q->cond, &q->lock);
        void *p = q->items[q->head];
        q->head = (q->head + 1) % QCAP;
        q->count--;
        pthread_cond_broadcast(&q->cond);
        pthread_mutex_unlock(&q->lock);
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *dir = argv[1];
    say("ready %d\n", (int)getpid());
    wait_for(dir, "go");
    pthread_t th[2 * PAIRS > THREADS ? 2 * PAIRS : THREADS];
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (long t = 0; t < THREADS; t++)
        if (pthread_create(&th[t], NULL, phase1, (void *)t) != 0) return 6;
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    for (int k = 0; k < PAIRS; k++) {
        pthread_mutex_init(&queues[k].lock, NULL);
        pthread_cond_init(&queues[k].cond, NULL);
        if (pthread_create(&th[2 * k], NULL, producer, &queues[k]) != 0) return 6;
        if (pthread_create(&th[2 * k + 1], NULL, consumer, &queues[k]) != 0) return 6;
    }
    for (int t = 0; t < 2 * PAIRS; t++) pthread_join(th[t], NULL);
    say("done\n");
    wait_for(dir, "exit");
    return 0;
}
