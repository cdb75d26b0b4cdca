/* heap_longpath: allocations by lib_alloc() of heap_longpath_lib.c, a shared library the test
 * installs under a path so long that its line of /proc/self/maps is longer than the heap
 * shim reads of a line (tests/system/test_heap_native.py).
 * Usage: heap_longpath <n> <dir>: prints "ready <pid>", waits for <dir>/go, calls lib_alloc
 * n times (64 B each, kept), prints "done", waits for <dir>/exit. */
#include "heap_common.h"

void *lib_alloc(size_t n);

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    long n = atol(argv[1]);
    say("ready %d\n", (int)getpid());
    wait_for(argv[2], "go");
    for (long i = 0; i < n; i++) heap_sink = lib_alloc(64);
    say("done\n");
    wait_for(argv[2], "exit");
    return 0;
}
