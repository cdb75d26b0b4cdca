"""CFI unwinding on the code users build: C through libc's qsort, C++ STL algorithms and
virtual calls, Rust with `rustc -O` (issue 12, must-have 8).

Each target is built -O2 without frame pointers and splits its work 3:1 between two
callers (heavy and light sort the same input 3 times and once). The assertions: the split
on the callers (inclusive: samples whose stack holds the caller), `main` on >= 95 % of
the samples, and no frame outside the mappings. Real processes, ratios only, so they hold
on a busy machine.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import BUILD_DIR, TARGETS, assert_share, build_target
from test_cfi_stacks import NO_FP, _assert_no_junk, _record, _stacks

Stacks = list[tuple[int, list[tuple[str, int, int | None]]]]
SECONDS = "0.8"  # of the target's CPU time


def holds(frames: list[tuple[str, int, int | None]], function: str) -> bool:
    """`function` is on the stack (C++ names carry their parameters: `Heavy::run(...)`)."""
    return any(f == function or f.startswith(function + "(") for f, _, _ in frames)


def inclusive(stacks: Stacks, function: str) -> int:
    return sum(n for n, frames in stacks if holds(frames, function))


def assert_split_and_main(stacks: Stacks, heavy: str, light: str, main: str) -> None:
    _assert_no_junk(stacks)
    total = sum(n for n, _ in stacks)
    assert total >= 100, f"too few samples to judge ({total})"
    reach = inclusive(stacks, main)
    assert reach >= 0.95 * total, f"{main} on {reach} of {total} samples"
    assert_share(inclusive(stacks, heavy), inclusive(stacks, light), 0.75)


def build_rust(source_name: str) -> Path:
    """`rustc -O` as a user builds, no force-frame-pointers (Rust's std has none either)."""
    source = TARGETS / source_name
    digest = hashlib.sha256(source.read_bytes() + b"-O -g").hexdigest()[:12]
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    binary = BUILD_DIR / f"{source.stem}-{digest}"
    if not binary.exists():
        tmp = binary.with_suffix(f".tmp{os.getpid()}")  # concurrent sessions build too
        subprocess.run(["rustc", "-O", "-g", "-o", str(tmp), str(source)], check=True,
                       capture_output=True)
        tmp.rename(binary)
    return binary


def _module_paths(profile: Path) -> dict[int, str]:
    db = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
    try:
        return {int(i): str(p) for i, p in db.execute("SELECT id, path FROM modules")}
    finally:
        db.close()


def test_c_through_libc_qsort_reaches_main(tmp_path: Path) -> None:
    """The comparator runs under libc's qsort (built without frame pointers, stripped of
    all but its exported names): the walk goes through libc's frames back into the program
    and up to main."""
    profile = _record(tmp_path / "qsort.db", str(build_target("cfi_qsort.c", NO_FP)), SECONDS)
    stacks = _stacks(profile)
    assert_split_and_main(stacks, "heavy", "light", "main")
    modules = _module_paths(profile)
    through = 0
    for count, frames in stacks:
        names = [f for f, _, _ in frames]
        if not names or names[0] != "slow_cmp":
            continue
        assert "sort_copy" in names, names
        between = frames[1 : names.index("sort_copy")]
        assert between, names  # qsort's own frames, never skipped
        for _, _, module_id in between:
            assert module_id is not None and "libc.so" in modules[module_id], names
        assert names[names.index("sort_copy") + 1] in ("heavy", "light"), names
        through += count
    assert through >= 0.5 * sum(n for n, _ in stacks), through


def test_cpp_std_sort_and_virtual_calls(tmp_path: Path) -> None:
    """std::sort's templates (inlined into sort_copy or outlined as __introsort_loop) call the
    comparator; the jobs are reached through a virtual call."""
    binary = build_target("cfi_sort.cc", NO_FP)
    stacks = _stacks(_record(tmp_path / "sort.db", str(binary), SECONDS))
    assert_split_and_main(stacks, "Heavy::run", "Light::run", "main")
    leaf = [(n, [f for f, _, _ in frames]) for n, frames in stacks
            if frames and frames[0][0].split("(")[0] == "slow_less"]  # full names: (args)
    assert sum(n for n, _ in leaf) >= 0.5 * sum(n for n, _ in stacks)
    for _, names in leaf:
        job = next(i for i, f in enumerate(names) if f.startswith(("Heavy::run(", "Light::run(")))
        assert "sort_copy" in [name.split("(")[0] for name in names[1:job]], names
        assert names[job + 1] == "main", names


@pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc is not installed")
def test_rust_without_frame_pointers(tmp_path: Path) -> None:
    """`slow_cmp` is a frameless leaf called from core's sort code; Rust links with lld,
    whose read-only and text segments share a file page (the unwinder once took the wrong
    one and stopped every walk at the leaf)."""
    stacks = _stacks(_record(tmp_path / "rust.db", str(build_rust("rust_split.rs")), SECONDS))
    assert_split_and_main(stacks, "rust_split::heavy", "rust_split::light", "rust_split::main")
    total = sum(n for n, _ in stacks)
    assert inclusive(stacks, "main") >= 0.95 * total  # through std's lang_start to C's main
    for _, frames in stacks:
        names = [f for f, _, _ in frames]
        if names and names[0] == "rust_split::slow_cmp":
            caller = next(f for f in names[1:] if not f.startswith("core::"))
            assert caller == "rust_split::sort_copy", names
