// A 3:1 split in C++ built -O2 -fomit-frame-pointer by tests/system/test_cfi_targets.py: main calls
// two jobs through a virtual method; Heavy::run sorts each round's input three times with
// std::sort and a slow comparator, Light::run once (same input, same comparisons: exactly
// 3:1). The comparator is called from libstdc++'s sort templates (__introsort_loop,
// __insertion_sort: inlined and outlined pieces), none with a frame pointer. Rounds have
// random sizes, since a fixed-length round aliases with cpu-clock's fixed sampling period
// (see split.c). Usage: cfi_sort SECONDS (of CPU time).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <vector>

static volatile unsigned long sink;

__attribute__((noinline)) static bool slow_less(unsigned long a, unsigned long b) {
    for (int i = 0; i < 48; i++) sink += (a ^ static_cast<unsigned long>(i)) * 2654435761u;
    return a < b;
}

__attribute__((noinline)) static void sort_copy(const std::vector<unsigned long>& input) {
    std::vector<unsigned long> v(input);
    std::sort(v.begin(), v.end(), [](unsigned long a, unsigned long b) { return slow_less(a, b); });
    sink += v[v.size() / 2];
}

struct Job {
    virtual ~Job() = default;
    virtual void run(const std::vector<unsigned long>& input) = 0;
};

struct Heavy : Job {
    __attribute__((noinline)) void run(const std::vector<unsigned long>& input) override {
        for (int i = 0; i < 3; i++) sort_copy(input);
        sink++;  // no tail call: Heavy::run stays on the stack of its last sort
    }
};

struct Light : Job {
    __attribute__((noinline)) void run(const std::vector<unsigned long>& input) override {
        sort_copy(input);
        sink++;
    }
};

static double cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

int main(int argc, char** argv) {
    double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
    // The order comes from the command line, so the compiler cannot know the dynamic types.
    std::vector<std::unique_ptr<Job>> jobs;
    for (const char* c = argc > 2 ? argv[2] : "hl"; *c; c++) {
        if (*c == 'h') jobs.push_back(std::make_unique<Heavy>());
        else jobs.push_back(std::make_unique<Light>());
    }
    std::vector<unsigned long> input;
    unsigned long state = 0x9e3779b97f4a7c15ul;
    double end = cpu_seconds() + seconds;
    do {
        for (int round = 0; round < 20; round++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            input.resize(64 + state % 192);
            for (size_t i = 0; i < input.size(); i++) input[i] = (state * (i + 1)) >> 11;
            for (auto& job : jobs) job->run(input);
        }
    } while (cpu_seconds() < end);
    std::printf("%lu\n", sink & 1);
    return 0;
}
