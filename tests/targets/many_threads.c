/* THREADS threads that spin until killed: the recorder must still stop on time. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile uint64_t sink;

static void *worker(void *arg) {
    (void)arg;
    uint64_t x = 1;
    for (;;) x = x * 6364136223846793005ull + 1, sink = x;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 300;
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        pthread_create(&t, NULL, worker, NULL);
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;) pause();
}
