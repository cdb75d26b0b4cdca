/* A target that abuses its own heap ring while rsprof reads it (issue 11).
 *
 * Run under the shim (rsprof run): allocates a little, spins on the CPU, and after
 * DELAY_MS does MODE to its ring /dev/shm/rsprof-heap.<pid>.<suffix>, then keeps spinning until SECONDS:
 *   none      nothing (baseline)
 *   truncate  ftruncate the ring file to its header (a reader touching it gets SIGBUS)
 *   kind      commit a record of kind 7
 *   depth     commit an ALLOC record of depth 200
 *   lost      set the lost-event counter to 2^63
 *   size      commit an ALLOC record of 2^63 bytes
 *   way       commit an ALLOC_AGAIN record naming way 200 (there are at most 64)
 *   way2      commit an AGAIN_SHORT record naming way 200
 *   random    commit records of random words (seed 11)
 *   flood     write ALLOC records with random stacks and addresses as fast as the ring
 *             takes them, for the rest of the run; a record the full ring cannot take is
 *             lost and counted in the header, as the shim does; prints
 *             "flood committed N" at the end (the records it wrote)
 * Usage: ring_abuse MODE SECONDS [DELAY_MS]
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x3150414548505352ULL
#define HEADER 4096u
#define OFF_RING_SIZE 16
#define OFF_LOST 136
#define OFF_LOST_BYTES 144
#define OFF_WRITE 192
#define OFF_READ 256

static volatile uint64_t sink;
static uint64_t rng = 11;

static uint64_t next_random(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static __attribute__((noinline)) void spin_ms(uint64_t ms) {
    uint64_t end = now_ms() + ms;
    while (now_ms() < end)
        for (int i = 0; i < 10000; i++) sink += (uint64_t)i * 7;
}

static char *base;
static uint64_t ring_size;

static uint64_t *hdr64(size_t off) { return (uint64_t *)(base + off); }

/* Reserves `words` words the way the shim does; NULL-like (-1) when the ring is full. */
static int64_t reserve(unsigned words) {
    uint64_t len = (uint64_t)words * 8;
    uint64_t w = __atomic_load_n(hdr64(OFF_WRITE), __ATOMIC_RELAXED);
    for (;;) {
        uint64_t r = __atomic_load_n(hdr64(OFF_READ), __ATOMIC_ACQUIRE);
        if (w + len - r > ring_size) return -1;
        if (__atomic_compare_exchange_n(hdr64(OFF_WRITE), &w, w + len, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return (int64_t)w;
    }
}

static void put(uint64_t pos, unsigned k, uint64_t v) {
    uint64_t *data = (uint64_t *)(base + HEADER);
    uint64_t mask = ring_size / 8 - 1;
    data[((pos >> 3) + k) & mask] = v;
}

static void commit(uint64_t pos, uint64_t head) {
    uint64_t *data = (uint64_t *)(base + HEADER);
    __atomic_store_n(&data[(pos >> 3) & (ring_size / 8 - 1)], head, __ATOMIC_RELEASE);
}

static uint64_t head_of(unsigned kind, unsigned depth) {
    return (uint64_t)(kind & 0xff) | ((uint64_t)(depth & 0xff) << 8) |
           ((uint64_t)getpid() << 32);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *mode = argv[1];
    uint64_t total_ms = (uint64_t)(atof(argv[2]) * 1000);
    uint64_t delay_ms = argc > 3 ? (uint64_t)atol(argv[3]) : 600;
    uint64_t start = now_ms();
    static void *volatile keep[100]; /* a little real heap data (volatile: not elided) */
    for (int i = 0; i < 100; i++) keep[i] = malloc(64 + (size_t)i);
    for (int i = 0; i < 50; i++) free(keep[i]);
    /* Its ring: the one name in /dev/shm of the form rsprof-heap.<pid>.<random suffix>. */
    char path[320] = "", prefix[64];
    snprintf(prefix, sizeof prefix, "rsprof-heap.%d.", (int)getpid());
    DIR *dir = opendir("/dev/shm");
    for (struct dirent *de; dir != NULL && (de = readdir(dir)) != NULL;)
        if (strncmp(de->d_name, prefix, strlen(prefix)) == 0)
            snprintf(path, sizeof path, "/dev/shm/%s", de->d_name);
    if (dir != NULL) closedir(dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        perror("ring");
        return 3;
    }
    struct stat st;
    fstat(fd, &st);
    base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED || *hdr64(0) != MAGIC) return 4;
    ring_size = *hdr64(OFF_RING_SIZE);
    unsigned max_depth = *(uint32_t *)(base + 56);
    spin_ms(delay_ms);
    if (strcmp(mode, "truncate") == 0) {
        if (ftruncate(fd, HEADER) != 0) return 5;
    } else if (strcmp(mode, "kind") == 0) {
        int64_t p = reserve(2);
        if (p >= 0) {
            put((uint64_t)p, 1, 0x1000);
            commit((uint64_t)p, head_of(7, 0));
        }
    } else if (strcmp(mode, "depth") == 0) {
        int64_t p = reserve(3 + 64);
        if (p >= 0) commit((uint64_t)p, head_of(1, 200));
    } else if (strcmp(mode, "way") == 0) {
        int64_t p = reserve(3);
        if (p >= 0) {
            put((uint64_t)p, 1, 0x7f0000001000ull);
            put((uint64_t)p, 2, 64);
            commit((uint64_t)p, head_of(3, 0) | (uint64_t)201 << 24);
        }
    } else if (strcmp(mode, "way2") == 0) {
        int64_t p = reserve(2);
        if (p >= 0) {
            put((uint64_t)p, 1, 0x7f0000001000ull);
            commit((uint64_t)p, head_of(5, 0) | (uint64_t)64 << 8 | (uint64_t)201 << 24);
        }
    } else if (strcmp(mode, "lost") == 0) {
        __atomic_store_n(hdr64(OFF_LOST), 1ull << 63, __ATOMIC_RELEASE);
    } else if (strcmp(mode, "size") == 0) {
        int64_t p = reserve(4);
        if (p >= 0) {
            put((uint64_t)p, 1, 0x7f0000001000ull);
            put((uint64_t)p, 2, 1ull << 63);
            put((uint64_t)p, 3, 0x401000);
            commit((uint64_t)p, head_of(1, 1));
        }
    } else if (strcmp(mode, "random") == 0) {
        for (int n = 0; n < 64; n++) {
            int64_t p = reserve(8);
            if (p < 0) break;
            for (unsigned k = 1; k < 8; k++) put((uint64_t)p, k, next_random());
            commit((uint64_t)p, next_random() | 1);
        }
    } else if (strcmp(mode, "flood") == 0) {
        uint64_t end = start + total_ms, committed = 0;
        while (now_ms() < end) {
            for (int n = 0; n < 4096; n++) {
                unsigned depth = max_depth;
                int64_t p = reserve(3 + depth);
                if (p < 0) { /* the shim's rule for a full ring: dropped, counted */
                    __atomic_fetch_add(hdr64(OFF_LOST), 1, __ATOMIC_RELAXED);
                    __atomic_fetch_add(hdr64(OFF_LOST_BYTES), (3 + depth) * 8, __ATOMIC_RELAXED);
                    break;
                }
                put((uint64_t)p, 1, (next_random() & 0x7ffffffff0ull) | 0x10); /* address */
                put((uint64_t)p, 2, 32);
                for (unsigned k = 0; k < depth; k++)
                    put((uint64_t)p, 3 + k, next_random() & 0x7fffffffffffull);
                commit((uint64_t)p, head_of(1, depth));
                committed++;
            }
        }
        printf("flood committed %llu\n", (unsigned long long)committed);
        fflush(stdout);
    }
    uint64_t elapsed = now_ms() - start;
    if (elapsed < total_ms) spin_ms(total_ms - elapsed);
    return 0;
}
