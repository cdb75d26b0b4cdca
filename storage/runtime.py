"""Frames that are the runtime's, not the program's: folded out by `--hide-runtime` (the
reports and exports) and the TUI's toggle, so a program's own functions come first.

- Start-up: how every process and thread begins (`_start`, `__libc_start_main`,
  `start_thread`, `clone3`, Rust's `lang_start` and thread entry). They hold 100 % Total on
  every stack and say nothing about the program.
- The interpreter: in a stack that runs Python code, the native frames of CPython itself
  (the `python3.X` executable or `libpython3.X.so`): its evaluation loop, calls and
  start-up, which py-spy does not show either. Native frames of other modules (a C
  extension, libc, zlib) stay: they are work the program asked for.

Folding removes frames and keeps the sample: its time goes to the nearest remaining frame
(the Python function running the interpreter's code). A stack made only of runtime frames
keeps its leaf, so no sample disappears.
"""

from __future__ import annotations

import re

from rsprof.storage.callsite import is_interpreter_module
from rsprof.storage.samples import Frame

STARTUP_FUNCTIONS = frozenset({
    "_start", "__libc_start_main", "__libc_start_main_impl", "__libc_start_call_main",
    "start_thread", "clone", "clone3", "__clone", "__clone3", "__clone_internal",
    "thread_start",  # musl
})
# Rust's runtime entry (std::rt::lang_start::{closure}, ..._internal) and its thread start
# (std::sys::pal::unix::thread::Thread::new::thread_start), whatever the std version.
_STARTUP_PATTERN = re.compile(r"^std::rt::lang_start|::thread::Thread::new::thread_start$"
                              r"|^std::sys::backtrace::__rust_begin_short_backtrace")
# CPython's own `main`, above everything it runs, Python frames or not (start-up, imports
# in C, finalization): start-up like `_start`, in the interpreter only.
_INTERPRETER_MAIN = re.compile(r"^(Py_BytesMain|Py_Main|Py_RunMain|pymain_\w+)$")


def is_startup(frame: Frame) -> bool:
    function = frame.lines[-1].function  # the outermost function at this address
    return (function in STARTUP_FUNCTIONS or bool(_STARTUP_PATTERN.search(function))
            or (bool(_INTERPRETER_MAIN.match(function)) and is_interpreter(frame)))


def is_interpreter(frame: Frame) -> bool:
    """A native frame of CPython itself (its module is the executable or libpython)."""
    return is_interpreter_module(frame.module)


def is_python(frame: Frame) -> bool:
    """A Python function's frame: collector/frames.py stores them under their code's file
    name as their module: a script's path, or `<frozen site>`, `<string>`."""
    module = frame.module
    return module.endswith(".py") or (module.startswith("<") and module.endswith(">"))


def runs_python(frames: tuple[Frame, ...]) -> bool:
    """The stack runs Python code: it has Python frames, or an evaluation loop whose frames
    could not be read (interpreter start-up, before rsprof knew the process)."""
    return any(is_python(f) or (f.lines[-1].function == "_PyEval_EvalFrameDefault"
                                and is_interpreter(f)) for f in frames)


def fold_runtime(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """`frames` (leaf first) without the runtime's; the leaf alone if nothing else is left."""
    python = runs_python(frames)
    kept = tuple(f for f in frames
                 if not is_startup(f) and not (python and is_interpreter(f)))
    if not kept and frames:
        return frames[:1]
    return kept
