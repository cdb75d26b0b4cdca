#!/usr/bin/env python3
"""Eval-loop samples without Python frames (issue 21), per interpreter, quiet and loaded.

`rsprof run -q --no-heap` records a pure-Python recursion (fib) and C re-entry (a generator
driven by `sum()`, `sorted(key=...)`) on every CPython given. A sample is "eval" when its
stack has Python frames or a `_PyEval_EvalFrameDefault` frame left unspliced; the printed
share is of eval samples that kept `_PyEval_EvalFrameDefault` (no Python frames: dropped,
late or unpaired), and those that have Python frames but whose innermost evaluator was
between frames at the sampled instant (kept native: collector.pyframes.splice_plan), with
the recording's meta (`python_mode` and its counters). Each
configuration runs once per load, interleaved over interpreters; load = N busy shell loops
started here and killed by PID after.

`--modes on drain` also runs each configuration with `--python=drain` right after (the
reads from outside at drain time, what rsprof did before the BPF sampler).

Usage: python bench/bench_pyevalgap.py [--seconds 4] [--freq 499] [--hogs 0 4]
       [--modes on drain] [PYTHON...]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

FIB = """\
import sys, time
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    fib(20)
"""
GEN = """\
import sys, time
def work(n):
    return sum(x * x for x in range(n))
def key(x):
    return x * 3
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    work(20000)
    sorted(range(2000), key=key)
"""
PYTHONS = [os.path.expanduser(f"~/.pyenv/versions/{v}/bin/python3")
           for v in ("3.11.7", "3.12.1", "3.13.0")]
META_KEYS = ("mode", "between", "walks", "bpf_attached", "bpf_missing", "bpf_fault",
             "bpf_freed", "bpf_ip_mismatch", "bpf_pair_dt_ns", "drain_attached", "dropped",
             "late", "unpaired")


def eval_share(db: Path) -> tuple[int, int, int, int, dict[str, str]]:
    """(samples, eval samples, eval samples without Python frames, eval samples with Python
    frames whose innermost evaluator was between frames (kept native), meta)."""
    con = sqlite3.connect(db)
    meta = dict(con.execute("SELECT key, value FROM meta"))
    rows = con.execute("""
      SELECT SUM(s.count),
        EXISTS (SELECT 1 FROM stack_frames sf JOIN frame_locations fl ON fl.frame_id = sf.frame_id
                JOIN locations l ON l.id = fl.location_id
                WHERE sf.stack_id = s.stack_id AND l.function = '_PyEval_EvalFrameDefault'),
        EXISTS (SELECT 1 FROM stack_frames sf JOIN frames f ON f.id = sf.frame_id
                WHERE sf.stack_id = s.stack_id AND ((f.address >> 48) & 65535) = 65534)
      FROM cpu_stack_samples s GROUP BY s.stack_id""").fetchall()
    con.close()
    total = sum(r[0] for r in rows)
    evals = sum(r[0] for r in rows if r[1] or r[2])
    lost = sum(r[0] for r in rows if r[1] and not r[2])
    return total, evals, lost, sum(r[0] for r in rows if r[1] and r[2]), meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", default="4")
    parser.add_argument("--freq", default="499")
    parser.add_argument("--hogs", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--rsprof", default="rsprof")
    parser.add_argument("--modes", nargs="+", default=["on"], choices=["on", "drain"])
    parser.add_argument("pythons", nargs="*", default=PYTHONS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pyevalgap-"))
    scripts = {"fib": work / "fib.py", "gen": work / "gen.py"}
    scripts["fib"].write_text(FIB)
    scripts["gen"].write_text(GEN)
    print("| interpreter | workload | hogs | --python | samples | eval | without Python frames "
          "| evaluator between frames | meta |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for load in args.hogs:
        hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(load)]
        try:
            for name, script in scripts.items():
                for python, mode in [(p, m) for p in args.pythons for m in args.modes]:
                    version = subprocess.run([python, "-c", "import sys; print(sys.version[:6])"],
                                             capture_output=True, text=True).stdout.strip()
                    db = work / f"{version}-{name}-{load}-{mode}.db"
                    run = subprocess.run([args.rsprof, "run", "-q", "--no-heap", "-F", args.freq,
                                          f"--python={mode}", "-o", str(db), "--", python,
                                          str(script), args.seconds],
                                         capture_output=True, text=True)
                    row = f"| {version} | {name} | {load} | {mode} |"
                    if run.returncode:
                        print(f"{row} failed: {run.stderr.strip()} |")
                        continue
                    total, evals, bad, between, meta = eval_share(db)
                    shown = " ".join(f"{key}={meta[f'python_{key}']}" for key in META_KEYS
                                     if f"python_{key}" in meta)
                    print(f"{row} {total} | {evals} | {bad} ({100 * bad / max(evals, 1):.1f} %)"
                          f" | {between} | {shown} |", flush=True)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
    print(f"profiles in {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
