"""Allocators that bypass malloc (issue 27, defect 13): jemalloc's and tcmalloc's operator
new and delete never call malloc, and a program with a malloc of its own never calls the
shim's. Real processes under `rsprof run`: exact counts and leaked bytes, and a warning and
heap_mode where the shim cannot see the allocations."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import build_target, profile_meta, run_rsprof, top_json

N, K = 20_000, 300  # strings made, strings leaked
STRING = 32 + 41  # a std::string object and its 41-byte buffer
FORMS = N // 10  # other_forms() iterations: new[], aligned new, aligned new[], nothrow new
FORMS_BYTES = 100 + 128 + 256 + 4

ALLOCATORS = {"glibc": (), "jemalloc": ("-ljemalloc",), "tcmalloc": ("-ltcmalloc_minimal",)}


def _binary(allocator: str) -> Path:
    libs = ALLOCATORS[allocator]
    try:
        # --no-as-needed: the allocator is linked even though no symbol is named from it
        # (it replaces malloc and operator new), and ahead of libstdc++.
        return build_target("heap_allocators.cc", ("-Wl,--no-as-needed", *libs))
    except subprocess.CalledProcessError:
        pytest.skip(f"{allocator} is not installed (apt-get install libjemalloc-dev "
                    "libgoogle-perftools-dev)")


def _site(rows: list[dict[str, Any]], function: str) -> dict[str, int]:
    """The function's call sites (one row per line) added up. A C++ function is named with
    its parameters (`make_strings(long, long)`), as its symbol demangles."""
    matching = [row for row in rows
                if row["function"] == function or row["function"].startswith(function + "(")]
    assert matching, [row["function"] for row in rows]
    keys = ("alloc_count", "free_count", "total_alloc_bytes", "live_bytes")
    return {key: sum(row[key] for row in matching) for key in keys}


@pytest.mark.parametrize("allocator", list(ALLOCATORS))
def test_new_and_delete_counted_once_whatever_the_allocator(allocator: str,
                                                            tmp_path: Path) -> None:
    """With jemalloc or tcmalloc, new/delete never reached the shim: make_strings showed 0 of
    its 2N allocations and none of its K leaked strings. With glibc, libstdc++'s new calls
    the shim's malloc: still counted once."""
    binary = _binary(allocator)
    out = tmp_path / "p.db"
    result = run_rsprof("run", "-q", "-o", str(out), "--", str(binary), str(N), str(K),
                        timeout=180)
    assert result.returncode == 0, result.stderr
    assert f"allocators done {K}" in result.stdout
    rows = top_json(out, "heap")
    strings = _site(rows, "make_strings")
    assert (strings["alloc_count"], strings["free_count"]) == (2 * N, 2 * (N - K))
    assert strings["total_alloc_bytes"] == N * STRING
    assert strings["live_bytes"] == K * STRING
    forms = _site(rows, "other_forms")
    assert (forms["alloc_count"], forms["free_count"]) == (4 * FORMS, 4 * FORMS)
    assert forms["total_alloc_bytes"] == FORMS * FORMS_BYTES
    assert forms["live_bytes"] == 0
    # Their own entry points (mallocx, tc_malloc), which a program may call directly, are
    # not interposed: said, not silent; the profile is complete for everything else.
    said = "calls the program makes to them directly are not seen"
    assert (said in result.stderr) == (allocator != "glibc"), result.stderr
    meta = profile_meta(out)
    assert meta["heap_mode"] == "full"
    assert (said in meta.get("heap_missed", "")) == (allocator != "glibc")


def test_program_with_its_own_malloc_is_not_a_silent_full_profile(tmp_path: Path) -> None:
    """An executable that defines malloc precedes LD_PRELOAD: the shim sees nothing. It used
    to record heap_mode=full with 0 events; now a warning and heap_mode=partial."""
    binary = build_target("heap_ownmalloc.c")
    out = tmp_path / "p.db"
    result = run_rsprof("run", "-q", "-o", str(out), "--", str(binary), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "own malloc done 1" in result.stdout  # its own malloc served it
    said = "its malloc is not the heap shim's"
    assert said in result.stderr
    meta = profile_meta(out)
    assert meta["heap_mode"] == "partial"
    assert said in meta["heap_missed"]
    assert said in meta["warnings"]


def test_free_address_taken_in_a_non_pie_program_is_not_a_foreign_malloc(
        tmp_path: Path) -> None:
    """A non-PIE executable that takes free's address (GCC's cc1 does) exports free as an
    undefined symbol at its PLT stub: dlsym finds the stub, not the shim. That is no malloc
    of the program's own (the stub jumps to the shim): no warning, heap_mode full, every
    block seen. `rsprof run -- gcc -c x.c` warned for cc1 before."""
    binary = build_target("heap_freeptr.c", ("-no-pie", "-fno-pie"))
    out = tmp_path / "p.db"
    result = run_rsprof("run", "-q", "-o", str(out), "--", str(binary), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "freeptr done 7" in result.stdout
    assert "not the heap shim's" not in result.stderr, result.stderr
    meta = profile_meta(out)
    assert meta["heap_mode"] == "full"
    assert "heap_missed" not in meta
    block = _site(top_json(out, "heap"), "make_block")
    assert (block["alloc_count"], block["free_count"]) == (500, 493)
    assert block["live_bytes"] == 7 * 1000
