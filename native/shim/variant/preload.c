/* Linked into librsprof_heap.so, the LD_PRELOAD shim (see heapshim.c, shim_init). */
__attribute__((visibility("hidden"))) const int rsprof_shim_injected_build = 0;
