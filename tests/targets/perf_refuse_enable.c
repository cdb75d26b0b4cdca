/* perf_refuse_enable: an LD_PRELOAD library for tests/system/test_native_perf.py.  While the
 * environment has RSPROF_TEST_ENABLE_OK=N, ioctl's PERF_EVENT_IOC_ENABLE fails with EACCES
 * (as when a security module refuses it: security_perf_event_write) once N calls of it went
 * through; without the variable, and for every other request, it is libc's ioctl.  Built
 * -shared -fPIC. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/perf_event.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/ioctl.h>

int ioctl(int fd, unsigned long request, ...) {
    static int (*real)(int, unsigned long, ...);
    static long enables;
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (request == PERF_EVENT_IOC_ENABLE) {
        const char *ok = getenv("RSPROF_TEST_ENABLE_OK");
        if (ok != NULL && enables >= atol(ok)) {
            errno = EACCES;
            return -1;
        }
        enables++;
    }
    if (real == NULL) real = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
    return real(fd, request, arg);
}
