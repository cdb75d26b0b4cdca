#!/usr/bin/env python3
"""Python self shares beside py-spy's (issue 21 item 4), per interpreter and workload.

Each workload (bench/targets/pyacc_*.py: C calling back into Python five ways; difflib and
email parsing) runs a fixed number of rounds (calibrated to --seconds of CPU on a plain run)
under five configurations, interleaved, --repeat times: a plain run; `rsprof run -q
--no-heap -F HZ` (Python frames read at sample time by the BPF program); the same with
`--python=drain` (read from outside at drain time); `py-spy record -r HZ -f raw` blocking
(py-spy's default: it stops the target to read, so its stacks are exact: the reference);
and `py-spy record --nonblocking`. Each tool starts the target itself.

Printed per row (the repeats pooled):

- self share of each Python function: the innermost Python frame of a sample (so a sample in
  C code called from Python is charged to that Python function, as py-spy without --native
  does), over the samples that have Python frames, plus, for rsprof, the samples in the
  evaluator that got none (`[no Python frames]`: a loss is an error in the shares too);
- L1 distance (in points: sum of |share difference| x 100) of rsprof's self shares from
  py-spy blocking's, and of total shares (function anywhere on the stack); beside each, the
  binomial noise: the L1 expected between two exact profilers drawing the pooled
  distribution with these sample counts (sum over functions of sqrt(2/pi) x sigma);
- eval-loop samples without Python frames (samples under `pymain_init` taken before rsprof
  found the interpreter are counted apart);
- slowdown: median wall (and CPU) time of the target's work loop vs the plain run's;
- profiler CPU per sample: the profiler process's CPU while the target's work loop ran (its
  threads' schedstat, read by the target around the loop: no start-up, symbolization or
  finalization), over the samples it took in that time (rsprof: its samples x the loop's
  share of the target's CPU time; py-spy: its samples x the loop's share of the target's
  lifetime).

Also printed (stderr): the shares of the functions `work` calls within `work`, beside the
truth: their CPU time (time.thread_time_ns around each call) in the plain runs, and each
tool's L1 from it with its binomial noise. py-spy, the reference above, stops the target
at every sample and samples wall-clock time: where that perturbs the target unevenly, its
shares move away from the truth too.

Also asked for by --configs only (printed on stderr, with the profiler CPU per sample of
every configuration and rsprof's off-CPU switch-outs per CPU sample): `rsprof-no-offcpu`
(`--no-off-cpu`: CPU samples only, as py-spy records) and `rsprof-base` (rsprof run by
--rsprof-base PYTHON, another install: before/after a change in one interleaved run).

Usage: python bench/bench_pyaccuracy.py [--seconds 3] [--repeat 3] [--freq 499]
       [--workloads reentry mail] [--configs ...] [--rsprof-base PYTHON] [PYTHON...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
TARGETS = HERE / "targets"
PYTHONS = ["/usr/bin/python3.11", os.path.expanduser("~/.pyenv/versions/3.12.1/bin/python3.12"),
           os.path.expanduser("~/.pyenv/versions/3.13.0/bin/python3.13")]
CONFIGS = ["plain", "rsprof", "rsprof-drain", "py-spy", "py-spy-nonblocking"]
# Asked for by --configs only, reported on stderr (the table keeps its columns):
# `rsprof run --no-off-cpu` (CPU samples only, as py-spy records), and rsprof run by
# another interpreter (--rsprof-base: an older install, for before/after in one run).
EXTRA_CONFIGS = ["rsprof-no-offcpu", "rsprof-base"]
LOST = "[no Python frames]"
PY_FRAME_TAG = 0xFFFE  # a Python frame's address >> 48 in the profile (stackwords.h)

Key = tuple[str, str]  # function (qualified), source file's base name


def _key(function: str, file: str) -> Key:
    return function, os.path.basename(file)


class Profile:
    """Per-sample Python stacks of one recording, innermost first: self and total counts."""

    def __init__(self) -> None:
        self.self: Counter[Key] = Counter()
        self.total: Counter[Key] = Counter()
        self.samples = 0  # samples with Python frames, plus LOST
        self.lost = 0
        self.lost_startup = 0
        self.evals = 0

    def add(self, stack: list[Key], count: int) -> None:
        self.samples += count
        self.self[stack[0]] += count
        for key in set(stack):
            self.total[key] += count

    def merge(self, other: Profile) -> None:
        self.self.update(other.self)
        self.total.update(other.total)
        self.samples += other.samples
        self.lost += other.lost
        self.lost_startup += other.lost_startup
        self.evals += other.evals


def read_rsprof(db: Path) -> tuple[Profile, dict[str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        frames: dict[int, list[tuple[bool, str, str]]] = {}
        for stack_id, address, function, file in conn.execute(
                "SELECT sf.stack_id, f.address, l.function, COALESCE(l.file, '')"
                " FROM stack_frames sf JOIN frames f ON f.id = sf.frame_id"
                " JOIN frame_locations fl ON fl.frame_id = sf.frame_id AND fl.inline_depth = 0"
                " JOIN locations l ON l.id = fl.location_id ORDER BY sf.stack_id, sf.position"):
            python = ((address >> 48) & 0xFFFF) == PY_FRAME_TAG
            frames.setdefault(stack_id, []).append((python, function, file))
        profile = Profile()
        for stack_id, count in conn.execute(
                "SELECT stack_id, SUM(count) FROM cpu_stack_samples GROUP BY stack_id"):
            stack = frames.get(stack_id, [])
            python = [_key(function, file) for is_py, function, file in stack if is_py]
            evaluating = any(f == "_PyEval_EvalFrameDefault" for _, f, _ in stack)
            if python:
                profile.evals += count
                profile.add(python, count)
            elif evaluating:
                profile.evals += count
                if any(f == "pymain_init" for _, f, _ in stack):
                    profile.lost_startup += count
                else:
                    profile.lost += count
                    profile.add([(LOST, "")], count)
        return profile, meta
    finally:
        conn.close()


def read_py_spy(path: Path) -> tuple[Profile, int]:
    """py-spy's speedscope output (each sample's stack, outermost first, in time order): the
    profile, and the longest run of consecutive identical samples (py-spy samples wall-clock
    time, so a target preempted for 100 ms gives it 50 identical samples at 499 Hz)."""
    data = json.loads(path.read_text())
    frames = [_key(f["name"], f.get("file") or "") for f in data["shared"]["frames"]]
    profile = Profile()
    longest = 0
    for thread in data["profiles"]:
        previous, run = None, 0
        for sample in thread["samples"]:  # weights: each 1/rate s
            run = run + 1 if sample == previous else 1
            previous = sample
            longest = max(longest, run)
            if not sample:
                continue  # a sample with no Python frame
            profile.add([frames[i] for i in reversed(sample)], 1)
            profile.evals += 1
    return profile, longest


def l1(a: Counter[Key], na: int, b: Counter[Key], nb: int) -> float:
    return 100 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def noise(a: Counter[Key], na: int, b: Counter[Key], nb: int, deff_b: float = 1.0) -> float:
    """Expected L1 (points) between two unbiased samplings of the pooled distribution with
    na and nb samples: each share's difference is ~normal with sigma^2 = p(1-p)(1/na+1/nb),
    and E|X| = sqrt(2/pi) sigma. deff_b: b's design effect (its variance over a binomial's:
    py-spy's clumped wall-clock samples count for fewer independent ones)."""
    total = na + nb
    spread = 1 / na + deff_b / nb
    return 100 * sum(math.sqrt(2 / math.pi * p * (1 - p) * spread)
                     for p in ((a[k] + b[k]) / total for k in set(a) | set(b)))


def run_once(config: str, python: str, script: Path, rounds: int, freq: str, work: Path,
             tag: str, nice: int, rsprof_base: str = "") -> dict[str, object]:
    timing = work / f"{tag}.json"
    target = [python, str(script), str(rounds), str(timing)]
    output = work / tag
    if config == "plain":
        command = target
    elif config.startswith("rsprof"):
        mode = "drain" if config == "rsprof-drain" else "on"
        output = work / f"{tag}.db"
        rsprof = rsprof_base if config == "rsprof-base" else sys.executable
        offcpu = ["--no-off-cpu"] if config == "rsprof-no-offcpu" else []
        command = [rsprof, "-P", "-m", "rsprof", "run", "-qq", "--no-heap", "-F", freq,
                   *offcpu, f"--python={mode}", "-o", str(output), "--", *target]
    else:
        output = work / f"{tag}.json.speedscope"
        nonblocking = ["--nonblocking"] if config.endswith("nonblocking") else []
        command = ["py-spy", "record", *nonblocking, "-r", freq, "-f", "speedscope", "-o",
                   str(output), "--", *target]
    if nice:
        command = ["nice", "-n", str(nice), *command]
    # The plain run also times each function `work` calls (bench/targets/pyacc_timing.py):
    # the CPU-time truth of their shares, which the profiled runs are compared with too.
    env = {**os.environ, "PYACC_PHASES": "1"} if config == "plain" else None
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0 or not timing.exists():
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}")
    return read_run(config, work, tag)


def read_run(config: str, work: Path, tag: str) -> dict[str, object]:
    """One run's timing and profile, from the files it left in `work`."""
    result: dict[str, object] = json.loads((work / f"{tag}.json").read_text())
    if config.startswith("rsprof"):
        output = work / f"{tag}.db"
        profile, meta = read_rsprof(output)
        target_cpu = float(result["process_cpu"])  # type: ignore[arg-type]
        conn = sqlite3.connect(f"file:{output}?mode=ro", uri=True)
        samples = conn.execute("SELECT SUM(count) FROM cpu_stack_samples").fetchone()[0] or 0
        conn.close()
        in_loop = samples * float(result["cpu"]) / max(target_cpu, 1e-9)  # type: ignore[arg-type]
        result.update(profile=profile, meta=meta, loop_samples=in_loop, all_samples=samples)
    elif config.startswith("py-spy"):
        profile, longest = read_py_spy(work / f"{tag}.json.speedscope")
        result["longest_run"] = longest
        share = float(result["wall"]) / max(float(result["lifetime"]), 1e-9)  # type: ignore[arg-type]
        result.update(profile=profile, loop_samples=profile.samples * share)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="CPU seconds of work per run (calibrated on a plain run)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--freq", default="499")
    parser.add_argument("--workloads", nargs="+", default=["reentry", "mail"])
    parser.add_argument("--configs", nargs="+", default=CONFIGS,
                        choices=CONFIGS + EXTRA_CONFIGS)
    parser.add_argument("--rsprof-base", default="", metavar="PYTHON",
                        help="the interpreter (with its rsprof) that config rsprof-base runs")
    parser.add_argument("--nice", type=int, default=-10,
                        help="niceness of each run, tool and target (0: as the shell's). Under"
                             " other sessions' load a target at 0 waits 10-250 ms at a time"
                             " for a core, and py-spy, sampling wall-clock time, takes up to"
                             " 128 identical samples in a row: its shares are then far noisier"
                             " than the binomial noise says")
    parser.add_argument("--keep", action="store_true", help="keep the profiles (printed path)")
    parser.add_argument("--summarize", type=Path, metavar="DIR",
                        help="print the table of the runs kept (--keep) in DIR; run nothing")
    parser.add_argument("pythons", nargs="*", default=PYTHONS)
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("py-spy is not installed (pip install py-spy)")
    configs = ["plain", *[c for c in args.configs if c != "plain"]]
    if args.summarize:
        summarize_kept(args.summarize, configs)
        return
    work = Path(tempfile.mkdtemp(prefix="pyaccuracy-"))
    for name in ("pyacc_timing.py", *(f"pyacc_{w}.py" for w in args.workloads)):
        shutil.copy(TARGETS / name, work / name)
    load_start = os.getloadavg()
    started = time.monotonic()
    rows = []
    try:
        for workload in args.workloads:
            script = work / f"pyacc_{workload}.py"
            for python in args.pythons:
                version = subprocess.run([python, "-c", "import sys; print(sys.version[:6])"],
                                         capture_output=True, text=True).stdout.strip()
                per_second = int(subprocess.run([python, str(script), "calibrate", "1"],
                                                capture_output=True, text=True,
                                                cwd=work).stdout)
                rounds = max(1, round(per_second * args.seconds))
                results: dict[str, list[dict[str, object]]] = {c: [] for c in configs}
                loads = []
                for repeat in range(args.repeat):
                    for config in configs:
                        tag = f"{workload}-{version}-{config}-{repeat}"
                        results[config].append(run_once(config, python, script, rounds,
                                                        args.freq, work, tag, args.nice,
                                                        args.rsprof_base))
                        loads.append(os.getloadavg()[0])
                rows.append(summarize(workload, version, rounds, results, loads))
                print(rows[-1], flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.freq} Hz, "
          f"{args.seconds:g} CPU s of work per run, {args.repeat} repeats interleaved, "
          f"{(time.monotonic() - started) / 60:.0f} min; load average at start "
          f"{load_start[0]:.1f} {load_start[1]:.1f} {load_start[2]:.1f}, at end "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print()
    print(HEADER)
    for row in rows:
        print(row)
    if args.keep:
        print(f"profiles in {work}", file=sys.stderr)


def summarize_kept(work: Path, configs: list[str]) -> None:
    """The table of a kept run: its files are WORKLOAD-VERSION-CONFIG-REPEAT.json."""
    runs: dict[tuple[str, str], dict[str, list[dict[str, object]]]] = {}
    for timing in sorted(work.glob("*.json")):
        workload, version, rest = timing.stem.split("-", 2)
        config, _, _ = rest.rpartition("-")
        if config in configs:
            row = runs.setdefault((workload, version), {c: [] for c in configs})
            row[config].append(read_run(config, work, timing.stem))
    print(HEADER)
    for (workload, version), results in runs.items():
        print(summarize(workload, version, 0, results, []))


HEADER = (
    "| workload | Python | samples rsprof / py-spy | self L1 vs py-spy (noise; with py-spy's "
    "measured spread) | total L1 (noise; spread) | "
    "run 1 vs runs 2-3, self L1 (noise): py-spy / rsprof | "
    "drain: self L1 (noise) | eval samples without Python frames: BPF / drain | "
    "slowdown wall (CPU): rsprof / drain / py-spy / py-spy nonblocking | "
    "profiler CPU per sample: rsprof / drain / py-spy / nonblocking | load |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def summarize(workload: str, version: str, rounds: int,
              results: dict[str, list[dict[str, object]]], loads: list[float]) -> str:
    def pooled(config: str) -> Profile:
        total = Profile()
        for r in results.get(config, []):
            total.merge(r["profile"])  # type: ignore[arg-type]
        return total

    def median(config: str, field: str) -> float:
        return statistics.median(float(r[field]) for r in results[config])  # type: ignore[arg-type]

    def slowdown(config: str) -> str:
        if not results.get(config):
            return "-"
        return (f"{median(config, 'wall') / median('plain', 'wall'):.2f}"
                f" ({median(config, 'cpu') / median('plain', 'cpu'):.2f})")

    def per_sample(config: str) -> str:
        if not results.get(config):
            return "-"
        us = statistics.median(float(r["tool_cpu_ns"]) / 1000  # type: ignore[arg-type]
                               / max(float(r["loop_samples"]), 1)  # type: ignore[arg-type]
                               for r in results[config])
        return f"{us:.0f} µs"

    spy = pooled("py-spy")
    on = pooled("rsprof")
    drain = pooled("rsprof-drain")
    def control(config: str) -> tuple[float, float]:
        """The tool's first run against its others, and the binomial noise for those
        sample counts: their ratio squared is the tool's design effect (1: its samples
        are as good as independent draws)."""
        first, rest = Profile(), Profile()
        for i, r in enumerate(results.get(config, [])):
            (first if i == 0 else rest).merge(r["profile"])  # type: ignore[arg-type]
        if not first.samples or not rest.samples:
            return math.nan, math.nan
        return (l1(first.self, first.samples, rest.self, rest.samples),
                noise(first.self, first.samples, rest.self, rest.samples))

    spy_control, rsprof_control = control("py-spy"), control("rsprof")
    deff = max(1.0, (spy_control[0] / spy_control[1]) ** 2) if spy_control[1] > 0 else 1.0

    longest = max((int(r["longest_run"]) for r in results.get("py-spy", [])),  # type: ignore[call-overload]
                  default=0)

    def distance(p: Profile, kind: str) -> str:
        if not p.samples or not spy.samples:
            return "-"
        a, b = getattr(p, kind), getattr(spy, kind)
        return (f"{l1(a, p.samples, b, spy.samples):.1f} "
                f"({noise(a, p.samples, b, spy.samples):.1f}; "
                f"{noise(a, p.samples, b, spy.samples, deff):.1f})")

    def lost(p: Profile) -> str:
        if not p.evals:
            return "-"
        startup = f" (+{p.lost_startup} start-up)" if p.lost_startup else ""
        return f"{100 * p.lost / p.evals:.1f} % ({p.lost}/{p.evals}){startup}"

    worst = sorted(set(on.self) | set(spy.self), key=lambda k: -abs(
        on.self[k] / max(on.samples, 1) - spy.self[k] / max(spy.samples, 1)))[:6]
    print(f"{workload} {version}: largest self differences, rsprof vs py-spy (drain):",
          ", ".join(f"{k[0]} ({k[1]}) {100 * on.self[k] / max(on.samples, 1):.1f} vs "
                    f"{100 * spy.self[k] / max(spy.samples, 1):.1f} "
                    f"({100 * drain.self[k] / max(drain.samples, 1):.1f})" for k in worst),
          f"; py-spy's longest run of identical samples: {longest}", file=sys.stderr, flush=True)
    truth_ns: Counter[str] = Counter()
    for r in results.get("plain", []):
        truth_ns.update(r.get("phases_cpu_ns") or {})  # type: ignore[call-overload]

    def phases(p: Profile) -> str:
        """The L1 (points) of the shares of `work`'s callees within `work` from the CPU-time
        truth of the plain runs, and its binomial noise for the samples under `work`."""
        script = f"pyacc_{workload}.py"
        whole = p.total[("work", script)]
        total_ns = sum(truth_ns.values())
        if not whole or not total_ns:
            return "-"
        shares = {name: (p.total[(name, script)] / whole, ns / total_ns)
                  for name, ns in truth_ns.items()}
        distance = 100 * sum(abs(a - b) for a, b in shares.values())
        spread = 100 * sum(math.sqrt(2 / math.pi * b * (1 - b) / whole)
                           for _, b in shares.values())
        return f"{distance:.1f} ({spread:.1f})"

    if truth_ns:
        script = f"pyacc_{workload}.py"
        shown = {name: 100 * ns / sum(truth_ns.values()) for name, ns in truth_ns.items()}
        print(f"{workload} {version}: shares of work's callees, CPU-time truth / rsprof / "
              "py-spy:", ", ".join(
                  f"{name} {share:.1f} / "
                  f"{100 * on.total[(name, script)] / max(on.total[('work', script)], 1):.1f} / "
                  f"{100 * spy.total[(name, script)] / max(spy.total[('work', script)], 1):.1f}"
                  for name, share in sorted(shown.items(), key=lambda kv: -kv[1])),
              f"; L1 from the truth (noise): rsprof {phases(on)}, py-spy {phases(spy)}",
              file=sys.stderr, flush=True)

    worst_total = sorted(set(on.total) | set(spy.total), key=lambda k: -abs(
        on.total[k] / max(on.samples, 1) - spy.total[k] / max(spy.samples, 1)))[:6]
    print(f"{workload} {version}: largest total differences, rsprof vs py-spy:",
          ", ".join(f"{k[0]} ({k[1]}) {100 * on.total[k] / max(on.samples, 1):.1f} vs "
                    f"{100 * spy.total[k] / max(spy.samples, 1):.1f}" for k in worst_total),
          file=sys.stderr, flush=True)

    def switches(config: str) -> str:
        per = [int(r["meta"].get("offcpu_switches") or 0)  # type: ignore[attr-defined]
               / max(int(r["all_samples"]), 1)  # type: ignore[call-overload]
               for r in results.get(config, [])]
        return f"{statistics.median(per):.1f}" if per else "-"

    print(f"{workload} {version}: profiler CPU per sample: "
          + ", ".join(f"{c} {per_sample(c)}" for c in results if c != "plain")
          + "; off-CPU switch-outs per CPU sample: "
          + ", ".join(f"{c} {switches(c)}" for c in results if c.startswith("rsprof")),
          file=sys.stderr, flush=True)
    return (f"| {workload} | {version} | {on.samples} / {spy.samples} | {distance(on, 'self')} | "
            f"{distance(on, 'total')} | "
            f"{spy_control[0]:.1f} ({spy_control[1]:.1f}) / "
            f"{rsprof_control[0]:.1f} ({rsprof_control[1]:.1f}) | "
            f"{distance(drain, 'self')} | {lost(on)} / {lost(drain)} | "
            f"{' / '.join(slowdown(c) for c in CONFIGS[1:])} | "
            f"{' / '.join(per_sample(c) for c in CONFIGS[1:])} | "
            f"{min(loads, default=0):.0f}-{max(loads, default=0):.0f} |")


if __name__ == "__main__":
    main()
