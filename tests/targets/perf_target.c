/* Target for tests/system/test_native_perf.py.  Usage: perf_target MODE [ARG]
 *
 *   split SECONDS       one thread: caller() spends 3/4 of its time in heavy(), 1/4 in light()
 *   twothreads SECONDS  main thread and one extra thread, both busy in spin_worker()
 *   latethread SECONDS  idles 0.5 s, then starts a busy thread (in late_worker())
 *   dlopen LIBPATH      idles 0.5 s, dlopen()s LIBPATH, calls its perf_lib_work(), idles 1 s
 *   exit SECONDS        busy for SECONDS, then returns from main
 *
 * Prints "ready <pid>" once the threads that should exist at attach time exist, then
 * waits for one line on stdin before doing the timed part (so the test attaches first).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Same loop body in both, so time is proportional to the iteration count.  The volatile
 * local is there to give them a stack frame: GCC 12 builds a leaf that needs no stack
 * without push %rbp even under -mno-omit-leaf-frame-pointer, and the frame-pointer walk
 * would then skip caller() (the saved %rbp still points at caller's own frame). */
NOINLINE void heavy(void) {
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < 300000; i++) acc += i * 7;
    sink += acc;
}

NOINLINE void light(void) {
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < 100000; i++) acc += i * 7;
    sink += acc;
}

NOINLINE void caller(double seconds) {
    double end = now() + seconds;
    while (now() < end) {
        heavy();
        light();
    }
}

static double g_seconds;

NOINLINE void spin_worker(double seconds) {
    double end = now() + seconds;
    while (now() < end)
        for (unsigned long i = 0; i < 100000; i++) sink += i;
}

NOINLINE void late_worker(double seconds) { spin_worker(seconds); }

static void *spin_thread(void *arg) {
    (void)arg;
    spin_worker(g_seconds);
    return NULL;
}

static void *late_thread(void *arg) {
    (void)arg;
    printf("late %ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    /* Named only once the sampler has had time to follow us: a name set before our event
     * exists produces no COMM record for it. */
    usleep(200000);
    pthread_setname_np(pthread_self(), "perf-late");
    late_worker(g_seconds);
    return NULL;
}

static void wait_go(void) {
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL) exit(1);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *mode = argv[1];
    g_seconds = atof(argv[2]);
    if (strcmp(mode, "split") == 0) {
        wait_go();
        caller(g_seconds);
    } else if (strcmp(mode, "twothreads") == 0) {
        pthread_t t;
        pthread_create(&t, NULL, spin_thread, NULL);
        wait_go();
        spin_worker(g_seconds);
        pthread_join(t, NULL);
    } else if (strcmp(mode, "latethread") == 0) {
        wait_go();
        usleep(500000);
        pthread_t t;
        pthread_create(&t, NULL, late_thread, NULL);
        pthread_join(t, NULL);
    } else if (strcmp(mode, "dlopen") == 0) {
        wait_go();
        usleep(500000);
        void *h = dlopen(argv[2], RTLD_NOW);
        if (h == NULL) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        void (*work)(void) = (void (*)(void))dlsym(h, "perf_lib_work");
        if (work != NULL) work();
        printf("loaded\n");
        fflush(stdout);
        sleep(1);
    } else if (strcmp(mode, "exit") == 0) {
        wait_go();
        spin_worker(g_seconds);
    } else {
        return 2;
    }
    return 0;
}
