/* cputime OUT PROG [ARG...]: run PROG, wait for it with wait4, write the CPU time it used
 * (ru_utime and ru_stime: its own and that of the children it waited for) to the file OUT
 * as one line "USER_US SYS_US\n" (microseconds), and exit with its status (killed by a
 * signal: the same signal, so the caller sees what it would have seen without us).
 *
 * bench/bench_matrix.py puts it in front of a program in every mode (plain, rsprof run,
 * rsprof run --no-heap, heaptrack) to measure the program's CPU time without that of the
 * profiler's own processes. It allocates nothing: no stdio, no malloc, one stack buffer.
 * SIGINT, SIGTERM and SIGHUP are passed on to the program.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile pid_t child = 0;

static void say(const char *a, const char *b) {
    (void)!write(2, "cputime: ", 9);
    (void)!write(2, a, strlen(a));
    (void)!write(2, b, strlen(b));
    (void)!write(2, "\n", 1);
}

static void forward(int sig) {
    if (child > 0) kill(child, sig);
}

/* Writes v in decimal just before end; returns where its digits start. */
static char *digits(char *end, unsigned long long v) {
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return end;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        say("usage: cputime OUT PROG [ARG...]", "");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    pid_t pid = fork();
    if (pid < 0) {
        say("fork: ", strerror(errno));
        return 126;
    }
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        execvp(argv[2], argv + 2);
        say(argv[2], errno == ENOENT ? ": not found" : ": cannot execute");
        _exit(errno == ENOENT ? 127 : 126);
    }
    child = pid;

    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            say("wait4: ", strerror(errno));
            return 126;
        }
    }

    unsigned long long user = (unsigned long long)ru.ru_utime.tv_sec * 1000000ULL +
                              (unsigned long long)ru.ru_utime.tv_usec;
    unsigned long long sys = (unsigned long long)ru.ru_stime.tv_sec * 1000000ULL +
                             (unsigned long long)ru.ru_stime.tv_usec;
    char buf[64];
    char *end = buf + sizeof buf;
    *--end = '\n';
    char *p = digits(end, sys);
    *--p = ' ';
    p = digits(p, user);
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, p, (size_t)(buf + sizeof buf - p)) != buf + sizeof buf - p) {
        say(argv[1], ": cannot write");
        return 126;
    }
    close(fd);

    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none); /* the program dumped core already, if it did */
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(sig);
        return 128 + sig;
    }
    return WEXITSTATUS(status);
}
