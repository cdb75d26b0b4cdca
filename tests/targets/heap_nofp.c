/* heap_nofp: allocations whose call stacks only CFI can walk (built -O2
 * -fomit-frame-pointer; Debian's libc has no frame pointers either).
 *   - xalloc(), a helper without a frame of its own, called by make_nodes (30 x 48 B) and
 *     make_names (10 x 48 B): the helper is the call site, its callers tell the stacks apart;
 *   - dup_labels(): strdup in libc (20 x 13 B);
 *   - by_key(), a qsort comparator that leaks 16 B per call, called from inside libc's
 *     qsort, itself called by sort_records();
 *   - thread_leak(), in a thread: 25 x 40 B;
 *   - on_signal(), a signal handler run by raise() in signal_site(): 3 x 24 B, whose
 *     stacks go through the kernel's signal frame (libc's __restore_rt).
 * Everything is kept (never freed).  Prints "comparisons N" and "nofp ok". */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Global, so the blocks escape: with a static array nobody reads, GCC removes the
 * allocations altogether. */
void *kept[4096];
unsigned n_kept;
static unsigned comparisons;

__attribute__((noinline)) static void keep(void *p) {
    if (n_kept < sizeof kept / sizeof kept[0]) kept[n_kept++] = p;
}

__attribute__((noinline)) void *xalloc(size_t n) {
    void *p = malloc(n);
    if (p == NULL) abort(); /* not a tail call: xalloc stays on the stack */
    return p;
}

/* Different bodies, or GCC's identical code folding would merge the two callers. */
__attribute__((noinline)) void make_nodes(int n) {
    for (int i = 0; i < n; i++) {
        char *p = xalloc(48);
        memset(p, 0, 48);
        keep(p);
    }
}

__attribute__((noinline)) void make_names(int n) {
    for (int i = 0; i < n; i++) {
        char *p = xalloc(48);
        snprintf(p, 48, "name-%d", i);
        keep(p);
    }
}

/* Through a volatile pointer: GCC turns strdup of a literal into malloc + memcpy. */
static const char *volatile label = "label-000000"; /* 12 chars + NUL */

__attribute__((noinline)) void dup_labels(int n) {
    for (int i = 0; i < n; i++) keep(strdup(label));
}

__attribute__((noinline)) int by_key(const void *a, const void *b) {
    char *scratch = malloc(16);
    if (scratch == NULL) abort();
    keep(scratch);
    __atomic_fetch_add(&comparisons, 1, __ATOMIC_RELAXED);
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

__attribute__((noinline)) void sort_records(void) {
    int keys[40];
    for (int i = 0; i < 40; i++) keys[i] = (i * 17) % 40;
    qsort(keys, 40, sizeof keys[0], by_key);
}

__attribute__((noinline)) void thread_leak(int n) {
    for (int i = 0; i < n; i++) keep(malloc(40));
}

static void on_signal(int sig) {
    (void)sig;
    keep(malloc(24));
}

__attribute__((noinline)) void signal_site(int n) {
    for (int i = 0; i < n; i++) raise(SIGUSR1);
}

static void *worker(void *arg) {
    (void)arg;
    thread_leak(25);
    return NULL;
}

int main(void) {
    make_nodes(30);
    make_names(10);
    dup_labels(20);
    sort_records();
    signal(SIGUSR1, on_signal);
    signal_site(3);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) return 1;
    pthread_join(t, NULL);
    printf("comparisons %u\n", comparisons);
    puts("nofp ok");
    return 0;
}
