/* Target of tests/system/test_heap_attach.py: started WITHOUT rsprof, then attached by `rsprof -p`.
 * Four threads churn 4000-byte blocks at attach_spin_site all the time (allocation going on
 * while the shim is injected), and on command from stdin allocate exactly:
 *   "alloc N"  each thread: N blocks kept live at attach_keep_site, N freed at once at
 *              attach_churn_site; prints "done alloc N"
 *   "free"     each thread frees its kept blocks (also those allocated before the attach);
 *              prints "done free"
 *   "fork N"   forks N children while the threads churn on; each allocates and frees 10
 *              blocks, then leaves with _exit(0); prints "done fork N"
 *   "quit"     prints a checksum of everything it wrote and exits with status 7.
 * Its output never depends on timing, so a run under attach/detach must print exactly what
 * a plain run prints.  Built as C++ (g++ -x c++) it has 8 threads and allocates with
 * new[] / delete[] (operator new through libstdc++). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __cplusplus
#define THREADS 8
#define ALLOC(n) (new char[n])
#define FREE(p) (delete[] (p))
#else
#define THREADS 4
#define ALLOC(n) ((char *)malloc(n))
#define FREE(p) free(p)
#endif
#define BLOCK 4000
#define MAX_KEEP 100000

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER, done_cond = PTHREAD_COND_INITIALIZER;
static int command_seq, command_kind, command_n, done_count, quitting;
static uint64_t checksum[THREADS];

typedef struct {
    int id;
    char *kept[MAX_KEEP];
    int nkept;
} worker;

__attribute__((noinline)) static char *attach_keep_site(void) { return ALLOC(BLOCK); }
__attribute__((noinline)) static char *attach_churn_site(void) { return ALLOC(BLOCK); }
__attribute__((noinline)) static char *attach_spin_site(void) { return ALLOC(BLOCK); }

static void fill(char *p, int seed) {
    memset(p, seed & 0xff, BLOCK);
}

static void *run(void *arg) {
    worker *w = (worker *)arg;
    int seen = 0;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (command_seq == seen && !quitting) {
            pthread_mutex_unlock(&lock);
            char *p = attach_spin_site(); /* churn between commands */
            fill(p, w->id);
            FREE(p);
            usleep(500);
            pthread_mutex_lock(&lock);
        }
        if (quitting) {
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        seen = command_seq;
        int kind = command_kind, n = command_n;
        pthread_mutex_unlock(&lock);
        if (kind == 1) {
            for (int i = 0; i < n && w->nkept < MAX_KEEP; i++) {
                char *k = attach_keep_site();
                fill(k, i + w->id);
                checksum[w->id] += (unsigned char)k[BLOCK - 1];
                w->kept[w->nkept++] = k;
                char *c = attach_churn_site();
                fill(c, i);
                checksum[w->id] += (unsigned char)c[7];
                FREE(c);
            }
        } else if (kind == 2) {
            for (int i = 0; i < w->nkept; i++) FREE(w->kept[i]);
            w->nkept = 0;
        }
        pthread_mutex_lock(&lock);
        done_count++;
        pthread_cond_broadcast(&done_cond);
        pthread_mutex_unlock(&lock);
    }
}

static void command(int kind, int n) {
    pthread_mutex_lock(&lock);
    command_kind = kind;
    command_n = n;
    done_count = 0;
    command_seq++;
    pthread_cond_broadcast(&cond);
    while (done_count < THREADS) pthread_cond_wait(&done_cond, &lock);
    pthread_mutex_unlock(&lock);
}

int main(void) {
    static worker workers[THREADS];
    pthread_t threads[THREADS];
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < THREADS; i++) {
        workers[i].id = i;
        pthread_create(&threads[i], NULL, run, &workers[i]);
    }
    printf("ready\n");
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        int n;
        if (sscanf(line, "alloc %d", &n) == 1) {
            command(1, n);
            printf("done alloc %d\n", n);
        } else if (sscanf(line, "fork %d", &n) == 1) {
            for (int i = 0; i < n; i++) {
                pid_t child = fork();
                if (child == 0) {
                    for (int k = 0; k < 10; k++) FREE(attach_churn_site());
                    _exit(0);
                }
                int status;
                waitpid(child, &status, 0);
            }
            printf("done fork %d\n", n);
        } else if (strncmp(line, "free", 4) == 0) {
            command(2, 0);
            printf("done free\n");
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
    }
    pthread_mutex_lock(&lock);
    quitting = 1;
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    uint64_t sum = 0;
    for (int i = 0; i < THREADS; i++) sum += checksum[i];
    printf("sum %llu\n", (unsigned long long)sum);
    return 7;
}
