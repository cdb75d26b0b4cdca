"""Types of rsprof._native, the C core (native/*.c). The one boundary between Python and C.

Results cross it as struct sequences (read-only named tuples) or plain tuples whose shape is
spelled out here; docs/native.md says what each field means.
"""

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self, final

from typing_extensions import Buffer

# A call stack as the C side announces it, leaf first (native/stackwords.h): not only return
# addresses but marker words too. First native addresses: a CPU sample's ip or an
# allocation's caller, then return addresses (resolved at address - 1); a CPU sample taken
# in kernel mode has KERNEL_ADDRESS on top, and one whose CFI walk stopped early ends with
# TRUNCATED_ADDRESS. Then, when Python frames were read, the word PY_MARK and one word per
# Python frame, innermost first: the reader's function id in PY_FRAME_FUNCTION_BITS bits at
# PY_FRAME_FUNCTION_SHIFT, the entry flag at bit PY_FRAME_ENTRY_BIT, the line (signed) in
# the low PY_FRAME_LINE_BITS bits (collector.pyframes.split_python takes them apart).
Stack = tuple[int, ...]

# The stack words' encoding (native/stackwords.h).
TRUNCATED_ADDRESS: int  # RS_TRUNCATED_ADDRESS: the [truncated] root, 0
KERNEL_ADDRESS: int  # RS_KERNEL_ADDRESS: the [kernel] leaf, 1
PY_MARK: int  # RS_PY_MARK: the native addresses end, Python frame words follow
PY_MARK_SAMPLED: int  # RS_PY_MARK_SAMPLED: the same, frames read at sample time (BPF)
PY_FRAME_ENTRY_BIT: int  # RS_PY_FRAME_ENTRY_BIT
PY_FRAME_FUNCTION_SHIFT: int  # RS_PY_FRAME_FUNCTION_SHIFT
PY_FRAME_FUNCTION_BITS: int  # RS_PY_FRAME_FUNCTION_BITS
PY_FRAME_LINE_BITS: int  # RS_PY_FRAME_LINE_BITS

@final
class PerfMmap(tuple[int, int, int, str, bytes | None, int]):
    """One executable mapping seen by the kernel (PERF_RECORD_MMAP2)."""

    @property
    def start(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def pgoff(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def build_id(self) -> bytes | None: ...
    @property
    def image(self) -> int:
        """The process image the mapping belongs to (see PerfBatch.processes)."""

# (kind: "fork" | "exec" | "exit", image, pid, ppid, parent_image, time_ns, command): an image
# is one process between two execs; image 1 is the target as attached. command: an exec's
# /proc/PID/cmdline read as the record was drained (None if the process was gone already).
ProcessEvent = tuple[str, int, int, int, int, int, str | None]

@final
class PerfBatch(tuple[object, ...]):
    """What PerfSampler.take() collected since the previous call."""

    @property
    def samples(self) -> int: ...
    @property
    def lost(self) -> int: ...
    @property
    def new_stacks(self) -> list[tuple[int, int, Stack]]:
        """(stack_id, image, ips)"""
    @property
    def counts(self) -> list[tuple[int, int, int]]:
        """(stack_id, tid, samples)"""
    @property
    def new_threads(self) -> list[tuple[int, int]]:
        """(pid, tid)"""
    @property
    def exited_threads(self) -> list[int]: ...
    @property
    def comms(self) -> list[tuple[int, str]]:
        """(tid, thread name)"""
    @property
    def mmaps(self) -> list[PerfMmap]: ...
    @property
    def processes(self) -> list[ProcessEvent]: ...
    @property
    def offcpu(self) -> list[tuple[int, int, str, int, int]]:
        """(stack_id, tid, state, switch-outs, nanoseconds off the CPU)"""
    @property
    def offcpu_switches(self) -> int: ...
    @property
    def offcpu_lost(self) -> int: ...
    @property
    def offcpu_unpaired(self) -> int: ...
    @property
    def target_exited(self) -> bool: ...
    @property
    def first_time_ns(self) -> int: ...
    @property
    def last_time_ns(self) -> int: ...
    @property
    def truncated(self) -> int:
        """CFI mode: samples whose stack ends in a [truncated] root."""

@final
class PerfSampler:
    """perf_event_open sampling (cpu-clock, user call chains) of every thread of a process,
    inherited by the threads and, with follow=True, the processes it starts."""

    def __new__(
        cls,
        pid: int,
        freq_hz: int = 99,
        ring_kib: int = 128,
        max_stack: int = 127,
        follow: bool = False,
        stack_bytes: int = 0,
        kernel: bool = True,
        wake_each: bool = False,
        bpf_object: str | None = None,
        offcpu_tracepoint: int = -1,
        offcpu_state_offset: int = 32,
        offcpu_kernel: bool = True,
        gil_only: bool = False,
        offcpu_kernel_max_rate: int = 0,
    ) -> Self: ...
    @property
    def offcpu(self) -> bool:
        """Off-CPU time is recorded (sched:sched_switch opened on every thread)."""
    @property
    def offcpu_error(self) -> str:
        """Why off-CPU time is not recorded ('' when it is, or was not asked for)."""
    @property
    def offcpu_kernel_shed(self) -> tuple[int, int] | None:
        """(time_ns, switch-outs per second) when the switch rate passed
        offcpu_kernel_max_rate and the off-CPU kernel call chain was shed; None until then."""
    @property
    def pid(self) -> int: ...
    @property
    def stack_bytes(self) -> int: ...
    def unwind_stats(self) -> dict[str, int]:
        """CFI mode totals: cfi_frames, fp_frames, truncated, modules."""
    @property
    def closed(self) -> bool: ...
    @property
    def kernel(self) -> bool:
        """Kernel mode is sampled too (False: not allowed, or kernel=False)."""
    def add_thread(self, tid: int, /) -> None: ...
    def enable(self) -> None: ...
    def disable(self) -> None:
        """Sampling stops (the recording window ends); poll() still drains the rings."""
    def poll(self, timeout_ms: int, /) -> int: ...
    def take(self) -> PerfBatch: ...
    def threads(self) -> list[int]: ...
    def processes(self) -> list[int]: ...
    def images(self) -> list[tuple[int, int]]:
        """(pid, image) of the live processes being sampled."""
    def set_python(self, image: int, reader: PyFrameReader | None, /) -> None:
        """The image's samples get the Python frames `reader` reads at drain time."""
    def python_stats(self) -> dict[str, Any]:
        """walks, retries, attached, empty, dropped, late, frames, stale_ns_sum, stale_ns_max,
        stale_over_1ms, walk_ns_sum (int), stale_log2_us (list[int]: walked samples by
        delay, [0] under 1 us, [k] under 2^k us)."""
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> bool: ...

@final
class HeapBatch(tuple[object, ...]):
    """What HeapReader.take() collected since the previous call (byte and count deltas)."""

    @property
    def events(self) -> int: ...
    @property
    def lost(self) -> int: ...
    @property
    def new_stacks(self) -> list[tuple[int, Stack]]: ...
    @property
    def sites(self) -> list[tuple[int, int, int, int, int]]:
        """(stack_id, alloc_bytes, alloc_count, free_bytes, free_count)"""
    @property
    def unknown_frees(self) -> int: ...
    @property
    def live_bytes(self) -> int: ...
    @property
    def live_blocks(self) -> int: ...
    @property
    def exited(self) -> bool: ...
    @property
    def execed(self) -> bool: ...
    @property
    def sample_bytes(self) -> int: ...
    @property
    def dropped(self) -> int:
        """allocations the reader dropped because a bound was reached (a flood), or that
        repeat a stack named to a reader before this one (ALLOC_AGAIN in the moment of a
        re-attach)"""
    @property
    def thread_sites(self) -> list[tuple[int, int, int, int, int, int]]:
        """(stack_id, tid, alloc_bytes, alloc_count, free_bytes, free_count): `sites` split
        by the allocating thread (a free is charged to the thread that allocated)"""

HEAP_RING_VERSION: int  # native/heapring.h RSPROF_HEAP_VERSION
HEAP_RING_HEADER_SIZE: int  # native/heapring.h RSPROF_HEAP_HEADER_SIZE
HEAP_RING_NAME_PREFIX: str  # native/heapring.h RSPROF_HEAP_NAME_PREFIX: a ring's name in /dev/shm
HEAP_RING_SUFFIX_HEX: int  # native/heapring.h RSPROF_HEAP_SUFFIX_HEX: hex digits after <pid>.

@final
class HeapReader:
    """Reader of the heap shim's shared-memory ring (/dev/shm/rsprof-heap.<pid>.<suffix>)."""

    @classmethod
    def attach(cls, pid: int, name: str | None = None, /) -> HeapReader:
        """pid's ring `name` in /dev/shm; None: its newest ring not marked exited (else its
        newest). FileNotFoundError when there is none."""
    @staticmethod
    def sweep_stale() -> list[int]: ...
    @staticmethod
    def session_of(name: str, /) -> int:
        """The rsprof session (its pid) named by the ring `name` in /dev/shm, 0 if none, -1
        if there is no valid ring of ours at the name (yet)."""
    @property
    def pid(self) -> int: ...
    @property
    def ring_bytes(self) -> int: ...
    @property
    def sample_bytes(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def inode(self) -> int:
        """Inode of the ring file attached."""
    @property
    def name(self) -> str:
        """The ring's name in /dev/shm."""
    @property
    def created_ns(self) -> int:
        """CLOCK_MONOTONIC time the shim created the ring (perf's clock), 0 if unknown."""
    @property
    def repeated(self) -> int:
        """Allocations read as a repeat of a stack their thread sent before."""
    @property
    def lap_jumps(self) -> int:
        """Times the reader, having read everything reserved, moved both cursors to the
        next lap's start (docs/heap-ring.md, Protocol)."""
    new_stack_budget: int
    """New stacks one take() announces at most (1 .. 65536, clamped; default 65536). The
    allocation of one more new stack waits in the ring for the next take() (`deferred`);
    nothing is dropped for it. The recorder sizes it to its checkpoint interval."""
    @property
    def deferred(self) -> bool:
        """This take's budget is spent: poll() reads nothing until the next take()."""
    @property
    def write_pos(self) -> int:
        """The writers' reservation cursor now, in ring bytes (0 once closed): every record
        reserved before this moment lies below it."""
    @property
    def read_pos(self) -> int:
        """Ring bytes read so far; a record reserved but not committed yet stops poll()."""
    @property
    def python_wanted(self) -> bool: ...
    @property
    def shim_flags(self) -> int:
        """The ring header's flags (heapring.h RSPROF_HEAP_HF_*), 0 once closed or in error."""
    def set_python(self, reader: PyFrameReader | None, /) -> None: ...
    def python_stats(self) -> dict[str, int]: ...
    def poll(self) -> int: ...
    def discard(self) -> int: ...
    def take(self) -> HeapBatch: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> bool: ...

# (name, linkage_name, call_file, call_line, name_die): name_die is the DIE the name came from
Scope = tuple[str | None, str | None, int, int, int | None]
# (tag, name, linkage_name, parent, type, origin, decl_line, decl_column, artificial,
#  language, producer) of one DIE (DwarfReader.die)
DieInfo = tuple[int, str | None, str | None, int | None, int | None, int | None, int, int, int,
                int, str | None]
# (addrs: uint64 bytes, files: uint32 bytes, lines: uint32 bytes, file names by number)
LineTableData = tuple[bytes, bytes, bytes, list[str | None]]

@final
class DwarfReader:
    """DWARF line tables and inline scopes, decoded from section buffers (native/dwarf.c)."""

    def __init__(self, sections: dict[str, Buffer]) -> None: ...
    def units(self) -> list[int]: ...
    def aranges(self) -> list[tuple[int, int, int]]: ...
    def unit_ranges(self, unit: int, /) -> list[tuple[int, int]]: ...
    def line_table(self, unit: int, /) -> LineTableData | None: ...
    def inline_chains(self, unit: int, addrs: list[int], /) -> list[tuple[Scope, ...]]: ...
    def die(self, offset: int, /) -> DieInfo: ...
    def children(self, offset: int, /) -> list[int]: ...

def cfi_functions(path: str, /) -> tuple[list[tuple[int, int]], int, float]:
    """FDE function ranges (link-time addresses, sorted), unwind-table rows, build ms."""

def kallsyms_text(source: str | bytes, /) -> tuple[bytes, bytes, bytes, str, list[str], int, int,
                                                   int, int, bool, bool]:
    """/proc/kallsyms' text symbols (a path, or the text) in address order: starts (uint64s),
    module indexes (uint16s), each name's end in names (uint32s), names joined by newlines,
    module names, .sched.text's bounds, the kernel image's code (_stext, _etext; 0: not
    listed), listed, nonzero (native/kallsyms.c)."""

def symtab_build(sources: list[tuple[memoryview | bytes, bytes, bool, bool]
                               | list[tuple[str, int, int, int, int, int]]],
                 section_ends: dict[int, int], /) -> tuple[bytes, bytes, list[str]]:
    """A SymbolTable's function table (starts and ends as uint64s, names), by start, from ELF
    symbol sections (entries, string table, is64, big endian) and lists of (name, value,
    size, type, bind, shndx), with {executable section index: end} (native/symtab.c)."""

# The heap shim's own CPython offsets (native/shim/shimpy_layout.h), exported only so that
# tests check them against collector/pyframes.py's: {(3, 11): {field: offset}, (3, 12): ...}
# and, for 3.13, {field: (index of its uint64 in _Py_DebugOffsets after the cookie, or -1;
# the value when -1)}.
SHIM_PY_LAYOUTS: dict[tuple[int, int], dict[str, int]]
SHIM_PY_DEBUG_313: dict[str, tuple[int, int]]

@final
class PyFrame(tuple[str, str, int, int, bool]):
    """One Python frame read from another process (PyFrameReader.frames)."""

    @property
    def function(self) -> str: ...
    @property
    def file(self) -> str: ...
    @property
    def line(self) -> int: ...
    @property
    def first_line(self) -> int: ...
    @property
    def entry(self) -> bool:
        """Entered from C: the outermost Python frame of one _PyEval_EvalFrameDefault call."""

@final
class PyFrameReader:
    """A CPython process's Python frames, read with process_vm_readv (native/pyframes.c)."""

    def __init__(
        self, pid: int, runtime: int, code_type: int, unicode_type: int, offsets: dict[str, int]
    ) -> None: ...
    @property
    def pid(self) -> int: ...
    @property
    def walks(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def truncated(self) -> int: ...
    @property
    def reads(self) -> int: ...
    def frames(self, tid: int, /) -> list[PyFrame] | None: ...
    def walk(self, tid: int, /) -> list[tuple[int, int, bool]] | None:
        """(function id, line, entry) per frame, innermost first; ids resolve by functions()."""
    def functions(self, start: int = 1, /) -> list[tuple[int, str, str, int]]:
        """(id, qualname, file, first line) of every function id >= start."""
    def threads(self) -> list[int]: ...
    def thread_idents(self) -> list[tuple[int, int]]:
        """(native thread id, thread ident) of every thread state; ident 0 if unknown."""
    def read(self, address: int, size: int, /) -> bytes | None:
        """`size` (<= 256 KiB) bytes of the target, None when they cannot all be read."""
    def string(self, address: int, max: int = 1024, /) -> str | None:
        """The compact str object at `address` of at most `max` code points, else None."""


class StoppedProcess:
    """Every thread of a process stopped with ptrace until resume() (native/snapshot.c):
    their registers and stack tops are copied at once; signals that arrive meanwhile are
    delivered on resume."""

    def __init__(self, pid: int, stack_bytes: int = 65536) -> None: ...
    @property
    def pid(self) -> int: ...
    def threads(self) -> list[int]:
        """The threads that were stopped (those that left meanwhile are not)."""
    def stack(self, tid: int, /) -> tuple[list[int], bool, int]:
        """(addresses leaf first, truncated, system call number or -1), unwound by CFI from
        the copy taken while stopped (also after resume())."""
    def resume(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@final
class Tracee:
    """One thread of another process seized with ptrace (native/inject.c), to make it call
    a function: `rsprof -p` loads the heap shim so (collector/heapattach.py). Every method
    must be called from the thread that created it."""

    def __init__(self, tid: int) -> None:
        """PTRACE_SEIZE (no signal, the thread keeps running). OSError: EPERM (another
        tracer, or not allowed), ESRCH (no such thread)."""
    @property
    def tid(self) -> int: ...
    @property
    def stopped_ns(self) -> int:
        """Nanoseconds the thread has been stopped by us so far."""
    def interrupt(self) -> None:
        """Stops the thread (PTRACE_INTERRUPT) and waits for the stop; a signal it was about
        to take meanwhile is delivered first."""
    def resume(self) -> None: ...
    def regs(self) -> tuple[int, int, int, int]:
        """(pc, sp, orig_rax, rax) of the stopped thread; orig_rax -1 outside a system call."""
    def read(self, address: int, size: int, /) -> bytes:
        """What of [address, address + size) is readable, maybe less (up to 256 KiB)."""
    def unwind(self, max_frames: int = 128, /) -> tuple[list[int], bool]:
        """(frames, truncated): the stopped thread's stack by CFI (native/unwind.c, as CPU
        samples): frames[0] is the pc, then return addresses."""
    def call(self, fn: int, args: Sequence[int], data: bytes = b"", timeout_ms: int = 10000) -> int:
        """fn(*args) in the stopped thread, every register put back after; with data, a
        copy of it below the red zone is the first argument. Returns rax. OSError when the
        call faults, does not return in time or the thread exits."""
    def detach(self) -> None: ...
