// Target for tests/system/test_symbols_cxx.py: C++ names as the binary has them. std::sort with a
// lambda comparator, a thread pool running std::function tasks that are two different
// lambdas, a namespaced class method. Built -O2: most of it is inlined, and GCC gives the
// inlined templates and lambdas no DW_AT_linkage_name.  Usage: names_cxx SECONDS
#include <algorithm>
#include <functional>
#include <thread>
#include <vector>
#include <mutex>
#include <condition_variable>
#include <queue>
#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <unistd.h>

namespace shop {
struct Item { long price; int qty; };
class Basket {
 public:
  void add(long p, int q) { items_.push_back({p, q}); }
  long total() const {
    long t = 0;
    for (int r = 0; r < 2000; r++)
      for (auto &i : items_) t += i.price * i.qty + (t >> 7);
    return t;
  }
 private:
  std::vector<Item> items_;
};
}

class Pool {
 public:
  explicit Pool(int n) { for (int i = 0; i < n; i++) th_.emplace_back([this] { run(); }); }
  ~Pool() { { std::lock_guard<std::mutex> g(m_); stop_ = true; } cv_.notify_all(); for (auto &t : th_) t.join(); }
  void submit(std::function<void()> f) { { std::lock_guard<std::mutex> g(m_); q_.push(std::move(f)); } cv_.notify_one(); }
 private:
  void run() {
    for (;;) {
      std::function<void()> f;
      { std::unique_lock<std::mutex> l(m_); cv_.wait(l, [this] { return stop_ || !q_.empty(); });
        if (stop_ && q_.empty()) return; f = std::move(q_.front()); q_.pop(); }
      f();
    }
  }
  std::vector<std::thread> th_; std::mutex m_; std::condition_variable cv_;
  std::queue<std::function<void()>> q_; bool stop_ = false;
};

volatile long sink;

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 2.0;
  std::printf("ready %d\n", getpid());
  std::fflush(stdout);
  std::vector<int> v(200000);
  shop::Basket b;
  for (int i = 0; i < 1000; i++) b.add(i, i % 7);
  auto until = [secs] { static struct timespec s; struct timespec n; if (!s.tv_sec) clock_gettime(CLOCK_MONOTONIC, &s); clock_gettime(CLOCK_MONOTONIC, &n); return (n.tv_sec - s.tv_sec) + (n.tv_nsec - s.tv_nsec) / 1e9 < secs; };
  Pool pool(2);
  while (until()) {
    for (size_t i = 0; i < v.size(); i++) v[i] = (int)((i * 2654435761u) % 100000);  // FILL
    std::sort(v.begin(), v.end(), [](int a, int c) { return a % 1000 < c % 1000 || (a % 1000 == c % 1000 && a < c); });
    pool.submit([&b] { sink = b.total(); });
    pool.submit([] { long s = 0; for (long i = 0; i < 3000000; i++) s += i * i % 7; sink = s; });
  }
  return 0;
}
