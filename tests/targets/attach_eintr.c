/* Target of tests/system/test_heap_attach.py's EINTR test: started WITHOUT rsprof and attached by
 * `rsprof -p`, whose ptrace stop must never make a system call of the program fail with
 * EINTR. The main thread reads its commands with raw read(2) on stdin (no stdio, no
 * retry: an EINTR is counted, not hidden); with argument "sleeper" a second thread sleeps
 * in nanosleep(2) 2 ms at a time, counting EINTRs too. So the thread the injection stops
 * is blocked in read() (alone) or in nanosleep() (the sleeper: tried first).
 *   "alloc N"  N blocks of 4000 bytes kept live at eintr_keep_site; prints "done alloc N"
 *   "free"     frees them; prints "done free"
 *   "quit"     prints the EINTR counts and exits with status 0. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 4000
#define MAX_KEEP 10000

static volatile int quitting;
static long read_eintr, sleep_eintr;

__attribute__((noinline)) static char *eintr_keep_site(void) { return malloc(BLOCK); }

static void *sleeper(void *arg) {
    (void)arg;
    while (!quitting) {
        struct timespec t = {0, 2000000}, rem;
        if (nanosleep(&t, &rem) == -1 && errno == EINTR) __atomic_add_fetch(&sleep_eintr, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void say(const char *text) {
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t w = write(1, text, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) exit(2);
        text += w, n -= (size_t)w;
    }
}

int main(int argc, char **argv) {
    static char *kept[MAX_KEEP];
    int nkept = 0;
    pthread_t thread;
    int with_sleeper = argc > 1 && strcmp(argv[1], "sleeper") == 0;
    if (with_sleeper) pthread_create(&thread, NULL, sleeper, NULL);
    say("ready\n");
    char line[256];
    size_t have = 0;
    for (;;) {
        char *nl = memchr(line, '\n', have);
        if (nl == NULL) {
            if (have == sizeof line) exit(2);
            ssize_t got = read(0, line + have, sizeof line - have);
            if (got < 0 && errno == EINTR) {
                read_eintr++;
                continue;
            }
            if (got <= 0) break;
            have += (size_t)got;
            continue;
        }
        *nl = '\0';
        char out[64];
        int n;
        if (sscanf(line, "alloc %d", &n) == 1) {
            for (int i = 0; i < n && nkept < MAX_KEEP; i++) {
                char *p = eintr_keep_site();
                memset(p, i, BLOCK);
                kept[nkept++] = p;
            }
            snprintf(out, sizeof out, "done alloc %d\n", n);
            say(out);
        } else if (strcmp(line, "free") == 0) {
            for (int i = 0; i < nkept; i++) free(kept[i]);
            nkept = 0;
            say("done free\n");
        } else if (strcmp(line, "quit") == 0) {
            break;
        }
        size_t used = (size_t)(nl + 1 - line);
        memmove(line, nl + 1, have - used);
        have -= used;
    }
    quitting = 1;
    if (with_sleeper) pthread_join(thread, NULL);
    char out[96];
    snprintf(out, sizeof out, "eintr read %ld sleep %ld\n", read_eintr, sleep_eintr);
    say(out);
    return 0;
}
