/* heap_wrapper: 24 call sites allocate through one wrapper (as sqlite3Malloc, xmalloc or a
 * program's own pool do), in a cycle: malloc is called from one pc at one sp for every
 * path, and the cycle is longer than a memo of the last few walks. Site k allocates
 * 100 + k bytes per tick and frees it at once.
 * Usage: heap_wrapper <ticks> <dir> [mixed|alternate]: prints "ready <pid>", waits for
 * <dir>/go, runs the ticks, prints "done", waits for <dir>/exit, exits 0.  With "mixed" each tick visits
 * every site once in another order (site k * m + i, m cycling through the 8 units mod 24):
 * the site that follows a site changes from tick to tick.  With "alternate" the ticks take
 * two orders in turn (sites in order, then site 5k mod 24): the site that follows a site is
 * one of two. */
#include "heap_common.h"

#define SITES 24

__attribute__((noinline)) static void *xalloc(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory"); /* a real call, not a tail call */
    return p;
}

#define SITE(k)                                                                             \
    __attribute__((noinline)) static void site_##k(void) {                                \
        heap_sink = xalloc(100 + (k));                                                     \
        free(heap_sink);                                                                   \
    }
SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7) SITE(8) SITE(9) SITE(10)
SITE(11) SITE(12) SITE(13) SITE(14) SITE(15) SITE(16) SITE(17) SITE(18) SITE(19) SITE(20)
SITE(21) SITE(22) SITE(23)

static void (*const sites[SITES])(void) = {
    site_0,  site_1,  site_2,  site_3,  site_4,  site_5,  site_6,  site_7,
    site_8,  site_9,  site_10, site_11, site_12, site_13, site_14, site_15,
    site_16, site_17, site_18, site_19, site_20, site_21, site_22, site_23,
};

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) return 2;
    long ticks = atol(argv[1]);
    int mixed = argc == 4 && strcmp(argv[3], "mixed") == 0;
    int alternate = argc == 4 && strcmp(argv[3], "alternate") == 0;
    static const int units[8] = {1, 5, 7, 11, 13, 17, 19, 23};
    say("ready %d\n", (int)getpid());
    wait_for(argv[2], "go");
    for (long i = 0; i < ticks; i++)
        for (int k = 0; k < SITES; k++)
            sites[mixed       ? (k * units[i % 8] + i) % SITES
                  : alternate ? (i % 2 ? k * 5 % SITES : k)
                              : k]();
    say("done\n");
    wait_for(argv[2], "exit");
    return 0;
}
