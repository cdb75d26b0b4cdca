"""collector/heapattach.py's rules on synthetic values (no process, no ptrace): which stack
pointer leaves room for the call, which libc address is an exported function's, what meta
and the progress line say of an attach (issue 22 items 1-2)."""

from __future__ import annotations

import os
from datetime import datetime

import pytest
from rsprof.collector import heapattach
from rsprof.collector.heapattach import STACK_ROOM, HeapAttach, Injected, _Layout

LIBC = 0x7F00_0000_0000


def layout(**changes: object) -> _Layout:
    values: dict[str, object] = {
        "dlopen": LIBC + 0x100, "dlerror": 0, "ldso": [], "libc_text": [(LIBC, LIBC + 0x10000)],
        "unsafe": [],
        # malloc at 0x1000-0x1100 with an alias covering part of it, free at 0x2000-0x2080
        "exported": sorted([(LIBC + 0x1000, LIBC + 0x1100), (LIBC + 0x1000, LIBC + 0x1010),
                            (LIBC + 0x2000, LIBC + 0x2080)]),
        "stacks": [(0x1000_0000, 0x1000_0000 + 2 * STACK_ROOM), (0x2000_0000, 0x2000_1000)],
        "main_stack": (0x7FFF_0000_0000, 0x7FFF_0002_0000),
    }
    values.update(changes)
    return _Layout(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("offset", "exported"), [
    (0x1000, True), (0x10FF, True), (0x1050, True),  # past the alias, inside malloc
    (0x1100, False), (0x1800, False),  # between functions: an internal one (_int_malloc)
    (0x2000, True), (0x2080, False), (0x0, False),
])
def test_an_address_in_libc_is_an_exported_functions_or_not(offset: int, exported: bool) -> None:
    assert layout().is_exported(LIBC + offset) is exported


@pytest.mark.parametrize(("sp", "room"), [
    (0x1000_0000 + STACK_ROOM, True),  # a thread's stack with STACK_ROOM below sp
    (0x1000_0000 + STACK_ROOM - 8, False),  # less than that
    (0x2000_0800, False),  # a small stack of its own (a coroutine's)
    (0x7FFF_0000_0010, True),  # the main thread's [stack] grows down as it is used
    (0x3000_0000, False),  # in no known mapping
])
def test_the_call_runs_only_with_stack_room_below_sp(sp: int, room: bool) -> None:
    assert heapattach._stack_room(layout(), sp) is room


class FakeTracee:
    """A stopped thread as _unsafe_because sees it: registers, a few bytes, an unwound stack."""

    def __init__(self, frames: list[int], *, syscall: int = -1, truncated: bool = False,
                 sp: int = 0x1000_0000 + STACK_ROOM, sigreturn_at: int = 0) -> None:
        self.frames, self.syscall, self.truncated = frames, syscall, truncated
        self.sp, self.sigreturn_at = sp, sigreturn_at

    def regs(self) -> tuple[int, int, int, int]:
        return self.frames[0], self.sp, self.syscall, 0

    def read(self, address: int, size: int) -> bytes:
        if address == self.sigreturn_at:
            return heapattach.SIGRETURN_CODE[:size]
        return b"\x0f\x05" if self.syscall >= 0 and address == self.frames[0] - 2 else b"\0" * size

    def unwind(self, _max_frames: int) -> tuple[list[int], bool]:
        return self.frames, self.truncated


PROGRAM = 0x5555_0000_1000
LDSO = 0x7E00_0000_0000
FUTEX, MMAP = 202, 9
EXPORTED, INTERNAL = LIBC + 0x2010, LIBC + 0x3000  # free's code; between functions


@pytest.mark.parametrize(("tracee", "because"), [
    (FakeTracee([PROGRAM, PROGRAM + 0x100]), None),  # in the program's own code
    # waiting in an exported libc function the program called (pthread_cond_timedwait)
    (FakeTracee([EXPORTED, EXPORTED + 1, PROGRAM], syscall=FUTEX), None),
    (FakeTracee([INTERNAL, INTERNAL + 1, PROGRAM], syscall=FUTEX),
     "inside an internal libc function"),
    (FakeTracee([EXPORTED, PROGRAM]), "running libc code"),
    (FakeTracee([EXPORTED, PROGRAM], syscall=MMAP),
     "in a system call the allocator or fork make holding their locks"),
    (FakeTracee([PROGRAM, LDSO + 0x10, PROGRAM]), "inside the dynamic loader"),
    (FakeTracee([PROGRAM, LIBC + 0x1051, PROGRAM]),
     "inside the allocator, fork, thread creation or joining, or dlopen"),
    (FakeTracee([PROGRAM, PROGRAM], truncated=True), "on a stack the unwinder could not finish"),
    (FakeTracee([PROGRAM], sp=0x2000_0800), "on a stack with too little room below it"),
    (FakeTracee([PROGRAM, INTERNAL + 1, PROGRAM], sigreturn_at=INTERNAL + 1),
     "in a signal handler"),
])
def test_why_a_stop_is_not_a_safe_point(tracee: FakeTracee, because: str | None) -> None:
    found = layout(ldso=[(LDSO, LDSO + 0x1000)], unsafe=[(LIBC + 0x1000, LIBC + 0x1100)])
    assert heapattach._unsafe_because(tracee, found) == because  # type: ignore[arg-type]


def test_every_version_of_a_libc_function_is_known() -> None:
    """glibc keeps a compatibility pthread_cond_timedwait (@GLIBC_2.2.5) before the default
    one (@@GLIBC_2.3.2) in .dynsym: both are exported functions, not only the first."""
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    if not os.path.exists(libc):
        pytest.skip("no glibc at the Debian path")
    entries = heapattach._symbols(libc, os.stat(libc).st_ino)["pthread_cond_timedwait"]
    assert len(entries) >= 2 and len(set(entries)) == len(entries), entries


def test_signed_return_values() -> None:
    assert heapattach._signed(5) == 5
    assert heapattach._signed((1 << 64) - 3) == -3  # rsprof_heap_inject_start's -3
    assert heapattach.START_ERRORS[-3].startswith("its malloc is not libc's")


def test_meta_and_state_of_an_attach() -> None:
    attach = HeapAttach(os.getpid(), lambda _message: None)
    assert attach.state is None and attach.meta() == {} and attach.since() == ""
    attach.injected = Injected(os.getpid(), 0x7F00_0000_0000, 1_795_730_645.25, 0.4567, 2, 10,
                               True)
    assert attach.state == "attached"
    meta = attach.meta()
    assert meta["heap_since"] == "attach" and meta["heap_attach_tries"] == 2
    assert meta["heap_attach_stopped_ms"] == 0.46
    assert meta["heap_attached_at"] == "2026-11-26T22:04:05.250+00:00"
    assert attach.since() == datetime.fromtimestamp(1_795_730_645.25).strftime("%H:%M:%S")
    refused = HeapAttach(os.getpid(), lambda _message: None)
    refused.refused = "it is a static binary"
    assert refused.state == "off"
    assert refused.meta() == {"heap_off_reason": "it is a static binary"}
