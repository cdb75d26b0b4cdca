/* heap_sites: three allocation sites with exactly known behaviour.
 *   leak_site:  LEAK_SIZE bytes per tick, never freed
 *   churn_site: CHURN_SIZE bytes per tick, freed at once
 *   keep_site:  one block of KEEP_SIZE bytes, kept
 * Usage: heap_sites <ticks> <dir> [rounds]: prints "ready <pid>", waits for <dir>/go, runs
 * the ticks, prints "done"; each further round k waits for <dir>/go<k>, runs the ticks again
 * and prints "done"; then waits for <dir>/exit, exits 0. */
#include "heap_common.h"

#define LEAK_SIZE 1000
#define CHURN_SIZE 777
#define KEEP_SIZE 123457

static void **leaked;

__attribute__((noinline)) static void *leak_site(void) { return malloc(LEAK_SIZE); }

__attribute__((noinline)) static void churn_site(void) {
    heap_sink = malloc(CHURN_SIZE);
    free(heap_sink);
}

__attribute__((noinline)) static void *keep_site(void) { return malloc(KEEP_SIZE); }

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) return 2;
    long ticks = atol(argv[1]);
    const char *dir = argv[2];
    int rounds = argc == 4 ? atoi(argv[3]) : 1;
    leaked = calloc((size_t)(ticks * rounds), sizeof *leaked);
    say("ready %d\n", (int)getpid());
    wait_for(dir, "go");
    void *kept = keep_site();
    for (int round = 1; round <= rounds; round++) {
        if (round > 1) {
            char go[16];
            snprintf(go, sizeof go, "go%d", round);
            wait_for(dir, go);
        }
        for (long i = 0; i < ticks; i++) {
            leaked[(round - 1) * ticks + i] = leak_site();
            churn_site();
        }
        say("done\n");
    }
    wait_for(dir, "exit");
    heap_sink = kept;
    return 0;
}
