/* Many short-lived threads: THREADS threads, one after another in WAVES of 4, each
 * spinning MS of its own CPU time in thread_spin; the main thread spins MAIN_MS in
 * main_spin first. Usage: short_threads THREADS MS MAIN_MS */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static volatile uint64_t sink;

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void spin(double ms) {
    volatile uint64_t x[1] = {sink | 1};
    double end = thread_cpu() + ms / 1000.0;
    while (thread_cpu() < end)
        for (int i = 0; i < 20000; i++) x[0] = x[0] * 6364136223846793005ull + (uint64_t)i;
    sink = x[0];
}

static double thread_ms;
__attribute__((noinline)) void thread_spin(void) { spin(thread_ms); sink++; }  /* no tail call */
__attribute__((noinline)) void main_spin(double ms) { spin(ms); sink++; }

static void *worker(void *arg) {
    (void)arg;
    thread_spin();
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 100;
    thread_ms = argc > 2 ? atof(argv[2]) : 20;
    main_spin(argc > 3 ? atof(argv[3]) : 1000);
    for (int i = 0; i < threads; i += 4) {
        pthread_t t[4];
        int n = threads - i < 4 ? threads - i : 4;
        for (int k = 0; k < n; k++) pthread_create(&t[k], NULL, worker, NULL);
        for (int k = 0; k < n; k++) pthread_join(t[k], NULL);
    }
    return 0;
}
