/* Reproducer for the shim's CFI unwinding against the loader: two threads allocate without
 * pause while main dlopen()s and dlclose()s a library 200 times (its constructor allocates
 * under the loader lock, so the shim unwinds inside dlopen), then keeps it loaded and
 * leaks 10 x 77 B through lib_alloc() called by call_into_lib().
 * Usage: shim_dlopen LIB.  Prints "dlopen ok". */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int stop;
void *sink[16];

static void *churn(void *arg) {
    (void)arg;
    char *mine[16] = {0};
    unsigned i = 0;
    while (!stop) {
        char *p = strdup("churn");
        free(mine[i % 16]);
        mine[i++ % 16] = p;
    }
    for (unsigned k = 0; k < 16; k++) free(mine[k]);
    return NULL;
}

__attribute__((noinline)) void call_into_lib(void *(*lib_alloc)(size_t)) {
    for (int i = 0; i < 10; i++) sink[i] = lib_alloc(77);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, churn, NULL);
    for (int i = 0; i < 200; i++) {
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (h == NULL) return 3;
        void *(*f)(size_t) = (void *(*)(size_t))dlsym(h, "lib_alloc");
        if (f == NULL) return 4;
        free(f(16));
        dlclose(h);
    }
    stop = 1;
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    void *h = dlopen(argv[1], RTLD_NOW);
    if (h == NULL) return 3;
    call_into_lib((void *(*)(size_t))dlsym(h, "lib_alloc"));
    puts("dlopen ok");
    return 0;
}
