/* THREADS threads that spin until killed: the recorder must still stop on time.
 *   many_threads [THREADS] [--go=PATH]
 * With --go=PATH the threads wait until PATH exists before they spin (a test starts the
 * recorder first: 300 spinners on 2 cores leave an interpreter starting up ~1/150 of a
 * core, 20-30 s for rsprof's start-up alone). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile uint64_t sink;
/* A futex, not a condition variable: all 300 wake runnable at once, where a mutex handed
 * from thread to thread among spinners started ~100 in 2 s. */
static int go;

static void *worker(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&go, __ATOMIC_ACQUIRE))
        syscall(SYS_futex, &go, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
    uint64_t x = 1;
    for (;;) x = x * 6364136223846793005ull + 1, sink = x;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 300;
    const char *go_path = argc > 2 && strncmp(argv[2], "--go=", 5) == 0 ? argv[2] + 5 : NULL;
    __atomic_store_n(&go, go_path == NULL, __ATOMIC_RELEASE);
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        pthread_create(&t, NULL, worker, NULL);
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    struct stat st;
    while (go_path != NULL && stat(go_path, &st) != 0) usleep(5000);
    __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &go, FUTEX_WAKE_PRIVATE, threads, NULL, NULL, 0);
    for (;;) pause();
}
