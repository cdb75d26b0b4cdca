/* Reproducer (Rust std's thread start): a thread's first allocation happens inside
 * pthread_getattr_np(pthread_self()), which reallocs while glibc holds the thread's lock.
 * A shim that calls pthread_getattr_np from inside that realloc deadlocks. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *worker(void *arg) {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return NULL;
    pthread_attr_destroy(&attr);
    void *p = malloc(64 + (size_t)arg);
    free(p);
    return NULL;
}

int main(void) {
    for (int round = 0; round < 50; round++) {
        pthread_t t[4];
        for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)i);
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    }
    puts("getattr ok");
    return 0;
}
