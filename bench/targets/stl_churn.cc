// stl_churn: a C++ program that makes millions of allocations through STL containers, for
// bench/bench_heap.py (built -O2 without frame pointers, like Debian's own C++).
//
// Each round generates a text of random words (std::string, some longer than the 15-byte
// small-string buffer), indexes it in a std::map<std::string, std::vector<int>> (word ->
// positions) and a std::unordered_map<std::string, int> (counts), copies the counts into a
// std::vector<std::pair<std::string, int>> and sorts it, then drops everything.  Prints
// the strings built and a checksum (so nothing is optimized away), and its own loop time
// ("loop_s=...", start-up excluded).  With "--wait", reads one line from stdin first (the
// benchmark attaches its reader).
//
// Usage: stl_churn [rounds] [--wait]  (default 40 rounds)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

static inline uint64_t next_rand() {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1DULL;
}

// 4000 distinct words of 6..29 letters: about two thirds do not fit the SSO buffer.
__attribute__((noinline)) static std::string make_word(uint64_t id) {
    uint64_t r = id * 0x9E3779B97F4A7C15ULL;
    size_t len = 6 + (size_t)(r % 24);
    std::string w;
    for (size_t i = 0; i < len; i++) {
        w.push_back((char)('a' + (r % 26)));
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    return w;
}

__attribute__((noinline)) static std::vector<std::string> make_text(size_t words) {
    std::vector<std::string> text;
    for (size_t i = 0; i < words; i++) text.push_back(make_word(next_rand() % 4000));
    return text;
}

__attribute__((noinline)) static uint64_t index_text(const std::vector<std::string> &text) {
    std::map<std::string, std::vector<int>> positions;
    std::unordered_map<std::string, int> counts;
    for (size_t i = 0; i < text.size(); i++) {
        positions[text[i]].push_back((int)i);
        counts[text[i]]++;
    }
    std::vector<std::pair<std::string, int>> ranked(counts.begin(), counts.end());
    std::sort(ranked.begin(), ranked.end(), [](const auto &a, const auto &b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    uint64_t sum = 0;
    for (const auto &kv : positions) sum += kv.second.size() * kv.first.size();
    return sum + ranked.front().second;
}

int main(int argc, char **argv) {
    int rounds = 40;
    bool wait = false;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--wait") == 0) wait = true;
        else rounds = std::atoi(argv[i]);
    }
    if (wait) {
        char line[16];
        if (std::fgets(line, sizeof line, stdin) == nullptr) return 2;
    }
    timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t checksum = 0;
    size_t strings = 0;
    for (int r = 0; r < rounds; r++) {
        std::vector<std::string> text = make_text(50000);
        strings += text.size();
        checksum += index_text(text);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    std::printf("strings %zu checksum %llu\n", strings, (unsigned long long)checksum);
    std::printf("loop_s=%.6f\n", (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
