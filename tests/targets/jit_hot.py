"""A hot Python function for `python3.12 -X perf` tests (perf trampolines in a perf map)."""
import sys
import time


def hot_py_fn(n):
    s = 0
    for i in range(n):
        s = (s * 31 + i) % 1000003
    return s


end = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 2)
total = 0
while time.monotonic() < end:
    total += hot_py_fn(20000)
print(total)
