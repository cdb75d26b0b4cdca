// heap_stl: allocations made by inlined standard-library code (std::string, std::vector)
// inside the user's functions. Usage: heap_stl N: keeps N strings of 100 chars made in
// keep_strings() and a vector of N ints grown in fill_vector(), then exits.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static std::vector<std::string> *kept;
static std::vector<int> *numbers;

__attribute__((noinline)) void keep_strings(int n) {
    for (int i = 0; i < n; i++) kept->emplace_back(std::string(100, static_cast<char>('a' + i % 26)));
}

__attribute__((noinline)) void fill_vector(int n) {
    for (int i = 0; i < n; i++) numbers->push_back(i);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 1000;
    kept = new std::vector<std::string>();
    kept->reserve(static_cast<size_t>(n));
    numbers = new std::vector<int>();
    keep_strings(n);
    fill_vector(n);
    std::printf("%zu %zu\n", kept->size(), numbers->size());
    return 0;
}
