/* heap_apis: one function per allocator entry point, sizes known to the test.
 * Usage: heap_apis <dir>: prints "ready <pid>", waits for <dir>/go, runs, prints "done",
 * waits for <dir>/exit. */
#include <malloc.h>
#include "heap_common.h"

static void *volatile keep[16]; /* volatile: otherwise GCC drops the unused allocations */

__attribute__((noinline)) static void do_calloc(void) { keep[0] = calloc(10, 100); }

/* malloc 100 -> realloc 5000 -> realloc 50: three allocations, two frees, 50 live. */
__attribute__((noinline)) static void do_realloc(void) {
    char *p = malloc(100);
    p[0] = 1;
    p = realloc(p, 5000);
    p[4999] = 1;
    p = realloc(p, 50);
    keep[1] = p;
}

/* realloc(NULL, n) allocates; realloc(p, 0) frees (glibc). */
__attribute__((noinline)) static void do_realloc_edges(void) {
    void *p = realloc(NULL, 64);
    heap_sink = p;
    p = realloc(p, 0);
    keep[2] = p; /* NULL */
}

__attribute__((noinline)) static void do_posix_memalign(void) {
    void *p = NULL;
    if (posix_memalign(&p, 64, 3000) != 0) _exit(5);
    keep[3] = p;
}

__attribute__((noinline)) static void do_aligned_alloc(void) { keep[4] = aligned_alloc(128, 4096); }

__attribute__((noinline)) static void do_memalign(void) { keep[5] = memalign(256, 999); }

__attribute__((noinline)) static void do_valloc(void) { keep[6] = valloc(12345); }

__attribute__((noinline)) static void do_pvalloc(void) { keep[7] = pvalloc(5000); }

/* strdup allocates inside libc, which has no frame pointers here: the shim must still
 * find do_strdup as the caller. */
__attribute__((noinline)) static void do_strdup(void) { keep[8] = strdup("seventeen bytes!"); }

__attribute__((noinline)) static void do_free_all_aligned(void) {
    /* memalign-family blocks go back through plain free */
    free(keep[3]);
    free(keep[4]);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *dir = argv[1];
    say("ready %d\n", (int)getpid());
    wait_for(dir, "go");
    do_calloc();
    do_realloc();
    do_realloc_edges();
    do_posix_memalign();
    do_aligned_alloc();
    do_memalign();
    do_valloc();
    do_pvalloc();
    do_strdup();
    do_free_all_aligned();
    say("done %zu\n", (size_t)sysconf(_SC_PAGESIZE));
    wait_for(dir, "exit");
    return 0;
}
