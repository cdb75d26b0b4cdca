"""Heap target for tests/system/test_heap_python.py: allocations in every situation the shim's
in-process frame read must survive: worker threads, generator and coroutine frames, a
recursion deeper than a record holds (128 Python frames), finalizers that allocate while a
frame is being torn down, exceptions, and C code allocating without the GIL (zlib releases
it while it compresses). Prints one line per check and exits 0 when all ran."""

import asyncio
import os
import threading
import zlib

KEEP: list[object] = []


def gen(n):
    for _ in range(n):
        yield bytes(3000)  # the generator


async def coro(n):
    for _ in range(n):
        KEEP.append(bytearray(4000))  # the coroutine
        await asyncio.sleep(0)


def deep(n):
    if n == 0:
        return bytes(5000)  # the deep end
    return deep(n - 1)


class Finalized:
    def __del__(self):
        KEEP.append(bytes(6000))  # the finalizer


def raising():
    try:
        raise ValueError(bytes(7000))  # the raise
    except ValueError as error:
        return error


def without_gil():
    data = os.urandom(1 << 20)
    for _ in range(20):
        zlib.compress(data, 9)


def worker():
    KEEP.extend(gen(200))
    for _ in range(50):
        Finalized()
        raising()


def main():
    threads = [threading.Thread(target=worker) for _ in range(3)]
    threads.append(threading.Thread(target=without_gil))
    for t in threads:
        t.start()
    asyncio.run(coro(200))
    KEEP.extend(deep(300) for _ in range(20))
    for t in threads:
        t.join()
    print("done", len(KEEP), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
