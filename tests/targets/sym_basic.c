/* Target for tests/system/test_symbols.py: plain functions, a forced inline and an assembly label. */
#include <stdio.h>
#include <stdlib.h>

volatile unsigned long sink;

static inline __attribute__((always_inline)) unsigned long mix(unsigned long x) {
    unsigned long y = x * 2654435761u;   /* INLINE_BODY */
    y ^= y >> 13;
    sink += y;
    return y;
}

__attribute__((noinline)) unsigned long outer_work(unsigned long n) {
    unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++) {
        acc += mix(i + acc); /* CALL_SITE */
    }
    return acc;
}

__attribute__((noinline)) unsigned long leaf_sum(unsigned long n) {
    unsigned long s = 0;
    for (unsigned long i = 0; i < n; i++) s += i * i; /* LEAF_LOOP */
    return s;
}

/* No .type/.size: a zero-sized, untyped symbol in .text, as hand-written assembly makes. */
__asm__(".text\n.globl asm_label\nasm_label:\n\tnop\n\tnop\n\tnop\n\tret\n");
void asm_label(void);

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000;
    asm_label();
    printf("%lu %lu\n", outer_work(n), leaf_sum(n));
    return 0;
}
