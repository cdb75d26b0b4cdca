"""CPU sampling benchmark: what attaching costs the target, what each sample costs us.

Runs a fixed-work target (bench/targets/cpu_work.c) plainly, under `rsprof run` at 99,
999 and 4999 Hz (CFI unwinding of 16 KiB stack copies, the default), under `rsprof run
--stack-bytes 0` (frame pointers), `perf record -g` and `perf record --call-graph dwarf` at
999 Hz, in the same run, configurations interleaved (one of each, then again, so a change
in the machine's load hits them all), and reports the target's own elapsed time as a ratio
against the plain run (median of --repeat runs). Then: rsprof's own CPU time per sample,
for the whole process and for the C collector alone, with CFI and with frame pointers, and
the highest rate at which nothing was lost.

    python bench/bench_cpu.py [--repeat 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent
FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-pthread"]
THREADS = 1  # leaves the second core to the profiler, as perf's figure assumes


def build(workdir: Path) -> Path:
    binary = workdir / "cpu_work"
    subprocess.run(["gcc", *FLAGS, "-o", str(binary), str(HERE / "targets" / "cpu_work.c")],
                   check=True)
    return binary


def elapsed_ms(stderr: str) -> float:
    match = re.search(r"elapsed_ms ([\d.]+)", stderr)
    if not match:
        raise RuntimeError(f"target printed no timing: {stderr[-400:]}")
    return float(match.group(1))


def target_cpu_ms(stderr: str) -> float:
    """The target's own CPU time (it prints it last)."""
    match = re.search(r"cpu_ms ([\d.]+)", stderr)
    return float(match.group(1)) if match else float("nan")


def run_plain(binary: Path, units: str) -> tuple[float, float]:
    """(target wall ms, target CPU ms)."""
    done = subprocess.run([str(binary), str(THREADS), units], capture_output=True, text=True)
    return elapsed_ms(done.stderr), target_cpu_ms(done.stderr)


def run_rsprof(binary: Path, units: str, hz: int, out: Path,
               extra: tuple[str, ...] = ()) -> tuple[float, float, int, int, float]:
    """(target ms, rsprof CPU seconds, samples, lost, target CPU ms)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "rsprof", "run", "-q", "--no-heap", "--cpu-freq", str(hz),
         *extra, "-o", str(out), "--", str(binary), str(THREADS), units],
        capture_output=True, text=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    # Children's rusage includes the target's own CPU; subtract it via its thread count x time.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    db = sqlite3.connect(out)
    samples, lost = db.execute(
        "SELECT COALESCE(SUM(samples),0), COALESCE(SUM(lost_samples),0) FROM checkpoints"
    ).fetchone()
    db.close()
    return elapsed_ms(done.stderr), cpu, samples, lost, target_cpu_ms(done.stderr)


def run_perf(binary: Path, units: str, hz: int, workdir: Path,
             mode: tuple[str, ...] = ("-g",)) -> tuple[float, float] | None:
    if shutil.which("perf") is None:
        return None
    done = subprocess.run(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(hz), *mode, "-o",
         str(workdir / "perf.data"), "--", str(binary), str(THREADS), units],
        capture_output=True, text=True,
    )
    try:
        return elapsed_ms(done.stderr), target_cpu_ms(done.stderr)
    except RuntimeError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--units", default="1200", help="work per thread (1200 ~ 2 s here)")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rsprof-bench-cpu-"))
    binary = build(workdir)
    units = args.units

    # One run of every configuration per round, rounds repeated: interleaved, so a change
    # in the machine's load hits every configuration alike.
    def rsprof(hz: int, name: str, extra: tuple[str, ...] = ()) -> tuple[float, float]:
        r = run_rsprof(binary, units, hz, workdir / f"{name}.db", extra)
        return r[0], r[4]

    configs: dict[str, Callable[[int], tuple[float, float] | None]] = {
        "plain": lambda i: run_plain(binary, units),
        "rsprof 99 Hz": lambda i: rsprof(99, f"r99-{i}"),
        "rsprof 999 Hz (CFI, 16 KiB copies)": lambda i: rsprof(999, f"r999-{i}"),
        "rsprof 999 Hz frame pointers (--stack-bytes 0)":
            lambda i: rsprof(999, f"fp999-{i}", ("--stack-bytes", "0")),
        "rsprof 4999 Hz (CFI)": lambda i: rsprof(4999, f"r4999-{i}"),
        "perf record -g 999 Hz": lambda i: run_perf(binary, units, 999, workdir),
        "perf record --call-graph dwarf 999 Hz":
            lambda i: run_perf(binary, units, 999, workdir, ("--call-graph", "dwarf")),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    for i in range(args.repeat):
        for name, run in configs.items():
            ms = run(i)
            if ms is not None:
                times[name].append(ms)
    plain = statistics.median(w for w, _ in times["plain"])
    plain_cpu = statistics.median(c for _, c in times["plain"])
    lines = [f"target: {THREADS} threads of fixed work, plain run {plain:.0f} ms wall,"
             f" {plain_cpu:.0f} ms CPU (medians of {args.repeat}, interleaved with the others;"
             f" load average {os.getloadavg()[0]:.0f} at the end)", "",
             "| run | target wall | ratio vs plain | target CPU | ratio vs plain |",
             "| --- | --- | --- | --- | --- |"]
    ratios: dict[str, tuple[float, float]] = {}
    for name, runs in times.items():
        if name == "plain" or not runs:
            continue
        wall_ms = statistics.median(w for w, _ in runs)
        cpu_ms = statistics.median(c for _, c in runs)
        ratios[name] = (wall_ms / plain, cpu_ms / plain_cpu)
        lines.append(f"| {name} | {wall_ms:.0f} ms | {wall_ms / plain:.3f} | {cpu_ms:.0f} ms |"
                     f" {cpu_ms / plain_cpu:.3f} |")
    cfi, fp_perf = ratios.get("rsprof 999 Hz (CFI, 16 KiB copies)"), ratios.get(
        "perf record -g 999 Hz")
    if cfi and fp_perf:
        lines += ["", f"rsprof CFI at 999 Hz against perf record -g (goal within 1 %): wall"
                      f" {cfi[0] / fp_perf[0]:.3f} ({(cfi[0] / fp_perf[0] - 1) * 100:+.1f} %),"
                      f" target CPU {cfi[1] / fp_perf[1]:.3f}"
                      f" ({(cfi[1] / fp_perf[1] - 1) * 100:+.1f} %)"]

    # Collector CPU per sample, two ways. Whole process: rsprof attached with -p to a
    # target it did not start, so the children's rusage around it is rsprof's alone (Python
    # start-up, symbolization, SQLite included: on a 4 s run start-up is most of it). The C
    # collector alone: a PerfSampler polled on a thread of this process, that thread's CPU
    # time over its samples (ring parsing, unwinding, interning; bench_unwind.drain_cost),
    # the part that grows with the rate.
    def attach_cost(hz: int, seconds: int, extra: tuple[str, ...], tag: str) -> tuple[float, int]:
        target = subprocess.Popen([str(binary), str(THREADS), str(int(units) * 10)],
                                  stderr=subprocess.DEVNULL)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = workdir / f"cost-{tag}.db"
        subprocess.run([sys.executable, "-m", "rsprof", "-p", str(target.pid), "-q", "-d",
                        f"{seconds}s", "--cpu-freq", str(hz), *extra, "-o", str(out)],
                       capture_output=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        target.kill()
        target.wait()
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        db = sqlite3.connect(out)
        samples = db.execute("SELECT SUM(samples) FROM checkpoints").fetchone()[0] or 1
        db.close()
        return cpu, int(samples)

    lines.append("")
    from bench_unwind import drain_cost

    for label, extra, stack_bytes in (("CFI", (), 16384),
                                      ("frame pointers", ("--stack-bytes", "0"), 0)):
        whole = [attach_cost(4999, 4, extra, f"{label}-{i}") for i in range(args.repeat)]
        cpu, samples = sorted(whole)[len(whole) // 2]
        drains = [drain_cost([str(binary), str(THREADS), units], stack_bytes)
                  for _ in range(args.repeat)]
        drain_us, drain_n = sorted(drains)[len(drains) // 2]
        lines.append(
            f"collector CPU per sample, {label}: C collector {drain_us:.1f} µs at 999 Hz"
            f" ({drain_n} samples, median of {args.repeat}); whole rsprof process at 4999 Hz"
            f" for 4 s {cpu / samples * 1e6:.1f} µs ({cpu * 1000:.0f} ms for {samples}"
            f" samples, Python start-up, symbolization and SQLite included)")
    lines.append("")

    # Highest rate with nothing lost.
    best = None
    for hz in (999, 4999, 9999, 19999, 49999):
        target_ms, _, samples, lost, _ = run_rsprof(binary, units, hz,
                                                    workdir / f"rate{hz}.db")
        achieved = samples / (target_ms / 1000) / THREADS
        lines.append(f"rate {hz} Hz: {samples} samples in {target_ms:.0f} ms of target time"
                     f" ({achieved:.0f} samples/s per thread), {lost} lost")
        if lost == 0:
            best = hz
    lines.append(f"highest rate with no lost samples: {best} Hz")
    report = "\n".join(lines)
    print(report)
    if args.write_docs:
        write_docs("## CPU sampling", report)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def write_docs(heading: str, body: str) -> None:
    """Replaces (or appends) one section of docs/benchmarks.md."""
    doc = HERE.parent / "docs" / "benchmarks.md"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    section = f"{heading}\n\nMeasured {time.strftime('%Y-%m-%d')} with `python bench/"
    section += f"{Path(sys.argv[0]).name} --write-docs` on {os.cpu_count()} cores.\n\n"
    section += body + "\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(section + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + section
    doc.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
