"""The heap shim never changes what the target does: minimal reproducers of the ways it
once broke real programs, each run under `rsprof run` with heap tracking on."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BUILD_DIR, TARGETS, build_target, heap_rings, run_rsprof

# Each reproducer must finish well within this; a deadlock shows up as a timeout.
RUN_TIMEOUT = 90


def _run_profiled(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "p.db"
    result = run_rsprof("run", "-q", "-o", str(out), "--", *argv, timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert "target exited with code 0" in result.stderr, result.stderr
    return result


def test_allocation_inside_pthread_getattr_np_does_not_deadlock(tmp_path: Path) -> None:
    """Rust std's thread start: pthread_getattr_np reallocs while glibc holds the thread's
    lock; the shim once called pthread_getattr_np from inside that realloc."""
    binary = build_target("shim_getattr.c", ("-O2",))
    result = _run_profiled(tmp_path, str(binary))
    assert "getattr ok" in result.stdout


def test_malloc_called_with_garbage_rbp(tmp_path: Path) -> None:
    """binutils calls malloc with %rbp = 0xfffffffffffffff0; the frame walk's bounds check
    once wrapped to 0 and dereferenced it (the target died with SIGSEGV)."""
    binary = build_target("shim_badrbp.c", ("-mno-red-zone",))
    result = _run_profiled(tmp_path, str(binary))
    assert "badrbp ok" in result.stdout


def test_fork_vfork_spawn_exec_children_never_wait(tmp_path: Path) -> None:
    """15 children (fork, vfork+exec, posix_spawn) and one exec of the target itself: all
    finish at once. Every descendant once waited 2 s at exit for a reader that never came."""
    binary = build_target("shim_procs.c")
    plain_start = time.monotonic()
    subprocess.run([str(binary), "again"], check=True, capture_output=True, timeout=60)
    plain = time.monotonic() - plain_start
    start = time.monotonic()
    result = _run_profiled(tmp_path, str(binary), "again")
    profiled = time.monotonic() - start
    assert "procs ok" in result.stdout
    # Start-up and finalization are a few seconds at most on a busy machine; 15 children
    # that each waited 2 s would add 30 s.
    assert profiled < plain + 15, f"profiled {profiled:.1f}s vs plain {plain:.1f}s"


def test_shell_loop_of_short_children_is_not_slowed(tmp_path: Path) -> None:
    loop = "for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done"
    start = time.monotonic()
    _run_profiled(tmp_path, "/bin/sh", "-c", loop)
    assert time.monotonic() - start < 15


@pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc is not installed")
def test_multithreaded_rust_without_frame_pointers(tmp_path: Path) -> None:
    source = TARGETS / "shim_rust_threads.rs"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    binary = BUILD_DIR / f"shim_rust_threads-{digest}"
    if not binary.exists():
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(f".tmp{os.getpid()}")
        subprocess.run(["rustc", "-O", "-o", str(tmp), str(source)], check=True)
        tmp.rename(binary)
    result = _run_profiled(tmp_path, str(binary))
    assert "rust threads ok true" in result.stdout
    db = sqlite3.connect(f"file:{tmp_path / 'p.db'}?mode=ro", uri=True)
    try:
        (allocs,) = db.execute(
            "SELECT coalesce(max(alloc_count), 0) FROM heap_stack_samples"
        ).fetchone()
    finally:
        db.close()
    assert allocs > 0, "no allocation recorded from the Rust program"


def test_profiled_children_leave_no_ring_behind(tmp_path: Path) -> None:
    """Rings of a target's children are removed when they exit."""
    binary = build_target("shim_procs.c")
    _run_profiled(tmp_path, str(binary))
    # Only this run's processes (followed children included): other recordings on a
    # shared machine have rings of their own.
    db = sqlite3.connect(tmp_path / "p.db")
    pids = {pid for (pid,) in db.execute("SELECT DISTINCT pid FROM processes")}
    assert len(pids) > 1, pids  # the children were followed
    left = [pid for pid in pids if heap_rings(pid)]
    assert left == [], left
