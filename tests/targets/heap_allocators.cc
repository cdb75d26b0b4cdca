// heap_allocators.cc: N strings made with new, K of them leaked, the rest deleted; built
// plain (glibc), with -ljemalloc and with -ltcmalloc_minimal, whose operator new and delete
// never call malloc. Each string is two allocations: the std::string object (32 bytes) and
// its 41-byte buffer (40 characters and the terminator).
//   heap_allocators N K
// First a new[] of 2^62 bytes fails with bad_alloc, which is caught.
#include <cstdio>
#include <new>
#include <cstdlib>
#include <string>

static std::string **g_kept;
static void *volatile g_sink;

__attribute__((noinline)) static void make_strings(long n, long k) {
    for (long i = 0; i < n; i++) {
        std::string *s = new std::string(40, static_cast<char>('a' + i % 26));
        if (i < k) g_kept[i] = s;
        else delete s;
    }
}

// The array forms, aligned and nothrow variants and sized delete: allocated and freed here.
struct alignas(64) Wide {
    char bytes[128];
};

__attribute__((noinline)) static void other_forms(long n) {
    for (long i = 0; i < n; i++) {
        char *a = new char[100];
        Wide *w = new Wide;
        Wide *ws = new Wide[2];
        int *q = new (std::nothrow) int(7);
        // Seen from outside, so the compiler may not elide the allocations.
        g_sink = a, g_sink = w, g_sink = ws, g_sink = q;
        delete q;
        delete[] ws;
        delete w;
        delete[] a;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    long n = std::strtol(argv[1], nullptr, 10), k = std::strtol(argv[2], nullptr, 10);
    g_kept = static_cast<std::string **>(std::malloc(sizeof(std::string *) * (size_t)k));
    // A bad_alloc thrown by the allocator's operator new unwinds through the shim's wrapper:
    // what follows must still be recorded.
    volatile size_t huge = (size_t)1 << 62;
    try {
        g_sink = new char[huge];
        return 3;
    } catch (const std::bad_alloc &) {
    }
    make_strings(n, k);
    other_forms(n / 10);
    std::printf("allocators done %ld\n", k);
    return 0;
}
