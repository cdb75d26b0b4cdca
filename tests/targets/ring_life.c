/* Target for tests/system/test_heapshim_ring.py: the heap shim's ring must stay out of the
 * program's way (its fds, its files, its exec'd images).
 *
 * Usage:
 *   ring_life fds FILE        close every fd from 3 up, open FILE (it lands at fd 3) and
 *                             dup it onto every fd up to 1023 (whatever number the shim
 *                             uses, the program's file is there), write "hello world",
 *                             allocate enough to grow the ring, fork a child that writes
 *                             "child\n" to fd 3 and checks its fds are all still open;
 *                             exit 0 when all went well.
 *   ring_life storm N         N malloc/free pairs, prints the loop's seconds.
 *   ring_life exec K N LEAK   N malloc/free pairs and LEAK blocks of 1000 B leaked at
 *                             leak_site, then exec itself with K - 1 (K = 0: exit).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink; /* keeps malloc+free pairs real */

__attribute__((noinline)) void *leak_site(void) { return malloc(1000); }
__attribute__((noinline)) void churn(long n) {
    for (long i = 0; i < n; i++) {
        void *p = malloc(16 + (size_t)(i & 255));
        sink = p;
        free(p);
    }
}

static int fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur > 1024) return 1024;
    return (int)rl.rlim_cur;
}

static int all_open(int limit) {
    for (int fd = 3; fd < limit; fd++)
        if (fcntl(fd, F_GETFD) < 0) return 0;
    return 1;
}

static int fds(const char *path) {
    int limit = fd_limit();
    syscall(SYS_close_range, 3u, ~0u, 0u);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd != 3) return 10;
    for (int other = 4; other < limit; other++)
        if (dup2(fd, other) != other) return 11;
    if (write(3, "hello world", 11) != 11) return 12;
    churn(200000); /* several MiB of records: the ring grows (no reader drains it) */
    pid_t child = fork();
    if (child == 0) {
        churn(100000);
        int ok = all_open(limit) && write(3, "child\n", 6) == 6;
        _exit(ok ? 0 : 13);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child) return 14;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return WIFEXITED(status) ? WEXITSTATUS(status) : 15;
    return all_open(limit) ? 0 : 16;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "fds") == 0) return fds(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "storm") == 0) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        churn(atol(argv[2]));
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%.6f\n", (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9);
        return 0;
    }
    if (argc >= 5 && strcmp(argv[1], "exec") == 0) {
        long k = atol(argv[2]), n = atol(argv[3]), leak = atol(argv[4]);
        churn(n);
        for (long i = 0; i < leak; i++) sink = leak_site();
        if (k <= 0) return 0;
        char next[32];
        snprintf(next, sizeof next, "%ld", k - 1);
        char *args[] = {argv[0], "exec", next, argv[3], argv[4], NULL};
        execv("/proc/self/exe", args);
        return 20;
    }
    fprintf(stderr, "usage: ring_life fds FILE | storm N | exec K N LEAK\n");
    return 2;
}
