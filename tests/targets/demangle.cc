// C++ target for demangling: a namespaced template member function burns the CPU.
#include <chrono>
#include <cstdint>
#include <cstdlib>

namespace geometry {
template <typename T>
struct Mesh {
    volatile T acc = 1;
    __attribute__((noinline)) void refine(int rounds) {
        for (int r = 0; r < rounds; r++)
            for (int i = 0; i < 100000; i++) acc = acc * 3 + 1;
    }
};
}  // namespace geometry

int main(int argc, char **argv) {
    double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    geometry::Mesh<long> mesh;
    while (std::chrono::steady_clock::now() < end) mesh.refine(10);
    return 0;
}
