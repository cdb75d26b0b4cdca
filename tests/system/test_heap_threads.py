"""Heap per thread: the shim's commit word carries the allocating tid; the reader keeps it per
live block, so a free is charged to the thread that allocated (as heaptrack does), and
`rsprof top heap --tid` gives each thread's exact bytes."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from conftest import build_target, run_rsprof, top_json
from unit.synthetic import schema_1_copy

# tests/targets/heap_thread_leaks.c
A_BLOCKS, A_SIZE, A_FREED = 300, 1000, 100
B_BLOCKS, B_SIZE, CHURN = 50, 2048, 100


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    out = tmp_path_factory.mktemp("heapthreads") / "rsprof.heap_thread_leaks.261123101530.db"
    result = run_rsprof("run", "-q", "-i", "200ms", "-o", str(out), "--",
                        str(build_target("heap_thread_leaks.c")))
    assert result.returncode == 0, result.stderr
    tids = dict(re.findall(r"tid ([AB]) (\d+)", result.stdout))
    assert set(tids) == {"A", "B"}, result.stdout
    return out, int(tids["A"]), int(tids["B"])


def _site(rows: list[dict[str, object]], function: str) -> dict[str, object]:
    found = [r for r in rows if r["function"] == function]
    assert len(found) == 1, rows
    return found[0]


def test_per_thread_bytes_exact(recorded: tuple[Path, int, int]) -> None:
    path, tid_a, tid_b = recorded
    a = _site(top_json(path, "heap", "--tid", str(tid_a)), "leak_site")
    # B freed A_FREED of A's blocks: charged to A, the allocating thread.
    assert (a["live_bytes"], a["total_alloc_bytes"], a["alloc_count"], a["free_count"]) == (
        (A_BLOCKS - A_FREED) * A_SIZE, A_BLOCKS * A_SIZE, A_BLOCKS, A_FREED)
    rows_b = top_json(path, "heap", "--tid", str(tid_b))
    b = _site(rows_b, "leak_site")
    assert (b["live_bytes"], b["total_alloc_bytes"], b["free_count"]) == (
        B_BLOCKS * B_SIZE, B_BLOCKS * B_SIZE, 0)
    churn = _site(rows_b, "churn_site")
    assert (churn["live_bytes"], churn["alloc_count"], churn["free_count"]) == (0, CHURN, CHURN)
    # A allocated nothing at churn_site.
    assert not [r for r in top_json(path, "heap", "--tid", str(tid_a))
                if r["function"] == "churn_site"]


def test_threads_add_up_to_the_whole_heap(recorded: tuple[Path, int, int]) -> None:
    path = recorded[0]
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        per_thread = conn.execute(
            "SELECT stack_id, SUM(alloc_bytes), SUM(free_bytes), SUM(alloc_count),"
            " SUM(free_count) FROM heap_thread_samples GROUP BY stack_id ORDER BY stack_id"
        ).fetchall()
        whole = conn.execute(
            "SELECT stack_id, SUM(alloc_bytes), SUM(free_bytes), SUM(alloc_count),"
            " SUM(free_count) FROM heap_stack_samples GROUP BY stack_id ORDER BY stack_id"
        ).fetchall()
        # Every allocating thread has a threads row (for the pickers), with its process.
        heap_tids = {t for (t,) in conn.execute("SELECT DISTINCT tid FROM heap_thread_samples")}
        known = dict(conn.execute("SELECT tid, pid FROM threads").fetchall())
    finally:
        conn.close()
    assert per_thread == whole and whole
    assert heap_tids <= set(known)
    assert {known[t] for t in heap_tids} == {int(run_pid(path))}


def run_pid(path: Path) -> str:
    result = run_rsprof("query", str(path), "SELECT value FROM meta WHERE key = 'pid'")
    return result.stdout.splitlines()[1]


def test_old_file_without_thread_heap(recorded: tuple[Path, int, int], tmp_path: Path) -> None:
    """A file written before the table existed: whole-heap reports work, `--tid` says why
    it cannot answer (one line, exit 6)."""
    old = schema_1_copy(recorded[0], tmp_path / "old.db", by_thread=False)
    assert _site(top_json(old, "heap"), "leak_site")["live_bytes"] == (
        (A_BLOCKS - A_FREED) * A_SIZE + B_BLOCKS * B_SIZE)
    result = run_rsprof("top", "heap", str(old), "--tid", str(recorded[1]))
    assert result.returncode == 6
    assert result.stderr.count("\n") == 1 and "per thread" in result.stderr
    assert "Traceback" not in result.stderr
