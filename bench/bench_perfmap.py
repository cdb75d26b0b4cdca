"""A 2 M-entry perf map (~180 MB): rsprof's peak RSS and the time to its first checkpoint.

tests/targets/jit_anon.c runs a spin loop copied into an anonymous executable page (JIT code
as far as rsprof can tell); this script writes /tmp/perf-<its pid>.map (2 M entries, the
loop's own one last), records it with `rsprof -p PID -q -d 4s` under /usr/bin/time, and
removes the map. Everything else lives in a mktemp -d folder.

    python bench/bench_perfmap.py [--entries N] [--runs R]

Prints, per run: peak RSS (MiB), first checkpoint after start (s), share of samples named
`jit_spin`. Compare two trees by running this from each, interleaved.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / "tests" / "targets" / "jit_anon.c"


def write_map(path: Path, entries: int, jit: int) -> None:
    rng = random.Random(1)
    address = 0x7E0000000000
    with open(path, "w") as out:
        for i in range(entries - 1):
            size = rng.randint(0x40, 0x400)
            out.write(f"{address:x} {size:x} JS:*someFunctionName{i}"
                      f" /srv/app/node_modules/pkg/lib/file{i % 500}.js:{i % 9000}:{i % 80}\n")
            address += size + rng.randint(0, 64)
        out.write(f"{jit:x} 6 jit_spin\n")


def one_run(folder: Path, binary: Path, entries: int,
            rsprof: list[str]) -> tuple[float, float, float]:
    target = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
    assert target.stdout is not None
    _, pid, page = target.stdout.readline().split()
    perf_map = Path(f"/tmp/perf-{pid}.map")
    try:
        write_map(perf_map, entries, int(page, 16))
        out = folder / f"p{time.monotonic_ns()}.db"
        timing = folder / "time.txt"
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(timing), *rsprof, "-p", pid,
                        "-q", "-d", "4s", "-o", str(out)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak_mib = int(timing.read_text().split()[-1]) / 1024
        db = sqlite3.connect(out)
        start = int(db.execute("SELECT value FROM meta WHERE key='start_time_ms'").fetchone()[0])
        first = db.execute("SELECT MIN(timestamp_ms) FROM checkpoints").fetchone()[0]
        named = db.execute("SELECT COALESCE(SUM(count), 0) FROM cpu_samples s JOIN locations l"
                           " ON l.id = s.location_id WHERE l.function = 'jit_spin'").fetchone()[0]
        total = db.execute("SELECT COALESCE(SUM(count), 0) FROM cpu_samples").fetchone()[0]
        db.close()
        return peak_mib, (first - start) / 1000, named / total if total else 0.0
    finally:
        perf_map.unlink(missing_ok=True)
        target.kill()
        target.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-perfmap-"))
    binary = folder / "jit"
    subprocess.run(["gcc", "-O1", "-o", str(binary), str(TARGET)], check=True)
    command = [sys.executable, "-P", "-m", "rsprof"]
    import rsprof

    print(f"{args.entries} entries; rsprof {os.path.dirname(rsprof.__file__ or '')}")
    for _ in range(args.runs):
        peak, first, named = one_run(folder, binary, args.entries, command)
        print(f"peak RSS {peak:6.0f} MiB  first checkpoint {first:5.2f} s  jit_spin {named:.0%}")
    subprocess.run(["rm", "-rf", str(folder)], check=False)


if __name__ == "__main__":
    main()
