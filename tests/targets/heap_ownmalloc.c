/* heap_ownmalloc.c: a program with an allocator of its own: malloc, free, calloc and realloc
 * defined in the executable, which precedes LD_PRELOAD in symbol lookup, so neither it nor
 * libc ever calls the heap shim's.  A bump allocator over a static arena; blocks that are not
 * its own (libc's memalign & co) are left alone.  Allocates 1000 blocks and leaks them. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define ARENA (16u << 20)
static _Alignas(16) unsigned char g_arena[ARENA];
static size_t g_used;

static int mine(const void *p) { return (uintptr_t)p - (uintptr_t)g_arena < ARENA; }

void *malloc(size_t n) {
    size_t start = (g_used + 16 + 15) & ~(size_t)15;
    if (start > ARENA || n > ARENA - start) return NULL;
    g_used = start + n;
    ((size_t *)(g_arena + start))[-1] = n;
    return g_arena + start;
}

void free(void *p) { (void)p; }

void *calloc(size_t m, size_t n) {
    if (n && m > SIZE_MAX / n) return NULL;
    return malloc(m * n); /* the arena is static: already zero, never reused */
}

void *realloc(void *p, size_t n) {
    void *q = malloc(n);
    if (q != NULL && p != NULL && mine(p)) {
        size_t old = ((size_t *)p)[-1];
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}

static void *volatile g_keep[1000];

int main(void) {
    for (int i = 0; i < 1000; i++) g_keep[i] = malloc(100);
    printf("own malloc done %d\n", mine(g_keep[0]));
    return 0;
}
