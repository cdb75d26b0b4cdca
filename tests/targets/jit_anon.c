/* JIT code as rsprof sees it: a spin loop copied into an anonymous executable page.
   Prints "ready PID PAGE" and spins until killed; the test (or bench/bench_perfmap.py)
   writes /tmp/perf-PID.map naming the page. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* dec rdi; jnz -5; ret */
static const unsigned char code[] = {0x48, 0xff, 0xcf, 0x75, 0xfb, 0xc3};

int main(void) {
    unsigned char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 1;
    memcpy(page, code, sizeof code);
    printf("ready %d %lx\n", getpid(), (unsigned long)page);
    fflush(stdout);
    void (*spin)(long) = (void (*)(long))page;
    for (;;) spin(100000000L);
}
