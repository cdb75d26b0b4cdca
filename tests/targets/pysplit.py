"""heavy() and light() at 3:1, on the main thread or (`threads`) one each on two threads.
Prints `ready` once running; runs for argv[1] seconds."""
import sys
import threading
import time


def heavy():
    s = 0
    for i in range(30000):
        s += i * i
    return s


def light():
    s = 0
    for i in range(10000):
        s += i * i
    return s


def main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
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
