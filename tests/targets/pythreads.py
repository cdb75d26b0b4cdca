"""Named Python threads for tests/system/test_pythreads.py. Prints one JSON list per line,
[[native_id, ident, name], ...] of the threads it wants checked, then "done" at the end.

  names SECONDS   ten busy threading.Threads `CustomThreadName-0..9`, a ThreadPoolExecutor
                  (`pool_0..2`), asyncio's default executor (`asyncio_0`, from a thread
                  `asyncio-runner`), one thread renamed `renamed-later` -> `renamed-now` at 1 s
  loop N          after 1 s, N rounds of two named threads (`round-K-a`, `round-K-b`) started and
                  joined: their idents are reused round after round
"""

import asyncio
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def show(threads: list[threading.Thread]) -> None:
    print(json.dumps([[t.native_id, t.ident, t.name] for t in threads]), flush=True)


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(2000))
        time.sleep(0.001)


def names(seconds: float) -> None:
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            spin(0.05)

    threads = [threading.Thread(target=busy, name=f"CustomThreadName-{i}") for i in range(10)]
    renamed = threading.Thread(target=busy, name="renamed-later")
    for thread in [*threads, renamed]:
        thread.start()
    pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="pool")
    started = threading.Barrier(5)

    def pooled() -> None:
        started.wait()
        spin(seconds)

    async def in_executor() -> None:
        await asyncio.get_running_loop().run_in_executor(None, pooled)  # thread asyncio_0

    futures = [pool.submit(pooled) for _ in range(3)]
    runner = threading.Thread(target=asyncio.run, args=(in_executor(),), name="asyncio-runner")
    runner.start()
    started.wait()
    show(threading.enumerate())
    time.sleep(1.0)
    renamed.name = "renamed-now"
    show([renamed])
    spin(max(0.0, seconds - 1.0))
    stop.set()
    for thread in [*threads, renamed]:
        thread.join()
    for future in futures:
        future.result()
    pool.shutdown()
    runner.join()


def loop(rounds: int) -> None:
    time.sleep(1.0)  # rsprof finds the interpreter within 0.7 s of the exec
    for k in range(rounds):
        pair = [threading.Thread(target=spin, args=(0.5,), name=f"round-{k}-{s}") for s in "ab"]
        for thread in pair:
            thread.start()
        show(pair)
        for thread in pair:
            thread.join()


if __name__ == "__main__":
    if sys.argv[1] == "names":
        names(float(sys.argv[2]))
    else:
        loop(int(sys.argv[2]))
    print("done", flush=True)
