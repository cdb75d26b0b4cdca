/* Helpers shared by the heap_*.c test targets: unbuffered line output (fork-safe) and a
 * file-based rendezvous with the test (stdin is shared between a parent and its fork
 * children, so flag files are the simplest unambiguous "go" signal). */
#ifndef HEAP_COMMON_H
#define HEAP_COMMON_H
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void say(const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0 && write(1, buf, (size_t)n) != n) _exit(3);
}

/* Waits until <dir>/<name> exists (the test creates it). */
static void wait_for(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct timespec nap = {0, 2000000};
    for (int i = 0; i < 30000; i++) { /* 60 s at most: never hang a test run */
        if (access(path, F_OK) == 0) return;
        nanosleep(&nap, NULL);
    }
    _exit(4);
}

/* Keeps the compiler from eliding malloc/free pairs. */
static void *volatile heap_sink;
#endif
