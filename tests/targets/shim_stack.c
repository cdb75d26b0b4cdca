/* shim_stack.c: how much stack an allocator call takes, with and without the heap shim.
 *
 *   shim_stack measure     a thread on a 256 KiB stack of our own fills what lies below its
 *                          frame with a pattern, calls the allocator (first call of the
 *                          thread, new call sites, repeated calls, free, calloc, realloc,
 *                          posix_memalign) and finds the deepest byte that changed; prints
 *                          "deepest N" (bytes below the probe's frame, the maximum of all).
 *   shim_stack recurse B   a thread with a 16 KiB stack (PTHREAD_STACK_MIN) recurses B bytes
 *                          deep, then allocates and frees there; prints "recurse ok" or dies
 *                          with SIGSEGV when the stack is too small.
 *   shim_stack main B      the same on the main thread (whose limit is RLIMIT_STACK).
 *   shim_stack threads N   N threads one after the other, each allocating; then prints
 *                          "vmsize KB" (per-thread memory that outlived its thread would
 *                          show as more of it).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NOINLINE __attribute__((noinline))
#define PATTERN 0xA5
#define PROBE_STACK (256u * 1024u)

static uintptr_t g_lo; /* lowest address of the probe thread's stack */
static void *volatile g_keep[64];

NOINLINE static void op_malloc_a(void) { g_keep[0] = malloc(40); }
NOINLINE static void op_malloc_b(void) { g_keep[1] = malloc(4000); }
NOINLINE static void op_calloc(void) { g_keep[2] = calloc(10, 30); }
NOINLINE static void op_realloc(void) { g_keep[0] = realloc(g_keep[0], 9000); }
NOINLINE static void op_memalign(void) {
    void *p = NULL;
    if (posix_memalign(&p, 64, 200) == 0) g_keep[3] = p;
}
NOINLINE static void op_free(void) {
    for (int i = 0; i < 4; i++) {
        free(g_keep[i]);
        g_keep[i] = NULL;
    }
}
NOINLINE static void op_big(void) {
    g_keep[4] = malloc(1 << 20);
    free(g_keep[4]);
}
NOINLINE static void op_many(void) {
    for (int i = 0; i < 1000; i++) {
        g_keep[5] = malloc((size_t)(i % 100) + 1);
        free(g_keep[5]);
    }
}

/* Fills [g_lo, below) with the pattern without calling anything. */
NOINLINE static void fill(uintptr_t below) {
    for (volatile unsigned char *p = (unsigned char *)g_lo; (uintptr_t)p < below; p++)
        *p = PATTERN;
}

/* Deepest byte touched by op, as a distance below this frame. */
NOINLINE static size_t probe(void (*op)(void)) {
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    uintptr_t below = here - 160; /* fill()'s own frame lies above this */
    fill(below);
    op();
    uintptr_t p = g_lo;
    while (p < below && *(volatile unsigned char *)p == PATTERN) p++;
    return p >= below ? 0 : here - p;
}

static void *measure(void *arg) {
    (void)arg;
    void (*ops[])(void) = {op_malloc_a, op_malloc_b, op_calloc,  op_realloc, op_memalign,
                           op_free,     op_malloc_a, op_malloc_b, op_free,   op_big,
                           op_many};
    const char *names[] = {"malloc-first", "malloc-site2", "calloc", "realloc", "memalign",
                           "free", "malloc-again", "malloc-again2", "free-again", "big",
                           "many"};
    size_t deepest = 0;
    for (unsigned i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        size_t d = probe(ops[i]);
        printf("%s %zu\n", names[i], d);
        if (d > deepest) deepest = d;
    }
    printf("deepest %zu\n", deepest);
    return NULL;
}

static volatile size_t g_sink;

/* Each level holds 256 bytes of its own. */
NOINLINE static void recurse(size_t left) {
    volatile char pad[240];
    pad[0] = (char)left;
    if (left >= 256) {
        recurse(left - 256);
    } else {
        void *p = malloc(48);
        void *q = calloc(3, 100);
        p = realloc(p, 5000);
        free(q);
        free(p);
    }
    g_sink += (size_t)pad[0];
}

static void *alloc_thread(void *arg) {
    (void)arg;
    void *p = malloc(100);
    g_keep[6] = p;
    free(p);
    return NULL;
}

/* VmSize in kB, from /proc/self/status (adjacent anonymous mappings merge: a count of
 * /proc/self/maps lines would not show memory that outlived its threads). */
static long vm_size_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "VmSize:", 7) == 0) kb = strtol(line + 7, NULL, 10);
    fclose(f);
    return kb;
}

static void *recurse_thread(void *arg) {
    recurse((size_t)(uintptr_t)arg);
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_t th;
    if (argc >= 2 && strcmp(argv[1], "measure") == 0) {
        void *stack = mmap(NULL, PROBE_STACK, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (stack == MAP_FAILED) return 1;
        g_lo = (uintptr_t)stack;
        pthread_attr_setstack(&attr, stack, PROBE_STACK);
        if (pthread_create(&th, &attr, measure, NULL) != 0) return 1;
    } else if (argc >= 3 && strcmp(argv[1], "threads") == 0) {
        long n = strtol(argv[2], NULL, 10);
        for (long i = 0; i < n; i++) {
            if (pthread_create(&th, NULL, alloc_thread, NULL) != 0) return 1;
            pthread_join(th, NULL);
        }
        printf("vmsize %ld\n", vm_size_kb());
        return 0;
    } else if (argc >= 3 && strcmp(argv[1], "main") == 0) {
        recurse(strtoul(argv[2], NULL, 10));
        printf("recurse ok\n");
        return 0;
    } else if (argc >= 3 && strcmp(argv[1], "recurse") == 0) {
        pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN);
        size_t bytes = strtoul(argv[2], NULL, 10);
        if (pthread_create(&th, &attr, recurse_thread, (void *)(uintptr_t)bytes) != 0) return 1;
    } else {
        fprintf(stderr, "usage: shim_stack measure | recurse BYTES | main BYTES | threads N\n");
        return 2;
    }
    pthread_join(th, NULL);
    if (argv[1][0] == 'r') printf("recurse ok\n");
    return 0;
}
