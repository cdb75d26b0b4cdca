#!/usr/bin/env python3
"""Short-lived threads: samples rsprof records beside `perf record` on the same program, in
one run. The target (tests/targets/short_threads.c, the test's own) spins MAIN_MS on its
main thread, then runs THREADS threads of MS each (4 at a time), all on CPU time, so the
threads' true share is THREADS*MS / (THREADS*MS + MAIN_MS).

Printed per tool: samples, the threads' share of them (vs the truth), and samples per
second of the program's CPU time (vs the requested frequency).

Usage: python bench/bench_threads.py [--threads 200] [--ms 20] [--main-ms 1000] [--freq 999]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).parent


def build(tmp: Path) -> Path:
    binary = tmp / "short_threads"
    subprocess.run(["gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", str(binary),
                    str(HERE.parent / "tests" / "targets" / "short_threads.c")], check=True)
    return binary


def rsprof(binary: Path, argv: list[str], freq: int, tmp: Path) -> tuple[int, int]:
    out = tmp / "r.db"
    subprocess.run(["rsprof", "run", "-q", "--no-heap", "--cpu-freq", str(freq), "-o", str(out),
                    "--", str(binary), *argv], check=True, capture_output=True)
    rows = json.loads(subprocess.run(["rsprof", "top", "cpu", str(out), "--json", "-n", "0"],
                                     check=True, capture_output=True, text=True).stdout)
    by = {r["function"]: r for r in rows}
    total = sum(r["self"] for r in rows)
    return total, by.get("thread_spin", {}).get("total", 0)


def perf(binary: Path, argv: list[str], freq: int, tmp: Path) -> tuple[int, int] | None:
    tool = shutil.which("perf")
    if tool is None:
        return None
    data = tmp / "perf.data"
    subprocess.run([tool, "record", "-q", "-e", "cpu-clock", "-F", str(freq), "-g", "-o",
                    str(data), "--", str(binary), *argv], check=True, capture_output=True)
    script = subprocess.run([tool, "script", "-i", str(data), "-F", "ip,sym"], check=True,
                            capture_output=True, text=True).stdout
    stacks = script.strip().split("\n\n")
    threads = sum(1 for s in stacks if "thread_spin" in s)
    return len(stacks), threads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--ms", type=float, default=20)
    parser.add_argument("--main-ms", type=float, default=1000)
    parser.add_argument("--freq", type=int, default=999)
    args = parser.parse_args()
    truth = args.threads * args.ms / (args.threads * args.ms + args.main_ms)
    cpu_s = (args.threads * args.ms + args.main_ms) / 1000
    argv = [str(args.threads), str(args.ms), str(args.main_ms)]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        binary = build(tmp)
        print(f"{args.threads} threads x {args.ms} ms + main {args.main_ms} ms at {args.freq} Hz;"
              f" threads' true share {truth:.3f}")
        results = {"rsprof": rsprof(binary, argv, args.freq, tmp),
                   "perf": perf(binary, argv, args.freq, tmp)}
        base = results["perf"]
        for name, result in results.items():
            if result is None:
                print(f"{name:<8} not installed")
                continue
            total, threads = result
            vs = f"  {total / base[0]:.2f}x perf's samples" if base else ""
            print(f"{name:<8} {total:6d} samples  threads' share {threads / max(1, total):.3f}"
                  f"  {total / cpu_s:7.1f} samples per CPU second{vs}")


if __name__ == "__main__":
    main()
