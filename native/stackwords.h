/* The words of a stack as the C side announces it to Python (PerfBatch.new_stacks,
 * HeapBatch.new_stacks): one definition for the C code (perf.c, heapreader.c, unwind.c)
 * and, through the constants module.c exports (rsprof._native.PY_MARK, KERNEL_ADDRESS,
 * ...), for collector/frames.py and collector/pyframes.py. Changing a value here changes
 * the stacks of new profiles only: stored profiles hold symbolized frames, not these words.
 *
 * A stack, leaf first: native addresses (the sample's ip or the allocation's caller, then
 * return addresses), then, when Python frames were read, RS_PY_MARK and one
 * RS_PY_FRAME word per Python frame, innermost first. Native addresses are user addresses
 * (< 2^47) or [vsyscall]'s (0xffffffffff600000), so none is taken for a marker or a Python
 * frame word. Pure C: no Python header (the LD_PRELOAD shim may include it too). */
#ifndef RSPROF_STACKWORDS_H
#define RSPROF_STACKWORDS_H

#include <stdint.h>

/* The root of a stack whose walk stopped at something it could not justify: address 0,
 * never a caller ("[truncated]" in collector/frames.py). */
#define RS_TRUNCATED_ADDRESS 0u
/* The leaf of a CPU sample taken in kernel mode, on top of the user stack that entered the
 * kernel: address 1 is never code, and no return address either ("[kernel]"). */
#define RS_KERNEL_ADDRESS 1u
/* Marks the end of the native addresses: what follows is Python frames. */
#define RS_PY_MARK 0xFFFFFFFFFFFFFFF0ULL
/* The same, for Python frames read at sample time (the BPF sampler, native/bpf/): they are
 * the chain of the sampled instant, not of a later read. */
#define RS_PY_MARK_SAMPLED 0xFFFFFFFFFFFFFFF1ULL
/* A Python frame word: bit 63 set, bit RS_PY_FRAME_ENTRY_BIT the frame's `entry` flag
 * (entered from C), RS_PY_FRAME_FUNCTION_BITS bits at RS_PY_FRAME_FUNCTION_SHIFT the
 * reader's function id (< 2^18), the low RS_PY_FRAME_LINE_BITS bits the line (signed). */
#define RS_PY_FRAME_ENTRY_BIT 62
#define RS_PY_FRAME_FUNCTION_SHIFT 32
#define RS_PY_FRAME_FUNCTION_BITS 30
#define RS_PY_FRAME_LINE_BITS 32
#define RS_PY_FRAME(function, line, entry)                                           \
    ((1ULL << 63) | ((uint64_t)((entry) != 0) << RS_PY_FRAME_ENTRY_BIT) |          \
     ((uint64_t)(function) << RS_PY_FRAME_FUNCTION_SHIFT) | (uint64_t)(uint32_t)(line))

#endif
