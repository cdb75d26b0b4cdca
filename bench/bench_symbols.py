"""Symbolizer benchmark: 1000 libpython addresses, cold and cached, against addr2line.

    python bench/bench_symbols.py [--lib PATH] [--count 1000] [--seed 1] [--repeat 3]

Addresses are picked from the library's .symtab (sized functions, fixed seed, a random offset
inside each). Printed: the best-of-N times of `addr2line -f -i -C -e LIB <addrs>` (one process
for all addresses, as a profiler would batch them), of a cold symbolization (new Symbolizer,
empty cache directory), of a cached one (new Symbolizer, same cache directory, which must not
touch DWARF), the ratios, and how many addresses agree with addr2line on the innermost function
and file:line. llvm-addr2line is used as a second opinion on disagreements when installed.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rsprof.collector.symbols import Symbolizer
from rsprof.collector.symbols.elf import ElfFile
from rsprof.collector.symbols.symtab import STT_FUNC

DEFAULT_LIB = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"
Frame = tuple[str, str, int]


def pick_addresses(lib: str, count: int, seed: int) -> list[int]:
    elf = ElfFile(lib)
    funcs = sorted({(s.value, s.size) for s in elf.symbols()
                    if s.type == STT_FUNC and s.size > 0 and s.shndx != 0})
    rng = random.Random(seed)
    return [v + rng.randrange(size) for v, size in rng.sample(funcs, min(count, len(funcs)))]


def run_addr2line(tool: str, lib: str, addrs: list[int]) -> tuple[float, list[list[Frame]]]:
    cmd = [tool, "-a", "-f", "-i", "-C", "-e", lib, *(hex(a) for a in addrs)]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    elapsed = time.perf_counter() - start
    groups: list[list[Frame]] = []
    lines = out.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("0x"):
            groups.append([])
            i += 1
            continue
        if i + 1 >= len(lines):
            break
        file, _, line = lines[i + 1].split(" (discriminator")[0].rpartition(":")
        groups[-1].append((lines[i], "" if file == "??" else file,
                           int(line) if line.isdigit() else 0))
        i += 2
    return elapsed, groups


def time_addr2line_plain(lib: str, addrs: list[int]) -> float:
    """The exact command of the goal: `addr2line -f -i -C -e LIB <addrs>`."""
    start = time.perf_counter()
    subprocess.run(["addr2line", "-f", "-i", "-C", "-e", lib, *(hex(a) for a in addrs)],
                   capture_output=True, check=True)
    return time.perf_counter() - start


def symbolize(cache: Path, lib: str, addrs: list[int]) -> tuple[float, list[list[Frame]]]:
    start = time.perf_counter()
    module = Symbolizer(cache_dir=cache).module(lib)
    assert module is not None
    chains = module.symbolize(addrs)
    elapsed = time.perf_counter() - start
    return elapsed, [[(f.function, f.file, f.line) for f in c] for c in chains]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=DEFAULT_LIB)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not Path(args.lib).is_file() or shutil.which("addr2line") is None:
        print(f"need {args.lib} and addr2line", file=sys.stderr)
        return 2

    addrs = pick_addresses(args.lib, args.count, args.seed)
    a2l_time = min(time_addr2line_plain(args.lib, addrs) for _ in range(args.repeat))
    _, reference = run_addr2line("addr2line", args.lib, addrs)

    cold_times, cached_times = [], []
    ours: list[list[Frame]] = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="rsprof-bench-") as tmp:
            cold, ours = symbolize(Path(tmp), args.lib, addrs)
            cached, again = symbolize(Path(tmp), args.lib, addrs)
            assert again == ours, "cached results differ from cold ones"
            cold_times.append(cold)
            cached_times.append(cached)
    cold, cached = min(cold_times), min(cached_times)

    inner = sum(r[0] == o[0] for r, o in zip(reference, ours, strict=True))
    chain = sum(r == o for r, o in zip(reference, ours, strict=True))
    differ = [i for i, (r, o) in enumerate(zip(reference, ours, strict=True)) if r[0] != o[0]]

    print(f"library      {args.lib}")
    print(f"addresses    {len(addrs)} (seed {args.seed}), best of {args.repeat}")
    print(f"addr2line    {a2l_time * 1000:8.1f} ms")
    print(f"cold         {cold * 1000:8.1f} ms   {cold / a2l_time:5.2f}x addr2line  (goal <= 2x)")
    print(f"cached       {cached * 1000:8.1f} ms   {cached / a2l_time:5.2f}x addr2line  "
          f"(goal <= 0.2x)")
    print(f"match        {inner}/{len(addrs)} = {inner / len(addrs):.1%} innermost function + "
          f"file:line (goal >= 95%); whole inline chain {chain / len(addrs):.1%}")
    if differ:
        llvm = shutil.which("llvm-addr2line")
        second = run_addr2line(llvm, args.lib, [addrs[i] for i in differ])[1] if llvm else None
        agree = 0
        for _k, i in enumerate(differ[:10]):
            print(f"  {addrs[i]:#x}: addr2line {reference[i][0]}  ours {ours[i][0]}")
        if second is not None:
            # llvm names GCC clones `foo.constprop.0`: compare its file:line only.
            agree = sum(second[k][0][1:] == ours[i][0][1:] for k, i in enumerate(differ))
            print(f"  of the {len(differ)} differences, llvm-addr2line's file:line agrees "
                  f"with ours on {agree}")
    ok = cold <= 2 * a2l_time and cached <= 0.2 * a2l_time and inner >= 0.95 * len(addrs)
    print("goals        " + ("met" if ok else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
