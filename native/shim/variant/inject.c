/* Linked into librsprof_heap_inject.so, the shim rsprof -p loads into a running process
 * with ptrace (see heapshim.c, "injected mode"). */
__attribute__((visibility("hidden"))) const int rsprof_shim_injected_build = 1;
