/* Signal frames: a SIGPROF handler that does real work, interrupting busy_loop().  Built
 * -O2 -fomit-frame-pointer by tests/system/test_cfi_stacks.py: samples in the handler must walk
 * through the kernel's signal frame (glibc's __restore_rt) back to busy_loop and main.
 * Runs for SECONDS of CPU time (a busy machine stretches it, never shrinks it). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void handler_work(void) {
    volatile char pad[300];
    memset((char *)pad, 1, sizeof pad);
    for (int i = 0; i < 2000000; i++) sink += (unsigned long)i * 2654435761u + pad[i % 300];
}

__attribute__((noinline)) static void on_signal(int sig) {
    handler_work();
    sink += (unsigned long)sig;
}

__attribute__((noinline)) static void busy_loop(double seconds) {
    volatile char pad[700];
    struct timespec t0, t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    do {
        for (int i = 0; i < 100000; i++) sink += (unsigned long)i ^ (unsigned long)pad[i % 700];
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.5;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval it = {{0, 5000}, {0, 5000}};
    setitimer(ITIMER_PROF, &it, NULL);
    busy_loop(seconds);
    printf("%lu\n", sink & 1);
    return 0;
}
