#!/usr/bin/env python3
"""Real programs under `rsprof run` (heap shim on, CPU at 999 Hz, children followed) beside
the same programs alone and under heaptrack, in one run: median wall seconds of --repeat
runs, and the ratio to plain. The programs are Debian's own, built -O2 without frame
pointers; tests/test_real_programs.py checks the same programs behave unchanged.

Usage: python bench/bench_matrix.py [--repeat N]   (rsprof installed: pip install .)
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

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


def prepare(work: Path) -> None:
    (work / "t.c").write_text("int add(int a, int b) { return a + b; }\n"
                              "int main(void) { return add(1, 2) - 3; }\n")
    (work / "t.s").write_text(".text\n.globl f\nf:\n  movl $42, %eax\n  ret\n")
    (work / "data.bin").write_bytes(hashlib.sha256(b"x").digest() * 200000)
    tree = work / "tree"
    tree.mkdir(exist_ok=True)
    for i in range(200):
        (tree / f"f{i}.txt").write_text(("needle\n" if i % 3 == 0 else "hay\n") * 500)


def timed(argv: list[str], cwd: Path) -> float:
    start = time.monotonic()
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    heaptrack = shutil.which("heaptrack")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepare(work)
        print(f"{'program':<12} {'plain s':>8} {'rsprof s':>9} {'ratio':>6} "
              f"{'heaptrack s':>12} {'ratio':>6}")
        for name, argv in PROGRAMS.items():
            if shutil.which(argv[0]) is None and not argv[0].startswith("/"):
                print(f"{name:<12} (not installed)")
                continue
            plain, ours, theirs = [], [], []
            for k in range(args.repeat):
                plain.append(timed(argv, work))
                ours.append(timed(["rsprof", "run", "-q", "--cpu-freq", "999", "-o",
                                   str(work / f"p{k}.db"), "--", *argv], work))
                if heaptrack:
                    theirs.append(timed([heaptrack, "-o", str(work / f"h{k}"), *argv], work))
            p, o = statistics.median(plain), statistics.median(ours)
            h = statistics.median(theirs) if theirs else float("nan")
            print(f"{name:<12} {p:8.3f} {o:9.3f} {o / p:6.1f} {h:12.3f} {h / p:6.1f}")


if __name__ == "__main__":
    main()
