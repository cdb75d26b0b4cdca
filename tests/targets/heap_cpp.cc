// heap_cpp: C++ new/delete reach the shim through libstdc++'s operator new -> malloc.
// Usage: heap_cpp <dir>: "ready <pid>", waits for <dir>/go, runs, "done", waits for
// <dir>/exit.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>
#include <vector>

static void wait_for(const char *dir, const char *name) {
    char path[512];
    std::snprintf(path, sizeof path, "%s/%s", dir, name);
    for (int i = 0; i < 30000 && access(path, F_OK) != 0; i++) usleep(2000);
}

struct Widget {
    char payload[200];
};

static std::vector<Widget *> kept;

__attribute__((noinline)) static void make_widgets(int n) {
    for (int i = 0; i < n; i++) kept.push_back(new Widget());
}

__attribute__((noinline)) static void churn_arrays(int n) {
    for (int i = 0; i < n; i++) {
        char *volatile a = new char[3000];
        delete[] a;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    kept.reserve(1000);
    std::printf("ready %d\n", (int)getpid());
    std::fflush(stdout);
    wait_for(argv[1], "go");
    make_widgets(500);
    churn_arrays(700);
    std::printf("done\n");
    std::fflush(stdout);
    wait_for(argv[1], "exit");
    return 0;
}
