#!/usr/bin/env python3
"""Cost of reading a Python program's frames from outside, beside py-spy, in one run.

The target (bench/targets/pyloop.py) runs heavy():light() 3:1 for SECONDS and prints how
many rounds it did. Each configuration runs it once per repeat, interleaved (baseline,
rsprof's PyFrameReader at 99 and 999 Hz, `py-spy record --nonblocking` at 99 and 999 Hz),
so machine load hits all alike. Printed: the target's rounds relative to the baseline (1.00 =
not slowed), the reader's own CPU per walk, and the heavy share the reader saw (true 0.75).

Usage: python bench/bench_pyframes.py [--python /usr/bin/python3] [--seconds 3] [--repeat 2]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rsprof.collector.pyframes import open_reader

HERE = Path(__file__).parent
TARGET = HERE / "targets" / "pyloop.py"


def start(python: str, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([python, str(TARGET), str(seconds)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    return proc


def finish(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    rounds = int(proc.stdout.readline())
    proc.wait()
    return rounds


def baseline(python: str, seconds: float) -> dict[str, float]:
    return {"rounds": finish(start(python, seconds))}


def reader_run(python: str, seconds: float, hz: int) -> dict[str, float]:
    proc = start(python, seconds)
    reader = open_reader(proc.pid)
    assert reader is not None
    heavy = light = 0
    cpu = 0.0
    period = 1.0 / hz
    stop = threading.Event()

    def loop() -> None:
        nonlocal heavy, light, cpu
        next_at = time.monotonic()
        while not stop.is_set():
            begin = time.thread_time()
            try:
                frames = reader.frames(proc.pid)
            except ProcessLookupError:
                return
            cpu += time.thread_time() - begin
            if frames:
                heavy += frames[0].function == "heavy"
                light += frames[0].function == "light"
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    thread = threading.Thread(target=loop)
    thread.start()
    rounds = finish(proc)
    stop.set()
    thread.join()
    walks = max(1, reader.walks)
    return {"rounds": rounds, "walks": walks, "cpu_us_per_walk": cpu / walks * 1e6,
            "dropped_pct": 100 * reader.dropped / walks,
            "heavy_share": heavy / max(1, heavy + light)}


def py_spy_run(python: str, seconds: float, hz: int, py_spy: str, tmp: Path) -> dict[str, float]:
    proc = start(python, seconds)
    spy = subprocess.Popen([py_spy, "record", "--nonblocking", "-r", str(hz), "-p", str(proc.pid),
                            "-f", "raw", "-o", str(tmp / "spy.txt")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rounds = finish(proc)
    spy.wait()
    return {"rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    py_spy = shutil.which("py-spy")
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            runs: dict[str, Callable[[], dict[str, float]]] = {
                "baseline": lambda: baseline(args.python, args.seconds)}
            for hz in (99, 999):
                runs[f"rsprof reader {hz} Hz"] = functools.partial(
                    reader_run, args.python, args.seconds, hz)
                if py_spy:
                    runs[f"py-spy {hz} Hz"] = functools.partial(
                        py_spy_run, args.python, args.seconds, hz, py_spy, Path(tmp))
            for name, run in runs.items():
                results.setdefault(name, []).append(run())
    base = statistics.mean(r["rounds"] for r in results["baseline"])
    print(f"{'configuration':<22} {'rounds vs baseline':>18} {'µs CPU/walk':>12} "
          f"{'dropped %':>10} {'heavy share':>12}")
    for name, rows in results.items():
        ratio = statistics.mean(r["rounds"] for r in rows) / base
        extra = ""
        if "walks" in rows[0]:
            extra = (f"{statistics.mean(r['cpu_us_per_walk'] for r in rows):>12.1f} "
                     f"{statistics.mean(r['dropped_pct'] for r in rows):>10.2f} "
                     f"{statistics.mean(r['heavy_share'] for r in rows):>12.3f}")
        print(f"{name:<22} {ratio:>18.3f} {extra}")


if __name__ == "__main__":
    main()
