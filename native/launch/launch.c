/* rsprof-launch: how `rsprof run` starts its target (rsprof/session.py, launch()).
 *
 * Usage: rsprof-launch FD PPID PATH ARGV0 [ARGS...]
 *
 * rsprof starts this program and attaches its perf events to it; it waits, then execs
 * PATH in the same process (the events follow a thread across exec), so sampling covers
 * the target's first instruction. It changes nothing the target gets:
 * - the environment is the one rsprof sends on FD when it releases us (the user's, byte
 *   for byte, plus LD_PRELOAD and RSPROF_* for the heap shim), so this program runs without
 *   the shim and a bash wrapper can no longer drop OLDPWD or `_` or re-export functions;
 * - every other fd open here is one the user handed rsprof (rsprof passes exactly those),
 *   and FD itself is closed before the exec;
 * - signal dispositions and the mask are rsprof's at fork: the user's, but for SIGPIPE and
 *   SIGXFSZ, which Python ignores and subprocess sets back to their default.
 * And it never outlives rsprof: PR_SET_PDEATHSIG(SIGKILL) is set here, before the wait,
 * and survives the exec (not into a set-user-ID program: the kernel clears it there), so
 * a `kill -9` of rsprof, or a crash, takes the target with it. SIGKILL, not SIGTERM: a
 * target that ignores SIGTERM would stay behind.
 *
 * FD carries "go\0" then the environment's entries, each ending in '\0'. End of file
 * without "go" means rsprof gave up before releasing us: exit 127 without running PATH.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static const char GO[] = "go";

/* Reads FD to its end into a '\0'-terminated buffer; NULL on a read or memory error. */
static char *read_all(int fd, size_t *length) {
    size_t capacity = 1 << 16, used = 0;
    char *buffer = malloc(capacity + 1);
    while (buffer != NULL) {
        if (used == capacity) {
            char *bigger = realloc(buffer, 2 * capacity + 1);
            if (bigger == NULL) break;
            buffer = bigger;
            capacity *= 2;
        }
        ssize_t got = read(fd, buffer + used, capacity - used);
        if (got == 0) {
            buffer[used] = '\0';
            *length = used;
            return buffer;
        }
        if (got < 0 && errno != EINTR) break;
        if (got > 0) used += (size_t)got;
    }
    free(buffer);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: rsprof-launch FD PPID PATH ARGV0 [ARGS...] (run by rsprof)\n");
        return 127;
    }
    int fd = atoi(argv[1]);
    pid_t parent = (pid_t)atol(argv[2]);
    const char *path = argv[3];
    /* After setting it, check that rsprof is still our parent: had it died between the
     * fork and here, we were reparented already and the death signal will never come. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) return 127;

    size_t length = 0;
    char *message = read_all(fd, &length);
    close(fd);
    if (message == NULL || length < sizeof GO || memcmp(message, GO, sizeof GO) != 0)
        return 127;

    size_t count = 0;
    for (size_t i = sizeof GO; i < length; i++) count += message[i] == '\0';
    char **env = calloc(count + 1, sizeof *env);
    if (env == NULL) return 127;
    size_t n = 0;
    for (size_t i = sizeof GO; i < length && n < count; i += strlen(message + i) + 1)
        env[n++] = message + i;
    env[n] = NULL;

    execve(path, argv + 4, env);
    int error = errno;
    if (error == ENOEXEC) {
        /* A script without "#!": run by sh, as execvp(3) and shells do. */
        char **script = calloc((size_t)argc - 1, sizeof *script);
        if (script != NULL) {
            script[0] = "sh";
            script[1] = (char *)path;
            for (int i = 5; i < argc; i++) script[i - 3] = argv[i];
            execve("/bin/sh", script, env);
        }
    }
    fprintf(stderr, "rsprof: %s: %s\n", argv[4], strerror(error));
    return error == ENOENT ? 127 : 126;
}
