"""heavy() and light() at 3:1, on the main thread or (`threads`) one each on two threads.
Prints `ready` once running; runs for argv[1] seconds.

Each round has a random length (heavy and light share it, so the work stays exactly 3:1):
cpu-clock samples at a fixed period of thread CPU time, and a fixed-length round would
alias with it (tests/targets/split.c had that bug)."""
import random
import sys
import threading
import time

UNIT = 10000  # iterations of light(); heavy() does three times as many


def heavy():
    s = 0
    for i in range(3 * UNIT):
        s += i * i
    return s


def light():
    s = 0
    for i in range(UNIT):
        s += i * i
    return s


def main(seconds):
    global UNIT
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        UNIT = 5000 + int(random.random() * 10000)  # C code: no Python frame of its own
        heavy()
        light()


def spin(work, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        work()


if __name__ == "__main__":
    seconds = float(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "threads":
        workers = [threading.Thread(target=spin, args=(work, seconds), name=work.__name__)
                   for work in (heavy, light)]
        for worker in workers:
            worker.start()
        print("ready", " ".join(str(w.native_id) for w in workers), flush=True)
        for worker in workers:
            worker.join()
    else:
        print("ready", flush=True)
        main(seconds)
