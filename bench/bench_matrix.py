#!/usr/bin/env python3
"""Real programs under `rsprof run` (heap shim on, CPU at 999 Hz, children followed) beside
the same programs alone and under heaptrack, in one run. The programs are Debian's own,
built -O2 without frame pointers; tests/system/test_real_programs.py checks the same programs
behave unchanged. Two tables:

wall clock   median wall seconds of --repeat runs of plain, `rsprof run` and heaptrack,
             and the ratios to plain (start-up included: rsprof's interpreter, heaptrack's
             script and interpreter);
target CPU   median CPU seconds (user + sys) of the program itself, not of rsprof's
             recorder or heaptrack's interpreter, plain, under `rsprof run --no-heap`,
             `rsprof run` (heap shim on) and heaptrack, and the ratios heap on / --no-heap
             (what heap tracking costs the program) and heaptrack / plain. Each run goes
             through bench/targets/cputime.c, compiled here statically: it forks and execs
             the program, waits with wait4 and writes the program's ru_utime + ru_stime.
             Static, it loads neither rsprof's heap shim nor heaptrack's preload library,
             so it allocates nothing either sees, and both pass on to the program (heaptrack
             drops its LD_PRELOAD in the first process it loads into: a dynamic wrapper would
             be traced in place of the program). The same wrapper runs in all four modes;
             the rounds are interleaved (plain, --no-heap, heap on, heaptrack per round).

Besides the programs of tests/system/test_real_programs.py, three malloc-heavy ones (HEAP_HEAVY:
sqlite3 inserting 150,000 rows, perl and gawk over a generated 400,000-line CSV) are the
workloads of issue 20. For those the first round's profiles are also checked against
heaptrack's: the number of allocation calls and the bytes they asked for, summed over
`heap_process_samples` of the program's process (rsprof query) and from heaptrack_print's
"calls to allocation functions" and its allocation-size histogram (-H), equal or not.
Both count a realloc as one allocation of its new size. The two runs are not quite the
same process, though: heaptrack's preload library brings in libstdc++, whose start-up
allocates its 72,704-byte exception pool (one call heaptrack counts that the program alone
never makes), and rsprof's target has four more environment variables (LD_PRELOAD and three
RSPROF_HEAP_*: heaptrack removes its own before main), which perl's %ENV and gawk's ENVIRON
copy at start-up (5 allocations a variable in perl, about 3 in gawk).
`sh -c` programs are traced by heaptrack in the shell only (it does not follow children);
rsprof follows them.

Usage: python bench/bench_matrix.py [--repeat N] [--only NAME]... [--cpu-only] [--no-check]
(rsprof installed in the interpreter running this: pip install .; gcc and a static libc.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# -P: never the source tree in the current folder (`python -m` would put it first on the path)
RSPROF = [sys.executable, "-P", "-m", "rsprof"]
RSPROF_RUN = [*RSPROF, "run", "-q", "--cpu-freq", "999"]
CPUTIME_SRC = Path(__file__).resolve().parent / "targets" / "cputime.c"

PROGRAMS: dict[str, list[str]] = {
    "as": ["as", "-o", "t_as.o", "t.s"],
    "gcc -c": ["gcc", "-O2", "-c", "t.c", "-o", "t_cc.o"],
    "gcc + ld": ["sh", "-c", "gcc -c t.c -o t_l.o && gcc t_l.o -o t_bin"],
    "python3": ["/usr/bin/python3", "-c",
                "import json; d = {str(i): i for i in range(200000)}; print(len(json.dumps(d)))"],
    "perl": ["perl", "-e", "my %h; $h{$_} = $_ * 2 for 1..200000; print scalar(keys %h), qq(\\n)"],
    "sqlite3": ["sqlite3", ":memory:",
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<300000)"
                " SELECT SUM(x) FROM c;"],
    "tar": ["sh", "-c", "tar cf - tree | tar tf - | wc -l"],
    "awk": ["awk", "BEGIN { s = 0; for (i = 0; i < 2000000; i++) s += i % 7; print s }"],
    "xz -T2": ["sh", "-c", "xz -T2 -6 -c data.bin | wc -c"],
    "rg -j2": ["sh", "-c", "rg -j2 -c needle tree | wc -l"],
    "git": ["git", "hash-object", "data.bin"],
    "shell loop": ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done"],
}

# Malloc-heavy single processes (issue 20), also checked against heaptrack's counts.
HEAP_HEAVY: dict[str, list[str]] = {
    "sqlite3-ins": ["sqlite3", ":memory:", ".read ins.sql"],
    "perl-csv": ["perl", "-ne", r"$h{$1}++ while /(\w+)/g; END{print scalar(keys %h), qq(\n)}",
                 "data.csv"],
    "gawk-csv": ["gawk", "-F,",
                 '{s[$2]+=$3; n[$4]++; k[$2 "-" $4]++} END{for(x in s) c++; print c}',
                 "data.csv"],
}

ALL: dict[str, list[str]] = PROGRAMS | HEAP_HEAVY

# Environment added for a program in every mode. perl seeds its hashes at random in each
# run and the seed decides when a bucket array grows, so the same script's allocations
# varied by one or two between runs: fixed here, as the counts are compared.
ENV: dict[str, dict[str, str]] = {"perl-csv": {"PERL_HASH_SEED": "0"}}

# The modes of the CPU table, in the order each round runs them.
MODES = ("plain", "off", "on", "heaptrack")


def prepare(work: Path, names: list[str]) -> None:
    (work / "t.c").write_text("int add(int a, int b) { return a + b; }\n"
                              "int main(void) { return add(1, 2) - 3; }\n")
    (work / "t.s").write_text(".text\n.globl f\nf:\n  movl $42, %eax\n  ret\n")
    (work / "data.bin").write_bytes(hashlib.sha256(b"x").digest() * 200000)
    tree = work / "tree"
    tree.mkdir(exist_ok=True)
    for i in range(200):
        (tree / f"f{i}.txt").write_text(("needle\n" if i % 3 == 0 else "hay\n") * 500)
    if "sqlite3-ins" in names:
        with open(work / "ins.sql", "w") as sql:
            sql.write("CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);\nBEGIN;\n")
            for i in range(150_000):
                sql.write(f"INSERT INTO t(b,c) VALUES('name{i % 977}x{i}', {i * 0.5});\n")
            sql.write("COMMIT;\nCREATE INDEX t_b ON t(b);\nSELECT count(*), sum(c) FROM t;\n")
    if {"perl-csv", "gawk-csv"} & set(names):
        rng = random.Random(20)
        words = ("alpha", "beta", "gamma", "delta")
        with open(work / "data.csv", "w") as csv:
            for i in range(400_000):
                csv.write(f"{i},key{rng.randint(0, 50000)},{rng.uniform(0, 1000):.3f},"
                          f"{rng.choice(words)}\n")


def build_cputime(work: Path) -> Path:
    exe = work / "cputime"
    subprocess.run(["gcc", "-O2", "-static", "-o", str(exe), str(CPUTIME_SRC)], check=True)
    return exe


def installed(argv: list[str]) -> bool:
    return argv[0].startswith("/") or shutil.which(argv[0]) is not None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def environ(name: str) -> dict[str, str]:
    return os.environ | ENV.get(name, {})


def runnable(names: list[str]) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    """Each program's name, command and environment; one that is not installed is said in
    its table's row and skipped."""
    for name in names:
        argv = ALL[name]
        if not installed(argv):
            print(f"{name:<12} (not installed)")
            continue
        yield name, argv, environ(name)


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    return time.monotonic() - start


def remove(work: Path, stem: str) -> None:
    """A run's output files: NAME.db (and -wal, -shm), heaptrack's NAME.zst or NAME.gz."""
    for path in work.glob(f"{stem}.*"):
        path.unlink()


def wall_table(names: list[str], work: Path, repeat: int, heaptrack: str | None) -> None:
    print(f"{'program':<12} {'plain s':>8} {'rsprof s':>9} {'ratio':>6} "
          f"{'heaptrack s':>12} {'ratio':>6}")
    for name, argv, env in runnable(names):
        plain, ours, theirs = [], [], []
        for _ in range(repeat):
            plain.append(timed(argv, work, env))
            ours.append(timed([*RSPROF_RUN, "-o", str(work / "wall.db"), "--", *argv], work,
                              env))
            remove(work, "wall")
            if heaptrack:
                theirs.append(timed([heaptrack, "-o", str(work / "wall-h"), *argv], work, env))
                remove(work, "wall-h")
        p, o, h = median(plain), median(ours), median(theirs)
        print(f"{name:<12} {p:8.3f} {o:9.3f} {o / p:6.1f} {h:12.3f} {h / p:6.1f}", flush=True)


def mode_prefix(mode: str, work: Path, heaptrack: str | None) -> list[str]:
    """What goes in front of `cputime OUT PROG...` in MODE; its output file is work/MODE.*"""
    if mode == "plain":
        return []
    if mode == "off":
        return [*RSPROF_RUN, "--no-heap", "-o", str(work / "off.db"), "--"]
    if mode == "on":
        return [*RSPROF_RUN, "-o", str(work / "on.db"), "--"]
    assert mode == "heaptrack" and heaptrack
    return [heaptrack, "-o", str(work / "heaptrack")]


def target_cpu(prefix: list[str], cputime: Path, argv: list[str], work: Path,
               env: dict[str, str], warnings: set[str]) -> float:
    """CPU seconds (user + sys) of ARGV run as PREFIX cputime OUT ARGV; rsprof's warnings
    (a heap ring not read, say, which would make "heap on" measure nothing) go to WARNINGS."""
    out = work / "cpu.txt"
    out.unlink(missing_ok=True)
    proc = subprocess.run([*prefix, str(cputime), str(out), *argv], cwd=work, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{' '.join(prefix[:4])} ... {argv[0]}: exit {proc.returncode}\n"
                           + proc.stderr[-2000:])
    warnings.update(line for line in proc.stderr.splitlines() if "rsprof: warning" in line)
    user_us, sys_us = out.read_text().split()
    return (int(user_us) + int(sys_us)) / 1e6


@dataclass
class Counts:
    allocs: int
    bytes: int
    note: str = ""


def rsprof_counts(db: Path) -> Counts:
    """Allocations of the program's process: every process but the wrapper (the recorded
    target, meta pid), which loads no shim. Lost ring events and a partial heap are noted."""
    sql = ("SELECT COUNT(DISTINCT pid) AS procs, COALESCE(SUM(alloc_count), 0) AS allocs,"
           " COALESCE(SUM(alloc_bytes), 0) AS bytes,"
           " (SELECT COALESCE(SUM(heap_lost_events), 0) FROM checkpoints) AS lost,"
           " (SELECT value FROM meta WHERE key = 'heap_mode') AS mode"
           " FROM heap_process_samples"
           " WHERE pid <> (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'pid')")
    out = subprocess.run([*RSPROF, "query", "--json", str(db), sql], check=True,
                         capture_output=True, text=True).stdout
    row = json.loads(out)[0]
    notes = []
    if row["procs"] != 1:
        notes.append(f"{row['procs']} processes allocated")
    if row["lost"]:
        notes.append(f"{row['lost']} heap events lost")
    if row["mode"] != "full":
        notes.append(f"heap_mode {row['mode']}")
    return Counts(int(row["allocs"]), int(row["bytes"]), ", ".join(notes))


def heaptrack_counts(data: Path, work: Path) -> Counts:
    """heaptrack_print's "calls to allocation functions", and the bytes from its allocation
    size histogram (-H: one line "SIZE COUNT" per requested size), whose counts must add up
    to the same calls."""
    hist = work / "hist.txt"
    out = subprocess.run(["heaptrack_print", "-f", str(data), "-p", "0", "-a", "0", "-T", "0",
                          "-H", str(hist)], check=True, capture_output=True, text=True).stdout
    found = re.search(r"^calls to allocation functions: (\d+)", out, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"heaptrack_print {data}: no calls to allocation functions:\n{out}")
    calls = int(found.group(1))
    count = total = 0
    for line in hist.read_text().splitlines():
        size, n = (int(field) for field in line.split())
        count += n
        total += size * n
    hist.unlink()
    note = "" if count == calls else f"histogram holds {count} allocations"
    return Counts(calls, total, note)


def compare(name: str, ours: Counts, theirs: Counts) -> None:
    def verdict(a: int, b: int) -> str:
        return "equal" if a == b else f"different ({a - b:+d})"

    notes = "; ".join(f"{who}: {c.note}" for who, c in (("rsprof", ours), ("heaptrack", theirs))
                      if c.note)
    allocs, size = verdict(ours.allocs, theirs.allocs), verdict(ours.bytes, theirs.bytes)
    print(f"{name:<12} {ours.allocs:>13} {theirs.allocs:>13} {allocs:<20}"
          f" {ours.bytes:>13} {theirs.bytes:>13} {size:<20} {notes}".rstrip())


def cpu_table(names: list[str], work: Path, repeat: int, heaptrack: str | None,
              check: bool) -> None:
    cputime = build_cputime(work)
    modes = [m for m in MODES if m != "heaptrack" or heaptrack]
    print(f"{'program':<12} {'plain s':>8} {'--no-heap s':>12} {'heap on s':>10} "
          f"{'heaptrack s':>12} {'on/off':>7} {'ht/plain':>9}")
    checks: list[tuple[str, Counts, Counts]] = []
    for name, argv, env in runnable(names):
        warnings: set[str] = set()
        cpu: dict[str, list[float]] = {m: [] for m in MODES}
        for k in range(repeat):
            for mode in modes:
                cpu[mode].append(target_cpu(mode_prefix(mode, work, heaptrack), cputime, argv,
                                            work, env, warnings))
            if k == 0 and check and heaptrack and name in HEAP_HEAVY:
                data = next(work.glob("heaptrack.*"))
                checks.append((name, rsprof_counts(work / "on.db"), heaptrack_counts(data, work)))
            for mode in modes:
                remove(work, mode)
        p, off, on, h = (median(cpu[m]) for m in MODES)
        print(f"{name:<12} {p:8.3f} {off:12.3f} {on:10.3f} {h:12.3f} {on / off:7.2f} "
              f"{h / p:9.2f}", flush=True)
        for line in sorted(warnings):
            print(f"{'':<12} {line}")
    if checks:
        print(f"\n{'program':<12} {'rsprof allocs':>13} {'heaptrack':>13} {'':<20}"
              f" {'rsprof bytes':>13} {'heaptrack':>13}")
        for name, ours, theirs in checks:
            compare(name, ours, theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", action="append", metavar="NAME", choices=list(ALL),
                        help="run this program only (repeatable); one of: " + ", ".join(ALL))
    parser.add_argument("--cpu-only", action="store_true", help="skip the wall-clock table")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the allocation counts beside heaptrack's")
    args = parser.parse_args()
    names = [name for name in ALL if not args.only or name in args.only]
    heaptrack = shutil.which("heaptrack")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepare(work, names)
        if not args.cpu_only:
            print("wall clock (median seconds)")
            wall_table(names, work, args.repeat, heaptrack)
            print()
        print("target CPU (median user+sys seconds of the program itself)")
        cpu_table(names, work, args.repeat, heaptrack, not args.no_check)


if __name__ == "__main__":
    main()
