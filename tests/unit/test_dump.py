"""rsprof.collector.dump: `rsprof dump`'s rules without stopping a process: thread states,
how each error of the stop is said, and how the copied stacks are named (the recording's
resolver, kernel frame dropped, inlined calls and Python frames shown) on a made-up address
space. tests/test_dump.py dumps real processes."""

from __future__ import annotations

import errno
from typing import Any

import pytest
from rsprof.collector import dump as dump_module
from rsprof.collector.dump import SYSCALL_NAMES, ThreadStack, _symbolize, dump
from rsprof.collector.errors import PermissionDenied, ProcessNotFound
from rsprof.collector.maps import Mapping
from rsprof.collector.process import Target
from rsprof.collector.pyframes import encode_python

from rsprof._native import KERNEL_ADDRESS, PY_MARK
from unit.synthetic import FakeModule, FakeSymbolizer

BASE = 0x400000
FUNCTIONS = [(0x1000, 0x1100, [("inlined", "a.h", 2), ("wait", "w.c", 3)]),
             (0x2000, 0x2100, [("_PyEval_EvalFrameDefault", "ceval.c", 1)]),
             (0x3000, 0x3100, [("main", "m.c", 9)])]


@pytest.mark.parametrize(("syscall", "state"), [
    (None, "running"), ("futex", "waiting in futex"), ("syscall 999", "waiting in syscall 999"),
])
def test_thread_state(syscall: str | None, state: str) -> None:
    assert ThreadStack(1, "t", syscall).state == state


def test_syscall_names() -> None:
    assert (SYSCALL_NAMES[0], SYSCALL_NAMES[202], SYSCALL_NAMES[232]) == ("read", "futex",
                                                                         "epoll_wait")


class FakePython:
    def functions(self, start: int) -> list[tuple[int, str, str, int]]:
        return [(1, "handler", "/app.py", 5)] if start <= 1 else []


def test_stacks_are_named_as_a_recording_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    code = bytearray(0x4000)
    code[0x1003:0x1005] = b"\x0f\x05"  # syscall, ending where thread 11 stands
    module = FakeModule(FUNCTIONS, code=bytes(code))
    monkeypatch.setattr(dump_module, "Symbolizer", lambda: FakeSymbolizer({"/bin/app": module}))
    monkeypatch.setattr(dump_module, "read_executable_maps",
                        lambda pid: [Mapping(BASE, BASE + 0x10000, 0, "/bin/app")])
    threads = [ThreadStack(11, "main", "futex"), ThreadStack(12, "py", None)]
    chains = [
        (11, [KERNEL_ADDRESS, BASE + 0x1005, BASE + 0x3005]),
        (12, [BASE + 0x2005, BASE + 0x3005, PY_MARK, *encode_python([(1, 7, True)])]),
    ]
    _symbolize(0, FakePython(), chains, threads)  # type: ignore[arg-type]
    assert [(f.function, f.file, f.line, f.module, f.python) for f in threads[0].frames] == [
        ("inlined", "a.h", 2, "/bin/app", False), ("wait", "w.c", 3, "/bin/app", False),
        ("main", "m.c", 9, "/bin/app", False)]
    assert [(f.function, f.line, f.python) for f in threads[1].frames] == [
        ("handler", 7, True), ("main", 9, False)]
    # a thread in a system call: its pc follows the syscall, looked up at the call
    assert 0x1004 in module.lookups and 0x1005 not in module.lookups


@pytest.mark.parametrize(("error", "raised", "said"), [
    (errno.EPERM, PermissionDenied, "permission denied"),
    (errno.EACCES, PermissionDenied, "ptrace_scope"),
    (errno.ESRCH, ProcessNotFound, "exited while rsprof was stopping it"),
    (errno.EIO, OSError, "refused"),
])
def test_errors_of_the_stop(monkeypatch: pytest.MonkeyPatch, error: int,
                            raised: type[Exception], said: str) -> None:
    def stop(pid: int, stack_bytes: int) -> Any:
        raise OSError(error, "refused")

    monkeypatch.setattr(dump_module.process, "target_from_pid",
                        lambda pid: Target(pid, "app", "/bin/app", "app"))
    monkeypatch.setattr(dump_module, "StoppedProcess", stop)
    with pytest.raises(raised, match=said):
        dump(4242, python=False)
