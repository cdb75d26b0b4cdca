"""Frames that are the runtime's, not the program's: folded out by `--hide-runtime` (the
reports and exports) and the TUI's toggle, so a program's own functions come first.

- Start-up: how every process and thread begins (`_start`, `__libc_start_main`,
  `start_thread`, `clone3`, Rust's `lang_start` and thread entry). They hold 100 % Total on
  every stack and say nothing about the program.
- The interpreter: in a stack that has Python frames, the native frames of CPython itself
  (the `python3.X` executable or `libpython3.X.so`): its evaluation loop, calls and
  start-up, which py-spy does not show either. Native frames of other modules (a C
  extension, libc, zlib) stay: they are work the program asked for.

Folding removes frames and keeps the sample: its time goes to the nearest remaining frame
(the Python function running the interpreter's code). A stack made only of runtime frames
keeps its leaf, so no sample disappears.
"""

from __future__ import annotations

import os
import re

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
_INTERPRETER_MODULE = re.compile(r"^(lib)?python3(\.\d+)?[dmu]*(\.so(\.[\d.]+)?)?$")


def is_startup(frame: Frame) -> bool:
    function = frame.lines[-1].function  # the outermost function at this address
    return function in STARTUP_FUNCTIONS or bool(_STARTUP_PATTERN.search(function))


def is_interpreter(frame: Frame) -> bool:
    """A native frame of CPython itself (not a Python function: those have no mapping)."""
    return frame.mapping is not None and bool(
        _INTERPRETER_MODULE.match(os.path.basename(frame.module)))


def is_python(frame: Frame) -> bool:
    """A Python function's frame (collector/frames.py stores them under the script's path,
    with no executable mapping)."""
    return frame.mapping is None and frame.module.endswith(".py")


def fold_runtime(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """`frames` (leaf first) without the runtime's; the leaf alone if nothing else is left."""
    python = any(map(is_python, frames))
    kept = tuple(f for f in frames
                 if not is_startup(f) and not (python and is_interpreter(f)))
    if not kept and frames:
        return frames[:1]
    return kept
