/* dump_wait: threads in known places for tests/system/test_dump.py.
 *
 * "dump-spin" spins in spin_here(); "dump-block" is blocked in read() on a pipe nobody
 * writes, called from block_here(); the main thread waits in pthread_join.  A real-time
 * signal (SIGRTMIN, queued: none merges with another) is counted by a handler; SIGUSR2
 * prints the count and exits 0.  Prints "ready PID" when the threads run.
 *
 * Both signals are blocked in the two other threads, so the main thread takes every one:
 * handlers run one at a time, and SIGUSR2 (a lower number, so delivered first when both
 * are pending) lets the real-time signals still pending in before it counts.  With any
 * thread taking them, a CI run at load 42 printed "counted 18" of 20: SIGUSR2 handled
 * while the last ones were pending or in another thread's handler. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int counted;
static int pipe_fds[2];

/* Atomic: two threads may run the handler at once (a process-directed signal goes to any
 * of them), and a plain ++ lost one of 20 in CI. */
static void on_rt(int sig) { (void)sig; __atomic_fetch_add(&counted, 1, __ATOMIC_RELAXED); }

static void on_usr2(int sig) {
    (void)sig;
    /* SIGRTMINs still pending (the test stops the process 20 times in a row: on a loaded
     * machine the main thread may not run between two stops, so they wait in the queue)
     * are delivered before counting.  sigpending() lists only *blocked* pending signals:
     * with SIGRTMIN unblocked it always said none, and the count was printed with up to
     * 19 of them still queued ("counted 1" in CI at load 21).  So: block, look, unblock
     * (which delivers what is pending, nested here), until none is left. */
    sigset_t rt, pending;
    sigemptyset(&rt);
    sigaddset(&rt, SIGRTMIN);
    for (int i = 0; i < 100000; i++) {
        pthread_sigmask(SIG_BLOCK, &rt, NULL);
        int more = sigpending(&pending) == 0 && sigismember(&pending, SIGRTMIN);
        pthread_sigmask(SIG_UNBLOCK, &rt, NULL);
        if (!more) break;
    }
    char line[32];
    int n = snprintf(line, sizeof line, "counted %d\n", __atomic_load_n(&counted, __ATOMIC_RELAXED));
    (void)!write(1, line, (size_t)n);
    _exit(0);
}

__attribute__((noinline)) static void spin_here(void) {
    volatile unsigned long x = 0;
    for (;;) x++;
}

__attribute__((noinline)) static void block_here(void) {
    char c;
    (void)!read(pipe_fds[0], &c, 1); /* nobody writes: blocked for good */
}

static void *spinner(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "dump-spin");
    spin_here();
    return NULL;
}

static void *blocker(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "dump-block");
    block_here();
    return NULL;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_rt;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGRTMIN, &sa, NULL);
    sa.sa_handler = on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    if (pipe(pipe_fds) != 0) return 1;
    sigset_t counted_signals, before;
    sigemptyset(&counted_signals);
    sigaddset(&counted_signals, SIGRTMIN);
    sigaddset(&counted_signals, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &counted_signals, &before); /* inherited by the threads */
    pthread_t a, b;
    pthread_create(&a, NULL, spinner, NULL);
    pthread_create(&b, NULL, blocker, NULL);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    pthread_join(a, NULL);
    return 0;
}
