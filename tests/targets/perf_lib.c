/* Shared library dlopen()ed by perf_target after the sampler attached (compiled by the test
 * with gcc -shared -fPIC): loading it must produce an executable MMAP2 record. */
static volatile unsigned long lib_sink;

void perf_lib_work(void) {
    for (unsigned long i = 0; i < 1000000; i++) lib_sink += i;
}
