#!/usr/bin/env python3
"""Heap shim cost for a Python program: native stacks only vs with Python frames, with
pymalloc and with PYTHONMALLOC=malloc, and the same shim on a C allocation storm (which
must not pay for the Python support). No reader attached (a 64 KiB ring, full at once):
what the shim itself costs the target. Target user + system CPU (wait4), interleaved,
best of --repeat.

Usage: python bench/bench_heap_python.py [--python /usr/bin/python3] [--n 3000000]
                                          [--repeat 5]
rsprof must be installed (pip install .): the shim comes from the package.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from rsprof.session import SHIM_PATH

HERE = Path(__file__).resolve().parent


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{argv} failed: {status}")
    return usage.ru_utime + usage.ru_stime


def table(argv: list[str], modes: dict[str, dict[str, str]], repeat: int) -> None:
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(repeat):
        for mode, extra in modes.items():
            env = {**os.environ, "RSPROF_HEAP_RING_KB": "64", **extra}
            times[mode].append(cpu_seconds(argv, env))
    base = min(times["plain"])
    print(f"\n{' '.join(argv)}\n| mode | best s | median s | x plain |\n|---|---|---|---|")
    for mode, values in times.items():
        print(f"| {mode} | {min(values):.3f} | {statistics.median(values):.3f} |"
              f" {min(values) / base:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--n", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    shim = {"LD_PRELOAD": str(SHIM_PATH)}
    table([args.python, str(HERE / "targets/pyalloc.py"), str(args.n)], {
        "plain": {},
        "shim, native only": {**shim, "RSPROF_HEAP_PYTHON": "0"},
        "shim, Python frames": shim,
        "PYTHONMALLOC=malloc": {"PYTHONMALLOC": "malloc"},
        "PYTHONMALLOC=malloc, shim, native only": {**shim, "RSPROF_HEAP_PYTHON": "0",
                                                   "PYTHONMALLOC": "malloc"},
        "PYTHONMALLOC=malloc, shim, Python frames": {**shim, "PYTHONMALLOC": "malloc"},
    }, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        storm = Path(tmp) / "alloc_storm"
        subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(storm),
                        str(HERE / "targets/alloc_storm.c")], check=True)
        table([str(storm), "3000000"], {"plain": {}, "shim": shim}, args.repeat)


if __name__ == "__main__":
    main()
