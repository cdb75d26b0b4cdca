/* heap_fork: fork and exec under the shim.
 *   parent:      parent_site keeps PARENT_SIZE bytes, prints "parent <pid>", forks:
 *   child:       child_site keeps CHILD_SIZE bytes, prints "child <pid>", waits for
 *                <dir>/child-go, then execs itself as "--exec-child":
 *   exec child:  exec_site keeps EXEC_SIZE bytes, prints "exec <pid>", waits for
 *                <dir>/exec-go, exits 0.
 *   After <dir>/fork-quick, the parent forks a second child that allocates and leaves
 *   through _exit (its ring must not be left behind), and prints "quick <pid>" for it.
 *   The parent waits for both children, prints "children-done", waits for
 *   <dir>/parent-go and exits 0.
 * Usage: heap_fork <dir> | heap_fork --exec-child <dir> */
#include <sys/wait.h>
#include "heap_common.h"

#define PARENT_SIZE 11111
#define CHILD_SIZE 22222
#define EXEC_SIZE 33333
#define QUICK_SIZE 44444

static void *volatile keep[4]; /* volatile: otherwise GCC drops the unused allocations */

__attribute__((noinline)) static void parent_site(void) { keep[0] = malloc(PARENT_SIZE); }
__attribute__((noinline)) static void child_site(void) { keep[1] = malloc(CHILD_SIZE); }
__attribute__((noinline)) static void exec_site(void) { keep[2] = malloc(EXEC_SIZE); }
__attribute__((noinline)) static void quick_site(void) { keep[3] = malloc(QUICK_SIZE); }

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--exec-child") == 0) {
        exec_site();
        say("exec %d\n", (int)getpid());
        wait_for(argv[2], "exec-go");
        return 0;
    }
    if (argc != 2) return 2;
    const char *dir = argv[1];
    parent_site();
    say("parent %d\n", (int)getpid());
    pid_t child = fork();
    if (child < 0) return 7;
    if (child == 0) {
        child_site();
        say("child %d\n", (int)getpid());
        wait_for(dir, "child-go");
        execl("/proc/self/exe", argv[0], "--exec-child", dir, (char *)NULL);
        _exit(8);
    }
    wait_for(dir, "fork-quick"); /* keeps the output order deterministic */
    pid_t quick = fork();
    if (quick < 0) return 7;
    if (quick == 0) {
        quick_site();
        _exit(0);
    }
    say("quick %d\n", (int)quick);
    int status;
    if (waitpid(quick, &status, 0) != quick || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 9;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 10;
    say("children-done\n");
    wait_for(dir, "parent-go");
    return 0;
}
