#!/usr/bin/env python3
"""What the BPF program that reads Python frames at sample time costs the target per sample.

The program (native/bpf/pyperf.bpf.c) runs in the sampled thread's interrupt, so its time
is the target's. The kernel measures it when BPF statistics are on: this script turns them
on for its own lifetime only (a BPF_ENABLE_STATS file descriptor, released at exit; the
sysctl is never touched) and reads `run_time_ns / run_cnt` of the program from the
recorder's /proc/PID/fdinfo while `rsprof -p` records a recursion DEPTH frames deep at
999 Hz, for each interpreter and depth, interleaved per repeat. The shallow depth is the
baseline: the difference over the extra frames is the cost per frame. `--rsprof` adds
another install (a build of an earlier commit) beside this one, in the same runs.

Usage: python bench/bench_pybpf.py [--repeat 4] [--seconds 3] [--depth 5 --depth 60]
       [--python /usr/bin/python3 ...] [--rsprof NAME=PATH/TO/rsprof ...]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = """\
import sys, time
def rec(n, end):
    if n:
        return rec(n - 1, end)
    while time.monotonic() < end:
        s = 0
        for i in range(1000):
            s += i
print("ready", flush=True)
rec(int(sys.argv[2]), time.monotonic() + float(sys.argv[1]))
"""
BPF_ENABLE_STATS = 32
BPF_PROG_TYPE_PERF_EVENT = "7"
SYS_BPF = {"x86_64": 321, "aarch64": 280}


def enable_stats() -> int:
    """A file descriptor that keeps the kernel's BPF run-time statistics on while open."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 32)()  # enable_stats.type = BPF_STATS_RUN_TIME (0)
    fd = int(libc.syscall(SYS_BPF[os.uname().machine], BPF_ENABLE_STATS, ctypes.byref(attr),
                          ctypes.sizeof(attr)))
    if fd < 0:
        sys.exit(f"bench_pybpf: BPF_ENABLE_STATS failed: {os.strerror(ctypes.get_errno())}")
    return fd


def program_ns_per_run(pid: int) -> float | None:
    """rs_pyperf's mean run time in process `pid` (the recorder), from its fdinfo."""
    for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            text = fd.read_text()
        except OSError:
            continue
        info = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        if info.get("prog_type") == BPF_PROG_TYPE_PERF_EVENT and int(info.get("run_cnt", 0)):
            return int(info["run_time_ns"]) / int(info["run_cnt"])
    return None


def one_run(rsprof: str, python: str, script: Path, depth: int, seconds: float,
            out: Path) -> float | None:
    target = subprocess.Popen([python, str(script), str(seconds + 2), str(depth)],
                              stdout=subprocess.PIPE, text=True)
    assert target.stdout is not None and target.stdout.readline().startswith("ready")
    recorder = subprocess.Popen([rsprof, "-p", str(target.pid), "-q", "--no-heap",
                                 "--no-off-cpu", "--cpu-freq", "999", "-o", str(out)],
                                stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    ns = program_ns_per_run(recorder.pid)
    target.wait()
    recorder.wait()
    out.unlink(missing_ok=True)
    return ns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append")
    parser.add_argument("--depth", type=int, action="append")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--rsprof", action="append", default=[],
                        help="NAME=PATH: another rsprof beside this one")
    args = parser.parse_args()
    pythons = args.python or ["/usr/bin/python3"]
    depths = args.depth or [5, 60]
    this = shutil.which("rsprof") or sys.exit("bench_pybpf: rsprof is not on PATH")
    builds = {"this": this, **dict(b.split("=", 1) for b in args.rsprof)}
    stats_fd = enable_stats()
    results: dict[tuple[str, str, int], list[float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "deep.py"
            script.write_text(TARGET)
            for _ in range(args.repeat):
                for python in pythons:
                    for depth in depths:
                        for name, rsprof in builds.items():
                            ns = one_run(rsprof, python, script, depth, args.seconds,
                                         Path(tmp) / "p.db")
                            if ns is not None:
                                results.setdefault((name, python, depth), []).append(ns)
    finally:
        os.close(stats_fd)
    print(f"load average {os.getloadavg()[0]:.1f}; µs per sample, median of {args.repeat}")
    print(f"{'build':<8} {'python':<40} " + " ".join(f"{f'depth {d}':>9}" for d in depths)
          + f" {'per frame':>10}")
    for name in builds:
        for python in pythons:
            medians = [statistics.median(results.get((name, python, d), [float("nan")])) / 1e3
                       for d in depths]
            slope = (medians[-1] - medians[0]) / (depths[-1] - depths[0]) if len(depths) > 1 \
                else float("nan")
            print(f"{name:<8} {python:<40} " + " ".join(f"{m:>9.2f}" for m in medians)
                  + f" {slope * 1e3:>8.0f}ns")


if __name__ == "__main__":
    main()
