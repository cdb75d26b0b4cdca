"""Allocation loop for bench/bench_heap_python.py: N bytearray(1000) (above pymalloc's 512 B,
so each is a malloc) allocated and freed three Python calls deep."""

import sys


def inner(n: int) -> None:
    for _ in range(n):
        b = bytearray(1000)
        del b


def middle(n: int) -> None:
    inner(n)


def outer(n: int) -> None:
    for _ in range(10):
        middle(n // 10)


outer(int(sys.argv[1]))
