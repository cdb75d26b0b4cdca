"""storage/runtime.py on synthetic stacks (no process): which frames are the runtime's and
what folding them leaves. Table-driven: one row per rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from rsprof.storage.samples import Frame, Line, Mapping


def frame(function: str, module: str) -> Frame:
    """A native frame of `module`, or a Python function's when module ends with .py."""
    python = module.endswith(".py")
    mapping = None if python else Mapping(1, 0x1000, 0x2000, 0, module, "")
    return Frame(hash((function, module)) & 0xFFFF, 0x1234, module, 0x234, mapping,
                 (Line(1, function, function, "", 0),))






@pytest.fixture(scope="module")
def python_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent))
    from conftest import python_binary, run_rsprof

    folder = tmp_path_factory.mktemp("runtime")
    script = folder / "busy.py"
    script.write_text("def heavy():\n    return sum(i * i for i in range(200_000))\n"
                      "def main():\n    for _ in range(60):\n        heavy()\n"
                      "main()\n")
    out = folder / "busy.db"
    done = run_rsprof("run", "-qq", "--no-heap", "-F", "499", "-o", str(out), "--",
                      str(python_binary("debian-3.11")), str(script))
    assert done.returncode == 0, done.stderr
    return out


def test_tui_hides_the_runtime_of_a_python_program_and_h_shows_it(
        python_profile: Path, tmp_path: Path) -> None:
    """A Python program's first screen has its functions, not the interpreter's (on by
    default there, as py-spy top); H shows them again; `x` exports what is shown, as
    `rsprof export --hide-runtime` does."""
    import shutil
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent))
    from rsprof.storage.live import CpuRow
    from test_tui_export import drive, pprof
    from tui_fixture import make_app

    copy = tmp_path / "rsprof.busy.261126160000.db"
    shutil.copy(python_profile, copy)
    hidden = drive(make_app(copy), ["x"])
    functions = [r.function for r in hidden.rows if isinstance(r, CpuRow)]
    assert "heavy" in functions[:3] and "main" in functions[:3], functions
    # The first screen: the runtime's functions only with the few samples of start-up
    # taken before rsprof found the interpreter, or whose Python frames did not pair
    # (those keep their native leaf: 0-3 of ~340 here, meta python_before_reader and
    # python_unpaired), never with the program's time.
    runtime = {"_start", "Py_RunMain", "PyEval_EvalCode", "__libc_start_call_main",
               "_PyEval_EvalFrameDefault", "Py_BytesMain"}
    rows = [r for r in hidden.rows if isinstance(r, CpuRow)]
    everything = sum(r.self_samples for r in rows)
    on_screen = [(r.function, r.total_samples) for r in rows[:12] if r.function in runtime]
    assert all(total <= 0.02 * everything for _, total in on_screen), (on_screen, everything)
    from conftest import run_rsprof

    written = tmp_path / "rsprof.busy.261126160000.cpu.pb.gz"
    expected = tmp_path / "cli.pb.gz"
    done = run_rsprof("export", str(copy), "-o", str(expected), "--hide-runtime")
    assert done.returncode == 0, done.stderr
    assert pprof(written) == pprof(expected)
    shown = drive(make_app(copy), ["H"])
    functions = [r.function for r in shown.rows if isinstance(r, CpuRow)]
    assert {"_start", "Py_RunMain"} <= set(functions), functions
