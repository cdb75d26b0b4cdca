/* A library for shim_dlopen.c: its constructor allocates while dlopen holds the loader
 * lock, lib_alloc() allocates from a dlopen'ed module without frame pointers. */
#include <stdlib.h>
#include <string.h>

static char *at_load;

__attribute__((constructor)) static void lib_ctor(void) {
    at_load = malloc(64);
    if (at_load) memset(at_load, 1, 64);
}

__attribute__((destructor)) static void lib_dtor(void) { free(at_load); }

__attribute__((noinline)) void *lib_alloc(size_t n) {
    void *p = malloc(n);
    if (p == NULL) abort();
    return p;
}
