/* heap_longpath_lib: lib_alloc() keeps a return address into its caller in its own frame
 * (as a spilled register or a stale slot can), then calls malloc.  Built with frame
 * pointers, so the heap shim's frame-pointer walk has no gap to scan here; a scan, done when
 * the library passes for a frame-pointer-less one (libc), reads that word as one more
 * caller: the caller twice. */
#include <stdint.h>
#include <stdlib.h>

__attribute__((noinline)) void *lib_alloc(size_t n) {
    volatile uintptr_t caller = (uintptr_t)__builtin_return_address(0);
    void *p = malloc(n);
    if (p == NULL) abort(); /* not a tail call: lib_alloc's frame stays below malloc */
    (void)caller;
    return p;
}
