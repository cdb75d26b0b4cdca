/* shimcfi.h: call stacks by CFI inside the heap shim (native/shim/shimcfi.c).
 *
 * Everything here may run inside malloc, with any lock of the target held: no allocation,
 * no lock, no dl_iterate_phdr.  Modules are found with glibc's lock-free _dl_find_object
 * (2.35+), rules are computed from the module's .eh_frame_hdr / .eh_frame in memory the
 * first time a return address is seen and cached in a fixed-size lock-free table mapped at
 * init.  See docs/heap-ring.md, "Stack capture".
 */
#ifndef RSPROF_SHIMCFI_H
#define RSPROF_SHIMCFI_H

#include <stdint.h>

/* Sets up the rule cache and resolves _dl_find_object.  Call once, at shim init, outside
 * any allocator call (it calls dlsym and mmap).  Returns 1 when CFI unwinding is
 * available, 0 otherwise (glibc older than 2.35, or no memory for the cache). */
int shimcfi_init(void);

/* Forgets every cached rule: a module was unloaded, and its addresses may be reused by
 * the next one.  Lock-free; concurrent walks recompute what they miss. */
void shimcfi_flush(void);

/* Working memory of a walk, kept off the target's stack (a thread with a 16 KiB stack must
 * not run out of it inside malloc): the caller owns one per thread and nesting level, in
 * memory of its own (docs/heap-ring.md, "Stack use").  Sizes are checked in shimcfi.c and
 * shimmemo.h. */
#define SHIMCFI_WAYS 64
#define SHIMCFI_SCRATCH_BYTES 768
#define SHIMCFI_MEMO_BYTES (1216u * SHIMCFI_WAYS + 832u)
typedef struct {
    _Alignas(16) unsigned char bytes[SHIMCFI_SCRATCH_BYTES];
} shimcfi_scratch; /* a rule's computation: module bounds, CIE, CFA program state */
typedef struct {
    _Alignas(64) unsigned char bytes[SHIMCFI_MEMO_BYTES];
} shimcfi_memo; /* SHIMCFI_WAYS recent walks of a thread; all zero is empty */

/* Empties a memo that passes to another thread (without touching its ways). */
void shimcfi_memo_reset(shimcfi_memo *memo);

/* Walks the stack by CFI.  ips[0 .. n) are already filled, ips[n - 1] == pc is the return
 * address into the frame to unwind next, sp the value of the stack pointer in that frame
 * right after the call returned, bp its frame pointer register.  Every stack read lies in
 * [lo, hi).  Appends return addresses (an interrupted pc after a signal frame as pc + 1)
 * up to max entries; sets *truncated when frames remained.  Returns the new count.
 *
 * Up to SHIMCFI_WAYS recent walks of the thread are memoized in *memo (exactly: see
 * shimcfi.c).  With `memo` NULL it is neither used nor touched (a walk nested in another
 * one's recording: a signal handler that allocates).  Otherwise *way receives the memo way
 * that now holds this walk's stack (-1: none) and *hit whether it was already there (1) or
 * has just been written (0); the way predicted for this walk is not checked here: the
 * caller checks it first, inline (shimcfi_memo_hit, shimmemo.h).  A caller that has told
 * its reader "way w of this thread is
 * stack S" may say "way w again" after a hit.  On a hit, ips[n ..) are NOT filled: the
 * frames are at shimcfi_memo_frames(memo, way) (until the thread's next walk), and the
 * return value counts them.  `scratch` is used when a rule is computed; one walk at a
 * time per scratch. */
unsigned shimcfi_walk(uint64_t *ips, unsigned n, unsigned max, uintptr_t sp, uintptr_t bp,
                      uintptr_t lo, uintptr_t hi, int *truncated, shimcfi_memo *memo,
                      shimcfi_scratch *scratch, int *way, int *hit);

/* Walks of this memo's thread that the ways predicted from its last walk did not hold
 * (shimcfi_memo_hit), so that shimcfi_walk looked them up or walked them (for
 * RSPROF_HEAP_DEBUG and the tests). */
uint64_t shimcfi_memo_lookups(const shimcfi_memo *memo);

/* The frames after ips[0] of the walk memoized in `way` (after a hit). */
const uint64_t *shimcfi_memo_frames(const shimcfi_memo *memo, int way);

/* Counters for RSPROF_HEAP_DEBUG and the tests: rules computed (cache misses), rules that
 * did not fit the cache window, frames walked by the frame-pointer fallback. */
typedef struct {
    uint64_t computed, uncached, fp_frames;
} shimcfi_stats;
void shimcfi_get_stats(shimcfi_stats *out);

#endif
