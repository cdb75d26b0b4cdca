#!/usr/bin/env python3
"""Cost of reading a Python program's frames from outside, beside py-spy, in one run.

The target (bench/targets/pyloop.py) runs heavy():light() 3:1 for SECONDS and prints how
many rounds it did. Each configuration runs it once per repeat, interleaved, so machine load
hits all alike: a plain run (baseline); rsprof's PyFrameReader alone at 99 and 999 Hz;
`rsprof -p` recording at 99 and 999 Hz with Python frames (the default) and with
`--python=off`; `py-spy record --nonblocking` and blocking (py-spy's default, which stops
the target for every sample) at 99 and 999 Hz. Printed: the target's rounds relative to the
baseline (1.00 = not slowed), also per CPU second of the target (insensitive to how much CPU
the load and the profiler leave it: what sampling costs each of its instructions); for the
reader, its CPU per walk and the heavy share it saw
(true 0.75); for `rsprof -p`, the drain's time per Python read (meta python_walk_us_mean),
the recorder's whole CPU per sample (start-up, symbolization and SQLite included, so only
comparable between runs of one length), the heavy share of the samples and the median delay
from a sample to the read of its Python frames.

Usage: python bench/bench_pyframes.py [--python /usr/bin/python3] [--seconds 3] [--repeat 2]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
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


def finish(proc: subprocess.Popen[str]) -> tuple[int, float]:
    """The target's rounds, and the CPU seconds it used (its own, whatever the load)."""
    assert proc.stdout is not None
    rounds = int(proc.stdout.readline())
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return rounds, usage.ru_utime + usage.ru_stime


def _target(proc: subprocess.Popen[str]) -> dict[str, float]:
    rounds, cpu = finish(proc)
    return {"rounds": rounds, "rounds_per_cpu_s": rounds / max(cpu, 1e-9)}


def baseline(python: str, seconds: float) -> dict[str, float]:
    return _target(start(python, seconds))


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
    result = _target(proc)
    stop.set()
    thread.join()
    walks = max(1, reader.walks)
    return {**result, "walks": walks, "cpu_us_per_walk": cpu / walks * 1e6,
            "dropped_pct": 100 * reader.dropped / walks,
            "heavy_share": heavy / max(1, heavy + light)}


def rsprof_run(python: str, seconds: float, hz: int, tmp: Path, *extra: str) -> dict[str, float]:
    """`rsprof -p` on the running target until it exits: its rounds, the recorder's CPU per
    sample, and the heavy share of the samples whose stacks hold heavy or light."""
    proc = start(python, seconds)
    out = tmp / f"rsprof-{hz}-{time.monotonic_ns()}.db"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "rsprof", "-p", str(proc.pid), "-q", "--cpu-freq", str(hz),
         "-o", str(out), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = _target(proc)
    _, _, usage = os.wait4(recorder.pid, 0)
    recorder.returncode = 0
    conn = sqlite3.connect(out)
    samples = conn.execute("SELECT SUM(samples) FROM checkpoints").fetchone()[0] or 0
    shares = dict(conn.execute(
        "SELECT l.function, SUM(c.count) FROM cpu_stack_samples c"
        " JOIN (SELECT DISTINCT sf.stack_id, l.function FROM stack_frames sf"
        "       JOIN frame_locations fl ON fl.frame_id = sf.frame_id"
        "       JOIN locations l ON l.id = fl.location_id"
        "       WHERE l.function IN ('heavy', 'light')) AS l ON l.stack_id = c.stack_id"
        " GROUP BY l.function").fetchall())
    meta = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'python_%'").fetchall())
    conn.close()
    cpu = usage.ru_utime + usage.ru_stime
    heavy, light = shares.get("heavy", 0), shares.get("light", 0)
    return {**result, "samples": samples,
            "walk_us": float(meta.get("python_walk_us_mean", "nan")),
            "stale_p50_us": float(meta.get("python_stale_us_p50", "nan")),
            "cpu_ms_per_sample": 1000 * cpu / max(1, samples),
            "heavy_share": heavy / max(1, heavy + light) if heavy + light else float("nan")}


def py_spy_run(python: str, seconds: float, hz: int, py_spy: str, tmp: Path,
               blocking: bool = False) -> dict[str, float]:
    proc = start(python, seconds)
    mode = [] if blocking else ["--nonblocking"]
    spy = subprocess.Popen([py_spy, "record", *mode, "-r", str(hz), "-p", str(proc.pid),
                            "-f", "raw", "-o", str(tmp / "spy.txt")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = _target(proc)
    spy.wait()
    return result


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
                runs[f"rsprof -p {hz} Hz"] = functools.partial(
                    rsprof_run, args.python, args.seconds, hz, Path(tmp))
                runs[f"rsprof -p {hz} Hz off"] = functools.partial(
                    rsprof_run, args.python, args.seconds, hz, Path(tmp), "--python=off")
                if py_spy:
                    runs[f"py-spy {hz} Hz nonblock"] = functools.partial(
                        py_spy_run, args.python, args.seconds, hz, py_spy, Path(tmp))
                    runs[f"py-spy {hz} Hz blocking"] = functools.partial(
                        py_spy_run, args.python, args.seconds, hz, py_spy, Path(tmp), True)
            for name, run in runs.items():
                results.setdefault(name, []).append(run())
    base = statistics.mean(r["rounds"] for r in results["baseline"])
    base_cpu = statistics.mean(r["rounds_per_cpu_s"] for r in results["baseline"])
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'configuration':<26} {'rounds vs baseline':>18} {'per target CPU s':>16} "
          f"{'µs CPU/walk':>12} "
          f"{'dropped %':>10} {'heavy share':>12} {'ms CPU/sample':>14} {'p50 delay':>9}")
    for name, rows in results.items():
        ratio = statistics.mean(r["rounds"] for r in rows) / base
        per_cpu = statistics.mean(r["rounds_per_cpu_s"] for r in rows) / base_cpu
        extra = ""
        if "walks" in rows[0]:
            extra = (f"{statistics.mean(r['cpu_us_per_walk'] for r in rows):>12.1f} "
                     f"{statistics.mean(r['dropped_pct'] for r in rows):>10.2f} "
                     f"{statistics.mean(r['heavy_share'] for r in rows):>12.3f}")
        elif "samples" in rows[0]:
            extra = (f"{statistics.mean(r['walk_us'] for r in rows):>12.1f} {'':>10} "
                     f"{statistics.mean(r['heavy_share'] for r in rows):>12.3f} "
                     f"{statistics.mean(r['cpu_ms_per_sample'] for r in rows):>14.3f}"
                     f" {statistics.median(r['stale_p50_us'] for r in rows):>9.0f}")
        print(f"{name:<26} {ratio:>18.3f} {per_cpu:>16.3f} {extra}")


if __name__ == "__main__":
    main()
