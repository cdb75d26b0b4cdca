"""CPU sampling benchmark: what attaching costs the target, what each sample costs us.

Runs a fixed-work target (bench/targets/cpu_work.c) plainly, under `rsprof run` at 99,
999 and 4999 Hz (CFI unwinding of 16 KiB stack copies, the default), under `rsprof run
--stack-bytes 0` (frame pointers), `perf record -g` and `perf record --call-graph dwarf` at
999 Hz, in the same run, configurations interleaved (one of each, then again, so a change
in the machine's load hits them all), and reports the target's own elapsed time as a ratio
against the plain run (median of --repeat runs). Then: rsprof's own CPU time per sample,
whole process and marginal (a long attach minus a short one, so start-up cancels), with
CFI and with frame pointers, and the highest rate at which nothing was lost.

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


def run_plain(binary: Path, units: str) -> float:
    done = subprocess.run([str(binary), str(THREADS), units], capture_output=True, text=True)
    return elapsed_ms(done.stderr)


def run_rsprof(binary: Path, units: str, hz: int, out: Path,
               extra: tuple[str, ...] = ()) -> tuple[float, float, int, int]:
    """(target ms, rsprof CPU seconds, samples, lost)."""
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
    return elapsed_ms(done.stderr), cpu, samples, lost


def run_perf(binary: Path, units: str, hz: int, workdir: Path,
             mode: tuple[str, ...] = ("-g",)) -> float | None:
    if shutil.which("perf") is None:
        return None
    done = subprocess.run(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(hz), *mode, "-o",
         str(workdir / "perf.data"), "--", str(binary), str(THREADS), units],
        capture_output=True, text=True,
    )
    try:
        return elapsed_ms(done.stderr)
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
    configs: dict[str, Callable[[int], float | None]] = {
        "plain": lambda i: run_plain(binary, units),
        "rsprof 99 Hz": lambda i: run_rsprof(binary, units, 99, workdir / f"r99-{i}.db")[0],
        "rsprof 999 Hz (CFI, 16 KiB copies)":
            lambda i: run_rsprof(binary, units, 999, workdir / f"r999-{i}.db")[0],
        "rsprof 999 Hz frame pointers (--stack-bytes 0)":
            lambda i: run_rsprof(binary, units, 999, workdir / f"fp999-{i}.db",
                                 ("--stack-bytes", "0"))[0],
        "rsprof 4999 Hz (CFI)":
            lambda i: run_rsprof(binary, units, 4999, workdir / f"r4999-{i}.db")[0],
        "perf record -g 999 Hz": lambda i: run_perf(binary, units, 999, workdir),
        "perf record --call-graph dwarf 999 Hz":
            lambda i: run_perf(binary, units, 999, workdir, ("--call-graph", "dwarf")),
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    for i in range(args.repeat):
        for name, run in configs.items():
            ms = run(i)
            if ms is not None:
                times[name].append(ms)
    plain = statistics.median(times["plain"])
    lines = [f"target: {THREADS} threads of fixed work, plain run {plain:.0f} ms (median of"
             f" {args.repeat}, interleaved with the others)", "",
             "| run | target time | ratio vs plain |", "| --- | --- | --- |"]
    ratios: dict[str, float] = {}
    for name, ms_list in times.items():
        if name == "plain" or not ms_list:
            continue
        ms = statistics.median(ms_list)
        ratios[name] = ms / plain
        lines.append(f"| {name} | {ms:.0f} ms | {ms / plain:.3f} |")
    cfi, fp_perf = ratios.get("rsprof 999 Hz (CFI, 16 KiB copies)"), ratios.get(
        "perf record -g 999 Hz")
    if cfi and fp_perf:
        lines += ["", f"rsprof CFI at 999 Hz against perf record -g: {cfi / fp_perf:.3f}"
                      f" ({(cfi / fp_perf - 1) * 100:+.1f} %; goal within 1 %)"]

    # Collector CPU per sample: rsprof attached with -p to a target it did not start, so
    # the children's rusage around it is rsprof's alone (Python start-up, symbolization,
    # SQLite included). Marginal: 4 s attaches at 4999 Hz and at 999 Hz, the difference in
    # CPU over the difference in samples, so start-up and every per-second cost (polling,
    # checkpoints) cancel and what is left is what one more sample costs.
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
    for label, extra in (("CFI", ()), ("frame pointers", ("--stack-bytes", "0"))):
        fast = [attach_cost(4999, 4, extra, f"{label}-f{i}") for i in range(args.repeat)]
        slow = [attach_cost(999, 4, extra, f"{label}-s{i}") for i in range(args.repeat)]
        cpu, samples = sorted(fast)[len(fast) // 2]
        marginal = statistics.median(
            (f[0] - s[0]) / (f[1] - s[1]) for f, s in zip(fast, slow, strict=True))
        lines.append(
            f"collector CPU, {label}: at 4999 Hz for 4 s {cpu * 1000:.0f} ms for {samples}"
            f" samples = {cpu / samples * 1e6:.1f} µs per sample (whole rsprof process: Python"
            f" start-up, symbolization and SQLite included); marginal (4999 Hz minus 999 Hz,"
            f" 4 s each) {marginal * 1e6:.1f} µs per sample")
    lines.append("")

    # Highest rate with nothing lost.
    best = None
    for hz in (999, 4999, 9999, 19999, 49999):
        target_ms, _, samples, lost = run_rsprof(binary, units, hz, workdir / f"rate{hz}.db")
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
