#!/usr/bin/env python3
"""Off-CPU recording under a context-switch storm (issue 23 item 5): the target's slowdown
and the records lost, rsprof beside `perf record -e sched:sched_switch --call-graph dwarf`,
in one run, repeated interleaved rounds (median and spread).

The target (bench/targets/switch_storm.c) is 4 pairs of threads ping-ponging one byte over
pipes for SECONDS; it prints its round trips (two switch-outs each). Slowdown: round trips
alone / round trips recorded, both medians of the rounds; every round runs every row once,
in order, so the machine's load drifts over all rows alike.

Rows: the target alone; rsprof (CPU + off-CPU, --no-heap) as it runs by default at each
--stack-bytes asked (16 KiB is the default; as root the kernel call chain names the waited-in
function until the switch rate passes --off-cpu-kernel-max-rate, 20 k/s: the storm sheds it
after its first 0.25 s), with the chain kept (--off-cpu-kernel-max-rate 0) and without it
(--no-off-cpu-kernel); perf on
the tracepoint with its default 8 KiB dwarf copy; perf on
the software `context-switches` event (-c 1) with the same copy, the mechanism that needs
no tracepoint permission (measured with perf: the cost of the event, not of a reader).

Losses: rsprof's meta offcpu_lost of offcpu_switches + offcpu_lost; perf's lost samples
(`perf report --stats`, the last LOST_SAMPLES figure) of those plus its SAMPLE events.

--python-target PYTHON: the storm is bench/targets/py_switch_storm.py run by PYTHON instead (2
pairs of threads, 20 Python calls deep): rsprof reads their Python frames at every switch-out
(its BPF switch program) until the rate passes --off-cpu-kernel-max-rate, the chain-kept row
never sheds them.

Usage: python bench/bench_offcpu.py [--rounds 3] [--seconds 2] [--stack-bytes 16384]
       [--hogs 0] [--baseline PYTHON] [--python-target PYTHON]
  --hogs N: N busy loops beside every run, as the tests' four hogs;
  --baseline: an interpreter with another commit's rsprof installed (e.g. one without the
  kernel call chain), as one more row of the same rounds
"""

from __future__ import annotations

import argparse
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent


Storm = list[str]  # the target's command, without its SECONDS argument


def build(tmp: Path) -> Storm:
    binary = tmp / "storm"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", str(binary),
                    str(HERE / "targets" / "switch_storm.c")], check=True)
    return [str(binary)]


def trips(stdout: str) -> int:
    return int(stdout.strip().splitlines()[-1])


def alone(storm: Storm, seconds: int, tmp: Path) -> tuple[int, int, int]:
    done = subprocess.run([*storm, str(seconds)], capture_output=True, text=True,
                          check=True)
    return trips(done.stdout), 0, 0


def rsprof(stack_bytes: int, python: str = sys.executable, *options: str
           ) -> Callable[[Storm, int, Path], tuple[int, int, int]]:
    def run(storm: Storm, seconds: int, tmp: Path) -> tuple[int, int, int]:
        db = tmp / "r.db"
        done = subprocess.run([python, "-P", "-m", "rsprof", "run", "-q", "--no-heap",
                               "--stack-bytes", str(stack_bytes), *options, "-o", str(db), "--",
                               *storm, str(seconds)],
                              capture_output=True, text=True, check=True)
        with sqlite3.connect(db) as con:
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        db.unlink()
        lost = int(meta.get("offcpu_lost") or 0)
        if meta.get("python_offcpu_bpf_switches"):
            print(f"  Python frames read at {meta['python_offcpu_bpf_switches']} switch-outs,"
                  f" shed at {meta.get('python_offcpu_shed_s') or 'never'} s", file=sys.stderr)
        return trips(done.stdout), lost, int(meta.get("offcpu_switches") or 0) + lost
    return run


def perf(event: list[str]) -> Callable[[Storm, int, Path], tuple[int, int, int]]:
    def run(storm: Storm, seconds: int, tmp: Path) -> tuple[int, int, int]:
        data = tmp / "p.data"
        done = subprocess.run(["perf", "record", "-q", *event, "--call-graph", "dwarf",
                               "-o", str(data), "--", *storm, str(seconds)],
                              capture_output=True, text=True, check=True)
        stats = subprocess.run(["perf", "report", "--stats", "-i", str(data)],
                               capture_output=True, text=True, check=True).stdout
        data.unlink()
        lost = re.findall(r"LOST_SAMPLES events:\s+(\d+)", stats)
        samples = re.findall(r"\bSAMPLE events:\s+(\d+)", stats)
        n_lost = int(lost[-1]) if lost else 0
        return trips(done.stdout), n_lost, (int(samples[-1]) if samples else 0) + n_lost
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--stack-bytes", default="16384",
                        help="rsprof rows, comma-separated")
    parser.add_argument("--hogs", type=int, default=0)
    parser.add_argument("--no-perf", action="store_true", help="rsprof rows only")
    parser.add_argument("--baseline", default="",
                        help="a Python with another rsprof installed (another commit): one"
                             " more row, its default stack copy")
    parser.add_argument("--python-target", default="",
                        help="run bench/targets/py_switch_storm.py with this interpreter")
    args = parser.parse_args()
    rows: list[tuple[str, Callable[[Storm, int, Path], tuple[int, int, int]]]] = [
        ("alone", alone)]
    for size in (int(s) for s in args.stack_bytes.split(",") if s):
        rows.append((f"rsprof, sched_switch, {size // 1024} KiB copies", rsprof(size)))
    rows.append(("rsprof --off-cpu-kernel-max-rate 0 (chain kept), 16 KiB copies",
                 rsprof(16384, sys.executable, "--off-cpu-kernel-max-rate", "0")))
    rows.append(("rsprof --no-off-cpu-kernel, 16 KiB copies",
                 rsprof(16384, sys.executable, "--no-off-cpu-kernel")))
    if args.baseline:
        rows.append((f"rsprof at {args.baseline}, 16 KiB copies",
                     rsprof(16384, args.baseline)))
    if shutil.which("perf") and not args.no_perf:
        rows.append(("perf, sched_switch, dwarf 8 KiB", perf(["-e", "sched:sched_switch"])))
        rows.append(("perf, context-switches -c 1, dwarf 8 KiB",
                     perf(["-e", "context-switches", "-c", "1"])))
    results: dict[str, list[tuple[int, int, int]]] = {name: [] for name, _ in rows}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.hogs)]
    try:
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            storm = ([args.python_target, str(HERE / "targets" / "py_switch_storm.py")]
                     if args.python_target else build(tmp))
            for round_ in range(args.rounds):
                for row, run in rows:
                    results[row].append(run(storm, args.seconds, tmp))
                    print(f"round {round_ + 1} {row}: {results[row][-1]}", file=sys.stderr)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    base = statistics.median(t for t, _, _ in results["alone"])
    target = f"py_switch_storm.py ({args.python_target})" if args.python_target else "switch_storm"
    print(f"{target}: {args.rounds} rounds of {args.seconds} s, {args.hogs} hogs;"
          " median (min-max)\n")
    print("| run | round trips | slowdown | records lost |")
    print("| --- | --- | --- | --- |")
    for row, _ in rows:
        got = results[row]
        counts = [t for t, _, _ in got]
        slow = [base / t if t else float("inf") for t in counts]
        lost = [100 * lo / all_ if all_ else 0.0 for _, lo, all_ in got]
        lost_cell = "" if row == "alone" else (
            f"{statistics.median(lost):.1f} % ({min(lost):.1f}-{max(lost):.1f} %),"
            f" {int(statistics.median(lo for _, lo, _ in got)):,} of"
            f" {int(statistics.median(a for _, _, a in got)):,}")
        print(f"| {row} | {int(statistics.median(counts)):,} ({min(counts):,}-{max(counts):,})"
              f" | {statistics.median(slow):.2f}x ({min(slow):.2f}-{max(slow):.2f}) |"
              f" {lost_cell} |")


if __name__ == "__main__":
    main()
