/* Target of tests/system/test_heap_attach.py, shaped like `xz -T2`: the worker blocks every
 * signal (xz's mythread_create does), so it cannot be stopped for the injected call, and the
 * main thread waits in pthread_cond_timedwait (as xz's does), whose default version
 * (@@GLIBC_2.3.2) follows a compatibility one (@GLIBC_2.2.5) in glibc 2.36's .dynsym
 * (pthread_cond_wait's default comes first).  Started WITHOUT rsprof.
 *   stdin "alloc N"  the worker allocates N 3000-byte blocks at condwait_site, keeps them,
 *                    prints "done alloc N"
 *   stdin "quit"     the worker wakes the main thread, which prints the blocks' checksum
 *                    and exits with status 5. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK 3000
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int finished;
static uint64_t checksum;

__attribute__((noinline)) static char *condwait_site(void) { return malloc(BLOCK); }

static void *worker(void *arg) {
    (void)arg;
    char line[64];
    while (fgets(line, sizeof line, stdin) != NULL) {
        int n;
        if (sscanf(line, "alloc %d", &n) == 1) {
            for (int i = 0; i < n; i++) {
                char *p = condwait_site();
                memset(p, i & 0xff, BLOCK);
                checksum = checksum * 31 + (uint64_t)(unsigned char)p[i % BLOCK] + (uint64_t)i;
            }
            printf("done alloc %d\n", n);
            fflush(stdout);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
    }
    pthread_mutex_lock(&lock);
    finished = 1;
    pthread_cond_signal(&cond);
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    printf("ready\n");
    fflush(stdout);
    pthread_mutex_lock(&lock);
    while (!finished) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 60;
        pthread_cond_timedwait(&cond, &lock, &until);
    }
    pthread_mutex_unlock(&lock);
    pthread_join(t, NULL);
    printf("checksum %llu\n", (unsigned long long)checksum);
    return 5;
}
