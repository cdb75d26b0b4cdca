#!/usr/bin/env python3
"""Heap tracking of a running process (`rsprof -p PID`, issue 22): how long injecting the
shim takes and stops the target, and what the target's allocation speed is while attached
and after the detach; beside heaptrack -p (gdb) when it is installed.

Targets: tests/targets/attach_alloc.c (4 threads allocating 4000-byte blocks all the time)
for the injection figures; bench/targets/alloc_storm.c (malloc/free storm, started with
--wait so that its timed loop runs after the attach or after the detach) for the speeds.

Figures per run (median and max of --repeat runs):
  ring      seconds from starting `rsprof -p PID` to the shim's ring in /dev/shm
  first     ... to the first heap event in it (the ring's write_pos moves)
  stopped   ms the injecting thread was stopped (meta heap_attach_stopped_ms; the other
            threads run on), and the stops it took to find a safe point
  storm     loop seconds: plain, while attached, `rsprof run`, after a detach

Usage: python bench/bench_heap_attach.py [--repeat N] [--pairs N]
rsprof must be installed (pip install .).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRITE_POS = 192  # native/heapring.h RSPROF_HEAP_OFF_WRITE_POS


def build(source: Path, out: Path) -> Path:
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", str(out), str(source)], check=True)
    return out


def rings(pid: int) -> list[Path]:
    return list(Path("/dev/shm").glob(f"rsprof-heap.{pid}.*"))


def write_pos(ring: Path) -> int:
    try:
        with ring.open("rb") as f:
            f.seek(WRITE_POS)
            return struct.unpack("<Q", f.read(8))[0]
    except (OSError, struct.error):
        return 0


def rsprof(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-P", "-m", "rsprof", *args], text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]


def meta(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT key, value FROM meta"))


def inject_once(binary: Path, tmp: Path, n: int) -> dict[str, float]:
    target = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert target.stdout is not None and target.stdin is not None
    target.stdout.readline()
    db = tmp / f"attach{n}.db"
    start = time.monotonic()
    recorder = rsprof("-p", str(target.pid), "-q", "-d", "2s", "-o", str(db))
    ring_s = first_s = float("nan")
    while recorder.poll() is None:
        found = rings(target.pid)
        if found and ring_s != ring_s:
            ring_s = time.monotonic() - start
        if found and write_pos(found[0]) > 0:
            first_s = time.monotonic() - start
            break
        time.sleep(0.0005)
    _out, err = recorder.communicate(timeout=60)
    target.stdin.write("quit\n")
    target.stdin.close()
    target.wait(30)
    if recorder.returncode != 0:
        raise SystemExit(f"rsprof failed: {err}")
    m = meta(db)
    return {"ring": ring_s, "first": first_s, "stopped": float(m["heap_attach_stopped_ms"]),
            "tries": float(m["heap_attach_tries"])}


def heaptrack_once(binary: Path, tmp: Path) -> float | None:
    """Seconds from `heaptrack -p PID` to its 'injection finished' (gdb attaches to the
    whole process: every thread is stopped meanwhile)."""
    target = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert target.stdout is not None and target.stdin is not None
    target.stdout.readline()
    start = time.monotonic()
    tracker = subprocess.Popen(["heaptrack", "-p", str(target.pid)], cwd=tmp, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert tracker.stdout is not None
    took = None
    for line in tracker.stdout:
        if "injection finished" in line:
            took = time.monotonic() - start
            break
    tracker.send_signal(2)
    try:
        tracker.wait(30)
    except subprocess.TimeoutExpired:
        tracker.kill()
    target.stdin.write("quit\n")
    target.stdin.close()
    target.wait(30)
    return took


def storm(binary: Path, pairs: int, tmp: Path, mode: str) -> float:
    """The storm's loop seconds: plain, attached (rsprof -p while it runs), run (rsprof run),
    detached (attached and detached before the loop starts)."""
    if mode == "run":
        db = tmp / "run.db"
        db.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-P", "-m", "rsprof", "run", "-q", "-o", str(db),
                               "--", str(binary), str(pairs)], capture_output=True, text=True)
        return float(re.search(r"loop_s=([\d.]+)", done.stdout).group(1))  # type: ignore[union-attr]
    target = subprocess.Popen([str(binary), str(pairs), "--wait"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert target.stdin is not None
    recorder = None
    if mode in ("attached", "detached"):
        db = tmp / f"{mode}.db"
        db.unlink(missing_ok=True)
        recorder = rsprof("-p", str(target.pid), "-q", "-o", str(db),
                          *(["-d", "1s"] if mode == "detached" else []))
        while not rings(target.pid):
            time.sleep(0.005)
        if mode == "detached":
            recorder.communicate(timeout=60)
    target.stdin.write("go\n")
    target.stdin.flush()
    out, _ = target.communicate(timeout=600)
    if recorder is not None and recorder.poll() is None:
        recorder.send_signal(2)
        recorder.communicate(timeout=60)
    return float(re.search(r"loop_s=([\d.]+)", out).group(1))  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=5_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        alloc = build(ROOT / "tests/targets/attach_alloc.c", tmp / "attach_alloc")
        runs = [inject_once(alloc, tmp, n) for n in range(args.repeat)]
        for key, unit in (("ring", "s"), ("first", "s"), ("stopped", "ms"), ("tries", "")):
            values = [r[key] for r in runs]
            print(f"rsprof -p  {key:8} median {statistics.median(values):.3f}{unit}"
                  f"  max {max(values):.3f}{unit}")
        if shutil.which("heaptrack") and shutil.which("gdb"):
            took = [t for t in (heaptrack_once(alloc, tmp) for _ in range(args.repeat)) if t]
            if took:
                print(f"heaptrack -p injection (whole process stopped by gdb) median"
                      f" {statistics.median(took):.3f}s  max {max(took):.3f}s")
        else:
            print("heaptrack -p: not installed")
        storm_bin = build(ROOT / "bench/targets/alloc_storm.c", tmp / "alloc_storm")
        modes = ("plain", "attached", "run", "detached")
        loops: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.repeat):
            for mode in modes:  # interleaved: load changes hit every mode alike
                loops[mode].append(storm(storm_bin, args.pairs, tmp, mode))
        plain = statistics.median(loops["plain"])
        for mode in modes:
            value = statistics.median(loops[mode])
            print(f"storm {args.pairs} pairs {mode:9} loop {value:.3f}s  x{value / plain:.2f}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
