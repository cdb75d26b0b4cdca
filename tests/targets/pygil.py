"""Heap target for tests/system/test_heap_python.py: malloc called through ctypes from a worker
thread, once without the GIL (CDLL releases it around the call) while the main thread runs
Python code, and once with it (PyDLL keeps it). Only the second may carry Python frames:
an allocation made without the GIL belongs to no Python line, least of all to the line the
GIL holder is running (CPython 3.11's _PyThreadState_UncheckedGet names the holder)."""

import ctypes
import os
import sys
import threading

NOGIL_SIZE, GIL_SIZE, COUNT = 12345, 23456, 300
KEEP: list[object] = []
done = threading.Event()


def without_gil():
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    for _ in range(COUNT):
        KEEP.append(libc.malloc(NOGIL_SIZE))  # without the GIL


def with_gil():
    libc = ctypes.PyDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    for _ in range(COUNT):
        KEEP.append(libc.malloc(GIL_SIZE))  # with the GIL


def worker():
    without_gil()
    with_gil()
    done.set()


def busy():
    spins = 0
    while not done.is_set():
        spins += 1  # the busy loop
    return spins


def main():
    sys.setswitchinterval(0.0005)
    thread = threading.Thread(target=worker)
    thread.start()
    busy()
    thread.join()
    print("done", len(KEEP), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
