#!/usr/bin/env python3
"""Heap shim benchmark: an allocation storm and an STL-heavy C++ program, with call stacks
walked by CFI (the shim's default), by frame pointers and by libunwind, beside heaptrack,
all in the same run.

Targets, both built -O2 without frame pointers (as Debian builds its own code):

  storm   bench/targets/alloc_storm.c: 20 M malloc/free pairs of random sizes, fixed seed,
          a few thousand blocks live; 4-frame stacks
  stl     bench/targets/stl_churn.cc: std::string, std::map, std::unordered_map,
          std::vector and std::sort over 50,000-word texts, ~6 M allocations in 100
          rounds; 5-9-frame stacks through libstdc++ (no frame pointers either)

Modes (interleaved, median of --repeat runs):

  plain      no shim: the baseline
  cfi        shim (CFI unwinding), every event, a HeapReader draining the ring from this
             process; the target's own loop time ("loop_s=", start-up excluded)
  fp         the same with RSPROF_HEAP_UNWIND=fp (frame pointers: cheaper, and in these
             targets wrong: stacks end at the call site's caller or earlier)
  libunwind  the shim built with bench/shim_libunwind.c: unw_backtrace with a per-thread
             cache, heaptrack's unwinder (needs libunwind-dev)
  sampled    cfi with RSPROF_HEAP_SAMPLE_BYTES (default 512 KiB)
  noreader   cfi, nobody reading (ring full: events dropped and counted): what the shim
             itself costs the target; noreader-fp, noreader-libunwind likewise.  Their
             ratios use user CPU time (the target's own), which load inflates least
  run        `rsprof run -q -- TARGET` (the real CLI: CPU sampling at 99 Hz, heap shim),
             whole wall time, start-up included; run-fp the same with frame pointers
  heaptrack  `heaptrack -o <tmp> TARGET` (if installed), once

Ratios are loop times against plain's loop time, except run/run-fp/heaptrack (wall time
against plain's wall time, start-up included) and the noreader modes (user CPU time
against plain's).  "stacks" and "depth" are the distinct allocation stacks the reader saw
and their mean depth: frame pointers see shallower, wrong stacks in these targets.  "cpu x"
(reader modes): the target's user + system CPU time against plain's, which a loaded
machine inflates less than wall time (ring lines moving between the cores are in it).

Usage: python bench/bench_heap.py [--pairs N] [--rounds N] [--repeat R] [--only storm|stl]
                                  [--modes cfi,run,...] [--sample-bytes N] [--skip-heaptrack]
rsprof must be installed (pip install .): the shim and HeapReader come from the package.
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

import rsprof
from rsprof._native import HEAP_RING_NAME_PREFIX, HeapReader

REPO = Path(__file__).resolve().parents[1]
SHIM = Path(rsprof.__file__).resolve().parent / "lib" / "librsprof_heap.so"
NO_FP = ["-O2", "-g", "-fomit-frame-pointer"]


@dataclass
class Run:
    loop_s: float
    wall_s: float
    events: int = 0
    lost: int = 0
    reader_busy_s: float = 0.0
    user_s: float = 0.0  # the target's own user CPU time (noreader modes): the unwinder's cost
    cpu_s: float = 0.0  # the target's user + system CPU time (load inflates it less than wall)
    stacks: int = 0  # distinct allocation stacks the reader saw
    depth: float = 0.0  # their mean depth (frames)
    repeated: int = 0  # allocations sent as a repeat of their thread's stack (ALLOC_AGAIN)


@dataclass
class Mode:
    name: str
    runs: list[Run] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs)


@dataclass
class Target:
    name: str
    exe: Path
    args: list[str]


def build(tmp: Path) -> dict[str, Target]:
    storm, stl = tmp / "alloc_storm", tmp / "stl_churn"
    subprocess.run(["gcc", *NO_FP, "-o", str(storm), str(REPO / "bench/targets/alloc_storm.c")],
                   check=True)
    subprocess.run(["g++", *NO_FP, "-o", str(stl), str(REPO / "bench/targets/stl_churn.cc")],
                   check=True)
    return {"storm": Target("storm", storm, []), "stl": Target("stl", stl, [])}


def build_libunwind_shim(tmp: Path) -> Path | None:
    """heapshim.c linked with the libunwind walk; None without libunwind-dev."""
    out = tmp / "librsprof_heap_libunwind.so"
    result = subprocess.run(
        ["gcc", "-O2", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-omit-frame-pointer",
         "-pthread", f"-I{REPO / 'native'}", str(REPO / "native/shim/heapshim.c"),
         str(REPO / "native/shim/shimpy.c"),  # the shim's Python frames, as in the real one
         str(REPO / "bench/shim_libunwind.c"), "-lunwind", "-ldl", "-lpthread", "-lrt",
         "-o", str(out)],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        print(f"libunwind shim not built (apt-get install libunwind-dev):\n{result.stderr}",
              file=sys.stderr)
        return None
    return out


def loop_time(stdout: str) -> float:
    for line in stdout.splitlines():
        if line.startswith("loop_s="):
            return float(line.split("=", 1)[1])
    raise RuntimeError(f"the target printed no loop time: {stdout!r}")


def shim_env(shim: Path = SHIM, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSPROF_HEAP_")}
    env["LD_PRELOAD"] = str(shim)
    env.update(extra)
    return env


def run_plain(argv: list[str], env: dict[str, str] | None = None) -> Run:
    """Runs the target alone; also its user CPU time, which a loaded machine inflates far
    less than wall time."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"target failed with {proc.returncode}")
    return Run(loop_time(out), time.perf_counter() - t0, user_s=usage.ru_utime,
               cpu_s=usage.ru_utime + usage.ru_stime)


def run_with_reader(argv: list[str], env: dict[str, str]) -> Run:
    """Starts the target (waiting on stdin), attaches a reader, lets it go, and drains
    until it exits: the same loop the recorder's drain thread runs, without the rest."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([*argv, "--wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.monotonic() + 10
    while not list(Path("/dev/shm").glob(f"{HEAP_RING_NAME_PREFIX}{proc.pid}.*")):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the target created no ring: is the shim built?")
        time.sleep(0.001)
    reader = HeapReader.attach(proc.pid)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    events, busy = 0, 0.0
    while True:
        # wait4, not poll(): it keeps the target's CPU time (rusage) for the report.
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid != 0:
            break
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
    repeated = getattr(reader, "repeated", 0)  # builds before ALLOC_AGAIN: none
    reader.close()
    out = proc.stdout.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"target failed with {proc.returncode}")
    stacks = len(batch.new_stacks)
    depth = sum(len(ips) for _, ips in batch.new_stacks) / stacks if stacks else 0.0
    return Run(loop_time(out), time.perf_counter() - t0, events, batch.lost, busy,
               user_s=usage.ru_utime, cpu_s=usage.ru_utime + usage.ru_stime, stacks=stacks,
               depth=depth, repeated=repeated)


def run_rsprof(argv: list[str], tmp: Path, env: dict[str, str] | None = None) -> Run:
    out = tmp / "run.db"
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-P", "-m", "rsprof", "run", "-q", "-o", str(out),
                           "--", *argv], capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - t0
    out.unlink(missing_ok=True)
    return Run(loop_time(proc.stdout), wall)


def run_heaptrack(argv: list[str], tmp: Path) -> Run:
    t0 = time.perf_counter()
    proc = subprocess.run(["heaptrack", "-o", str(tmp / "ht"), *argv], capture_output=True,
                          text=True, check=True)
    wall = time.perf_counter() - t0
    for f in tmp.glob("ht*"):
        f.unlink()
    return Run(loop_time(proc.stdout), wall)


WALL_MODES = ("run", "run-fp", "heaptrack")


def bench(target: Target, size: str, args: argparse.Namespace, tmp: Path,
          libunwind: Path | None) -> list[Mode]:
    argv = [str(target.exe), size]
    names = ["plain", "cfi", "fp"] + (["libunwind"] if libunwind else [])
    names += ["sampled", "noreader", "noreader-fp"]
    names += (["noreader-libunwind"] if libunwind else []) + ["run", "run-fp"]
    if shutil.which("heaptrack") and not args.skip_heaptrack:
        names.append("heaptrack")
    if args.modes:
        names = ["plain"] + [n for n in names if n in args.modes.split(",") and n != "plain"]
    modes = [Mode(n) for n in names]
    no_env = {k: v for k, v in os.environ.items() if not k.startswith("RSPROF_HEAP_")}
    # The shim's environment per unwinder: with a reader draining (the mode's name) and
    # with nobody reading ("noreader-" + name; plain "noreader" is CFI's).
    unwinders = {"cfi": shim_env(), "fp": shim_env(RSPROF_HEAP_UNWIND="fp")}
    if libunwind is not None:
        unwinders["libunwind"] = shim_env(libunwind)
    run_plain(argv)  # warm caches, page in the binary
    for i in range(args.repeat):
        for mode in modes:  # interleaved, so a noisy neighbour hurts every mode alike
            name = mode.name
            if name == "plain":
                r = run_plain(argv)
            elif name in unwinders:
                r = run_with_reader(argv, unwinders[name])
            elif name == "sampled":
                r = run_with_reader(argv, shim_env(RSPROF_HEAP_SAMPLE_BYTES=str(args.sample_bytes)))
            elif name.startswith("noreader"):
                r = run_plain(argv, unwinders[name.removeprefix("noreader").lstrip("-") or "cfi"])
            elif name == "run":
                r = run_rsprof(argv, tmp, no_env)
            elif name == "run-fp":
                r = run_rsprof(argv, tmp, {**no_env, "RSPROF_HEAP_UNWIND": "fp"})
            else:
                if i > 0:  # several times slower: once is enough
                    continue
                r = run_heaptrack(argv, tmp)
            mode.runs.append(r)
            events = f"  events {r.events}  lost {r.lost}" if r.events else ""
            print(f"  {target.name} run {i + 1} {name:18s} loop {r.loop_s:7.3f} s  wall "
                  f"{r.wall_s:7.3f} s  user {r.user_s:7.3f} s{events}", flush=True)
    return modes


def report(target: Target, size: str, modes: list[Mode], repeat: int) -> None:
    plain = modes[0]
    base_loop, base_wall = plain.median("loop_s"), plain.median("wall_s")
    base_user, base_cpu = plain.median("user_s"), plain.median("cpu_s")
    print()
    print(f"{target.name} ({size}), median of {repeat} (heaptrack: 1 run); plain loop "
          f"{base_loop:.3f} s, wall {base_wall:.3f} s, user {base_user:.3f} s")
    print(f"{'mode':18s} {'loop s':>8s} {'wall s':>8s} {'x plain':>8s} {'events':>11s} "
          f"{'lost':>9s} {'reader s':>9s} {'stacks':>7s} {'depth':>6s} {'cpu x':>6s} "
          f"{'repeats':>9s}")
    for mode in modes:
        loop, wall = mode.median("loop_s"), mode.median("wall_s")
        if mode.name in WALL_MODES:
            ratio = wall / base_wall
        elif mode.name.startswith("noreader"):
            ratio = mode.median("user_s") / base_user
        else:
            ratio = loop / base_loop
        events, lost = int(mode.median("events")), int(mode.median("lost"))
        busy = mode.median("reader_busy_s")
        stacks = str(int(mode.median("stacks"))) if events else "-"
        depth = f"{mode.median('depth'):.1f}" if events else "-"
        cpu = f"{mode.median('cpu_s') / base_cpu:.2f}" if events else "-"
        repeats = str(int(mode.median("repeated"))) if events else "-"
        print(f"{mode.name:18s} {loop:8.3f} {wall:8.3f} {ratio:8.2f} "
              f"{events if events else '-':>11} {lost if events else '-':>9} "
              f"{f'{busy:.3f}' if busy else '-':>9} {stacks:>7} {depth:>6} {cpu:>6} "
              f"{repeats:>9}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20_000_000, help="storm: malloc/free pairs")
    ap.add_argument("--rounds", type=int, default=100, help="stl: rounds of 50,000 words")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode (median reported)")
    ap.add_argument("--only", choices=("storm", "stl"), help="one target only")
    ap.add_argument("--sample-bytes", type=int, default=512 * 1024,
                    help="RSPROF_HEAP_SAMPLE_BYTES for the sampled mode")
    ap.add_argument("--skip-heaptrack", action="store_true")
    ap.add_argument("--modes", help="comma-separated subset of the modes (plain always runs)")
    args = ap.parse_args()
    if not SHIM.exists():
        print(f"{SHIM} missing: pip install . first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rsprof-bench-heap-") as tmpdir:
        tmp = Path(tmpdir)
        targets = build(tmp)
        libunwind = build_libunwind_shim(tmp)
        results = []
        for name, size in (("storm", str(args.pairs)), ("stl", str(args.rounds))):
            if args.only in (None, name):
                results.append((targets[name], size, bench(targets[name], size, args, tmp,
                                                           libunwind)))
    load = os.getloadavg()[0]
    for target, size, modes in results:
        report(target, size, modes, args.repeat)
    print(f"\nload average at the end: {load:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
