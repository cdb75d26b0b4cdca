"""Heap target for tests/system/test_heap_python.py: leaks LEAK_COUNT bytes objects of LEAK_SIZE
bytes at one known line (`KEEP.append(...)`), churns CHURN_COUNT bytearrays of CHURN_SIZE
bytes at another (allocated and freed at once), from a worker thread too, and leaves with
os._exit so that the interpreter's teardown does not free what leaked."""

import os
import sys
import threading

LEAK_COUNT, LEAK_SIZE = 1000, 10000
CHURN_COUNT, CHURN_SIZE = 500, 20000
KEEP: list[bytes] = []


def leak(n):
    for _ in range(n):
        KEEP.append(bytes(LEAK_SIZE))  # the leak


def churn(n):
    for _ in range(n):
        b = bytearray(CHURN_SIZE)  # the churn
        del b


def main():
    churn(CHURN_COUNT)
    leak(LEAK_COUNT)
    worker = threading.Thread(target=churn, args=(CHURN_COUNT,))
    worker.start()
    worker.join()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
