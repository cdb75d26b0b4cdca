/* JIT code as rsprof sees it: a spin loop copied into an anonymous executable page.
   Prints "ready PID PAGE" and spins until killed; the test (or bench/bench_perfmap.py)
   writes /tmp/perf-PID.map naming the page, or with --map the program writes it itself,
   in its own /tmp and under its own pid, as a JIT runtime does. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* dec rdi; jnz -5; ret */
static const unsigned char code[] = {0x48, 0xff, 0xcf, 0x75, 0xfb, 0xc3};

int main(int argc, char **argv) {
    unsigned char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 1;
    memcpy(page, code, sizeof code);
    if (argc > 1 && strcmp(argv[1], "--map") == 0) {
        char name[64];
        snprintf(name, sizeof name, "/tmp/perf-%d.map", getpid());
        FILE *map = fopen(name, "w");
        if (map == NULL) return 2;
        fprintf(map, "%lx 6 jit_spin\n", (unsigned long)page);
        fclose(map);
    }
    printf("ready %d %lx\n", getpid(), (unsigned long)page);
    fflush(stdout);
    void (*spin)(long) = (void (*)(long))page;
    for (;;) spin(100000000L);
}
