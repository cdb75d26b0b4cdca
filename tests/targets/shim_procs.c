/* fork, vfork, posix_spawn and exec under the shim: every child finishes at once and
 * allocates safely; nothing waits at exit for a reader that is not there. */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int wait_ok(pid_t pid) {
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
    int ok = 1;
    for (int i = 0; i < 5; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            char *s = strdup("child");
            free(s);
            _exit(0);
        }
        ok &= wait_ok(pid);
        pid = vfork();
        if (pid == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        ok &= wait_ok(pid);
        char *args[] = {"true", NULL};
        if (posix_spawn(&pid, "/bin/true", NULL, NULL, args, environ) == 0) ok &= wait_ok(pid);
        else ok = 0;
    }
    if (argc > 1) { /* exec ourselves once more: the new image gets a fresh ring */
        char *args[] = {argv[0], NULL};
        execv(argv[0], args);
        return 127;
    }
    puts(ok ? "procs ok" : "procs FAILED");
    return ok ? 0 : 1;
}
