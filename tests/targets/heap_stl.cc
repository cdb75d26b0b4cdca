// heap_stl: allocations made by inlined standard-library code (std::string, std::vector,
// std::map) inside the user's functions. Usage: heap_stl N: keeps N strings of 100 chars
// made in keep_strings(), a vector of N ints grown in fill_vector() and a map of N ints
// (one 40-byte tree node each) filled in fill_map(), then exits.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

static std::vector<std::string> *kept;
static std::vector<int> *numbers;
static std::map<int, int> *table;

__attribute__((noinline)) void keep_strings(int n) {
    for (int i = 0; i < n; i++) kept->emplace_back(std::string(100, static_cast<char>('a' + i % 26)));
}

__attribute__((noinline)) void fill_vector(int n) {
    for (int i = 0; i < n; i++) numbers->push_back(i);
}

__attribute__((noinline)) void fill_map(int n) {
    for (int i = 0; i < n; i++) (*table)[i] = i;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 1000;
    kept = new std::vector<std::string>();
    kept->reserve(static_cast<size_t>(n));
    numbers = new std::vector<int>();
    table = new std::map<int, int>();
    keep_strings(n);
    fill_vector(n);
    fill_map(n);
    std::printf("%zu %zu %zu\n", kept->size(), numbers->size(), table->size());
    return 0;
}
