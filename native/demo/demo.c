/* rsprof-demo: the bundled workload `rsprof demo` profiles.
 *
 * Three busy threads with clearly named hot functions, and a heap that has one slowly
 * leaking call site, one churning site and one long-lived buffer, so every view of rsprof
 * has something true to show:
 *
 *   main thread  "demo-main"   : parse_requests()  (light, sleeps half the time)
 *   thread       "demo-hash"   : compute_hashes()  ~ 3/4 of its time, checksum_block() ~ 1/4
 *   thread       "demo-matrix" : multiply_matrices()
 *   heap: remember_request() leaks 4096 bytes every 100 ms; churn_buffers() allocates and
 *         frees at once; load_config() keeps one block of 1 MiB for the whole run.
 *
 * Usage: rsprof-demo [SECONDS]   (runs until killed when SECONDS is omitted or 0)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop_requested;
static volatile uint64_t sink; /* keeps the compiler from deleting the work */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU time of the calling thread: the demo's shares hold however busy the machine is
 * (spinning for wall-clock time would credit a preempted slice to whichever function was
 * running when the thread got the CPU back). */
static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Spins for about `ms` milliseconds of this thread's CPU time, doing real arithmetic. */
static __attribute__((noinline)) uint64_t spin_for(double ms, uint64_t seed) {
    double end = thread_cpu_seconds() + ms / 1000.0;
    uint64_t x = seed | 1;
    while (thread_cpu_seconds() < end) {
        for (int i = 0; i < 2000; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    }
    return x;
}

__attribute__((noinline)) uint64_t checksum_block(uint64_t seed) { return spin_for(1.0, seed); }

__attribute__((noinline)) uint64_t compute_hashes(uint64_t seed) { return spin_for(3.0, seed); }

__attribute__((noinline)) uint64_t multiply_matrices(uint64_t seed) { return spin_for(4.0, seed); }

__attribute__((noinline)) uint64_t parse_requests(uint64_t seed) { return spin_for(2.0, seed); }

/* Heap call sites. */
static char *config_block;
static void **remembered;
static size_t remembered_count, remembered_cap;

__attribute__((noinline)) void load_config(void) {
    config_block = malloc(1 << 20);
    if (config_block) memset(config_block, 1, 1 << 20);
}

/* Leaks on purpose: requests are remembered and never forgotten. */
__attribute__((noinline)) void remember_request(int n) {
    if (remembered_count == remembered_cap) {
        size_t cap = remembered_cap ? remembered_cap * 2 : 64;
        void **grown = realloc(remembered, cap * sizeof *grown);
        if (!grown) return;
        remembered = grown;
        remembered_cap = cap;
    }
    char *request = malloc(4096);
    if (!request) return;
    memset(request, n & 0xff, 4096);
    remembered[remembered_count++] = request;
}

__attribute__((noinline)) void churn_buffers(int n) {
    for (int i = 0; i < 50; i++) {
        char *buf = malloc(256 + (size_t)((n + i) % 7) * 512);
        if (!buf) return;
        buf[0] = (char)i;
        sink += (uint64_t)buf[0];
        free(buf);
    }
}

static void *hash_thread(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "demo-hash");
    uint64_t seed = 1;
    while (!stop_requested) {
        seed = compute_hashes(seed);
        seed = checksum_block(seed);
        sink += seed;
    }
    return NULL;
}

static void *matrix_thread(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "demo-matrix");
    uint64_t seed = 7;
    while (!stop_requested) {
        seed = multiply_matrices(seed);
        struct timespec pause = {0, 2 * 1000 * 1000};
        nanosleep(&pause, NULL); /* leaves some idle time so the split is visible */
        sink += seed;
    }
    return NULL;
}

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 0.0;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    pthread_setname_np(pthread_self(), "demo-main");
    load_config();

    pthread_t hash, matrix;
    if (pthread_create(&hash, NULL, hash_thread, NULL) != 0 ||
        pthread_create(&matrix, NULL, matrix_thread, NULL) != 0) {
        perror("rsprof-demo: pthread_create");
        return 1;
    }

    double start = now_seconds(), last_leak = start;
    uint64_t seed = 3;
    int n = 0;
    while (!stop_requested && (seconds <= 0 || now_seconds() - start < seconds)) {
        seed = parse_requests(seed);
        churn_buffers(n++);
        if (now_seconds() - last_leak >= 0.1) {
            remember_request(n);
            last_leak = now_seconds();
        }
        struct timespec pause = {0, 2 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    stop_requested = 1;
    pthread_join(hash, NULL);
    pthread_join(matrix, NULL);
    sink += seed + (uint64_t)(config_block ? config_block[0] : 0);
    return 0;
}
