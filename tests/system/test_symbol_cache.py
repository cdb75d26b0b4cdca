"""The on-disk symbol cache (collector/symbols/cache.py, keyed in symbolizer.py): two files
that claim one build id never share entries. Real binaries built with a chosen build id,
one of them stripped."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_rsprof, top_json
from rsprof.collector.symbols import Symbolizer

SOURCE = r"""
#include <stdio.h>
#include <time.h>
__attribute__((noinline)) long spin_here(long n) {
    volatile long x = 0;
    for (long i = 0; i < n; i++) x += i;
    return x;
}
int main(void) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        spin_here(1000000);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec - start.tv_sec < 2);
    return 0;
}
"""


def _pair(folder: Path, build_id: str) -> tuple[Path, Path]:
    """The same program twice with one build id: with its symbol table, and stripped.
    No -g: both take their names from symbol tables, so the DWARF source (the one thing
    the cache used to tell apart) is the same for both: none."""
    source = folder / "spin.c"
    source.write_text(SOURCE)
    named = folder / "named"
    subprocess.run(["gcc", "-O1", f"-Wl,--build-id=0x{build_id}", "-o", str(named),
                    str(source)], check=True)
    stripped = folder / "stripped"
    shutil.copy(named, stripped)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True)
    return named, stripped


def _vaddr(binary: Path, symbol: str) -> int:
    for line in subprocess.run(["nm", str(binary)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split()
        if parts[-1] == symbol:
            return int(parts[0], 16)
    raise AssertionError(f"{symbol} not in {binary}")


@pytest.mark.parametrize("stripped_first", [True, False])
def test_one_build_id_two_files_never_share_names(tmp_path: Path, stripped_first: bool) -> None:
    named, stripped = _pair(tmp_path, secrets.token_hex(20))
    address = _vaddr(named, "spin_here")
    cache = tmp_path / "cache"

    def function(binary: Path) -> str:
        module = Symbolizer(cache_dir=cache).module(str(binary))  # a new recording each time
        assert module is not None
        return module.symbolize([address])[0][0].function

    order = [stripped, named] if stripped_first else [named, stripped]
    names = {binary: function(binary) for binary in order}
    assert names[named] == "spin_here"
    assert names[stripped] == f"stripped+0x{address:x}"
    # And again, now that both are cached: each its own entries.
    assert function(named) == "spin_here"
    assert function(stripped) == f"stripped+0x{address:x}"


def test_file_replaced_in_place_is_not_served_old_names(tmp_path: Path) -> None:
    """The same path, the same build id, the content swapped (a crafted collision copied
    over the file): the cache entries of the earlier file are not used."""
    named, stripped = _pair(tmp_path, secrets.token_hex(20))
    address = _vaddr(named, "spin_here")
    cache = tmp_path / "cache"
    target = tmp_path / "app"
    shutil.copy(stripped, target)
    module = Symbolizer(cache_dir=cache).module(str(target))
    assert module is not None and module.symbolize([address])[0][0].function.startswith("app+")
    shutil.copy(named, target)  # same inode, new content: ctime and size differ
    module = Symbolizer(cache_dir=cache).module(str(target))
    assert module is not None and module.symbolize([address])[0][0].function == "spin_here"


def test_profiles_of_both_are_named(tmp_path: Path) -> None:
    """Real recordings one after the other, sharing the test run's symbol cache: the
    stripped binary first, then its unstripped twin still has `spin_here` on top."""
    named, stripped = _pair(tmp_path, secrets.token_hex(20))
    functions = {}
    for binary in (stripped, named):
        out = tmp_path / f"{binary.name}.db"
        result = run_rsprof("run", "-q", "-d", "1500ms", "--cpu-freq", "499", "-o", str(out),
                            "--", str(binary))
        assert result.returncode == 0, result.stderr
        rows = top_json(out, "cpu")
        functions[binary.name] = {row["function"] for row in rows if row["self"] >= 5}
    assert "spin_here" in functions["named"], functions
    assert "spin_here" not in functions["stripped"], functions
