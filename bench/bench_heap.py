#!/usr/bin/env python3
"""Allocation-storm benchmark for the heap shim (librsprof_heap.so) and HeapReader.

Compiles bench/targets/alloc_storm.c (20 M malloc/free pairs of random sizes, fixed seed,
a few thousand blocks live) and times it, in the same run:

  plain      no shim: the baseline
  full       shim, every event, with a HeapReader draining the ring from this process
  sampled    shim with RSPROF_HEAP_SAMPLE_BYTES (default 512 KiB), reader draining
  noreader   shim, every event, nobody reading (ring fills, then events are dropped and
             counted): what an unattended target pays
  heaptrack  `heaptrack -o <tmp> ./alloc_storm` (if installed)

The storm prints its own loop time (loop_s, start-up excluded); that is the figure the
ratios use.  Wall time of the whole command is printed beside it (for heaptrack it
includes heaptrack's start-up and the writing of its data file).

Usage: python bench/bench_heap.py [--pairs N] [--repeat R] [--sample-bytes N]
                                  [--ring-mb M] [--skip-heaptrack]
Build first: python setup.py -q build_ext --inplace
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rsprof._native import HeapReader  # noqa: E402

SHIM = REPO / "rsprof" / "lib" / "librsprof_heap.so"
SOURCE = REPO / "bench" / "targets" / "alloc_storm.c"


@dataclass
class Run:
    loop_s: float
    wall_s: float
    events: int = 0
    lost: int = 0
    reader_busy_s: float = 0.0


@dataclass
class Mode:
    name: str
    runs: list[Run] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs)


def build(tmp: Path) -> Path:
    exe = tmp / "alloc_storm"
    subprocess.run(
        ["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", str(exe), str(SOURCE)], check=True
    )
    return exe


def loop_time(stdout: str) -> float:
    for line in stdout.splitlines():
        if line.startswith("loop_s="):
            return float(line.split("=", 1)[1])
    raise RuntimeError(f"alloc_storm printed no loop time: {stdout!r}")


def shim_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSPROF_HEAP_")}
    env["LD_PRELOAD"] = str(SHIM)
    env.update(extra)
    return env


def run_plain(exe: Path, pairs: int, env: dict[str, str] | None = None) -> Run:
    t0 = time.perf_counter()
    out = subprocess.run(
        [str(exe), str(pairs)], capture_output=True, text=True, env=env, check=True
    ).stdout
    return Run(loop_time(out), time.perf_counter() - t0)


def run_with_reader(exe: Path, pairs: int, env: dict[str, str]) -> Run:
    """Starts the storm (waiting on stdin), attaches a reader, lets it go, and drains
    until it exits: the same loop the recorder's drain thread runs, without the rest."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [str(exe), str(pairs), "--wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    ring = Path(f"/dev/shm/rsprof-heap.{proc.pid}")
    deadline = time.monotonic() + 10
    while not ring.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the storm created no ring: is the shim built?")
        time.sleep(0.001)
    reader = HeapReader.attach(proc.pid)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    events, busy = 0, 0.0
    while proc.poll() is None:
        a = time.perf_counter()
        n = reader.poll()
        busy += time.perf_counter() - a
        events += n
        # Poll again at once while the ring is busy (full capture moves ~20 M events/s,
        # the 16 MiB ring holds ~10 ms of them); otherwise nap, so that a trickle of events
        # (sampled mode) does not keep a reader spinning on the target's second core.
        if n < 4096:
            time.sleep(0.005)
    events += reader.poll()
    batch = reader.take()
    reader.close()
    out = proc.stdout.read()
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"storm failed with {proc.returncode}")
    return Run(loop_time(out), time.perf_counter() - t0, events, batch.lost, busy)


def run_noreader(exe: Path, pairs: int, env: dict[str, str]) -> Run:
    t0 = time.perf_counter()
    out = subprocess.run(
        [str(exe), str(pairs)], capture_output=True, text=True, env=env, check=True
    ).stdout
    return Run(loop_time(out), time.perf_counter() - t0)


def run_heaptrack(exe: Path, pairs: int, tmp: Path) -> Run:
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["heaptrack", "-o", str(tmp / "ht"), str(exe), str(pairs)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - t0
    for f in tmp.glob("ht*"):
        f.unlink()
    return Run(loop_time(proc.stdout), wall)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20_000_000, help="malloc/free pairs")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode (median reported)")
    ap.add_argument(
        "--sample-bytes",
        type=int,
        default=512 * 1024,
        help="RSPROF_HEAP_SAMPLE_BYTES for the sampled mode",
    )
    ap.add_argument(
        "--ring-mb", type=int, default=0, help="RSPROF_HEAP_RING_MB (0: the shim's default)"
    )
    ap.add_argument("--skip-heaptrack", action="store_true")
    args = ap.parse_args()
    if not SHIM.exists():
        print(
            f"{SHIM} missing: run `python setup.py -q build_ext --inplace` first", file=sys.stderr
        )
        return 2

    ring = {"RSPROF_HEAP_RING_MB": str(args.ring_mb)} if args.ring_mb else {}
    have_heaptrack = shutil.which("heaptrack") is not None and not args.skip_heaptrack
    modes = [Mode("plain"), Mode("full"), Mode("sampled"), Mode("noreader")]
    if have_heaptrack:
        modes.append(Mode("heaptrack"))
    with tempfile.TemporaryDirectory(prefix="rsprof-bench-heap-") as tmpdir:
        tmp = Path(tmpdir)
        exe = build(tmp)
        run_plain(exe, args.pairs // 10)  # warm caches, page in the binary
        for i in range(args.repeat):
            # interleaved, so a noisy neighbour hurts every mode alike
            for mode in modes:
                if mode.name == "plain":
                    r = run_plain(exe, args.pairs)
                elif mode.name == "full":
                    r = run_with_reader(exe, args.pairs, shim_env(**ring))
                elif mode.name == "sampled":
                    r = run_with_reader(
                        exe,
                        args.pairs,
                        shim_env(RSPROF_HEAP_SAMPLE_BYTES=str(args.sample_bytes), **ring),
                    )
                elif mode.name == "noreader":
                    r = run_noreader(exe, args.pairs, shim_env(**ring))
                else:
                    if i > 0:  # ~15x slower: once is enough
                        continue
                    r = run_heaptrack(exe, args.pairs, tmp)
                mode.runs.append(r)
                print(
                    f"  run {i + 1} {mode.name:9s} loop {r.loop_s:7.3f} s  wall "
                    f"{r.wall_s:7.3f} s"
                    + (f"  events {r.events}  lost {r.lost}" if r.events else ""),
                    flush=True,
                )

    base = modes[0].median("loop_s")
    print()
    print(
        f"alloc_storm: {args.pairs:,} malloc/free pairs, median of {args.repeat} (heaptrack: 1 run)"
    )
    print(
        f"{'mode':10s} {'loop s':>8s} {'x plain':>8s} {'wall s':>8s} {'ns/pair':>8s} "
        f"{'events':>11s} {'lost':>9s} {'reader s':>9s}"
    )
    for mode in modes:
        loop = mode.median("loop_s")
        events = int(mode.median("events"))
        lost = int(mode.median("lost"))
        busy = mode.median("reader_busy_s")
        print(
            f"{mode.name:10s} {loop:8.3f} {loop / base:8.2f} {mode.median('wall_s'):8.3f} "
            f"{loop / args.pairs * 1e9:8.1f} {events if events else '-':>11} "
            f"{lost if mode.name in ('full', 'sampled') else '-':>9} "
            f"{f'{busy:.3f}' if busy else '-':>9}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
