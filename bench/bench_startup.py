#!/usr/bin/env python3
"""Start-up and short-program cost of `rsprof run`, beside heaptrack, in one run.

Times (median of --repeat runs, wall clock) of:

  plain        the command alone: the baseline
  rsprof       `rsprof run -q -o <tmp> -- CMD` (CPU sampling + heap shim, the defaults)
  rsprof-cpu   the same with --no-heap
  heaptrack    `heaptrack -o <tmp> CMD` (if installed)

for `/bin/true` (nothing but start-up and finalization) and a shell loop starting ten
children (`sh -c 'for i in ...; do /bin/true; done'`), which every descendant's exit
path is part of.  Printed as seconds and as differences to plain (start-up overhead).

Usage: python bench/bench_startup.py [--repeat N]   (rsprof installed: pip install .)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "/bin/true": ["/bin/true"],
    "sh loop of 10 children": [
        "/bin/sh",
        "-c",
        "for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done",
    ],
}


def timed(argv: list[str]) -> float:
    start = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def runners(tmp: Path) -> dict[str, list[str]]:
    rsprof = [sys.executable, "-P", "-m", "rsprof", "run", "-q"]
    found = {
        "plain": [],
        "rsprof": [*rsprof, "-o", str(tmp / "p{n}.db"), "--"],
        "rsprof-cpu": [*rsprof, "--no-heap", "-o", str(tmp / "c{n}.db"), "--"],
    }
    if shutil.which("heaptrack"):
        found["heaptrack"] = ["heaptrack", "-o", str(tmp / "h{n}")]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        counter = 0
        print(f"{'command':26} {'runner':11} {'median s':>9} {'- plain':>9}")
        for label, command in COMMANDS.items():
            medians: dict[str, float] = {}
            for runner, prefix in runners(tmp).items():
                times = []
                for _ in range(args.repeat):
                    counter += 1
                    argv = [part.replace("{n}", str(counter)) for part in prefix] + command
                    times.append(timed(argv))
                medians[runner] = statistics.median(times)
                extra = medians[runner] - medians["plain"]
                print(f"{label:26} {runner:11} {medians[runner]:9.3f} {extra:+9.3f}")


if __name__ == "__main__":
    main()
