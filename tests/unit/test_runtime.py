"""storage/runtime.py on synthetic stacks (no process): which frames are the runtime's and
what folding them leaves. Table-driven: one row per rule."""

from __future__ import annotations

import pytest
from rsprof.storage.runtime import fold_runtime, is_interpreter, is_python, is_startup
from rsprof.storage.samples import Frame, Line, Mapping

_LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def frame(function: str, module: str) -> Frame:
    """A native frame of `module`, or a Python function's when module ends with .py."""
    python = module.endswith(".py")
    mapping = None if python else Mapping(1, 0x1000, 0x2000, 0, module, "")
    return Frame(hash((function, module)) & 0xFFFF, 0x1234, module, 0x234, mapping,
                 (Line(1, function, function, "", 0),))


@pytest.mark.parametrize(("function", "module", "startup", "interpreter", "python"), [
    ("_start", "/usr/bin/app", True, False, False),
    ("__libc_start_call_main", _LIBC, True, False, False),
    ("__libc_start_main_impl", _LIBC, True, False, False),
    ("start_thread", _LIBC, True, False, False),
    ("clone3", _LIBC, True, False, False),
    ("std::rt::lang_start_internal", "/usr/bin/rustapp", True, False, False),
    ("std::sys::pal::unix::thread::Thread::new::thread_start", "/usr/bin/rustapp", True, False,
     False),
    ("main", "/usr/bin/app", False, False, False),
    ("PyEval_EvalCode", "/usr/bin/python3.11", False, True, False),
    ("Py_BytesMain", "/usr/bin/python3.11", True, True, False),
    ("pymain_run_python", "/usr/lib/libpython3.12.so.1.0", True, True, False),
    ("_PyEval_EvalFrameDefault", "/opt/py/lib/libpython3.12.so.1.0", False, True, False),
    ("python3.13+0x1234", "/root/.pyenv/versions/3.13.0/bin/python3.13", False, True, False),
    ("zlib_compress", "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13", False, False, False),
    ("heavy", "/srv/app.py", False, False, True),
    ("addsitedir", "<frozen site>", False, False, True),
    ("python_helper", "/usr/bin/python3-config", False, False, False),  # not an interpreter
])
def test_which_frames_are_the_runtimes(function: str, module: str, startup: bool,
                                       interpreter: bool, python: bool) -> None:
    f = frame(function, module)
    assert (is_startup(f), is_interpreter(f), is_python(f)) == (startup, interpreter, python)


def _names(frames: tuple[Frame, ...]) -> list[str]:
    return [f.lines[0].function for f in frames]


PY = "/usr/bin/python3.11"


@pytest.mark.parametrize(("stack", "folded"), [
    # C: start-up goes, the program stays
    ([("work", "/app"), ("main", "/app"), ("__libc_start_call_main", _LIBC),
      ("__libc_start_main_impl", _LIBC), ("_start", "/app")], ["work", "main"]),
    ([("spin", "/app"), ("worker", "/app"), ("start_thread", _LIBC), ("clone3", _LIBC)],
     ["spin", "worker"]),
    # Python: the interpreter's frames go, leaf side included (its time is the function's)
    ([("python3.11+0x1a85", PY), ("heavy", "/t/app.py"), ("_PyFunction_Vectorcall", PY),
      ("main", "/t/app.py"), ("<module>", "/t/app.py"), ("PyEval_EvalCode", PY),
      ("Py_RunMain", PY), ("__libc_start_call_main", _LIBC), ("_start", PY)],
     ["heavy", "main", "<module>"]),
    # ...but a C library called from Python stays, with libc's own functions
    ([("deflate", "/lib/libz.so.1"), ("zlib_compress", "/lib/zlib.cpython-311.so"),
      ("PyObject_Vectorcall", PY), ("pack", "/t/app.py"), ("start_thread", _LIBC)],
     ["deflate", "zlib_compress", "pack"]),
    # without Python frames the interpreter is a program like any other (its start-up,
    # its own main included, goes)
    ([("PyObject_Free", PY), ("Py_FinalizeEx", PY), ("Py_RunMain", PY), ("Py_BytesMain", PY),
      ("_start", PY)], ["PyObject_Free", "Py_FinalizeEx"]),
    # Python code whose frames were not read (start-up): the interpreter's frames go too
    ([("python3.11+0x1a85", PY), ("_PyEval_EvalFrameDefault", PY), ("PyEval_EvalCode", PY),
      ("Py_RunMain", PY), ("_start", PY)], ["python3.11+0x1a85"]),
    ([("__libc_open64", _LIBC), ("_Py_wfopen", PY), ("_PyEval_EvalFrameDefault", PY),
      ("Py_BytesMain", PY)], ["__libc_open64"]),
    # a program's own function called Py_RunMain is not the interpreter's
    ([("Py_RunMain", "/usr/bin/app"), ("main", "/usr/bin/app")], ["Py_RunMain", "main"]),
    # nothing but runtime: the leaf stays, the sample is never lost
    ([("_start", "/app")], ["_start"]),
    ([("clone3", _LIBC), ("_start", "/app")], ["clone3"]),
])
def test_fold_runtime(stack: list[tuple[str, str]], folded: list[str]) -> None:
    assert _names(fold_runtime(tuple(frame(f, m) for f, m in stack))) == folded


# ------------------------------------------------------------------ on a real Python program




