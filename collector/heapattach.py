"""Heap tracking of a process started without the shim (`rsprof -p PID`).

rsprof loads the heap shim into the running process with ptrace, as memray and heaptrack
do with gdb, but with no debugger: one thread is stopped (PTRACE_SEIZE + PTRACE_INTERRUPT,
the others keep running) at a point where it holds neither the allocator's locks nor the
dynamic loader's, made to call `dlopen(librsprof_heap_inject.so)` and then the shim's
`rsprof_heap_inject_start`, which creates the ring the recorder reads (as under
LD_PRELOAD) and redirects every loaded module's GOT entries for malloc & co. to the
shim's wrappers; every register is put back and the thread let go. When the recording
ends, `rsprof_heap_inject_stop` is called the same way: the GOT entries go back, the ring
is removed, the wrappers stay pass-through. See docs/heap-ring.md, "Injected mode".
"""

from __future__ import annotations

import bisect
import json
import math
import os
import platform
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from rsprof._native import Tracee, cfi_functions

# Beside the installed package, not resolved: a strict editable install links each module to
# its source file (resolve() led to the source tree, which has no lib/, and heap attach was
# off as "missing").
SHIM_INJECT_PATH = Path(__file__).parent.parent / "lib" / "librsprof_heap_inject.so"
PRELOAD_NAME = "librsprof_heap.so"
INJECT_NAME = "librsprof_heap_inject.so"

RTLD_NOW = 0x2
RTLD_NODELETE = 0x1000
SIGSEGV_BIT = 1 << (11 - 1)
# Ring size of an attached process: as under `rsprof run` (its pages are allocated only as
# it fills).
RING_BYTES = 64 << 20

# Functions of libc during which a thread may hold a lock that dlopen or the shim's start
# would take: the allocator's arenas (everything between the first and the last of
# malloc.c's exported functions: its static helpers lie between them), fork (holds every
# arena), thread creation and joining (the stack cache lock, which loading a library with
# static TLS takes), and the loader's entry points in libc.
MALLOC_FAMILY = (
    "malloc", "free", "calloc", "realloc", "memalign", "aligned_alloc", "posix_memalign",
    "valloc", "pvalloc", "malloc_usable_size", "malloc_trim", "mallopt", "mallinfo",
    "mallinfo2", "malloc_stats", "malloc_info",
)
LOCKING_FUNCTIONS = (
    "fork", "_Fork", "pthread_create", "pthread_join", "pthread_timedjoin_np",
    "pthread_clockjoin_np", "pthread_tryjoin_np", "pthread_detach", "pthread_exit",
    "dl_iterate_phdr", "dlopen", "dlmopen", "dlclose", "dlsym", "dlvsym", "dladdr", "dladdr1",
    "dlinfo", "__libc_dlopen_mode", "__libc_dlsym", "__libc_dlclose",
)
# System calls during which the allocator or fork hold their locks (sysmalloc, trimming,
# fork's clone): a thread stopped in one is not at a safe point.
LOCKING_SYSCALLS = frozenset({9, 10, 11, 12, 25, 28, 56, 57, 435})  # mmap ... clone3
# System calls that a ptrace stop ends with EINTR instead of restarting them (signal(7),
# "Interruption of system calls by stop signals"): a thread in one is not chosen.
EINTR_SYSCALLS = frozenset({232, 281, 441, 128, 65, 220, 208, 333, 69, 70})
MAX_FRAMES = 256
# glibc's __restore_rt (the return address of every signal handler): mov $15, %rax; syscall.
SIGRETURN_CODE = b"\x48\xc7\xc0\x0f\x00\x00\x00\x0f\x05"
TRIES_PER_THREAD = 25
# Stack the call needs below the thread's stack pointer: dlopen and the shim's start use a
# few KiB; a thread on a small stack of its own (a coroutine's) is never made to run them.
STACK_ROOM = 64 * 1024
RETRY_PAUSE_S = 0.002

# rsprof_heap_inject_start's errors (native/shim/heapshim.c, injected mode).
START_ERRORS = {
    -1: "the library loaded is not the injectable heap shim",
    -2: "its libc's allocator functions were not found",
    -3: "its malloc is not libc's (the executable or a preloaded library defines its own)",
    -4: "another rsprof is tracking its heap",
    -5: "the shim could not create its ring in /dev/shm",
}


class HeapAttachRefused(Exception):
    """Heap tracking cannot start in this process: the message says why (one line)."""


@dataclass(slots=True)
class Injected:
    """The shim in a process, started by us."""

    pid: int
    shim_base: int
    attached_at: float  # time.time() when recording began
    stopped_ms: float  # the injecting thread was stopped this long
    tries: int  # interrupts until a safe point
    patched: int  # GOT entries redirected
    loaded: bool  # the shim was loaded now (not by an earlier attach)


@dataclass(slots=True)
class _Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str


def _maps(pid: int) -> list[_Mapping]:
    out = []
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 5:
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].rstrip("\n") if len(parts) > 5 else ""
            out.append(_Mapping(start, end, parts[1], int(parts[2], 16), path))
    return out


def _base_of(maps: list[_Mapping], path: str) -> int:
    """Load address of an ELF shared object mapped from `path` (its offset-0 mapping)."""
    return min(m.start - m.offset for m in maps if m.path == path)


STT_FUNC, SHN_UNDEF, PT_INTERP = 2, 0, 3


@cache
def _symbols(path: str, inode: int) -> dict[str, list[tuple[int, int]]]:
    """Defined functions (STT_FUNC: an IFUNC's value is its resolver, not the code that
    runs) of an ELF file's .dynsym: name -> [(value, size)], every entry of a name in table
    order. A name has one entry per symbol version, at different code when a compatibility
    version is kept: glibc 2.36 has 217 such names, pthread_cond_wait@GLIBC_2.2.5 before
    the pthread_cond_wait@@GLIBC_2.3.2 every program calls. With the first entry alone, a
    thread waiting in pthread_cond_wait was "inside an internal libc function", never at a
    safe point, and `rsprof -p` of `xz -T2` (its workers block every signal, its main
    thread waits on a condition variable) refused heap tracking.
    Read with rsprof's own ELF reader (collector/symbols/elf.py), not pyelftools, which is
    not a dependency of rsprof: in a plain install the helper failed to import it and heap
    attach was off for every process. The same tables as pyelftools' for libc, libstdc++,
    the shim and sqlite3, in 0.033 s instead of 0.112 s for libc, 0.011 s instead of
    0.213 s for libstdc++."""
    from rsprof.collector.symbols.elf import ElfError, ElfFile

    out: dict[str, list[tuple[int, int]]] = {}
    try:
        elf = ElfFile(path)
    except ElfError as error:
        raise ValueError(str(error)) from None
    for sym in elf.symbols(dynamic_only=True):
        if sym.shndx != SHN_UNDEF and sym.type == STT_FUNC:
            out.setdefault(sym.name, []).append((sym.value, sym.size))
    return out


def _file_symbols(pid: int, path: str) -> dict[str, list[tuple[int, int]]]:
    """The symbols of a file the process maps, read through its root (a container's)."""
    inside = f"/proc/{pid}/root{path}"
    try:
        st = os.stat(inside)
        return _symbols(inside, st.st_ino)
    except (OSError, ValueError) as error:
        raise HeapAttachRefused(f"cannot read {path} of the process ({error})") from None


def _is_static(pid: int) -> bool:
    """No program interpreter: a statically linked executable."""
    from rsprof.collector.symbols.elf import ElfError, ElfFile

    try:
        return not any(seg.type == PT_INTERP for seg in ElfFile(f"/proc/{pid}/exe").segments)
    except (OSError, ElfError):
        return False


def _tracer_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


@dataclass(slots=True)
class _Layout:
    """Where things are in the target: what makes a stop unsafe, and what to call."""

    dlopen: int
    dlerror: int
    ldso: list[tuple[int, int]]
    libc_text: list[tuple[int, int]]
    unsafe: list[tuple[int, int]]  # libc functions that may hold a lock dlopen takes
    # libc's exported functions, sorted (start, end): an address in libc outside all of
    # them is in an internal function (the allocator's _int_malloc, _int_free ...).
    exported: list[tuple[int, int]]
    # Writable anonymous mappings (thread stacks among them) and the main thread's [stack],
    # which grows down as the thread uses it.
    stacks: list[tuple[int, int]]
    main_stack: tuple[int, int]

    def is_exported(self, address: int) -> bool:
        i = bisect.bisect_right(self.exported, (address, 1 << 64)) - 1
        # Symbols overlap (aliases): look back a little for one that covers the address.
        return any(lo <= address < hi for lo, hi in self.exported[max(0, i - 4):i + 1])


def _layout(pid: int, maps: list[_Mapping]) -> _Layout:
    libc = next((m.path for m in maps if _is_libc(m.path)), None)
    if libc is None:
        if any("musl" in Path(m.path).name for m in maps):
            raise HeapAttachRefused("it uses musl libc: the injected heap shim needs glibc")
        if _is_static(pid):
            raise HeapAttachRefused(
                "it is a static binary: there is no dynamic loader to load the heap shim into it")
        raise HeapAttachRefused("it has no glibc (libc.so.6) to load the heap shim with")
    _check_own_malloc(pid)
    syms = _file_symbols(pid, libc)
    base = _base_of(maps, libc)
    # dlopen@@GLIBC_2.34 and its compatibility versions are the same code
    dlopens = syms.get("dlopen") or syms.get("__libc_dlopen_mode")
    if not dlopens:
        raise HeapAttachRefused("its libc has no dlopen (glibc older than 2.34)")
    dlopen = dlopens[0]
    dlerror = syms.get("dlerror", [(0, 0)])[0]
    family = [entry for name in MALLOC_FAMILY for entry in syms.get(name, ())]
    if not family:
        raise HeapAttachRefused("its libc exports no malloc")
    unsafe = [(base + min(v for v, _ in family), base + max(v + s for v, s in family))]
    # every version of each: a compatibility pthread_join is a join too
    unsafe += [(base + v, base + v + max(s, 1))
               for name in LOCKING_FUNCTIONS for v, s in syms.get(name, ())]
    ldso = [(m.start, m.end) for m in maps
            if Path(m.path).name.startswith("ld-linux") and "x" in m.perms]
    libc_text = [(m.start, m.end) for m in maps if m.path == libc and "x" in m.perms]
    exported = sorted({(base + v, base + v + s)
                       for entries in syms.values() for v, s in entries if s > 0})
    # The unwinder's tables of the modules a stack may run through are built now, not while
    # the thread is stopped (cached per file).
    for path in {m.path for m in maps if "x" in m.perms and m.path.startswith("/")}:
        try:
            cfi_functions(f"/proc/{pid}/root{path}")
        except OSError:
            pass
    stacks = [(m.start, m.end) for m in maps if "w" in m.perms]
    main_stack = next(((m.start, m.end) for m in maps if m.path == "[stack]"), (0, 0))
    return _Layout(base + dlopen[0], base + dlerror[0] if dlerror[0] else 0, ldso, libc_text,
                   unsafe, exported, stacks, main_stack)


def _check_own_malloc(pid: int) -> None:
    """Refuses, before anything is loaded into it, a process whose executable defines
    malloc & co. (it precedes libc in every module's lookup: the shim, which forwards to
    libc's, would see none of its calls). The shim checks again, for libraries preloaded
    with an allocator of their own."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return
    defined = _file_symbols(pid, exe) if exe.startswith("/") else {}
    if any(name in defined for name in ("malloc", "free", "calloc", "realloc")):
        raise HeapAttachRefused(START_ERRORS[-3])


def _is_libc(path: str) -> bool:
    name = Path(path).name
    return name == "libc.so.6" or (name.startswith("libc-") and name.endswith(".so"))


def _inside(ranges: list[tuple[int, int]], value: int) -> bool:
    return any(lo <= value < hi for lo, hi in ranges)


def _unsafe_because(tracee: Tracee, layout: _Layout) -> str | None:
    """Why the stopped thread may not call dlopen now, or None when it may. Its stack,
    unwound by CFI as the CPU sampler does, must show no frame in the loader and none in a
    libc function that may hold a lock dlopen takes (the allocator's, fork's, the loader's,
    the thread stack cache's); the pc must not be libc code outside a system call (it may
    be the allocator's internals, an arena locked), nor a system call the allocator or fork
    make under their locks; between the pc and the program's first frame no internal libc
    function may stand (the allocator's _int_free is reached by a tail call from free, so
    free's own frame is not there); and no signal handler may be running (what it
    interrupted may hold any lock). A stack the unwinder cannot finish is not safe. The
    reason is said when no stop was safe (it once always said "the allocator or the dynamic
    loader", also of a thread waiting on a condition variable)."""
    pc, sp, orig_rax, _rax = tracee.regs()
    if not _stack_room(layout, sp):
        return "on a stack with too little room below it"
    in_syscall = orig_rax >= 0 and tracee.read(pc - 2, 2) == b"\x0f\x05"
    if in_syscall and orig_rax in LOCKING_SYSCALLS:
        return "in a system call the allocator or fork make holding their locks"
    if not in_syscall and _inside(layout.libc_text, pc):
        return "running libc code"
    frames, truncated = tracee.unwind(MAX_FRAMES)
    if truncated or not frames:
        return "on a stack the unwinder could not finish"
    program_seen = False
    for i, frame in enumerate(frames):
        address = frame if i == 0 else frame - 1  # a return address is after its call
        if _inside(layout.ldso, address):
            return "inside the dynamic loader"
        if _inside(layout.unsafe, address):
            return "inside the allocator, fork, thread creation or joining, or dlopen"
        if not _inside(layout.libc_text, address):
            program_seen = True
        elif i > 0 and not layout.is_exported(address):
            if not program_seen:
                return "inside an internal libc function"
            if tracee.read(frame, len(SIGRETURN_CODE)) == SIGRETURN_CODE:
                return "in a signal handler"
    return None


def _stack_room(layout: _Layout, sp: int) -> bool:
    """STACK_ROOM below sp in the mapping that holds it (the main thread's [stack] grows)."""
    lo, hi = layout.main_stack
    if lo <= sp < hi:
        return True
    return any(lo <= sp < hi and sp - lo >= STACK_ROOM for lo, hi in layout.stacks)


def _thread_candidates(pid: int) -> tuple[list[int], int]:
    """The process's threads, those a stop could disturb left out: SIGSEGV blocked or
    ignored (the call's return traps on it, and the kernel would reset such a disposition),
    or asleep in a system call that a stop ends with EINTR; and how many were left out."""
    out = []
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError as error:
        raise ProcessLookupError(error.errno, f"PID {pid}: {error.strerror}") from None
    for tid in tids:
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if (int(fields["SigBlk"], 16) | int(fields["SigIgn"], 16)) & SIGSEGV_BIT:
                continue
            syscall = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()
        except (OSError, KeyError, ValueError):
            continue
        if syscall and syscall[0].lstrip("-").isdigit() and int(syscall[0]) in EINTR_SYSCALLS:
            continue
        out.append(tid)
    # The main thread last: its stack may end just below its stack pointer (a thread's is
    # mapped whole), where the call's frame is written.
    if pid in out and len(out) > 1:
        out.remove(pid)
        out.append(pid)
    return out, len(tids) - len(out)


def _gone(pid: int) -> bool:
    """The process has exited, or is exiting (a zombie, or its threads leaving): ptrace
    then answers EPERM, which says nothing of permissions."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZXx"


def _seize(pid: int, tid: int) -> Tracee:
    try:
        return Tracee(tid)
    except PermissionError as error:
        if _gone(pid):
            raise ProcessLookupError(3, f"PID {pid} exited") from None
        tracer = _tracer_of(pid)
        if tracer:
            raise HeapAttachRefused(
                f"ptrace refused: it is traced by PID {tracer} ({_process_name(tracer)})"
            ) from None
        raise HeapAttachRefused(f"ptrace refused ({error.strerror}): see"
                                " /proc/sys/kernel/yama/ptrace_scope, CAP_SYS_PTRACE and a"
                                " seccomp profile (containers)") from None


def _stopped_at_safe_point(pid: int, layout: _Layout) -> tuple[Tracee, int]:
    """A thread stopped at a safe point, and how many stops it took."""
    tries = 0
    candidates, left_out = _thread_candidates(pid)
    if not candidates:
        raise HeapAttachRefused("none of its threads can be stopped safely (SIGSEGV blocked"
                                " or ignored, or asleep in a call a stop would interrupt)")
    seen: Counter[str] = Counter()
    for tid in candidates:
        try:
            tracee = _seize(pid, tid)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        try:
            for _ in range(TRIES_PER_THREAD):
                tracee.interrupt()
                tries += 1
                because = _unsafe_because(tracee, layout)
                if because is None:
                    return tracee, tries
                seen[because] += 1
                tracee.resume()
                time.sleep(RETRY_PAUSE_S)
        except ProcessLookupError:
            continue
        except BaseException:
            tracee.detach()
            raise
        tracee.detach()
    said = "; ".join(f"{reason} ({count})" for reason, count in seen.most_common(2))
    others = (f"; {left_out} more not tried: SIGSEGV blocked or ignored, or asleep in a call"
              " a stop would interrupt" if left_out > 0 else "")
    raise HeapAttachRefused(
        f"no thread reached a safe point in {tries} tries ({said or 'none stopped'}{others})")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


@cache
def _shim_offsets() -> tuple[int, int]:
    syms = _symbols(str(SHIM_INJECT_PATH), os.stat(SHIM_INJECT_PATH).st_ino)
    return syms["rsprof_heap_inject_start"][0][0], syms["rsprof_heap_inject_stop"][0][0]


def _check_target(pid: int) -> list[_Mapping]:
    if platform.machine() != "x86_64":
        raise HeapAttachRefused(f"loading the heap shim into a running process needs x86_64"
                                f" (this is {platform.machine()})")
    if not SHIM_INJECT_PATH.exists():
        raise HeapAttachRefused(f"the injectable heap shim is missing ({SHIM_INJECT_PATH});"
                                " reinstall rsprof")
    if _gone(pid):
        raise ProcessLookupError(3, f"PID {pid} exited")
    try:
        return _maps(pid)
    except FileNotFoundError:
        raise ProcessLookupError(3, f"PID {pid} is gone") from None
    except PermissionError as error:
        raise HeapAttachRefused(f"cannot read its memory map ({error.strerror})") from None


def preloaded(pid: int) -> bool:
    """The process already has the LD_PRELOAD shim: its ring is read as it is."""
    try:
        return any(Path(m.path).name == PRELOAD_NAME for m in _maps(pid))
    except OSError:
        return False


def inject(pid: int, session_pid: int, ring_bytes: int = RING_BYTES) -> Injected:
    """Loads and starts the heap shim in `pid`, whose ring names `session_pid` (this
    rsprof) as its reader. Raises HeapAttachRefused (one line: why) when it cannot,
    ProcessLookupError when the process is gone."""
    maps = _check_target(pid)
    shim_path = str(SHIM_INJECT_PATH)
    loaded = next((m.path for m in maps if Path(m.path).name == INJECT_NAME), None)
    layout = _layout(pid, maps)
    start_off, _ = _shim_offsets()
    tracee, tries = _stopped_at_safe_point(pid, layout)
    try:
        if loaded is None:
            handle = tracee.call(layout.dlopen, [RTLD_NOW | RTLD_NODELETE],
                                 data=shim_path.encode() + b"\0")
            if handle == 0:
                why = _dlerror(tracee, layout)
                raise HeapAttachRefused(f"it could not load the heap shim: {why}")
            # The handle is the shim's link_map: its first field is the load address.
            base = struct.unpack("<Q", tracee.read(handle, 8))[0]
        else:
            base = _base_of(maps, loaded)
        result = _signed(tracee.call(base + start_off, [session_pid, ring_bytes, 0,
                                                        int(bool(os.environ.get(
                                                            "RSPROF_HEAP_DEBUG")))]))
        stopped_ms = tracee.stopped_ns / 1e6
    finally:
        tracee.detach()
    if result < 0:
        raise HeapAttachRefused(START_ERRORS.get(result, f"the heap shim failed ({result})"))
    injected = Injected(pid, base, time.time(), stopped_ms, tries, result, loaded is None)
    if result == 0:
        stop(injected)
        raise HeapAttachRefused("no module of it calls libc's malloc through its GOT (a static"
                                " or custom allocator)")
    return injected


def _dlerror(tracee: Tracee, layout: _Layout) -> str:
    if not layout.dlerror:
        return "dlopen failed"
    text = tracee.call(layout.dlerror, [])
    if text == 0:
        return "dlopen failed"
    raw = tracee.read(text, 512).split(b"\0", 1)[0]
    return raw.decode(errors="replace") or "dlopen failed"


def stop(injected: Injected) -> int:
    """Stops heap tracking in the process: GOT entries back, ring removed. Returns the
    entries put back. Raises like inject() (the shim also stops by itself once this rsprof
    has exited)."""
    if _gone(injected.pid):
        raise ProcessLookupError(3, f"PID {injected.pid} exited")
    maps = _check_target(injected.pid)
    layout = _layout(injected.pid, maps)
    _, stop_off = _shim_offsets()
    tracee, _tries = _stopped_at_safe_point(injected.pid, layout)
    try:
        return _signed(tracee.call(injected.shim_base + stop_off, []))
    finally:
        tracee.detach()


class HeapAttach:
    """Loads the shim into the recorded process once CPU sampling has started, so that
    the CPU recording never waits for it (finding libc's symbols and a safe point takes a
    fraction of a second); the recorder finds the shim's ring by its usual scan of
    /dev/shm. `finish()`, after the recorder's last read of the ring, waits for the
    injection and stops the shim.

    The ptrace work runs in a helper process of its own (`python -m
    rsprof.collector.heapattach`, in a session of its own, deaf to SIGINT, SIGTERM and
    SIGHUP): while a call runs, the target's thread executes on a frame whose return
    address traps, and only its tracer can put the thread back. Killed mid-call (rsprof
    killed with -9), an in-process tracer would leave the thread to return to address 0
    and the target to die of SIGSEGV; the helper finishes its few milliseconds and exits,
    and the shim, seeing its rsprof gone, stops by itself."""

    def __init__(self, pid: int, warn: Callable[[str], None]) -> None:
        self.pid = pid
        self._warn = warn
        self.injected: Injected | None = None
        self.refused: str | None = None
        self._thread: threading.Thread | None = None
        # The helper that injected, waiting on its stdin to stop the shim at the end (one
        # Python start-up and one read of the process's layout less per recording).
        self._helper: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if preloaded(self.pid):
            return  # its own ring is read as it is
        self._thread = threading.Thread(target=self._inject, name="rsprof-heap-attach",
                                        daemon=True)
        self._thread.start()

    @property
    def state(self) -> str | None:
        """"attaching" (the helper runs), "attached", "off" (refused), or None (not
        started, the process has the preloaded shim, or it exited meanwhile)."""
        if self.injected is not None:
            return "attached"
        if self.refused is not None:
            return "off"
        if self._thread is not None and self._thread.is_alive():
            return "attaching"
        return None

    def since(self) -> str:
        """The local time heap tracking began, HH:MM:SS ("" before)."""
        if self.injected is None:
            return ""
        return datetime.fromtimestamp(self.injected.attached_at).strftime("%H:%M:%S")

    def _inject(self) -> None:
        helper = _spawn("inject", str(self.pid), str(os.getpid()))
        if isinstance(helper, dict):
            answer = helper
        else:
            answer = _answer(helper)
            if "injected" in answer:
                self._helper = helper  # asked to stop the shim by finish()
            elif helper not in _abandoned:
                _let_go(helper)
        if "injected" in answer:
            self.injected = Injected(**answer["injected"])
        elif "refused" in answer:
            self.refused = str(answer["refused"])
            self._warn(f"heap tracking off: {self.refused}; CPU profiling goes on")

    def meta(self) -> dict[str, object]:
        """What meta says of it so far (docs/schema.md heap_since ...)."""
        if self.injected is not None:
            when = datetime.fromtimestamp(self.injected.attached_at, UTC)
            return {"heap_since": "attach",
                    "heap_attached_at": when.isoformat(timespec="milliseconds"),
                    "heap_attach_stopped_ms": round(self.injected.stopped_ms, 2),
                    "heap_attach_tries": self.injected.tries}
        if self.refused is not None:
            return {"heap_off_reason": self.refused}
        return {}

    def finish(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self.injected is None:
            return
        helper, self._helper = self._helper, None
        answer: dict[str, Any] | None = None
        if helper is not None:
            try:
                assert helper.stdin is not None
                helper.stdin.write(b"stop\n")
                helper.stdin.flush()
            except OSError:  # it has gone: a helper of its own, as before
                _let_go(helper)
            else:
                answer = _answer(helper)
                _let_go(helper)
        if answer is None:
            answer = _helper("stop", str(self.pid), str(self.injected.shim_base))
        if "refused" in answer:
            self._warn(f"could not stop heap tracking in PID {self.pid} ({answer['refused']}):"
                       " its shim stops by itself once rsprof has exited")


HELPER_TIMEOUT_S = 60.0


def _spawn(*args: str) -> subprocess.Popen[bytes] | dict[str, Any]:
    """Starts this module as the ptrace helper (in a session of its own: see HeapAttach);
    a refusal when it cannot be started."""
    try:
        return subprocess.Popen(
            [sys.executable, "-P", "-m", "rsprof.collector.heapattach", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
    except OSError as error:
        return {"refused": f"the ptrace helper failed ({error})"}


def _answer(helper: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The helper's next line of JSON as a dict ({} when the process is gone). A helper
    that has not answered in HELPER_TIMEOUT_S is left to finish, never killed: killed in
    the middle of a call, it would leave the target's thread returning to address 0, and
    the target would die of SIGSEGV. (Seen on the shared 2-core machine at load average
    26-42: an inject helper still running after 60 s.) Once it has loaded the shim for an
    rsprof that stopped waiting, the shim stops by itself when that rsprof has exited."""
    assert helper.stdout is not None
    fd = helper.stdout.fileno()
    # poll, not select: rsprof holds a perf event fd per thread of the target, so this
    # pipe's fd is above 1024 (FD_SETSIZE) once the target has a few hundred threads
    # (select raised "filedescriptor out of range" with 300: a traceback, no heap).
    waiter = select.poll()
    waiter.register(fd, select.POLLIN)
    deadline = time.monotonic() + HELPER_TIMEOUT_S
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not waiter.poll(math.ceil(left * 1000)):
            _abandoned.append(helper)  # reaped if it ends before rsprof does; never killed
            return {"refused": f"the ptrace helper did not answer in {HELPER_TIMEOUT_S:g} s"
                               " (left to finish its calls)"}
        try:
            chunk = os.read(fd, 4096)
        except OSError as error:  # one line, never a traceback; left to finish, as above
            _abandoned.append(helper)
            return {"refused": f"the ptrace helper's answer was not read ({error})"}
        if not chunk:
            break  # it exited without a line
        line += chunk
    try:
        answer = json.loads(line.decode(errors="replace").strip().splitlines()[-1])
    except (IndexError, ValueError):
        _let_go(helper)
        assert helper.stderr is not None
        said = helper.stderr.read().decode(errors="replace").strip().splitlines()
        why = said[-1] if said else f"status {helper.returncode}"
        return {"refused": f"the ptrace helper failed ({why})"}
    return answer if isinstance(answer, dict) else {}


def _let_go(helper: subprocess.Popen[bytes]) -> None:
    """Tells a helper that answered that nothing more is asked (EOF on its stdin) and
    reaps it; one that does not end in HELPER_TIMEOUT_S is left to finish (see _answer)."""
    if helper.stdin is not None and not helper.stdin.closed:
        try:
            helper.stdin.close()
        except OSError:
            pass
    try:
        helper.wait(HELPER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _abandoned.append(helper)


def _helper(*args: str) -> dict[str, Any]:
    """Runs this module as the ptrace helper for one command; its answer (_answer)."""
    helper = _spawn(*args)
    if isinstance(helper, dict):
        return helper
    answer = _answer(helper)
    if helper not in _abandoned:
        _let_go(helper)
    return answer


# Helpers that did not answer in time: kept referenced (a Popen collected while its process
# runs only warns), never killed (see _helper).
_abandoned: list[subprocess.Popen[bytes]] = []


def _serve(argv: list[str]) -> dict[str, Any]:
    command, pid = argv[0], int(argv[1])
    try:
        if command == "inject":
            return {"injected": asdict(inject(pid, int(argv[2])))}
        base = int(argv[2])
        return {"restored": stop(Injected(pid, base, 0.0, 0.0, 0, 0, False))}
    except HeapAttachRefused as error:
        return {"refused": str(error)}
    except ProcessLookupError:
        return {}
    except OSError as error:
        return {"refused": f"ptrace failed ({error})"}


def main(argv: list[str]) -> int:
    """`python -m rsprof.collector.heapattach inject PID SESSION_PID | stop PID SHIM_BASE`:
    one line of JSON on stdout (see HeapAttach)."""
    # Ctrl-C in the terminal, rsprof's own stop signals: the helper finishes first.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    if len(argv) != 3 or argv[0] not in ("inject", "stop"):
        print(json.dumps({"refused": "usage: inject PID SESSION_PID | stop PID SHIM_BASE"}))
        return 2
    answer = _serve(argv)
    print(json.dumps(answer), flush=True)
    if argv[0] == "inject" and "injected" in answer:
        # rsprof asks for the stop when its recording ends; EOF (it has exited, killed
        # maybe): nothing more, the shim stops by itself once its rsprof is gone.
        try:
            asked = sys.stdin.readline().strip()
        except (OSError, ValueError):
            asked = ""
        if asked == "stop":
            base = str(answer["injected"]["shim_base"])
            print(json.dumps(_serve(["stop", argv[1], base])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
