"""Target of tests/system/test_heap_attach.py: a Python program started WITHOUT rsprof. Each
number N read from stdin: N bytearrays of 5000 bytes kept (leak_line), N x 10 of 3000 bytes
made and dropped (churn); prints "done N total"."""

import sys

keep: list[bytearray] = []


def leak_line() -> None:
    keep.append(bytearray(5000))


def churn() -> int:
    made = [bytearray(3000) for _ in range(10)]
    return len(made)


print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    for _ in range(n):
        leak_line()
        churn()
    print("done", n, len(keep), flush=True)
