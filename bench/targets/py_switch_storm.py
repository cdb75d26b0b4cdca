"""A context-switch storm in Python: 2 pairs of threads ping-pong one byte over pipes for
argv[1] seconds, each 20 Python calls deep (so that reading a thread's Python frames at
each switch-out costs what a real program's would), then prints the round trips (two
switch-outs each). bench/bench_offcpu.py --python-target runs it."""

import os
import sys
import threading
import time

SECONDS = float(sys.argv[1])
DEPTH = 20


def nested(depth: int, work):  # type: ignore[no-untyped-def]
    return work() if depth == 0 else nested(depth - 1, work)


def pair(trips: list[int]) -> None:
    there_r, there_w = os.pipe()
    back_r, back_w = os.pipe()
    stop = time.monotonic() + SECONDS

    def echo() -> None:
        while os.read(there_r, 1) == b"x":
            os.write(back_w, b"x")

    def ping() -> None:
        n = 0
        while time.monotonic() < stop:
            os.write(there_w, b"x")
            os.read(back_r, 1)
            n += 1
        os.write(there_w, b"q")
        trips.append(n)

    peer = threading.Thread(target=nested, args=(DEPTH, echo))
    peer.start()
    nested(DEPTH, ping)
    peer.join()


def main() -> None:
    trips: list[int] = []
    pairs = [threading.Thread(target=pair, args=(trips,)) for _ in range(2)]
    for thread in pairs:
        thread.start()
    for thread in pairs:
        thread.join()
    print(sum(trips))


main()
