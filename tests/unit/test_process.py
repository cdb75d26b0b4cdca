"""rsprof.collector.process: which PIDs are profilable, read from /proc (this process and
PID 2, kthreadd, when this system has it). Nothing is started."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from rsprof.collector.errors import NotProfilable, ProcessNotFound
from rsprof.collector.process import (
    is_alive,
    target_from_name,
    target_from_pid,
    thread_ids,
    thread_name,
)

NO_SUCH_PID = 2**22 + 1  # above pid_max's maximum (4194304): never a process


def test_this_process_is_a_target() -> None:
    target = target_from_pid(os.getpid())
    assert target.pid == os.getpid()
    assert target.name == Path("/proc/self/comm").read_text().strip()
    assert target.exe == os.readlink("/proc/self/exe")
    assert "pytest" in target.cmdline


@pytest.mark.parametrize("pid", [0, -1, NO_SUCH_PID])
def test_no_such_process(pid: int) -> None:
    with pytest.raises(ProcessNotFound, match=f"no process with PID {pid}"):
        target_from_pid(pid)


def test_a_kernel_thread_is_not_profilable() -> None:
    try:
        is_kthreadd = Path("/proc/2/comm").read_text().strip() == "kthreadd"
    except OSError:
        is_kthreadd = False
    if not is_kthreadd:
        pytest.skip("no kthreadd visible here (a PID namespace)")
    with pytest.raises(NotProfilable, match="kernel thread"):
        target_from_pid(2)


def test_is_alive() -> None:
    assert is_alive(os.getpid())
    assert not is_alive(NO_SUCH_PID)
    assert not is_alive(0)


def test_threads_of_this_process() -> None:
    ready, done = threading.Event(), threading.Event()

    def run() -> None:
        ready.set()
        done.wait()

    thread = threading.Thread(target=run, name="unit-thread")
    thread.start()
    try:
        ready.wait()
        tids = thread_ids(os.getpid())
        assert tids == sorted(tids) and os.getpid() in tids
        assert thread.native_id in tids
        assert thread_name(os.getpid(), os.getpid()) == Path("/proc/self/comm").read_text().strip()
    finally:
        done.set()
        thread.join()
    assert thread_ids(NO_SUCH_PID) == []
    assert thread_name(NO_SUCH_PID, NO_SUCH_PID) is None


@pytest.mark.parametrize("pattern", ["no-process-is-named-this-3f9a2c", "\0"])
def test_a_name_matching_nothing(pattern: str) -> None:
    with pytest.raises(ProcessNotFound, match="no process whose name contains"):
        target_from_name(pattern)


def test_rsprof_never_picks_itself_by_name() -> None:
    """-P skips rsprof's own process and its parent: this very process's unique name,
    matched by nothing else, is not found."""
    own = Path("/proc/self/comm").read_text().strip()
    try:
        target = target_from_name(own)
    except ProcessNotFound:
        return  # none or several others: either way never this process
    assert target.pid != os.getpid()
