/* A non-PIE program that takes the address of free (as GCC's cc1 does): the executable's
 * dynamic symbol table then has free as an undefined symbol with the address of its PLT
 * stub, the "canonical" address every module sees, so dlsym(RTLD_DEFAULT, "free") returns
 * the stub, not the heap shim's free. The stub still jumps to the shim: nothing is missed.
 * Leaks LEAKS blocks of 1000 bytes through malloc and frees the rest through the pointer. */
#include <stdio.h>
#include <stdlib.h>

#define BLOCKS 500
#define LEAKS 7

void (*volatile release)(void *);

__attribute__((noinline)) static void *make_block(void) { return malloc(1000); }

int main(void) {
    release = free; /* in code, non-PIC: an absolute address, so the PLT stub is canonical */
    void *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) blocks[i] = make_block();
    for (int i = LEAKS; i < BLOCKS; i++) release(blocks[i]);
    printf("freeptr done %d\n", LEAKS);
    return 0;
}
