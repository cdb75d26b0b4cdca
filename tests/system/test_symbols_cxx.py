"""C++ names as the binary has them (collector/symbols/dwarf.py CxxNames, native/dwarf.c):
inlined templates qualified (`std::sort<...>`, not `sort<...>`), each lambda its own name as
c++filt prints it (`main::{lambda(int, int)#2}::operator()`), out-of-line functions named
by their symbol where DWARF has no linkage name (`std::_Function_handler<void (),
main::{lambda()#4}>::_M_invoke(std::_Any_data const&)`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import build_target, rsprof_env, run_rsprof, top_json
from rsprof.collector.symbols import Symbolizer
from rsprof.collector.symbols.dwarf import CxxNames, DwarfIndex, native_available
from rsprof.collector.symbols.elf import ElfFile
from test_robust import FUZZ_SCRIPT

LAMBDA = re.compile(r"main::\{lambda\([^)]*\)#\d+\}")


def _binary() -> Path:
    return build_target("names_cxx.cc", ("-O2",))


def _text_symbols(binary: Path) -> list[tuple[int, int]]:
    out = subprocess.run(["nm", "-S", "--defined-only", str(binary)], capture_output=True,
                         text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            found.append((int(parts[0], 16), int(parts[1], 16)))
    return found


def _all_names(binary: Path) -> set[str]:
    """Every function name of every inline chain, at every byte of every function."""
    module = Symbolizer(disk_cache=False).module(str(binary))
    assert module is not None
    addrs = [a for start, size in _text_symbols(binary) for a in range(start, start + size)]
    return {frame.function for chain in module.symbolize(addrs) for frame in chain}


def _cxxfilt_lambdas(binary: Path) -> set[str]:
    out = subprocess.run(["nm", "-C", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    return set(LAMBDA.findall(out))


def test_inlined_frames_qualified_and_lambdas_apart() -> None:
    binary = _binary()
    names = _all_names(binary)
    assert any(n.startswith("std::sort<") for n in names), sorted(names)
    assert any("std::__introsort_loop<" in n for n in names)  # `void std::...` out of line
    assert "shop::Basket::total() const" in names
    # No name lost its qualification: every one is qualified, or a plain C-like function.
    bare = sorted(n for n in names if re.match(r"^(sort|__introsort_loop|operator\(\)|_M_invoke)"
                                               r"\b", n))
    assert not bare, bare
    lambdas = {n for n in names if LAMBDA.match(n) and n.endswith("::operator()")}
    # until(), the comparator, two pool tasks: four lambdas, four names.
    assert len(lambdas) == 4, sorted(lambdas)
    # Numbered as the compiler mangled them (c++filt of the symbols that mention them).
    ours = {LAMBDA.match(n).group(0) for n in lambdas}  # type: ignore[union-attr]
    theirs = _cxxfilt_lambdas(binary)
    assert theirs and theirs <= ours, (sorted(ours), sorted(theirs))
    invokes = {n for n in names if n.startswith("std::_Function_handler<void (), main::{lambda")
               and "::_M_invoke(" in n}
    assert len(invokes) == 2, sorted(names)


def test_recorded_cxx_program_shows_qualified_names_and_separate_lambdas(
        tmp_path: Path) -> None:
    """rsprof run -q on the C++ program: `top cpu --json` has the qualified names and one row
    per lambda (it had one `operator()` row for all of them, 88.9 % Total)."""
    out = tmp_path / "cxx.db"
    result = run_rsprof("run", "-q", "--cpu-freq", "999", "-o", str(out), "--",
                        str(_binary()), "3", timeout=180)
    assert result.returncode == 0, result.stderr
    rows = top_json(out, "cpu")
    names = {str(row["function"]) for row in rows}
    assert "operator()" not in names and not any(n.startswith("sort<") for n in names)
    assert any(n.startswith("std::sort<") for n in names), sorted(names)
    assert "shop::Basket::total() const" in names, sorted(names)
    lambdas = {n for n in names if LAMBDA.match(n) and n.endswith("::operator()")}
    assert len(lambdas) >= 2, sorted(names)  # the comparator and the spinning task
    assert any("(int, int)" in n for n in lambdas) and any("lambda()" in n for n in lambdas)
    # The 80-column table shortens for display (std::sort<…>) and keeps a row per lambda.
    table = run_rsprof("top", "cpu", str(out), "-n", "0")
    assert table.returncode == 0, table.stderr
    assert "std::sort<…>" in table.stdout and "shop::Basket::total " in table.stdout
    for name in lambdas:
        assert sum(name in line for line in table.stdout.splitlines()) == 1, name


@pytest.mark.skipif(not native_available(), reason="rsprof._native is not built")
def test_pure_python_fallback_names_cxx_the_same() -> None:
    binary = _binary()
    elf = ElfFile(str(binary))
    addrs = [a for start, size in _text_symbols(binary) for a in range(start, start + size, 3)]
    native = DwarfIndex(elf, native=True).lookup(addrs)
    pure = DwarfIndex(elf, native=False).lookup(addrs)
    assert {a: r.scopes for a, r in native.items()} == {a: r.scopes for a, r in pure.items()}
    assert any(LAMBDA.match(s[0] or "") for r in native.values() for s in r.scopes)


class _Reader:
    """A DIE tree in memory: offset -> die() tuple, and children."""

    def __init__(self, dies: dict[int, tuple[Any, ...]], children: dict[int, list[int]]):
        self.dies, self.kids = dies, children

    def die(self, offset: int) -> tuple[Any, ...]:
        return self.dies[offset]

    def children(self, offset: int) -> list[int]:
        return self.kids.get(offset, [])


def _lambda_tree(producer: str) -> CxxNames:
    """unit > ns::f (no linkage name) > two closures: `(int)` at line 5, `()` at line 9."""
    unit = (0x11, "a.cc", None, None, None, None, 0, 0, 0, 0x21, producer)
    dies = {
        1: unit,
        2: (0x39, "ns", None, 1, None, None, 1, 1, 0, 0, None),
        3: (0x2E, "f", None, 2, None, None, 2, 1, 0, 0, None),
        4: (0x13, None, None, 3, None, None, 5, 3, 0, 0, None),
        5: (0x2E, "operator()", None, 4, None, None, 5, 3, 0, 0, None),
        6: (0x05, None, None, 5, 20, None, 0, 0, 1, 0, None),  # this
        7: (0x05, "x", None, 5, 21, None, 5, 9, 0, 0, None),
        8: (0x13, None, None, 3, None, None, 9, 3, 0, 0, None),
        9: (0x2E, "operator()", None, 8, None, None, 9, 3, 0, 0, None),
        20: (0x0F, None, None, 1, 21, None, 0, 0, 0, 0, None),
        21: (0x24, "int", None, 1, None, None, 0, 0, 0, 0, None),
    }
    kids = {1: [2, 20, 21], 2: [3], 3: [4, 8], 4: [5], 5: [6, 7], 8: [9]}
    return CxxNames(_Reader(dies, kids))


@pytest.mark.parametrize("producer,second", [
    ("GNU C++17 12.2.0 -mtune=generic -O2", 2),  # GCC up to 13: all lambdas counted
    ("GNU C++17 14.1.0 -O2", 1),  # GCC 14: per signature (the Itanium ABI)
    ("clang version 16.0.6", 1),
])
def test_lambda_numbering_follows_the_compiler(producer: str, second: int) -> None:
    names = _lambda_tree(producer)
    assert names.is_cxx(5)
    assert names.qualified(5) == "ns::f::{lambda(int)#1}::operator()"
    assert names.qualified(9) == f"ns::f::{{lambda()#{second}}}::operator()"


def test_mutated_cxx_dwarf_never_raises(tmp_path: Path) -> None:
    """Seeded random mutations of the C++ target's DWARF through the symbolizer (the DIE
    parent walk and lambda naming included): a frame for every address, no exception, no
    crash."""
    binary = _binary()
    addrs = ",".join(str(start + size // 2) for start, size in _text_symbols(binary)[:40])
    seeds = ",".join(str(s) for s in range(150))
    result = subprocess.run(
        [sys.executable, "-P", "-c", FUZZ_SCRIPT, str(binary), str(tmp_path), seeds, addrs],
        capture_output=True, text=True, timeout=300, env=rsprof_env())
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
