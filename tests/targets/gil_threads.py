"""Threads with a known GIL story, for tests/system/test_gil.py. Usage:
    gil_threads.py MODE SECONDS OUT
contend: two threads computing in pure Python (each holds the GIL about half the time and
         waits for it the rest);
zip:     one thread computing in Python, one compressing with zlib (which releases the GIL
         while it compresses);
waits:   threads blocked in time.sleep, Lock.acquire, Event.wait, queue.get and select, none
         of which waits for the GIL.
Writes one JSON object to OUT: per role, the thread's native id, its lifetime and CPU time
(seconds), and for zip the time spent inside zlib.compress."""

from __future__ import annotations

import json
import os
import queue
import select
import sys
import threading
import time
import zlib


def spin(n: int) -> int:
    x = 0
    for i in range(n):
        x += i * i
    return x


def worker(end: float) -> dict[str, float]:
    while time.monotonic() < end:
        spin(20000)
    return {}


def zipper(end: float) -> dict[str, float]:
    data = os.urandom(1 << 19)
    inside = 0.0
    while time.monotonic() < end:
        start = time.monotonic()
        zlib.compress(data, 6)
        inside += time.monotonic() - start
    return {"in_zlib": inside}


def sleeper(end: float) -> dict[str, float]:
    while time.monotonic() < end:
        time.sleep(0.02)
    return {}


def locker(end: float) -> dict[str, float]:
    lock = threading.Lock()
    lock.acquire()
    while time.monotonic() < end:
        lock.acquire(timeout=0.02)
    return {}


def eventer(end: float) -> dict[str, float]:
    event = threading.Event()
    while time.monotonic() < end:
        event.wait(0.02)
    return {}


def queuer(end: float) -> dict[str, float]:
    q: queue.Queue[int] = queue.Queue()
    while time.monotonic() < end:
        try:
            q.get(timeout=0.02)
        except queue.Empty:
            pass
    return {}


def selecter(end: float) -> dict[str, float]:
    r, _w = os.pipe()  # the write end stays open: select waits its full timeout
    while time.monotonic() < end:
        select.select([r], [], [], 0.02)
    return {}


MODES = {
    "contend": {"w1": worker, "w2": worker},
    "zip": {"python": worker, "zlib": zipper},
    "waits": {"sleep": sleeper, "lock": locker, "event": eventer, "queue": queuer,
              "select": selecter},
}


def main() -> None:
    mode, seconds, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    results: dict[str, dict[str, float]] = {}
    end = time.monotonic() + seconds

    def run(role: str, body: object) -> None:
        start, cpu = time.monotonic(), time.thread_time()
        extra = body(end)  # type: ignore[operator]
        results[role] = {"tid": threading.get_native_id(), "life": time.monotonic() - start,
                         "cpu": time.thread_time() - cpu, **extra}

    threads = [threading.Thread(target=run, args=(role, body), name=role)
               for role, body in MODES[mode].items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with open(out, "w") as f:
        json.dump(results, f)


main()
