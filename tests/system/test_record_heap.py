"""Heap end to end through the CLI: exact bytes per call site, leaks first, rsprof's query."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import build_target, rsprof_env, run_rsprof, top_json

README_LEAK_QUERY = """
  SELECT function, file, line,
         total_alloc_bytes - total_free_bytes as leaked,
         total_allocs - total_frees as leaked_count
  FROM heap_samples
  WHERE total_allocs > total_frees
  ORDER BY leaked DESC
  LIMIT 20
"""
TICKS, THREADS = 80, 4


@pytest.fixture(scope="module")
def heap_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("heap") / "leaky.db"
    result = run_rsprof("run", "-q", "-i", "200ms", "-o", str(out), "--",
                        str(build_target("leaky.c")), str(TICKS), "25", str(THREADS))
    assert result.returncode == 0, result.stderr
    assert "target exited with code 0" in result.stderr
    return out


def _sites(path: Path, *extra: str) -> list[dict[str, Any]]:
    return top_json(path, "heap", *extra)


def test_exact_bytes_per_call_site(heap_profile: Path) -> None:
    sites = {str(s["function"]): s for s in _sites(heap_profile)}
    leak, churn, keep = sites["leak_site"], sites["churn_site"], sites["keep_site"]
    assert (leak["live_bytes"], leak["alloc_count"], leak["free_count"]) == (TICKS * 4000, TICKS, 0)
    assert (churn["live_bytes"], churn["total_alloc_bytes"]) == (0, TICKS * 777)
    assert churn["alloc_count"] == churn["free_count"] == TICKS
    assert (keep["live_bytes"], keep["alloc_count"]) == (123457, 1)
    threads = sites["thread_leak"]
    assert threads["live_bytes"] == TICKS * THREADS * 64
    assert threads["alloc_count"] == TICKS * THREADS
    assert str(leak["file"]).endswith("leaky.c") and leak["line"] == 21
    assert set(leak) == {"function", "file", "line", "module", "live_bytes", "total_alloc_bytes",
                         "total_free_bytes", "alloc_count", "free_count", "growing"}


def test_leaking_site_first_and_flagged_growing(heap_profile: Path) -> None:
    sites = _sites(heap_profile)
    assert sites[0]["function"] == "leak_site"
    flags = {s["function"]: s["growing"] for s in sites}
    assert flags["leak_site"] is True
    assert flags["keep_site"] is False and flags["churn_site"] is False
    by_allocs = _sites(heap_profile, "--by", "allocs")
    assert by_allocs[0]["function"] == "thread_leak"  # TICKS * THREADS allocations
    by_bytes = _sites(heap_profile, "--by", "alloc_bytes")
    assert by_bytes[0]["function"] == "leak_site"


def test_rsprof_readme_leak_query_verbatim(heap_profile: Path) -> None:
    result = run_rsprof("query", str(heap_profile), README_LEAK_QUERY)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "function\tfile\tline\tleaked\tleaked_count"
    function, _file, _line, leaked, count = lines[1].split("\t")
    assert (function, int(leaked), int(count)) == ("leak_site", TICKS * 4000, TICKS)
    assert "churn_site" not in result.stdout  # freed everything: not a leak
    # Per-checkpoint deltas add up to the totals: nothing counted twice.
    total = run_rsprof("query", str(heap_profile),
                       "SELECT SUM(h.alloc_bytes) FROM heap_site_samples h JOIN locations l"
                       " ON l.id = h.location_id WHERE l.function = 'leak_site'")
    assert int(total.stdout.splitlines()[1]) == TICKS * 4000


def test_attach_later_with_preload(tmp_path: Path) -> None:
    shim = run_rsprof("preload").stdout.strip()
    assert os.path.isabs(shim) and Path(shim).exists()
    target = subprocess.Popen([str(build_target("leaky.c")), "400", "10", "1"],
                              env={**os.environ, "LD_PRELOAD": shim}, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().startswith("ready")
        out = tmp_path / "attached.db"
        result = run_rsprof("-p", str(target.pid), "-q", "-d", "1500ms", "-o", str(out))
        assert result.returncode == 0, result.stderr
    finally:
        target.kill()
        target.wait()
    sites = {s["function"]: s for s in _sites(out)}
    assert sites["leak_site"]["alloc_count"] > 20
    assert sites["leak_site"]["live_bytes"] == 4000 * sites["leak_site"]["alloc_count"]
    assert sites["churn_site"]["live_bytes"] == 0


def test_cpu_only_profile_says_how_to_enable_heap(tmp_path: Path) -> None:
    """A process started without the shim (it lives 30 s, killed after: under four CPU hogs
    rsprof took longer than the 2 s it once lived to attach)."""
    target = subprocess.Popen([str(build_target("leaky.c")), "3000", "10"],
                              stdout=subprocess.PIPE, text=True,
                              env=rsprof_env() | {"LD_PRELOAD": ""})
    try:
        assert target.stdout is not None and target.stdout.readline().startswith("ready")
        out = tmp_path / "cpu-only.db"
        # --no-heap: without it the heap shim is loaded into the process (test_heap_attach).
        assert run_rsprof("-p", str(target.pid), "-q", "-d", "1s", "--no-heap", "-o",
                          str(out)).returncode == 0
    finally:
        target.kill()
        target.wait()
    result = run_rsprof("top", "heap", str(out), "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout) == []
    assert "LD_PRELOAD=$(rsprof preload)" in result.stderr


def test_sampled_mode_estimates_within_tolerance(tmp_path: Path) -> None:
    out = tmp_path / "sampled.db"
    ticks = 400
    result = run_rsprof("run", "-q", "--heap-sample", "4096", "-o", str(out), "--",
                        str(build_target("leaky.c")), str(ticks), "2", "0")
    assert result.returncode == 0, result.stderr
    meta = run_rsprof("query", str(out), "SELECT value FROM meta WHERE key = 'heap_mode'")
    assert meta.stdout.splitlines()[1] == "sampled"
    leak = {s["function"]: s for s in _sites(out)}["leak_site"]
    truth = ticks * 4000
    assert abs(int(leak["total_alloc_bytes"]) - truth) / truth < 0.2, leak
