"""Heap for Python (issue 14, must-have 4): allocations made by Python code are charged to
the Python line that made them. Real CPython processes through `rsprof run`: the shim reads
the allocating thread's Python frames in-process (native/shim/shimpy.c), the reader decodes
them (native/heapreader.c) and the resolver splices them in place of the evaluator's native
frames; `rsprof top heap -g lines` then shows the leak at its file and line."""

from __future__ import annotations

import os
import shutil
import sqlite3
import struct
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHONS, TARGETS, profile_meta, python_binary, run_rsprof, top_json
from rsprof.collector.pyframes import _DEBUG_FIELDS_313, LAYOUTS, debug_offsets_layout

from rsprof._native import SHIM_PY_DEBUG_313, SHIM_PY_LAYOUTS, HeapReader
from rsprof.session import SHIM_PATH

SCRIPT = TARGETS / "pyleak.py"
SOURCE = SCRIPT.read_text().splitlines()
LEAK_LINE = next(i + 1 for i, line in enumerate(SOURCE) if "# the leak" in line)
CHURN_LINE = next(i + 1 for i, line in enumerate(SOURCE) if "# the churn" in line)
LEAK_COUNT, LEAK_SIZE, CHURN_COUNT, CHURN_SIZE = 1000, 10000, 500, 20000
# A bytes object of n bytes is one block of n + 33 (PyBytesObject: 32-byte header and the
# trailing NUL); the list that keeps them grows at the same line (its pointer array,
# reallocated as it grows: at most ~9 KiB live for 1000 items). So the leak's live bytes
# lie in [count * (size + 33), that + 16 KiB].
OBJECT_OVERHEAD, LIST_SLACK = 33, 16 * 1024




def _record(tmp_path: Path, python: Path, *extra: str) -> Path:
    out = tmp_path / "pyleak.db"
    result = run_rsprof("run", "-q", "-i", "200ms", "-o", str(out), *extra, "--",
                        str(python), str(SCRIPT))
    assert result.returncode == 0, result.stderr
    assert "target exited with code 0" in result.stderr
    return out


def _row(rows: list[dict[str, object]], line: int) -> dict[str, object]:
    found = [r for r in rows if str(r["file"]).endswith("pyleak.py") and r["line"] == line]
    assert len(found) == 1, rows[:8]
    return found[0]


@pytest.mark.parametrize("name", list(PYTHONS))
def test_python_leak_found_at_its_line(tmp_path: Path, name: str) -> None:
    profile = _record(tmp_path, python_binary(name))
    rows = top_json(profile, "heap", "-g", "lines")
    leak = _row(rows, LEAK_LINE)
    assert leak["function"] == "leak"
    expected = LEAK_COUNT * (LEAK_SIZE + OBJECT_OVERHEAD)
    assert expected <= int(leak["live_bytes"]) <= expected + LIST_SLACK  # type: ignore[call-overload]
    assert int(leak["alloc_count"]) >= LEAK_COUNT  # type: ignore[call-overload]
    assert rows[0] is not None and rows[0]["line"] == LEAK_LINE  # the biggest live site
    assert leak["growing"] in (True, False)
    # Freed at once, from the main thread and from a worker: live 0, every block counted.
    churn = _row(rows, CHURN_LINE)
    assert churn["function"] == "churn"
    assert churn["live_bytes"] == 0
    assert churn["alloc_count"] == churn["free_count"] == 2 * CHURN_COUNT
    assert int(churn["total_alloc_bytes"]) >= 2 * CHURN_COUNT * CHURN_SIZE  # type: ignore[call-overload]
    meta = profile_meta(profile)
    assert int(meta["heap_python_decoded"]) > 0


@pytest.fixture(scope="module")
def debian_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("pyheap"), python_binary("debian-3.11"))


def test_python_heap_stacks_read_through(debian_profile: Path) -> None:
    """The whole stack: malloc's native callers, then the Python frames in place of the
    evaluator, then the native frames below (`Py_RunMain`)."""
    profile = debian_profile
    result = run_rsprof("traces", "--kind", "heap", str(profile), "-g", "lines",
                        "--focus", "^leak$", "-n", "1")
    assert result.returncode == 0, result.stderr
    frames = [line.split("|", 1)[1].strip() for line in result.stdout.splitlines() if "|" in line]
    python = [i for i, frame in enumerate(frames) if "pyleak.py:" in frame]
    assert [frames[i].split()[0] for i in python] == ["leak", "main", "<module>"], frames
    assert frames[python[0]].endswith(f"pyleak.py:{LEAK_LINE}")
    below = frames[python[-1] + 1:]
    assert "PyEval_EvalCode" in below and "Py_RunMain" in below and "_start" in below
    assert not any("_PyEval_EvalFrameDefault" in frame for frame in frames)


def test_exports_carry_the_python_lines(debian_profile: Path, tmp_path: Path) -> None:
    """folded (the leak's bytes under `<module>;main;leak`) and pprof (checked by `go tool
    pprof -top -lines` when installed: the leak's line holds its bytes)."""
    folded = run_rsprof("export", str(debian_profile), "--kind", "heap", "-f", "folded",
                        "-o", "-")
    assert folded.returncode == 0, folded.stderr
    # Heap stacks are trimmed to their call site, here the innermost Python frame (as in
    # `rsprof top heap`): `leak` is the leaf.
    leaked = sum(int(line.rsplit(" ", 1)[1]) for line in folded.stdout.splitlines()
                 if line.rsplit(" ", 1)[0].endswith(";<module>;main;leak"))
    expected = LEAK_COUNT * (LEAK_SIZE + OBJECT_OVERHEAD)
    assert expected <= leaked <= expected + LIST_SLACK
    pprof = tmp_path / "heap.pb.gz"
    result = run_rsprof("export", str(debian_profile), "--kind", "heap", "-o", str(pprof))
    assert result.returncode == 0, result.stderr
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed (golang-go): pprof not checked")
    top = subprocess.run([go, "tool", "pprof", "-top", "-lines", "-unit", "B", str(pprof)],
                         capture_output=True, text=True, timeout=120)
    assert top.returncode == 0, top.stderr
    line = next((row for row in top.stdout.splitlines() if f"pyleak.py:{LEAK_LINE}" in row),
                "")
    assert line.split() and line.split()[-2] == "leak", top.stdout
    # flat and cumulative: the leak's bytes (the call site is the leaf, as in `top heap`)
    assert expected <= int(line.split()[0].rstrip("B")) <= expected + LIST_SLACK, line
    assert expected <= int(line.split()[3].rstrip("B")) <= expected + LIST_SLACK, line


def test_tui_memory_view_lists_the_leak_line(debian_profile: Path) -> None:
    """The TUI's Memory view (its table of call sites) has the leak at its line, first."""
    import asyncio
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from rsprof.storage.live import HeapRow
    from rsprof.tui.widgets.table import ProfileTable
    from tui_fixture import make_app, settle

    app = make_app(debian_profile)
    rows: list[HeapRow] = []

    async def main() -> None:
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await settle(pilot)
            rows.extend(r for r in app.main.query_one(ProfileTable).rows
                        if isinstance(r, HeapRow))

    asyncio.run(main())
    assert rows, "no Memory rows"
    assert rows[0].function == "leak" and f"pyleak.py:{LEAK_LINE}" in rows[0].location, rows[:3]
    expected = LEAK_COUNT * (LEAK_SIZE + OBJECT_OVERHEAD)
    assert expected <= rows[0].live_bytes <= expected + LIST_SLACK


def test_python_off_keeps_native_stacks(tmp_path: Path) -> None:
    profile = _record(tmp_path, python_binary("debian-3.11"), "--python", "off")
    rows = top_json(profile, "heap", "-g", "lines")
    assert not [r for r in rows if str(r["file"]).endswith("pyleak.py")]
    assert sum(int(r["live_bytes"]) for r in rows) >= LEAK_COUNT * LEAK_SIZE  # type: ignore[call-overload]


# The fields the shim reads (native/shim/shimpy_layout.h), whatever the version.
SHIM_FIELDS = set(SHIM_PY_DEBUG_313) - {"version", "free_threaded"}


@pytest.mark.parametrize("version", [(3, 11), (3, 12)])
def test_shim_offsets_match_the_reader_table(version: tuple[int, int]) -> None:
    """The shim's offsets (C, in the target; its table as compiled, exported by the
    extension) and the reader's (checked against every installed Python's headers by
    test_pyframes.py) are the same numbers, field by field."""
    shim = SHIM_PY_LAYOUTS[version]
    assert set(shim) == SHIM_FIELDS
    assert shim == {field: LAYOUTS[version][field] for field in shim}


def test_shim_313_debug_offsets_match_the_reader() -> None:
    """3.13: the shim takes its offsets from _Py_DebugOffsets as the reader does
    (debug_offsets_layout): the same words, and the same values for the fields 3.13 does not
    publish. A synthetic _Py_DebugOffsets whose every word differs, read both ways."""
    assert set(SHIM_PY_LAYOUTS) | {(3, 13)} == set(LAYOUTS)  # every supported version
    words = [1000 + 8 * index for index in range(72)]
    words[SHIM_PY_DEBUG_313["version"][0]] = 0x030D00F0  # 3.13.0 final
    words[SHIM_PY_DEBUG_313["free_threaded"][0]] = 0
    data = b"xdebugpy" + struct.pack("<72Q", *words)
    reader = debug_offsets_layout(data, (3, 13, 0))
    assert reader is not None
    shim = {field: words[index] if index >= 0 else value
            for field, (index, value) in SHIM_PY_DEBUG_313.items() if field in SHIM_FIELDS}
    assert shim == {field: reader[field] for field in shim}
    for field, (index, _) in SHIM_PY_DEBUG_313.items():
        assert (index >= 0) == (field in _DEBUG_FIELDS_313), field
        if index >= 0:
            assert _DEBUG_FIELDS_313[field] == index, field


def test_non_python_program_pays_nothing() -> None:
    """A program without CPython: the shim finds no Py_Version at init and never reads
    Python frames (ring header flag PYTHON unset)."""
    child = subprocess.Popen(["/bin/sleep", "0.5"],
                             env={**os.environ, "LD_PRELOAD": str(SHIM_PATH)})
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                reader = HeapReader.attach(child.pid)
                break
            except FileNotFoundError:
                assert time.monotonic() < deadline
                time.sleep(0.005)
        assert reader.python_stats()["shim"] is False
        reader.close()
    finally:
        child.wait(10)


STRESS = TARGETS / "pystress.py"
STRESS_SOURCE = STRESS.read_text().splitlines()


def _stress_line(marker: str) -> int:
    return next(i + 1 for i, line in enumerate(STRESS_SOURCE) if f"# the {marker}" in line)


@pytest.mark.parametrize("name", list(PYTHONS))
def test_frames_read_safely_in_every_situation(tmp_path: Path, name: str) -> None:
    """Threads, generator and coroutine frames, finalizers allocating while a frame is torn
    down, exceptions, a recursion deeper than a record holds, C code without the GIL: the
    target runs to its end, every site is at its own line, nothing is lost."""
    out = tmp_path / "stress.db"
    result = run_rsprof("run", "-q", "-i", "200ms", "-o", str(out), "--",
                        str(python_binary(name)), str(STRESS))
    assert result.returncode == 0, result.stderr
    assert "target exited with code 0" in result.stderr
    rows = [r for r in top_json(out, "heap", "-g", "lines")
            if str(r["file"]).endswith("pystress.py")]
    by_line = {int(r["line"]): r for r in rows}  # type: ignore[call-overload]
    # Every site below must be there; if one is not, show what was (a rare failure in CI
    # under 4 CPU hogs had no row for the coroutine's line, cause not found yet).
    wanted = {_stress_line(what) for what in ("generator", "coroutine", "finalizer", "raise")}
    assert wanted <= set(by_line), (sorted(wanted - set(by_line)), rows,
                                    top_json(out, "heap", "-n", "15"), profile_meta(out))
    assert by_line[_stress_line("generator")]["function"] == "gen"
    assert by_line[_stress_line("generator")]["alloc_count"] == 3 * 200
    assert by_line[_stress_line("coroutine")]["function"] == "coro"
    assert int(by_line[_stress_line("coroutine")]["alloc_count"]) >= 200  # type: ignore[call-overload]
    assert by_line[_stress_line("finalizer")]["function"] == "Finalized.__del__"
    assert int(by_line[_stress_line("finalizer")]["alloc_count"]) >= 150  # type: ignore[call-overload]
    raised = by_line[_stress_line("raise")]
    assert raised["function"] == "raising" and raised["alloc_count"] == 150
    assert raised["live_bytes"] == 0
    # Deeper than 128 Python frames: recorded with native frames only, never a wrong line.
    assert _stress_line("deep end") not in by_line
    known = {"gen", "coro", "Finalized.__del__", "raising", "worker", "without_gil", "main",
             "<module>", "deep"}
    assert {str(r["function"]) for r in rows} <= known, rows
    conn = sqlite3.connect(f"file:{out}?mode=ro", uri=True)
    try:
        lost = conn.execute("SELECT SUM(heap_lost_events) FROM checkpoints").fetchone()[0]
    finally:
        conn.close()
    assert lost == 0


GIL = TARGETS / "pygil.py"
GIL_SOURCE = GIL.read_text().splitlines()


@pytest.mark.parametrize("name", list(PYTHONS))
def test_allocation_without_the_gil_gets_no_python_frames(tmp_path: Path, name: str) -> None:
    """malloc through ctypes from a worker: without the GIL (while the main thread runs
    Python) native frames only, never the GIL holder's line; with the GIL, its own line."""
    out = tmp_path / "gil.db"
    result = run_rsprof("run", "-q", "-i", "200ms", "-o", str(out), "--",
                        str(python_binary(name)), str(GIL))
    assert result.returncode == 0, result.stderr
    rows = top_json(out, "heap", "-g", "lines")

    def line_of(marker: str) -> int:
        return next(i + 1 for i, line in enumerate(GIL_SOURCE) if f"# {marker}" in line)

    mine = {int(r["line"]): r for r in rows if str(r["file"]).endswith("pygil.py")}  # type: ignore[call-overload]
    with_gil = mine[line_of("with the GIL")]
    assert with_gil["function"] == "with_gil"
    # + the shared list's reallocations at this line (every size it went through)
    assert 300 * 23456 <= int(with_gil["total_alloc_bytes"]) <= 300 * 23456 + 4 * LIST_SLACK  # type: ignore[call-overload]
    # The line itself grows the shared list (blocks of a few KiB): none of the 12345s.
    assert int(mine.get(line_of("without the GIL"), {"total_alloc_bytes": 0})  # type: ignore[call-overload]
               ["total_alloc_bytes"]) < 300 * 12345 // 10
    assert line_of("the busy loop") not in mine
    native = [r for r in rows if r["total_alloc_bytes"] == 300 * 12345]
    assert len(native) == 1 and native[0]["alloc_count"] == 300, rows[:5]
    assert not str(native[0]["file"]).endswith(".py")


@pytest.mark.parametrize("scope", [["--since", "0s"], ["--tid", "MAIN"]])
def test_filtered_reports_keep_the_python_call_site(debian_profile: Path,
                                                    scope: list[str]) -> None:
    """A time range or a thread makes `top heap` rebuild call sites from the stacks (not the
    recorder's per-site rows): the site is still the innermost Python frame, not the C
    function under it that called malloc (bytes(), here)."""
    if scope[0] == "--tid":
        conn = sqlite3.connect(f"file:{debian_profile}?mode=ro", uri=True)
        try:
            (main_tid,) = conn.execute("SELECT MIN(tid) FROM threads").fetchone()
        finally:
            conn.close()
        scope = ["--tid", str(main_tid)]
    rows = top_json(debian_profile, "heap", "-g", "lines", *scope)
    leak = _row(rows, LEAK_LINE)
    assert leak["function"] == "leak", rows[:5]
    assert rows[0] is not None and rows[0]["line"] == LEAK_LINE, rows[:5]
