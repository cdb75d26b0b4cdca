"""Python frames in CPU stacks (issue 14, must-have 3): real CPython processes recorded
through `rsprof run` and `rsprof -p`, the Python frames read from outside at drain time and
spliced in place of `_PyEval_EvalFrameDefault`, then read back through the profile, the
reports and the exports."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import (
    TARGETS,
    assert_share,
    profile_meta,
    python_binary,
    record_pid,
    run_rsprof,
    top_json,
)

SCRIPT = TARGETS / "pysplit.py"
SOURCE = SCRIPT.read_text().splitlines()


def _line_of(text: str, after: int = 0) -> int:
    """1-based number of the first line from `after` on that contains `text`."""
    return next(i + 1 for i, line in enumerate(SOURCE) if i >= after and text in line)


HEAVY_DEF, LIGHT_DEF = _line_of("def heavy"), _line_of("def light")
MAIN_DEF = _line_of("def main")
CALLS = {"heavy": _line_of("heavy()", MAIN_DEF), "light": _line_of("light()", MAIN_DEF)}
MODULE_CALL = _line_of("main(seconds)", _line_of("__main__"))




Frame = tuple[str, str, int]  # function, file, line


def _stacks(profile: Path) -> list[tuple[int, int, list[Frame]]]:
    """(count, tid, frames leaf first, inline chains innermost first) of every CPU stack."""
    conn = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
    try:
        frames: dict[int, list[Frame]] = {}
        for stack_id, function, file, line in conn.execute(
            "SELECT sf.stack_id, l.function, l.file, l.line FROM stack_frames sf"
            " JOIN frame_locations fl ON fl.frame_id = sf.frame_id"
            " JOIN locations l ON l.id = fl.location_id"
            " ORDER BY sf.stack_id, sf.position, fl.inline_depth"
        ):
            frames.setdefault(stack_id, []).append((function, file, line))
        return [(count, tid, frames.get(stack_id, [])) for stack_id, tid, count in conn.execute(
            "SELECT stack_id, tid, SUM(count) FROM cpu_stack_samples GROUP BY stack_id, tid")]
    finally:
        conn.close()


def _python_part(frames: list[Frame]) -> list[Frame]:
    return [frame for frame in frames if frame[1] == str(SCRIPT)]


def _run_split(python: Path, out: Path, *extra: str) -> Path:
    result = run_rsprof("run", "-q", "--cpu-freq", "499", "-i", "500ms", "-o", str(out),
                        *extra, "--", str(python), str(SCRIPT), "2", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "target exited with code 0" in result.stderr, result.stderr
    return out


@pytest.fixture(scope="module")
def debian_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run_split(python_binary("debian-3.11"), tmp_path_factory.mktemp("pysplice") / "p.db")


def _check_split(profile: Path) -> None:
    shares: Counter[str] = Counter()
    for count, _, frames in _stacks(profile):
        python = _python_part(frames)
        if not python:
            continue
        functions = [function for function, _, _ in python]
        names = [function for function, _, _ in frames]
        # Leaf first: heavy or light, then main at the line calling it, then <module> at the
        # line calling main; the evaluator frames they replace are gone, and the native
        # frames that started the interpreter are still below them.
        assert functions[-1] == "<module>", functions
        if "heavy" in functions or "light" in functions:
            assert python[-1][2] == MODULE_CALL, python
            work = "heavy" if "heavy" in functions else "light"
            assert functions == [work, "main", "<module>"], functions
            body = range(HEAVY_DEF, LIGHT_DEF) if work == "heavy" else range(LIGHT_DEF, MAIN_DEF)
            assert python[0][2] in body, python
            assert python[1][2] == CALLS[work], python
            shares[work] += count
        assert "_PyEval_EvalFrameDefault" not in names, names
        assert "Py_RunMain" in names[names.index("<module>"):], names
    assert_share(shares["heavy"], shares["light"], 0.75)
    meta = profile_meta(profile)
    # read at sample time (BPF) or at drain time (the fallback): either way, read
    assert int(meta["python_walks"]) + int(meta.get("python_bpf_attached", 0)) > 0
    assert int(meta["python_spliced"]) > 0


def test_run_splits_python_frames_debian_311(debian_profile: Path) -> None:
    """pysplit.py's heavy:light 3:1 under `rsprof run` on Debian's python3.11: the split
    within binomial tolerance, each frame at its file and line, down to <module> and the
    native Py_RunMain below it."""
    _check_split(debian_profile)
    assert profile_meta(debian_profile)["python_runtimes"].startswith("3.11.")


@pytest.mark.parametrize("name", ["pyenv-3.12", "pyenv-3.13"])
def test_run_splits_python_frames_pyenv(name: str, tmp_path: Path) -> None:
    """The same on pyenv's 3.12 and 3.13 (libpython shared; 3.13's own debug offsets)."""
    profile = _run_split(python_binary(name), tmp_path / "p.db")
    _check_split(profile)
    assert profile_meta(profile)["python_runtimes"].startswith(name.split("-")[1])


def test_reports_name_python_functions(debian_profile: Path) -> None:
    """`top` (functions and lines), `--focus heavy`, `peek` and `traces` name the Python
    functions with their file and line."""
    rows = {row["function"]: row for row in top_json(debian_profile, "cpu", "--cum")
            if row["module"] == str(SCRIPT)}
    assert rows["heavy"]["file"] == str(SCRIPT)
    assert_share(rows["heavy"]["total"], rows["light"]["total"], 0.75)
    assert rows["<module>"]["total"] >= rows["heavy"]["total"] + rows["light"]["total"]
    lines = top_json(debian_profile, "cpu", "-g", "lines")
    heavy_lines = {row["line"] for row in lines if row["function"] == "heavy"}
    assert heavy_lines and heavy_lines <= set(range(HEAVY_DEF, LIGHT_DEF)), heavy_lines
    focused = {row["function"] for row in top_json(debian_profile, "cpu", "--focus", "^heavy$")}
    assert {"heavy", "main", "<module>"} <= focused and "light" not in focused
    peek = run_rsprof("peek", str(debian_profile), "^heavy$")
    assert peek.returncode == 0, peek.stderr
    assert "caller" in peek.stdout and "main" in peek.stdout
    traces = run_rsprof("traces", str(debian_profile))
    assert traces.returncode == 0 and "<module>" in traces.stdout


def test_exports_carry_python_names(debian_profile: Path, tmp_path: Path) -> None:
    """folded, speedscope and pprof (checked by `go tool pprof` when installed): the Python
    functions by name, with their file and line where the format has them."""
    folded = run_rsprof("export", str(debian_profile), "-f", "folded", "-o", "-")
    assert folded.returncode == 0, folded.stderr
    assert any(";<module>;main;heavy" in line for line in folded.stdout.splitlines())
    speedscope = run_rsprof("export", str(debian_profile), "-f", "speedscope", "-o", "-")
    frames = json.loads(speedscope.stdout)["shared"]["frames"]
    heavy = [frame for frame in frames if frame["name"] == "heavy"]
    assert heavy and all(frame["file"] == str(SCRIPT) for frame in heavy)
    pprof = tmp_path / "cpu.pb.gz"
    result = run_rsprof("export", str(debian_profile), "-o", str(pprof))
    assert result.returncode == 0, result.stderr
    assert b"heavy" in gzip.decompress(pprof.read_bytes())
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed (golang-go): pprof not checked")
    top = subprocess.run([go, "tool", "pprof", "-top", "-lines", str(pprof)],
                         capture_output=True, text=True, timeout=120)
    assert top.returncode == 0, top.stderr
    assert f"heavy {SCRIPT}:" in top.stdout, top.stdout


def test_python_off_keeps_native_stacks(tmp_path: Path) -> None:
    """--python=off: the interpreter's own frames, no Python ones, no Python meta."""
    profile = _run_split(python_binary("debian-3.11"), tmp_path / "off.db", "--python=off")
    stacks = _stacks(profile)
    assert not any(_python_part(frames) for _, _, frames in stacks)
    evaluating = sum(count for count, _, frames in stacks
                     if any(f[0] == "_PyEval_EvalFrameDefault" for f in frames))
    assert_share(evaluating, sum(count for count, _, _ in stacks) - evaluating, 0.95,
                 floor=0.05)
    assert "python_walks" not in profile_meta(profile)


def test_attach_reads_each_threads_frames(tmp_path: Path) -> None:
    """`rsprof -p` on two Python threads: each thread's samples carry its own function
    (spin -> heavy on one, spin -> light on the other)."""
    proc = subprocess.Popen([str(python_binary("debian-3.11")), str(SCRIPT), "30", "threads"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        heavy_tid, light_tid = int(ready[1]), int(ready[2])
        result = record_pid(proc.pid, tmp_path / "threads.db", "--cpu-freq", "499")
        assert result.returncode == 0, result.stderr
    finally:
        proc.kill()
        proc.wait()
    seen: dict[int, Counter[str]] = {heavy_tid: Counter(), light_tid: Counter()}
    for count, tid, frames in _stacks(tmp_path / "threads.db"):
        functions = [function for function, _, _ in _python_part(frames)]
        if tid in seen and functions:
            # spin (threading.py's frames below it are filtered out), running its function
            # or its time.monotonic() check
            assert functions[-1] == "spin" and len(functions) <= 2, functions
            seen[tid][functions[0]] += count
    assert seen[heavy_tid]["heavy"] > 0 and seen[light_tid]["light"] > 0, seen
    assert seen[heavy_tid]["light"] == 0 and seen[light_tid]["heavy"] == 0, seen


def test_tui_lists_python_functions(debian_profile: Path) -> None:
    """The TUI's CPU table (the same storage) has heavy and light, with their file."""
    import asyncio
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from rsprof.storage.live import CpuRow
    from rsprof.tui.widgets.table import ProfileTable
    from tui_fixture import make_app, settle

    app = make_app(debian_profile)
    rows: list[CpuRow] = []

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            rows.extend(r for r in app.main.query_one(ProfileTable).rows
                        if isinstance(r, CpuRow))

    asyncio.run(main())
    by_name = {row.function: row for row in rows}
    assert {"heavy", "light"} <= by_name.keys(), sorted(by_name)[:20]
    assert "pysplit.py:" in by_name["heavy"].location, by_name["heavy"]


def test_forked_child_has_its_own_python_frames(tmp_path: Path) -> None:
    """`rsprof run` follows a fork: the child (heavy) is a process image of its own with its
    own reader, its stacks resolved through the mappings its parent had (the exec'd
    python3's, drained in the same checkpoint as the fork)."""
    script = TARGETS / "pyfork.py"
    out = tmp_path / "fork.db"
    result = run_rsprof("run", "-q", "--cpu-freq", "499", "-o", str(out), "--",
                        str(python_binary("debian-3.11")), str(script), "1.5", timeout=120)
    assert result.returncode == 0, result.stderr
    conn = sqlite3.connect(f"file:{out}?mode=ro", uri=True)
    pids = [pid for (pid,) in conn.execute("SELECT DISTINCT pid FROM processes ORDER BY id")]
    conn.close()
    parent, child = pids[0], pids[-1]
    assert parent != child, pids
    seen: dict[int, Counter[str]] = {parent: Counter(), child: Counter()}
    for count, tid, frames in _stacks(out):
        functions = [function for function, file, _ in frames if file == str(script)]
        if tid in seen and functions and functions[0] in ("heavy", "light"):
            assert functions[1:] == ["spin", "<module>"], functions
            seen[tid][functions[0]] += count
    assert seen[child]["heavy"] > 0 and seen[parent]["light"] > 0, seen
    assert seen[child]["light"] == 0 and seen[parent]["heavy"] == 0, seen
