/* shimpy.h: the Python frames of the allocating thread, read in-process by the heap shim
 * (native/shim/shimpy.c; docs/heap-ring.md, "Python frames"). */
#ifndef RSPROF_SHIMPY_H
#define RSPROF_SHIMPY_H

#include <stdint.h>

/* Looks for a CPython 3.11-3.13 in the process (dlsym of its exported symbols: the
 * interpreter executable or a libpython loaded at start-up). Call once at init, with the
 * shim's re-entrancy guard set (dlsym may allocate). Returns 1 when frames can be read. */
int shimpy_init(int debug);

/* The calling thread's Python frames, innermost first, as the ring's word pairs (see
 * heapring.h) into out[0 .. 2 * max). Returns the number of frames, 0 when the thread does
 * not hold the GIL, runs no Python code, or anything read fails a check (then the record
 * keeps its native stack only). Call with the re-entrancy guard set. */
unsigned shimpy_capture(uint64_t *out, unsigned max, uint32_t tid);

#endif
