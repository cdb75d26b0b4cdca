"""Heap call sites in code built without frame pointers: the shim walks stacks by CFI
(native/shim/shimcfi.c). Real programs under `rsprof run`: C (-O2 -fomit-frame-pointer,
through a frameless helper, libc's strdup and qsort, a thread, a signal handler), C++ STL
containers, Rust's std, and a program that dlopens while other threads allocate. Every
leak is checked to the byte and every stack up to the user's functions above it; with the
old frame-pointer walk (RSPROF_HEAP_UNWIND=fp) these stacks stopped at the call site."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import BUILD_DIR, TARGETS, build_target, run_rsprof, top_json

# Later flags win over conftest's -O1 -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer.
NO_FP = ("-O2", "-fomit-frame-pointer", "-momit-leaf-frame-pointer")
PROLOGUE = ("__libc_start_call_main", "__libc_start_main_impl", "_start")


def _record(tmp: Path, *argv: str) -> tuple[Path, str]:
    out = tmp / "p.db"
    result = run_rsprof("run", "-q", "-o", str(out), "--", *argv, timeout=90)
    assert result.returncode == 0, result.stderr
    assert "target exited with code 0" in result.stderr, result.stderr
    return out, result.stdout


def _sites(profile: Path) -> dict[str, dict[str, Any]]:
    """`top heap` rows by function name without C++ parameters, the largest of a name."""
    sites: dict[str, dict[str, Any]] = {}
    for row in top_json(profile, "heap"):
        name = str(row["function"]).split("(")[0]
        sites.setdefault(name, row)
    return sites


def _traces(profile: Path, focus: str) -> list[tuple[int, list[str]]]:
    """Allocation stacks (allocated bytes, frames leaf first from the call site) through
    functions matching `focus`."""
    result = run_rsprof("traces", str(profile), "--kind", "heap", "--sample-index",
                        "alloc_space", "--no-threads", "-n", "0", "--focus", focus, "--json")
    assert result.returncode == 0, result.stderr
    return [(int(t["value"]), [str(f).split("(")[0] for f in t["stack"]])
            for t in json.loads(result.stdout)]


def _all_stacks(profile: Path) -> list[list[str]]:
    return [stack for _, stack in _traces(profile, ".")]


# ------------------------------------------------------------------ C


@pytest.fixture(scope="module")
def c_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    binary = build_target("heap_nofp.c", NO_FP)
    profile, stdout = _record(tmp_path_factory.mktemp("nofp"), str(binary))
    assert "nofp ok" in stdout
    match = re.search(r"comparisons (\d+)", stdout)
    assert match is not None, stdout
    return profile, int(match.group(1))


def test_frameless_helper_split_by_its_callers(c_profile: tuple[Path, int]) -> None:
    profile, _ = c_profile
    helper = _sites(profile)["xalloc"]
    assert (helper["live_bytes"], helper["alloc_count"]) == (40 * 48, 40)
    by_caller = {stack[1]: (value, stack) for value, stack in _traces(profile, "^xalloc$")}
    assert set(by_caller) == {"make_nodes", "make_names"}
    assert by_caller["make_nodes"][0] == 30 * 48
    assert by_caller["make_names"][0] == 10 * 48
    for _, stack in by_caller.values():
        assert stack[2:] == ["main", *PROLOGUE], stack


def test_libc_strdup_charged_to_its_caller(c_profile: tuple[Path, int]) -> None:
    profile, _ = c_profile
    site = _sites(profile)["dup_labels"]
    assert (site["live_bytes"], site["alloc_count"]) == (20 * 13, 20)
    [(_, stack)] = _traces(profile, "^dup_labels$")
    assert stack == ["dup_labels", "main", *PROLOGUE]


def test_qsort_comparator_stacks_cross_libc(c_profile: tuple[Path, int]) -> None:
    """by_key runs inside libc's qsort (no frame pointers): every one of its stacks goes
    through qsort's frames to sort_records and main."""
    profile, comparisons = c_profile
    site = _sites(profile)["by_key"]
    assert comparisons > 40
    assert (site["live_bytes"], site["alloc_count"]) == (16 * comparisons, comparisons)
    traces = _traces(profile, "^by_key$")
    assert sum(value for value, _ in traces) == 16 * comparisons
    for _, stack in traces:
        assert stack[0] == "by_key" and stack[-5:] == ["sort_records", "main", *PROLOGUE], stack
        assert all("sort" in frame for frame in stack[1:-4]), stack  # qsort's own frames


def test_thread_and_signal_handler_stacks(c_profile: tuple[Path, int]) -> None:
    profile, _ = c_profile
    sites = _sites(profile)
    assert (sites["thread_leak"]["live_bytes"], sites["thread_leak"]["alloc_count"]) == (1000, 25)
    [(_, stack)] = _traces(profile, "^thread_leak$")
    assert stack[:2] == ["thread_leak", "worker"], stack
    # The handler's stack crosses the kernel's signal frame (libc's __restore_rt, whose
    # caller is the interrupted pc) back to the function that raised the signal.
    assert (sites["on_signal"]["live_bytes"], sites["on_signal"]["alloc_count"]) == (72, 3)
    [(_, stack)] = _traces(profile, "^on_signal$")
    assert stack[0] == "on_signal" and stack[-5:] == ["signal_site", "main", *PROLOGUE], stack
    assert any("raise" in frame for frame in stack), stack


def test_no_junk_frames(c_profile: tuple[Path, int]) -> None:
    profile, _ = c_profile
    for stack in _all_stacks(profile):
        assert "[truncated]" not in stack, stack
        assert not any(re.fullmatch(r"0x[0-9a-f]+", frame) for frame in stack), stack


# ------------------------------------------------------------------ C++


@pytest.fixture(scope="module")
def cpp_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = build_target("heap_stl.cc", NO_FP)
    profile, stdout = _record(tmp_path_factory.mktemp("stl"), str(binary), "1000")
    assert stdout.split() == ["1000", "1000", "1000"]
    return profile


def test_stl_containers_without_frame_pointers(cpp_profile: Path) -> None:
    sites = _sites(cpp_profile)
    assert not any(name.startswith(("std::", "void std::")) for name in sites), sites.keys()
    strings, nodes, vector = sites["keep_strings"], sites["fill_map"], sites["fill_vector"]
    assert (strings["live_bytes"], strings["alloc_count"]) == (1000 * 101, 1000)
    assert (nodes["live_bytes"], nodes["alloc_count"]) == (1000 * 40, 1000)  # map nodes
    # push_back doubles the capacity: 1, 2, 4 ... 1024 ints, all but the last freed.
    assert (vector["live_bytes"], vector["total_alloc_bytes"]) == (4096, 2047 * 4)
    assert (vector["alloc_count"], vector["free_count"]) == (11, 10)
    for function in ("keep_strings", "fill_map", "fill_vector"):
        for _, stack in _traces(cpp_profile, f"^{function}"):
            assert stack == [function, "main", *PROLOGUE], stack


def test_libstdcxx_emergency_pool_is_not_a_leak(cpp_profile: Path) -> None:
    """libstdc++ mallocs a 72,704-byte exception pool before main and never frees it; the
    shim has it freed at exit (__gnu_cxx::__freeres, as valgrind does)."""
    rows = top_json(cpp_profile, "heap")
    pool = [row for row in rows if row["total_alloc_bytes"] == 72704]
    assert len(pool) == 1, rows
    assert (pool[0]["live_bytes"], pool[0]["free_count"]) == (0, 1)
    assert "libstdc++" in str(pool[0]["module"])
    leaks = run_rsprof("query", str(cpp_profile),
                       "SELECT function FROM heap_samples WHERE total_allocs > total_frees")
    assert "libstdc++" not in leaks.stdout and "pool" not in leaks.stdout


# ------------------------------------------------------------------ Rust


@pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc is not installed")
def test_rust_std_without_frame_pointers(tmp_path: Path) -> None:
    source = TARGETS / "heap_rust.rs"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    binary = BUILD_DIR / f"heap_rust-{digest}"
    if not binary.exists():  # no force-frame-pointers: neither the program nor std has them
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(f".tmp{os.getpid()}")
        subprocess.run(["rustc", "-O", "-g", "-o", str(tmp), str(source)], check=True)
        tmp.rename(binary)
    profile, stdout = _record(tmp_path, str(binary))
    assert "rust heap ok 1000 500" in stdout
    sites = _sites(profile)
    assert not any(name.startswith(("alloc::", "<alloc::", "core::")) for name in sites)
    vecs, strings = sites["heap_rust::keep_vecs"], sites["heap_rust::keep_strings"]
    assert (vecs["live_bytes"], vecs["alloc_count"]) == (1000 * 100, 1000)
    assert (strings["live_bytes"], strings["alloc_count"]) == (500 * 64, 500)
    for function in ("keep_vecs", "keep_strings"):
        [(_, stack)] = _traces(profile, f"^heap_rust::{function}$")
        assert stack[:2] == [f"heap_rust::{function}", "heap_rust::main"], stack
        assert stack[-4:] == ["main", *PROLOGUE], stack


# ------------------------------------------------------------------ dlopen


def test_dlopen_dlclose_while_threads_allocate(tmp_path: Path) -> None:
    """The shim unwinds inside dlopen (the library's constructor allocates under the loader
    lock) while two threads allocate without pause: no deadlock, and after 200
    dlopen/dlclose rounds a call into the library is unwound through it to main."""
    library = BUILD_DIR / "libshim_dlopen_nofp.so"
    source = TARGETS / "shim_dlopen_lib.c"
    tmp = library.with_suffix(f".tmp{os.getpid()}")
    subprocess.run(["gcc", *NO_FP, "-g", "-shared", "-fPIC", "-o", str(tmp), str(source)],
                   check=True)
    tmp.rename(library)
    binary = build_target("shim_dlopen.c", NO_FP)
    profile, stdout = _record(tmp_path, str(binary), str(library))
    assert "dlopen ok" in stdout
    sites = _sites(profile)
    assert sites["lib_ctor"]["alloc_count"] == 201  # 200 rounds + the last load
    traces = _traces(profile, "^call_into_lib$")
    assert sum(value for value, _ in traces) == 10 * 77
    for _, stack in traces:
        assert stack == ["lib_alloc", "call_into_lib", "main", *PROLOGUE], stack
