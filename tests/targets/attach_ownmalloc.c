/* Linked with attach_alloc.c by tests/system/test_heap_attach.py: an executable that defines malloc,
 * free, calloc and realloc itself (here thin ones over glibc's __libc_* entry points), which
 * the process binds every module's calls to: rsprof -p must refuse its heap (the shim
 * forwards to libc's allocator and would see none of these calls), not record nothing. */
#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t m, size_t n) { return __libc_calloc(m, n); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
