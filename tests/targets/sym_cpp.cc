// Target for tests/system/test_symbols.py: namespaced and templated C++ functions.
#include <cstdio>
#include <cstdlib>

namespace geometry {
template <typename T>
struct Grid {
    T cells[16];
    __attribute__((noinline)) T total(int rounds) const {
        T sum = 0;
        for (int r = 0; r < rounds; r++)
            for (int i = 0; i < 16; i++) sum += cells[i] * r;  // GRID_LOOP
        return sum;
    }
};

__attribute__((noinline)) long scale(long v, int k) { return v * k + 1; }
}  // namespace geometry

int main(int argc, char **argv) {
    geometry::Grid<long> g{};
    for (int i = 0; i < 16; i++) g.cells[i] = i;
    int rounds = argc > 1 ? std::atoi(argv[1]) : 100;
    std::printf("%ld\n", geometry::scale(g.total(rounds), rounds));
    return 0;
}
