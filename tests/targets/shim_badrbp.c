/* Reproducer (binutils): code built without frame pointers calls malloc with arbitrary
 * values in %rbp.  The shim's frame walk must check every step without overflow.
 * Built with -mno-red-zone: the inline asm calls malloc below the compiler's frame. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void *malloc_with_rbp(uintptr_t rbp, size_t n) {
    void *r;
    /* Fixed registers: %rbp cannot be named as a clobber, so nothing may live in it. */
    __asm__ volatile(
        "mov %%rbp, %%r12\n\t"
        "mov %%rsp, %%rbx\n\t"
        "and $-16, %%rsp\n\t"
        "mov %%rsi, %%rbp\n\t"
        "call malloc@PLT\n\t"
        "mov %%rbx, %%rsp\n\t"
        "mov %%r12, %%rbp\n\t"
        : "=a"(r), "+D"(n), "+S"(rbp)
        :
        : "rbx", "r12", "rcx", "rdx", "r8", "r9", "r10", "r11", "memory", "cc");
    return r;
}

int main(void) {
    uintptr_t here = (uintptr_t)&here;
    const uintptr_t values[] = {
        0xfffffffffffffff0u, 0xfffffffffffffff8u, 0x8000000000000000u, 0x7ffffffffff0u,
        1, 0x10, here + 8, here + (1u << 20), (uintptr_t)-16 - here,
    };
    for (unsigned i = 0; i < sizeof values / sizeof values[0]; i++) {
        void *p = malloc_with_rbp(values[i], 32 + i);
        free(p);
    }
    puts("badrbp ok");
    return 0;
}
