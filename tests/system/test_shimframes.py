"""rsprof's heap shim is in no stored stack (collector/shimframes.py, issue 20): the rule on
synthetic stacks, then real programs under `rsprof run` against the same under `rsprof -p`."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from conftest import build_target, profile_meta, record_pid, run_rsprof, start_target, top_json
from rsprof.collector.shimframes import (
    HEAP_TRACKING_FUNCTION,
    is_shim_module,
    shim_exports,
)
from rsprof.collector.symbols.elf import ElfFile

from rsprof.session import SHIM_PATH

# -- the rule, on synthetic stacks (leaf first) ---------------------------------------------


def shim_internal_names() -> set[str]:
    """Every function of the shim that is not one of its public entry points."""
    names = {symbol.name for symbol in ElfFile(str(SHIM_PATH)).symbols() if symbol.type == 2}
    return names - shim_exports(str(SHIM_PATH))


def stored_functions(profile: Path) -> set[tuple[str, str]]:
    """(function, module path) of every frame of every stored stack."""
    db = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
    try:
        return set(db.execute(
            "SELECT DISTINCT l.function, coalesce(m.path, '') FROM stack_frames sf"
            " JOIN frame_locations fl ON fl.frame_id = sf.frame_id"
            " JOIN locations l ON l.id = fl.location_id"
            " JOIN frames f ON f.id = sf.frame_id LEFT JOIN modules m ON m.id = f.module_id"
        ).fetchall())
    finally:
        db.close()


def thread_ids(profile: Path) -> dict[str, int]:
    result = run_rsprof("query", str(profile), "SELECT name, tid FROM threads", "--json")
    return {row["name"]: row["tid"] for row in json.loads(result.stdout)}


@pytest.fixture(scope="module")
def churn_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("shim-churn") / "run.db"
    result = run_rsprof("run", "-q", "--cpu-freq", "499", "-i", "250ms", "-o", str(out), "--",
                        str(build_target("shim_churn.c")), "2", timeout=180)
    assert result.returncode == 0, result.stderr
    return out, result.stderr


def test_no_shim_frame_is_stored_but_heap_tracking(churn_run: tuple[Path, str]) -> None:
    profile, _ = churn_run
    functions = stored_functions(profile)
    assert not [f for f in functions if is_shim_module(f[1])], functions
    names = {function for function, _ in functions}
    assert not names & shim_internal_names(), names & shim_internal_names()
    assert HEAP_TRACKING_FUNCTION in names
    for kind in ("cpu", "heap"):
        rows = top_json(profile, kind)
        assert not {row["function"] for row in rows} & shim_internal_names()
    traces = run_rsprof("traces", str(profile), "-n", "0").stdout
    assert "thread_trampoline" not in traces
    heap = run_rsprof("traces", str(profile), "--kind", "heap", "--sample-index", "alloc_space",
                      "-n", "0").stdout
    assert "churn_worker" in heap and "thread_trampoline" not in heap
    folded = run_rsprof("export", str(profile), "-f", "folded", "-o", "-").stdout
    assert "thread_trampoline" not in folded and "record_alloc" not in folded


def test_heap_tracking_sits_under_the_allocator_the_worker_called(
        churn_run: tuple[Path, str]) -> None:
    profile, _ = churn_run
    for name, tid in thread_ids(profile).items():
        if not name.startswith("churn-"):
            continue
        rows = {row["function"]: row for row in top_json(profile, "cpu", "--tid", str(tid))}
        samples = rows["start_thread"]["total"]  # every sample of the thread
        # Its whole life is under its start routine, as without the shim, and its worker's
        # Total is ~100 % with the shim's work inside it (a sample or two may fall in the
        # thread's start: pthread_getattr_np, pthread_setname_np).
        assert rows["start"]["total"] >= samples - 2, (rows["start"], samples)
        assert rows["churn_worker"]["total"] >= 0.95 * samples - 2, (rows["churn_worker"],
                                                                      samples)
        assert rows[HEAP_TRACKING_FUNCTION]["self"] > 0
    peek = run_rsprof("peek", str(profile), r"^\[rsprof heap tracking\]$").stdout
    assert "malloc" in peek and "free" in peek, peek


def test_the_summary_and_meta_give_the_heap_tracking_share(churn_run: tuple[Path, str]) -> None:
    profile, stderr = churn_run
    meta = profile_meta(profile)
    rows = {row["function"]: row for row in top_json(profile, "cpu")}
    tracked = rows[HEAP_TRACKING_FUNCTION]["total"]
    assert int(meta["heap_tracking_samples"]) == tracked
    assert float(meta["heap_tracking_pct"]) == pytest.approx(
        rows[HEAP_TRACKING_FUNCTION]["total_pct"], abs=0.11)
    assert f"heap tracking took {float(meta['heap_tracking_pct']):.1f}% of CPU samples" in stderr
    if float(meta["heap_tracking_pct"]) > 10:
        assert "--heap-sample BYTES" in stderr and "--no-heap" in stderr


def test_diff_against_an_attached_profile_reports_no_shim_function(
        churn_run: tuple[Path, str], tmp_path: Path) -> None:
    run_profile, _ = churn_run
    proc = start_target(build_target("shim_churn.c"), "60")  # killed once recorded
    try:
        attached = tmp_path / "attached.db"
        # --no-heap: CPU only, no shim in the process (rsprof -p would load one).
        result = record_pid(proc.pid, attached, "--no-heap")
        assert result.returncode == 0, result.stderr
    finally:
        proc.kill()
        proc.wait()
    diff = run_rsprof("diff", str(attached), str(run_profile), "--kind", "cpu", "-n", "0")
    assert diff.returncode == 0, diff.stderr
    assert "thread_trampoline" not in diff.stdout
    assert "churn_worker" in diff.stdout
    assert not [name for name in shim_internal_names() if f" {name}" in diff.stdout]
    assert HEAP_TRACKING_FUNCTION in diff.stdout
    # the program's calls into the shim, by their public names, hold the new cost
    assert re.search(r" malloc +new", diff.stdout) and re.search(r" free +new", diff.stdout)
