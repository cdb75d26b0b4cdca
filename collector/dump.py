"""Every thread's stack of a process, now (`rsprof dump PID`, as `py-spy dump`).

Sampling cannot show where a thread waits: a thread blocked in a system call takes no CPU
sample. So the threads are stopped for a moment (native/snapshot.c: ptrace, no signal
sent, none lost), their registers and stack tops copied and, for CPython, their Python
frames read while they stand still; then they run on, and the copies are unwound and
symbolized exactly as a recording's samples are (collector/frames.py FrameResolver, into a
scratch profile that is deleted afterwards), Python frames in place of the interpreter's.
"""

from __future__ import annotations

import errno
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rsprof.collector import process
from rsprof.collector.errors import PermissionDenied, ProcessNotFound
from rsprof.collector.frames import KERNEL_FUNCTION, FrameResolver
from rsprof.collector.maps import read_executable_maps
from rsprof.collector.pyframes import PythonRuntime, encode_python, find_runtime, reader_for
from rsprof.collector.pythreads import ThreadNames
from rsprof.collector.symbols import Symbolizer
from rsprof.storage.writer import ProfileWriter

from rsprof._native import KERNEL_ADDRESS, PY_MARK, PyFrameReader, StoppedProcess

# x86_64 system calls a stopped thread is most often found in (orig_rax); others by number.
SYSCALL_NAMES = {
    0: "read", 1: "write", 7: "poll", 17: "pread64", 18: "pwrite64", 19: "readv",
    20: "writev", 23: "select", 34: "pause", 35: "nanosleep", 42: "connect", 43: "accept",
    44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 128:
    "rt_sigtimedwait", 130: "rt_sigsuspend", 202: "futex", 230: "clock_nanosleep",
    232: "epoll_wait", 247: "waitid", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
    288: "accept4", 299: "recvmmsg", 441: "epoll_pwait2",
}


@dataclass(frozen=True, slots=True)
class DumpFrame:
    function: str
    file: str
    line: int
    module: str
    python: bool  # a Python function (file and line are the script's)


@dataclass(slots=True)
class ThreadStack:
    tid: int
    name: str
    syscall: str | None  # the system call it was in when stopped; None: running user code
    frames: list[DumpFrame] = field(default_factory=list)  # leaf first
    truncated: bool = False

    @property
    def state(self) -> str:
        return "running" if self.syscall is None else f"waiting in {self.syscall}"


@dataclass(slots=True)
class ProcessDump:
    pid: int
    name: str
    cmdline: str
    python: bool  # Python frames were read (a CPython rsprof reads)
    stopped_ms: float  # how long the threads were stopped
    threads: list[ThreadStack]


def dump(pid: int, *, python: bool = True, stack_bytes: int = 65536) -> ProcessDump:
    """Stops every thread of `pid` for a moment and returns their stacks."""
    target = process.target_from_pid(pid)
    runtime, reader = _python_reader(pid) if python else (None, None)
    names = {tid: process.thread_name(pid, tid) or "" for tid in process.thread_ids(pid)}
    started = time.monotonic()
    try:
        stopped = StoppedProcess(pid, stack_bytes)
    except OSError as error:
        if error.errno in (errno.EPERM, errno.EACCES):
            raise PermissionDenied(
                f"cannot stop PID {pid} to read its stacks (ptrace): permission denied; run"
                " as root or as its user with kernel.yama.ptrace_scope <= 1 (another tracer,"
                " a debugger or strace, also refuses it)") from error
        if error.errno == errno.ESRCH:
            raise ProcessNotFound(f"PID {pid} exited while rsprof was stopping it") from error
        raise
    with stopped:
        tids = stopped.threads()
        # The Python frames while the threads stand still: exact, never late.
        walked = {tid: reader.walk(tid) for tid in tids} if reader is not None else {}
        if reader is not None and runtime is not None and runtime.layout is not None:
            names.update(ThreadNames(reader, runtime.version, runtime.layout, runtime.runtime,
                                     runtime.dict_type, runtime.long_type).poll())
    stopped_ms = (time.monotonic() - started) * 1000
    threads = []
    chains: list[tuple[int, list[int]]] = []
    for tid in tids:
        addresses, truncated, syscall = stopped.stack(tid)
        in_syscall = syscall >= 0
        # A thread in a system call: its pc follows the syscall instruction, which the
        # resolver looks up at the call only under a [kernel] frame (dropped below).
        ips = ([KERNEL_ADDRESS] if in_syscall else []) + list(addresses)
        frames = walked.get(tid)
        if frames:
            ips += [PY_MARK, *encode_python(frames)]
        chains.append((tid, ips))
        name = names.get(tid) or process.thread_name(pid, tid) or ""
        threads.append(ThreadStack(tid, name, SYSCALL_NAMES.get(syscall, f"syscall {syscall}")
                                   if in_syscall else None, truncated=truncated))
    _symbolize(pid, reader, chains, threads)
    return ProcessDump(pid, target.name, target.cmdline, reader is not None, stopped_ms,
                       threads)


def _python_reader(pid: int) -> tuple[PythonRuntime | None, PyFrameReader | None]:
    """The process's CPython and a frame reader for it, when it runs one rsprof reads."""
    try:
        runtime = find_runtime(pid)
    except OSError:
        return None, None
    if runtime is None or runtime.layout is None:
        return runtime, None
    return runtime, reader_for(pid, runtime)


def _symbolize(pid: int, reader: PyFrameReader | None, chains: list[tuple[int, list[int]]],
               threads: list[ThreadStack]) -> None:
    """Names the frames as a recording does: the same resolver, into a scratch profile."""
    with tempfile.TemporaryDirectory(prefix="rsprof-dump-") as scratch:
        writer = ProfileWriter(Path(scratch) / "dump.db")
        try:
            resolver = FrameResolver(pid, writer, Symbolizer())
            resolver.python = reader
            for mapping in read_executable_maps(pid):
                resolver.add_mapping(mapping)
            stored = resolver.resolve_stacks(chains, python_read_late=False)
            for thread, (tid, _) in zip(threads, chains):
                for frame_id in resolver.ids.stack_frames[stored[tid]]:
                    path, locations = resolver.frame_info.get(frame_id, ("", ()))
                    if not locations or locations[0].function == KERNEL_FUNCTION:
                        continue
                    python = resolver.is_python_frame(frame_id)
                    for location in locations:  # inlined calls first, as recordings show
                        thread.frames.append(DumpFrame(location.function, location.file,
                                                       location.line, path, python))
        finally:
            writer.abandon()
