// A translation unit that keeps cc1plus -O2 busy for a few seconds with deep recursion
// (templates, regex, lambdas): bench/bench_unwind.py profiles Debian's cc1plus compiling it.
#include <map>
#include <string>
#include <vector>
#include <regex>
#include <unordered_map>
#include <algorithm>
#include <iostream>
#include <sstream>
#include <functional>
#include <memory>
template <int N> struct R { static int f() { return R<N - 1>::f() + N; } };
template <> struct R<0> { static int f() { return 0; } };
int main() {
  std::map<std::string, std::vector<int>> m; std::regex re("a+b*"); std::unordered_map<int, std::string> u;
  std::ostringstream os; os << R<400>::f();
  std::vector<std::function<int(int)>> fs; for (int i = 0; i < 10; i++) fs.push_back([i](int x) { return x + i; });
  std::sort(fs.begin(), fs.end(), [](auto &a, auto &b) { return a(1) < b(1); });
  std::cout << os.str() << m.size() << u.size() << std::regex_match("aab", re) << std::endl;
}
