/* rs_unwind.h: CFI stack unwinding of sampled user stacks (native/unwind.c).
 *
 * A sample brings the user registers (ip, sp, bp) and a copy of the top of the user stack;
 * rs_unwind() walks it with compact tables built once per module from .eh_frame (or
 * .debug_frame, also from a separate debug file).  Everything here is plain C with no
 * Python API, so it runs in the drain with the GIL released.  An rs_space is not thread
 * safe: perf.c serialises access with its mutex.  The module cache behind it is global and
 * guarded by its own mutex.
 */
#ifndef RSPROF_UNWIND_H
#define RSPROF_UNWIND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rs_space rs_space;

typedef struct {
    uint64_t frames;          /* frames produced by CFI rules */
    uint64_t fp_frames;       /* frames produced by the frame-pointer fallback */
    uint64_t truncated;       /* stacks that ended in a [truncated] root */
    uint64_t modules_loaded;  /* modules whose CFI this space parsed or took from the cache */
} rs_unwind_stats;

/* A truncated stack ends with RS_TRUNCATED_ADDRESS (stackwords.h). */
#include "stackwords.h"

rs_space *rs_space_new(int32_t pid);
void rs_space_free(rs_space *space);
/* A forked process: the parent's mappings (no stats), for the child's pid. */
rs_space *rs_space_clone(const rs_space *src, int32_t pid);
/* The target exec'd: every mapping is gone. */
void rs_space_clear(rs_space *space);
/* Adds the executable mappings listed in /proc/PID/maps; false if it cannot be read. */
bool rs_space_read_proc_maps(rs_space *space);
/* One executable mapping (MMAP2 record); later mappings replace what they overlap. */
void rs_space_add(rs_space *space, uint64_t start, uint64_t end, uint64_t pgoff, const char *path);
const rs_unwind_stats *rs_space_stats(const rs_space *space);

/* Walks one sample.  out[0] is ip, then return addresses (callers are resolved at
 * address - 1; a frame interrupted by a signal is reported as its pc + 1 for the same
 * reason).  A walk that stops at something it cannot justify ends with
 * RS_TRUNCATED_ADDRESS and sets *truncated.  Returns the number of entries in out. */
uint32_t rs_unwind(rs_space *space, uint64_t ip, uint64_t sp, uint64_t bp, const uint8_t *stack,
                   uint64_t stack_len, uint64_t *out, uint32_t max, bool *truncated);

/* For symbolization of stripped code and for tests: the FDE function ranges of one ELF
 * file, as (start, end) link-time addresses sorted by start.  *n = 0 when it has no CFI.
 * The array belongs to the global cache.  Returns false if the file cannot be read. */
bool rs_cfi_functions(const char *path, const uint64_t **ranges, size_t *n, size_t *rows,
                      double *build_ms);

#endif
