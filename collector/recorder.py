"""The recording loop: sample every thread, checkpoint every interval, finalize on any stop.

Two threads share the work. A drain thread keeps the kernel rings empty (`poll` releases
the GIL while it waits, and parsing and stack de-duplication happen in C). The main thread
wakes once per interval, takes the aggregated batch, symbolizes what is new and commits
one checkpoint, so slow symbolization never makes the kernel drop samples.
"""

from __future__ import annotations

import errno
import gc
import os
import resource
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil
from rsprof.collector import process
from rsprof.collector.errors import PERMISSION_HINT, PermissionDenied, ProcessNotFound
from rsprof.collector.frames import FrameResolver
from rsprof.collector.heap import HeapParts, HeapTracker, PythonNotYet
from rsprof.collector.maps import Mapping, read_executable_maps
from rsprof.collector.offcpu import (
    OFFCPU_KERNEL_MAX_RATE,
    OffCpuUnavailable,
    Tracepoint,
    find_tracepoint,
)
from rsprof.collector.process import Target
from rsprof.collector.pyframes import PythonImages, find_runtime, program_runs_python
from rsprof.collector.symbols import Symbolizer
from rsprof.storage.writer import Checkpoint, ProfileWriter

from rsprof import __version__
from rsprof._native import (
    HEAP_RING_HEADER_SIZE,
    HEAP_RING_NAME_PREFIX,
    HEAP_RING_SUFFIX_HEX,
    HeapBatch,
    HeapReader,
    PerfBatch,
    PerfMmap,
    PerfSampler,
    PyFrameReader,
)

# The heap ring's header: a smaller file is a ring the shim has created but not sized yet.
_HEAP_HEADER_BYTES = HEAP_RING_HEADER_SIZE


def _ring_pid(name: str) -> int | None:
    """The pid in a ring's name, None if `name` is not one (heapring_name_pid in C).

    A ring is /dev/shm/rsprof-heap.<pid>.<16 hex digits, random> (native/heapring.h; the
    prefix and the digits' count are exported by rsprof._native): nobody can squat a ring's
    name before it exists, and each image of an exec'ing process has a ring of its own."""
    if not name.startswith(HEAP_RING_NAME_PREFIX):
        return None
    pid_text, dot, suffix = name[len(HEAP_RING_NAME_PREFIX):].partition(".")
    if (not dot or not pid_text.isdigit() or len(suffix) != HEAP_RING_SUFFIX_HEX
            or suffix.strip("0123456789abcdef")):
        return None
    pid = int(pid_text)
    return pid if 0 < pid <= 0x7FFFFFFF else None


@dataclass(slots=True)
class RecordOptions:
    freq_hz: int = 99
    interval_s: float = 1.0
    duration_s: float | None = None
    ring_kib: int = 128
    heap: bool = True  # read the heap shim's ring when the target has one
    follow: bool = False  # sample the processes the target starts, too (`run` sets it)
    # User stack bytes copied per sample and unwound by CFI in C; 0 = frame pointers.
    stack_bytes: int = 16384
    # Python frames of CPython 3.11-3.13 images spliced into their stacks (`--python`).
    python: bool = True
    # Read them at sample time by BPF when it can be loaded (`--python=on`), else, or with
    # `--python=drain`, from outside when the sample is drained.
    python_bpf: bool = True
    # One extra checkpoint this soon after sampling starts (the live TUI's first screen
    # then has data before the first interval ends); None: the first after interval_s.
    first_checkpoint_s: float | None = None
    # Off-CPU time from sched:sched_switch (`--off-cpu/--no-off-cpu`), where permitted.
    offcpu: bool = True
    # ... with the kernel function each wait is in (`--off-cpu-kernel`), when kernel stacks
    # are allowed: the kernel call chain of every switch-out (docs/native.md, "Off-CPU time")
    offcpu_kernel: bool = True
    # ... until the target switches out more than this many times a second (0: always):
    # then the chain is shed (meta offcpu_kernel_shed_*), as each switch-out's kernel unwind
    # costs the target 1-2 us
    offcpu_kernel_max_rate: int = OFFCPU_KERNEL_MAX_RATE
    # `--gil` (py-spy's): CPU samples of a CPython's threads are kept only when the thread
    # held the GIL at sample time (decided by the BPF program; meta python_gil_*).
    gil: bool = False


# Stack copies per CPU ring, largest first: one ring per CPU takes every thread's samples,
# and 300 threads starting together burst (their events begin at a short period before the
# kernel's frequency adjustment catches up) while they starve the drain of CPU: with rings
# of 32 copies 12-21 % of the samples were lost, with 128 copies 0-13 % (load average
# 300-800 here). Without privileges, locked ring memory is capped per user: the smaller
# rings are tried next, then frame pointers.
RING_COPIES = (128, 32)
# All CPUs' rings together stay under this, whatever the copy count asks for (a 64-CPU
# machine must not pin 256 MiB for a profile).
RING_BUDGET_KIB = 64 * 1024


# A checkpoint symbolizes and stores the heap stacks new since the last one, on the main
# thread: a target allocating from ever new stacks (a flood: tests/targets/ring_abuse.c)
# brought 8 Ki of them to every checkpoint, ~65 us each with 4 CPU hogs on 2 cores
# (Python, SQLite, and the garbage collector walking the growing caches), and
# checkpoints of a 250 ms interval came 570 ms-1.3 s apart (median), up to 1.9 s, the
# gaps growing; with the budget 250 ms (median), up to 250-480 ms. Each heap reader
# announces at most as many new stacks per take() as take this share of the interval, at
# the cost per stack last measured (never fewer than HEAP_STACKS_MIN); the allocations
# of further new stacks wait in the shared ring for the next take (only what the ring
# cannot hold meanwhile is lost, counted by the shim). Until a first measurement the
# budget is HEAP_STACKS_START: 100 ms of stacks at 50 us each. The reader's maximum
# there made the first checkpoints of a flood 1.3-2.3 s apart on a loaded machine. On an
# idle one a program's start with more new stacks than that is read over the first
# checkpoints (the ring keeps the rest), and the first measurement sizes the budget.
HEAP_STACKS_SHARE = 0.4
HEAP_STACKS_MIN = 256
HEAP_STACKS_START = 2048
HEAP_STACKS_MAX = 65536
# Below this many new stacks, a fill's time says too little about the cost of one.
HEAP_STACKS_MEASURED = 64
# After the recording stops, checkpoints are written until every ring's deferred events
# are read; the readers' memory bounds end it sooner (their dropping is counted), this only
# guards against a ring that never empties.
FINAL_ROUNDS = 64
# After the recording stops, how long the last read waits for records the program had
# reserved in its ring before the stop to be committed (a writer preempted between the two
# on a loaded machine; HeapTracker.settle). Bounded: a thread stopped mid-record (SIGSTOP,
# a debugger) would never commit.
FINAL_COMMIT_WAIT_S = 1.0


def ring_kib_for(options: RecordOptions, copies: int = RING_COPIES[0]) -> int:
    """Each CFI sample carries its stack copy: a CPU's ring must hold `copies` of them
    between two drains, whatever ring_kib says (a power of two, as perf requires)."""
    if options.stack_bytes <= 0:
        return options.ring_kib
    need = copies * (options.stack_bytes + 96) // 1024
    kib = options.ring_kib
    while kib < need:
        kib *= 2
    cpus = os.cpu_count() or 1
    while kib * cpus > RING_BUDGET_KIB and kib // 2 >= 4 * (options.stack_bytes + 96) // 1024:
        kib //= 2
    return kib


@dataclass(slots=True)
class RecordResult:
    stop_reason: str
    checkpoints: int
    samples: int
    lost_samples: int
    threads: int
    heap_mode: str
    truncated_samples: int = 0
    kernel_sampled: bool = True
    # CPU samples charged to `[rsprof heap tracking]` (the heap shim's own work) and the
    # samples counted with them (collector/shimframes.py).
    heap_tracking_samples: int = 0
    counted_samples: int = 0
    # Bytes allocated minus bytes freed over the recording, as the heap rings told (blocks
    # allocated before a ring was read are not in it): the live heap a progress line shows.
    heap_live_bytes: int = 0
    # --gil: CPU samples read but not kept (their thread did not hold the GIL)
    gil_dropped: int = 0
    # Unix ms when sampling stopped (the duration reached, a stop asked for): the end of the
    # recording window, before the final drain and writing (meta end_time_ms).
    window_end_ms: int | None = None


def heap_tracking_share(result: RecordResult) -> float:
    """The share of CPU samples spent in the heap shim's own work, 0..1."""
    return result.heap_tracking_samples / result.counted_samples if result.counted_samples else 0


def _unwind_label(options: RecordOptions) -> str:
    return f"cfi:{options.stack_bytes}" if options.stack_bytes else "frame-pointers"


@dataclass(slots=True)
class _Image:
    """One process image (a process between two execs) and what resolves its addresses."""

    row_id: int
    pid: int
    ppid: int | None
    command: str | None
    resolver: FrameResolver


class Recorder:
    """Records one target, and with `follow` the processes it starts, into one profile."""

    def __init__(
        self,
        target: Target,
        writer: ProfileWriter,
        options: RecordOptions,
        *,
        symbolizer: Symbolizer | None = None,
        child: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.target = target
        self.writer = writer
        self.options = options
        self.child = child
        symbolizer = symbolizer or Symbolizer()
        self.resolver = FrameResolver(target.pid, writer, symbolizer)
        self.stop_event = threading.Event()
        self.stop_reason: str | None = None
        self._sampler: PerfSampler | None = None
        # Heap trackers by pid: the target's, and with `follow` its descendants' (each
        # process started with the shim has its own ring).
        # Keyed by ring, (pid, inode): an exec replaces a process's ring under the same name,
        # and the new one is read from the moment it appears, beside the old one's last data.
        self._heaps: dict[tuple[int, int], HeapTracker] = {}
        self._images: dict[int, _Image] = {}
        self._image_of_pid: dict[int, int] = {}
        self._thread_pids: dict[int, int] = {}
        self._unnamed_images: dict[int, str] = {}  # exec'd images known by comm only
        # Ring names in /dev/shm looked at already: attached (or read to the end), refused
        # (warned once, never attached later: a ring another rsprof reads stays not used),
        # or another session's (attached after all if its pid turns out to be followed).
        self._seen_rings: set[str] = set()
        self._other_rings: set[str] = set()
        # (time_ns, image) per pid, in order: which image made a ring (its created_ns).
        self._image_starts: dict[int, list[tuple[int, int]]] = {}
        self._heap_lost_warned = False
        self._heap_unknown_frees = 0  # frees of blocks allocated before the shim came
        self._stop_marks: dict[tuple[int, int], int] = {}  # ring -> write_pos at the stop
        self._settle_warned = False
        # More meta, asked for at every checkpoint and written when it changed: how the heap
        # shim was loaded into the attached process (collector/heapattach.py HeapAttach).
        self.extra_meta: Callable[[], dict[str, object]] | None = None
        self._extra_meta_written: dict[str, object] = {}
        self._exited_pids: set[int] = set()  # EXIT records taken by checkpoints
        self._heap_mode: tuple[str, int] | None = None  # (mode, sample bytes) once known
        self._thread_names: dict[int, str | None] = {}  # the kernel's (comm)
        # tid -> the name Python gave the thread (threading.Thread.name), shown instead of
        # comm; kept after the thread exits, dropped when its tid is reused
        self._python_names: dict[int, str] = {}
        self._exited: set[int] = set()
        self._psutil: psutil.Process | None = None
        self._totals = RecordResult("", 0, 0, 0, 0, "none")
        self._drain_error: BaseException | None = None
        self._drain_stop = threading.Event()
        # The recording window's end (_end_window), taken by whichever thread sees it first.
        self._window_lock = threading.Lock()
        self._window_end_ms: int | None = None
        self._deadline: float | None = None
        self._native_to_stored: dict[int, int] = {}
        self._written_tids: set[int] = set()
        # Called once sampling is enabled; `rsprof run` releases the held child from here.
        self.on_attached: Callable[[], None] | None = None
        # Called (in the recording thread) after each checkpoint is written, with the
        # running totals and the seconds since sampling began: the headless progress line.
        self.on_checkpoint: Callable[[RecordResult, float], None] | None = None
        # What was last written to meta: (heap_mode, sample bytes), heap_missed.
        self._heap_meta_written: tuple[tuple[str, int], str] | None = None
        self._heap_missed = ""  # the target's MISSED messages, one per line
        self._missed_said: set[str] = set()
        # Problems that cost part of the data but not the recording (a refused or corrupt
        # heap ring, a module whose debug info could not be read): each said once, through
        # on_warning (the CLI prints it), and kept in meta `warnings` (docs/schema.md).
        self.on_warning: Callable[[str], None] | None = None
        self.warnings: list[str] = []
        self._warnings_written = 0
        self._warn_lock = threading.Lock()
        symbolizer.on_warning = self.warn  # corrupt debug info: fewer symbols, said once
        symbolizer.cancelled = self.stop_event.is_set  # a long debug-file read gives up
        self._unwind_note: str | None = None
        # Off-CPU: the tracepoint (None: not asked for, or unavailable: _offcpu_error says)
        self._offcpu_tracepoint: Tracepoint | None = None
        self._offcpu_error = ""
        self._offcpu_meta: dict[str, int | float] = {}
        self._started = time.monotonic()  # the recording's start, CLOCK_MONOTONIC as samples'
        self.resolver.on_warning = self.warn  # a refused perf map (symlink, other owner)
        self._python: PythonImages | None = None
        self._python_meta: dict[str, object] = {}
        # Heap stacks with Python frames per ring (HeapReader.python_stats), for meta.
        self._heap_py_stats: dict[tuple[int, int], dict[str, int]] = {}
        self._heap_python_meta: dict[str, int] = {}
        self._heap_tracking_meta: dict[str, float] = {}
        # Seconds to symbolize and store one new heap stack (moving average; None until
        # measured) and the budget of new stacks per take() it gives every heap reader.
        self._heap_stack_cost: float | None = None
        self._heap_stack_budget = HEAP_STACKS_START

    @property
    def sampler(self) -> PerfSampler:
        if self._sampler is None:
            raise RuntimeError("the recorder is not attached yet")
        return self._sampler

    # -- control -------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Called from a signal handler or another thread; the loop finalizes and returns."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop_event.set()

    @property
    def heap_rings(self) -> int:
        """Heap shim rings being read now (an attached target started with the shim)."""
        return len(self._heaps)

    @property
    def checkpoints_written(self) -> int:
        return self._totals.checkpoints

    def warn(self, message: str) -> None:
        """Says `message` once per recording (any thread)."""
        with self._warn_lock:
            if message in self.warnings:
                return
            self.warnings.append(message)
        if self.on_warning is not None:
            self.on_warning(message)

    # -- attach --------------------------------------------------------------------------

    def _attach(self) -> None:
        pid = self.target.pid
        tids = process.thread_ids(pid)
        if not tids:
            raise ProcessNotFound(f"no process with PID {pid}")
        opened = None
        for copies in RING_COPIES if self.options.stack_bytes else ():
            try:
                opened = self._open_sampler(tids, copies)
                break
            except PermissionDenied:
                # Without privileges the kernel caps locked ring memory per user
                # (kernel.perf_event_mlock_kb x CPUs, then RLIMIT_MEMLOCK): try smaller rings.
                if self._sampler is not None:
                    self._sampler.close()
        if opened is None and self.options.stack_bytes:
            # Even the smallest rings for stack copies were refused where frame-pointer
            # rings may fit: record anyway, and say so, rather than fail.
            self.options.stack_bytes = 0
            self._unwind_note = "frame-pointers (rings for CFI stack copies refused)"
            self.warn("the rings for CFI stack copies were refused (locked-memory limit):"
                      " stacks walked by frame pointers")
        if opened is None:
            opened = self._open_sampler(tids)
        if opened == 0:
            raise ProcessNotFound(f"PID {pid} exited before it could be sampled")
        # A launched child is still the waiting launcher: its real mappings arrive as MMAP2
        # records when it execs, and the launcher's must not linger in the address space.
        if self.child is None:
            try:
                for mapping in read_executable_maps(pid):
                    self.resolver.add_mapping(mapping)
            except OSError as error:
                raise ProcessNotFound(f"cannot read /proc/{pid}/maps: {error}") from error
        try:
            self._psutil = psutil.Process(pid)
            self._psutil.cpu_percent(None)
        except psutil.Error:
            self._psutil = None
        command = self.target.cmdline or self.target.name
        ppid = _parent_pid(pid)
        self._images[1] = _Image(
            self.writer.add_process(pid, ppid, None, command), pid, ppid, command, self.resolver
        )
        self._image_of_pid[pid] = 1
        self._image_starts[pid] = [(0, 1)]
        if self.options.heap:
            HeapTracker.sweep_stale()
            self._scan_heap_rings()
        if self.options.python:
            self._python = PythonImages(self.sampler, self.warn)
            self._python.poll()
        try:
            self.sampler.enable()
        except OSError as error:  # a security module may refuse PERF_EVENT_IOC_ENABLE
            self._raise_if_refused(error, "could not be started")
            raise
        # Threads created while the events were being opened, by a thread that had none yet,
        # inherited nothing: open theirs now. (Drain first: a FORK record says a thread did
        # inherit, and a second event would sample it twice.)
        self.sampler.poll(0)
        self._follow_missed_threads()
        if self.options.offcpu and not self.sampler.offcpu:
            reason = self.sampler.offcpu_error or self._offcpu_error
            self._offcpu_error = reason
            self.warn(f"off-CPU time not recorded: {reason}; CPU samples are"
                      " (--no-off-cpu does not ask)")
        stats = self.sampler.python_stats() if self.options.gil else None
        if stats is not None and stats["mode"] != "bpf":
            reason = stats["bpf_error"] or "not built in this install"
            self.warn(f"--gil needs the BPF program, which is not loaded ({reason}): CPU"
                      " samples are kept whether or not their thread held the GIL"
                      " (meta python_gil_unknown counts them)")
        if self.on_attached is not None:
            self.on_attached()

    def _find_offcpu(self) -> None:
        if not self.options.offcpu or self._offcpu_tracepoint is not None or self._offcpu_error:
            return
        try:
            self._offcpu_tracepoint = find_tracepoint()
        except OffCpuUnavailable as error:
            self._offcpu_error = str(error)

    def _open_sampler(self, tids: list[int], copies: int = RING_COPIES[0]) -> int:
        self._find_offcpu()
        tracepoint = self._offcpu_tracepoint
        try:
            self._sampler = PerfSampler(
                self.target.pid,
                self.options.freq_hz,
                ring_kib_for(self.options, copies),
                follow=self.options.follow,
                stack_bytes=self.options.stack_bytes,
                wake_each=self._python_hint(),
                bpf_object=self._bpf_object(),
                offcpu_tracepoint=tracepoint.id if tracepoint else -1,
                offcpu_state_offset=tracepoint.state_offset if tracepoint else 32,
                offcpu_kernel=self.options.offcpu_kernel,
                offcpu_kernel_max_rate=self.options.offcpu_kernel_max_rate,
                gil_only=self.options.gil,
            )
        except PermissionError as error:  # CFI mode reads /proc/PID/maps
            raise PermissionDenied(
                f"cannot read the mappings of PID {self.target.pid}: {error};"
                f" {PERMISSION_HINT}"
            ) from error
        return sum(1 for tid in tids if self._open_thread(tid))

    def _bpf_object(self) -> str | None:
        """The BPF program that reads Python frames at sample time (native/bpf/), when
        Python frames are wanted and the install built it (clang and libbpf-dev present)."""
        if not (self.options.python and self.options.python_bpf):
            return None
        path = Path(__file__).resolve().parent.parent / "lib" / "pyperf.bpf.o"
        return str(path)

    def _python_hint(self) -> bool:
        """Python frames are read when a sample is drained, so for a CPython target (or a
        launched command that starts one) the drain is woken at every sample: the median
        delay from sample to read fell from under 1024 us (drained every 1 ms) to under
        64 us (pysplit.py at 999 Hz, load 7 on 2 cores). Not for other programs: a wake-up
        per sample of 300 threads would keep the drain loop spinning."""
        if not self.options.python:
            return False
        if self.child is not None:
            return program_runs_python(self.target.exe)
        try:
            return find_runtime(self.target.pid) is not None
        except OSError:
            return False

    def _raise_if_refused(self, error: OSError, what: str, call: str = "perf events") -> None:
        """A permission refusal of perf_event_open or its ioctls is one line naming the fix
        (exit 4); other errors are the caller's."""
        if error.errno in (errno.EACCES, errno.EPERM):
            raise PermissionDenied(
                f"{call} on PID {self.target.pid} {what}: permission denied; {PERMISSION_HINT}"
            ) from error

    def _open_thread(self, tid: int) -> bool:
        try:
            self.sampler.add_thread(tid)
        except OSError as error:
            self._raise_if_refused(error, "refused", "perf_event_open")
            if error.errno == errno.ESRCH:
                return False  # the thread exited between listing and opening
            raise
        self._thread_names.setdefault(tid, process.thread_name(self.target.pid, tid))
        self._thread_pids[tid] = self.target.pid
        return True

    def _write_start_meta(self) -> None:
        now = time.time()
        self.writer.set_meta(
            {
                "version": __version__,
                "pid": self.target.pid,
                "process_name": self.target.name,
                "exe_path": self.target.exe,
                "cmdline": self.target.cmdline,
                # 1: started by `rsprof run` (ending the recording ends it), 0: attached
                "target_launched": int(self.child is not None),
                "start_time": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
                "start_time_ms": int(now * 1000),
                "cpu_freq_hz": self.options.freq_hz,
                "cpu_event": "cpu-clock",
                "cpu_unwind": self._unwind_note or _unwind_label(self.options),
                # 0: not allowed to sample kernel mode, so system-call time is missing
                "kernel_sampled": int(self.sampler.kernel),
                # off-CPU time: the event, or why not ('' when not asked for)
                "offcpu_event": "sched:sched_switch" if self.sampler.offcpu else "",
                "offcpu_error": self._offcpu_error if self.options.offcpu else "",
                # 1: off-CPU stacks name the kernel function waited in
                "offcpu_kernel": int(self.sampler.offcpu and self.sampler.kernel
                                     and self.options.offcpu_kernel),
                "interval_ms": int(self.options.interval_s * 1000),
                "heap_mode": self._heap_mode[0] if self._heap_mode else "none",
                "heap_sample_bytes": self._heap_mode[1] if self._heap_mode else 0,
                "state": "recording",
            }
        )
        self.writer.commit()

    # -- loop ----------------------------------------------------------------------------

    def run(self) -> RecordResult:
        _raise_priority()
        _raise_fd_limit()
        try:
            self._attach()
        except ProcessLookupError as error:  # ESRCH from any step: the target left
            raise ProcessNotFound(
                f"PID {self.target.pid} exited while rsprof was attaching ({error})"
            ) from error
        self._write_start_meta()
        self._started = time.monotonic()
        if self.options.duration_s:
            self._deadline = self._started + self.options.duration_s
        drain = threading.Thread(target=self._drain_loop, name="rsprof-drain", daemon=True)
        drain.start()
        try:
            self._loop(drain)
            self._checkpoint(final=True)
            self._read_deferred()
        finally:
            # Back in the collector's sight: what died in a cycle meanwhile is collected.
            gc.unfreeze()
        self.sampler.close()
        for heap in self._heaps.values():
            heap.close()
        if self.options.heap:
            # A target killed without a chance to unlink its ring leaves it behind.
            HeapTracker.sweep_stale()
        result = self._totals
        result.stop_reason = self.stop_reason or "interrupted"
        result.kernel_sampled = self.sampler.kernel
        result.threads = len(self._thread_names)
        result.heap_mode = self._heap_mode[0] if self._heap_mode else "none"
        result.window_end_ms = self._window_end_ms
        return result

    def _loop(self, drain: threading.Thread) -> None:
        """Writes a checkpoint every interval until the recording stops, then stops the
        drain thread."""
        started = self._started
        next_checkpoint = started + self.options.interval_s
        deadline = self._deadline
        first = self.options.first_checkpoint_s
        # the extra early checkpoint; the others keep their cadence
        early = started + first if first is not None and first < self.options.interval_s else None
        try:
            while True:
                wake = next_checkpoint if early is None else early
                wake = wake if deadline is None else min(wake, deadline)
                if self.stop_event.wait(max(0.0, wake - time.monotonic())):
                    if self._drain_error is not None:
                        raise self._drain_error
                    break
                if self._drain_error is not None:
                    raise self._drain_error
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self.request_stop("duration")
                    break
                exited = self._checkpoint()
                if self.on_checkpoint is not None:
                    self.on_checkpoint(self._totals, time.monotonic() - started)
                if exited:
                    self.request_stop("target-exited")
                    break
                _freeze_garbage_collection()
                if early is not None:
                    early = None
                    continue
                next_checkpoint += self.options.interval_s
                if next_checkpoint < now:  # fell behind (e.g. a long cold symbolization)
                    next_checkpoint = now + self.options.interval_s
        finally:
            self._stop_drain(drain)

    def _read_deferred(self) -> None:
        """What the heap readers deferred is real allocations: read and written after the
        recording stopped, however many checkpoints that takes now that no cadence is kept."""
        for _ in range(FINAL_ROUNDS):
            # A reader that had spent its budget when its batch was taken has more to read.
            waiting = [heap for heap in self._heaps.values() if heap.deferred]
            if not waiting:
                return
            _freeze_garbage_collection()
            self._settle_heaps([(ring, heap) for ring, heap in self._heaps.items()
                                if heap in waiting])
            self._checkpoint(final=True)
        self.warn("heap events still waiting in a ring after the recording stopped were not"
                  " read")

    def _drain_loop(self) -> None:
        try:
            while not self._drain_stop.is_set():
                if self._window_end_ms is None:
                    # On time, whatever the main thread is doing: a checkpoint of 300
                    # threads' stacks took 2-6 s beside 300 spinners, and `-d 2s` recorded
                    # for 8 s when only the main loop looked at the clock.
                    if self._deadline is not None and time.monotonic() >= self._deadline:
                        self.request_stop("duration")
                    if self.stop_event.is_set():
                        self._end_window()
                # The heap ring fills in milliseconds under an allocation storm: with a
                # heap attached, wake often and drain it until it is empty.
                self.sampler.poll(5 if self._heaps or self.options.heap else 50)
                if self._python is not None:
                    self._python.poll()
                if self.options.heap:
                    # A launched target creates its ring only after exec, and a short one
                    # may be gone before the first checkpoint: look for it on every poll.
                    # Straight from the sampler's drain, not the last checkpoint: a child
                    # that lives 100 ms must have its ring read before it exits.
                    self._scan_heap_rings()
                for heap in list(self._heaps.values()):
                    heap.drain()
                # Notice the target's exit within one poll, not at the next checkpoint: a
                # short command under `rsprof run` must not cost a whole interval.
                if not self._target_alive():
                    self.request_stop("target-exited")
                    return
        except BaseException as error:  # surfaced to the main loop, never lost
            self._drain_error = error
            self.stop_event.set()

    def _end_window(self) -> None:
        """Ends the recording window, once, from the thread that sees the stop first (the
        drain thread within a poll of the deadline or of a stop request; the main loop if
        the drain thread has not): sampling stops, and each heap ring's writer position is
        its stop mark: everything below it is read before the recording ends
        (_settle_heaps). What the rings hold is still drained and written; the heap rings
        are drained until the main loop has stopped too (left unread, an allocation storm
        would fill them and its events be counted lost), as before the window had an end
        of its own."""
        with self._window_lock:
            if self._window_end_ms is not None:
                return
            self._stop_marks = {ring: heap.reader.write_pos
                                for ring, heap in list(self._heaps.items())}
            self.sampler.disable()
            self._window_end_ms = int(time.time() * 1000)

    def _stop_drain(self, drain: threading.Thread) -> None:
        self._end_window()
        self._drain_stop.set()
        drain.join()
        # From now on every take() may announce as many new stacks as a reader holds.
        self._heap_stack_budget = HEAP_STACKS_MAX
        for heap in list(self._heaps.values()):
            heap.set_budget(HEAP_STACKS_MAX)
        self.sampler.poll(0)
        if self.options.heap:
            self._scan_heap_rings()
        for ring, heap in list(self._heaps.items()):
            self._stop_marks.setdefault(ring, heap.reader.write_pos)  # attached just now
        self._settle_heaps(list(self._heaps.items()))

    def _settle_heaps(self, heaps: list[tuple[tuple[int, int], HeapTracker]]) -> None:
        """Reads each ring up to its stop mark, waiting (FINAL_COMMIT_WAIT_S at most) for
        writers that had reserved a record and not yet committed it."""
        deadline = time.monotonic() + FINAL_COMMIT_WAIT_S
        for ring, heap in heaps:
            if not heap.settle(self._stop_marks.get(ring, 0), deadline) and not self._settle_warned:
                self._settle_warned = True
                self.warn(f"heap events of PID {ring[0]} reserved before the recording stopped"
                          f" were still not written {FINAL_COMMIT_WAIT_S:g} s later (a thread"
                          " stopped while recording one): they and those after them were"
                          " not read")

    def _scan_heap_rings(self) -> None:
        """Attaches the rings in /dev/shm (one directory read per poll) of the processes
        being recorded (the target, followed processes), and those a process of this
        session left behind: a child that exits before the drain has seen it (`ls` in a
        shell script lives 1 ms), or an image that exec'd before its ring was attached,
        keeps its unread ring for us (native/shim/heapshim.c, ring_kept_for_session).
        Each new name's header is read once."""
        try:
            entries = list(os.scandir("/dev/shm"))
        except OSError:
            return
        followed = {self.target.pid, *self.sampler.processes()}
        for entry in entries:
            name = entry.name
            if name in self._seen_rings and name not in self._other_rings:
                continue
            pid = _ring_pid(name)
            if pid is None:
                continue
            if pid in followed:
                self._attach_heap(pid, name)
                continue
            if name in self._other_rings:
                continue
            session = HeapReader.session_of(name)
            if session == os.getpid():
                self._attach_heap(pid, name)
            elif session >= 0:
                self._seen_rings.add(name)
                self._other_rings.add(name)  # another session's, or none's

    def _attach_heap(self, pid: int, name: str) -> None:
        """Attaches to pid's heap ring `name`, once (a refused ring is warned about once and
        never attached later, so the warning stays true)."""
        try:
            info = os.lstat(f"/dev/shm/{name}")
        except OSError:
            return
        if (stat.S_ISREG(info.st_mode) and info.st_size < _HEAP_HEADER_BYTES
                and info.st_uid == _owner(pid)):
            return  # the shim is creating it right now: look again at the next poll
        self._seen_rings.add(name)
        self._other_rings.discard(name)
        image = self._images.get(self._image_of_pid.get(pid, 1))
        tracker = HeapTracker.attach(pid, name, image.resolver if image else self.resolver,
                                     self.warn, python=lambda: self._heap_python(pid))
        if tracker is None:
            return
        tracker.set_budget(self._heap_stack_budget)
        # The image that made the ring: its fork or exec record is in the perf ring by now
        # (the kernel writes it before the new image runs), drained here. Its stacks are
        # resolved with that image's mappings, never those of the image before an exec
        # (the main thread may not have taken the exec record yet); a ring of an image
        # that exec'd since is told apart by its creation time (_ring_image).
        self.sampler.poll(0)
        tracker.image = next(
            (live_image for live_pid, live_image in self.sampler.images() if live_pid == pid),
            None,
        )
        self._heaps[(pid, tracker.reader.inode)] = tracker

    def _ring_image(self, pid: int, heap: HeapTracker) -> int | None:
        """The image of pid that made the ring: the last one started (fork, exec) before
        the ring was created; None when that is not known."""
        created = heap.reader.created_ns
        starts = self._image_starts.get(pid)
        if not created or not starts:
            return None
        made = [image for started, image in starts if started <= created]
        return made[-1] if made else None

    def _heap_image_known(self, pid: int, heap: HeapTracker, final: bool) -> bool:
        """Whether a checkpoint may take the ring's stacks now. A ring attached after its
        process had exited has no image of its own: its stacks resolve with the pid's last
        image, known once a checkpoint has taken the process's EXIT record (drained before
        the ring was attached: so, at the latest, from the next checkpoint on)."""
        return heap.image is not None or pid in self._exited_pids or final

    def _heap_python(self, pid: int) -> PyFrameReader | None:
        """The frame reader that decodes the Python frames of pid's allocations: the one its
        CPU samples use (their function ids must agree), looked for now if the drain loop
        has not found it yet. None with --python=off or without a supported CPython."""
        if self._python is None:
            return None
        images = [image for live_pid, image in self.sampler.images() if live_pid == pid]
        if not images:
            if not process.is_alive(pid):
                return None  # gone (a ring it left behind): its code objects went with it
            raise PythonNotYet(pid)  # its fork or exec record is not drained yet
        return self._python.reader_for(pid, max(images))

    def _checkpoint(self, final: bool = False) -> bool:
        """Writes one checkpoint; returns True when the target has exited."""
        # The heap first, then the perf records: a heap stack may run through a library
        # dlopen'd or a process exec'd a moment ago, and their MMAP, FORK and EXEC records
        # were written to the perf ring before the allocation was, so polling it now brings
        # every one of them into this batch. (Taken the other way round, allocations read
        # after the take lost their frames in a just-loaded _asyncio module as [truncated].)
        heap_batches = [(ring, heap, heap.take()) for ring, heap in list(self._heaps.items())
                        if self._heap_image_known(ring[0], heap, final)]
        self.sampler.poll(0)
        batch = self.sampler.take()
        self._follow_processes(batch)
        renamed = self._follow_threads(batch)
        cpu = self._resolve_cpu(batch)
        offcpu = self._resolve_offcpu(batch)
        seen_tids = {tid for (_, tid) in cpu} | {tid for (_, tid, _) in offcpu}
        self._exited.update(batch.exited_threads)
        checkpoint = Checkpoint(
            timestamp_ms=int(time.time() * 1000),
            samples=batch.samples,
            lost_samples=batch.lost,
            cpu=cpu,
            offcpu=offcpu,
            threads={tid: self._python_names.get(tid) or self._thread_names.get(tid)
                     for tid in seen_tids | set(self._new_tids()) | renamed},
            thread_comms=self._thread_names,
            thread_pids=self._thread_pids,
            exited_threads=batch.exited_threads,
        )
        heap_parts = self._fill_heap(heap_batches, final)
        heap_parts.into(checkpoint)
        self._write_heap_meta(heap_parts)
        self._measure_target(checkpoint)
        if len(self.warnings) != self._warnings_written:
            self._warnings_written = len(self.warnings)
            self.writer.set_meta({"warnings": "\n".join(self.warnings)})
        self.writer.write_checkpoint(checkpoint)
        self._count(batch, heap_parts, cpu)
        self._write_offcpu_meta(batch)
        return not self._target_alive()

    def _follow_processes(self, batch: PerfBatch) -> None:
        """Forks, execs and exits, and the mappings each process image has."""
        names = dict(batch.comms)
        # A fork copies its parent's mappings, those the parent mapped in this batch too
        # (seen: `rsprof run python3` forking within its first second: every stack of the
        # child unresolved, the exec'd program's mappings missing from its copy).
        pending: dict[int, list[PerfMmap]] = {}
        for mmap in batch.mmaps:
            pending.setdefault(mmap.image, []).append(mmap)
        for kind, image, pid, ppid, parent_image, time_ns, command in batch.processes:
            if kind in ("fork", "exec"):
                self._image_starts.setdefault(pid, []).append((time_ns, image))
            if kind == "fork":
                self._add_mmaps(pending.pop(parent_image, []))
            self._process_event(kind, image, pid, ppid, parent_image, command or names.get(pid))
            if kind == "exec" and command is None and names.get(pid):
                # Gone before its command line could be read: its program's path, from
                # the mapping of the file the kernel named, is the next best thing.
                self._unnamed_images[image] = names[pid]
        self._add_mmaps([mmap for mmaps in pending.values() for mmap in mmaps])

    def _follow_threads(self, batch: PerfBatch) -> set[int]:
        """New threads and their names; returns the tids whose name changed."""
        for pid, tid in batch.new_threads:
            self._thread_pids[tid] = pid
            # Gone before its name could be read: a new thread starts with the comm of the
            # thread that made it, the process's as far as rsprof knows.
            self._thread_names.setdefault(
                tid, process.thread_name(pid, tid) or self._thread_names.get(pid))
            self._python_names.pop(tid, None)  # a reused tid: not the old thread's name
        for tid, name in batch.comms:
            self._thread_names[tid] = name
            # The kernel renamed it (an exec, or prctl): a Python name read before may be
            # the old program's. Still a Python thread, it is read again just below.
            self._python_names.pop(tid, None)
        return self._read_python_names() | {tid for tid, _ in batch.comms}

    def _resolve_cpu(self, batch: PerfBatch) -> dict[tuple[int, int], int]:
        """The batch's new stacks symbolized by their image's resolver; returns the
        samples per (stored stack, tid)."""
        by_image: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for native_id, image, ips in batch.new_stacks:
            by_image.setdefault(image, []).append((native_id, ips))
        for image, stacks in by_image.items():
            resolver = self._image(image).resolver
            if self._python is not None:
                resolver.python = self._python.readers.get(image)
            self._native_to_stored.update(resolver.resolve_stacks(stacks))
        cpu: dict[tuple[int, int], int] = {}
        for native_id, tid, count in batch.counts:
            key = (self._native_to_stored[native_id], tid)
            cpu[key] = cpu.get(key, 0) + count
        return cpu

    def _resolve_offcpu(self, batch: PerfBatch) -> dict[tuple[int, int, str], tuple[int, int]]:
        """The batch's off-CPU time per (stored stack, tid, state): (switch-outs, ns). Its
        stacks are among the batch's new stacks, symbolized by _resolve_cpu."""
        offcpu: dict[tuple[int, int, str], tuple[int, int]] = {}
        for native_id, tid, state, switches, ns in batch.offcpu:
            key = (self._native_to_stored[native_id], tid, state)
            had = offcpu.get(key, (0, 0))
            offcpu[key] = (had[0] + switches, had[1] + ns)
        return offcpu

    def _fill_heap(
        self, heap_batches: list[tuple[tuple[int, int], HeapTracker, HeapBatch | None]],
        final: bool,
    ) -> HeapParts:
        """What every ring's batch adds to this checkpoint; rings whose process exec'd or
        exited are read to their end and closed."""
        heap_parts = HeapParts()
        for ring, heap, heap_batch in heap_batches:
            if heap_batch is None:
                continue  # a dropped ring, its last batch already written
            pid = ring[0]
            # The image that made the ring (else, gone before it was attached, the pid's
            # last one): after an exec, the old ring's stacks keep the old mappings.
            made_by = self._ring_image(pid, heap)
            if made_by is None:
                made_by = heap.image if heap.image is not None else -1
            current = self._images.get(made_by)
            if current is None:
                current = self._images.get(self._image_of_pid.get(pid, 0))
            if current is not None:
                heap.resolver = current.resolver
            done = heap.fill(heap_parts, heap_batch)
            if not final:
                self._measure_heap_stacks(*heap.last_resolve)
            stats = heap.python_stats()
            if stats is not None:
                self._heap_py_stats[ring] = stats
            missed = heap.missed()
            for message in missed:
                if message not in self._missed_said:  # once, not once per child process
                    self._missed_said.add(message)
                    self.warn(f"heap of PID {pid}: {message}")
            if pid == self.target.pid or self._heap_mode is None:
                self._heap_mode = (heap.mode, heap.sample_bytes)
                self._heap_missed = "\n".join(missed)
            if done:
                # The process exec'd (its new image makes a new ring) or exited: nobody
                # writes the ring any more, and it is read to its end.
                name = heap.reader.name
                heap.close()
                del self._heaps[ring]
                _remove_left_ring(name, ring[1])
        return heap_parts

    def _write_heap_meta(self, heap_parts: HeapParts) -> None:
        """Heap meta that changed: the attach's (extra_meta), unknown frees, lost events
        (warned once), Python frames decoded, the heap mode and what the shims miss."""
        if self.extra_meta is not None:
            extra = self.extra_meta()
            if extra != self._extra_meta_written:
                self._extra_meta_written = extra
                self.writer.set_meta(extra)
        if heap_parts.unknown_frees:
            self._heap_unknown_frees += heap_parts.unknown_frees
            self.writer.set_meta({"heap_unknown_frees": self._heap_unknown_frees})
        if heap_parts.lost and not self._heap_lost_warned:
            self._heap_lost_warned = True
            self.warn("heap events were lost (a shim's ring was full, or /dev/shm had no room"
                      " for it): counted in heap_lost_events; heap totals are approximate")
        if self._heap_py_stats:
            rings = self._heap_py_stats.values()
            heap_meta = {f"heap_python_{key}": sum(stats[key] for stats in rings)
                         for key in ("decoded", "partial", "undecoded")}
            if heap_meta != self._heap_python_meta:
                self._heap_python_meta = heap_meta
                self.writer.set_meta(heap_meta)
        if self._heap_mode is not None and self._heap_meta_written != (
                self._heap_mode, self._heap_missed):
            # Written again when it changes: the shim sets its flags just after the ring's
            # header, and a first batch may predate them.
            self._heap_meta_written = (self._heap_mode, self._heap_missed)
            mode, sample_bytes = self._heap_mode
            meta: dict[str, object] = {"heap_mode": mode, "heap_sample_bytes": sample_bytes}
            if self._heap_missed:
                meta["heap_missed"] = self._heap_missed
            self.writer.set_meta(meta)

    def _count(self, batch: PerfBatch, heap_parts: HeapParts,
               cpu: dict[tuple[int, int], int]) -> None:
        """The recording's running totals (the progress line, the summary, meta)."""
        totals = self._totals
        totals.checkpoints += 1
        totals.samples += batch.samples
        totals.lost_samples += batch.lost
        totals.heap_live_bytes += heap_parts.live_bytes_change()
        if self._python is not None and self._python.runtimes:
            self._write_python_meta()
        self._count_heap_tracking(cpu)
        if batch.truncated:
            totals.truncated_samples += batch.truncated
            # counted in the profile, so `top` can say how many stacks are incomplete
            self.writer.set_meta({"truncated_samples": totals.truncated_samples})

    def _write_offcpu_meta(self, batch: PerfBatch) -> None:
        """Off-CPU switch-outs, lost and unpaired records so far (meta offcpu_*); lost
        records are warned of."""
        if not (self.sampler.offcpu or self._offcpu_meta):
            return
        off_meta = dict(self._offcpu_meta)
        for meta_key, value in (("offcpu_switches", batch.offcpu_switches),
                                ("offcpu_lost", batch.offcpu_lost),
                                ("offcpu_unpaired", batch.offcpu_unpaired)):
            off_meta[meta_key] = off_meta.get(meta_key, 0) + value
        shed = self.sampler.offcpu_kernel_shed
        if shed is not None and "offcpu_kernel_shed_rate" not in off_meta:
            at = round(max(0.0, shed[0] / 1e9 - self._started), 3)
            off_meta["offcpu_kernel_shed_s"], off_meta["offcpu_kernel_shed_rate"] = at, shed[1]
            self.warn(f"off-CPU kernel functions are not recorded after {at:.1f} s:"
                      f" {shed[1]:,} switch-outs/s passed --off-cpu-kernel-max-rate"
                      f" {self.options.offcpu_kernel_max_rate:,} (each cost the target 1-2 us);"
                      " later waits name none")
        if off_meta != self._offcpu_meta:
            self._offcpu_meta = off_meta
            self.writer.set_meta(dict(off_meta))
        if batch.offcpu_lost:
            self.warn("off-CPU records were lost (the off-CPU ring was full): counted in"
                      " meta offcpu_lost; off-CPU totals are low")

    def _measure_heap_stacks(self, stacks: int, seconds: float) -> None:
        """Sizes every heap reader's budget of new stacks per take() so that symbolizing a
        checkpoint's new stacks takes about HEAP_STACKS_SHARE of the interval at the cost
        measured now: checkpoints keep their cadence under a flood of new stacks, on a busy
        machine too, and the rest waits in the rings."""
        if stacks < HEAP_STACKS_MEASURED:
            return
        cost = seconds / stacks
        if self._heap_stack_cost is not None:
            cost = (cost + self._heap_stack_cost) / 2
        self._heap_stack_cost = cost
        budget = int(HEAP_STACKS_SHARE * self.options.interval_s / max(cost, 1e-9))
        self._heap_stack_budget = max(HEAP_STACKS_MIN, min(HEAP_STACKS_MAX, budget))
        # Set on every reader each time: one the drain thread attached meanwhile has it too.
        for heap in list(self._heaps.values()):
            heap.set_budget(self._heap_stack_budget)

    def _count_heap_tracking(self, cpu: dict[tuple[int, int], int]) -> None:
        """Adds the checkpoint's samples in the heap shim's own work to the totals, and
        their share to meta while heap tracking is on (docs/schema.md `heap_tracking_*`)."""
        totals = self._totals
        tracking = self.resolver.heap_tracking_stacks
        totals.heap_tracking_samples += sum(
            count for (stack_id, _), count in cpu.items() if stack_id in tracking)
        totals.counted_samples += sum(cpu.values())
        if self._heap_mode is None and not totals.heap_tracking_samples:
            return
        meta = {"heap_tracking_samples": totals.heap_tracking_samples,
                "heap_tracking_pct": round(100 * heap_tracking_share(totals), 1)}
        if meta != self._heap_tracking_meta:
            self._heap_tracking_meta = meta
            self.writer.set_meta(meta)

    def _add_mmaps(self, mmaps: list[PerfMmap]) -> None:
        for mmap in mmaps:
            comm = self._unnamed_images.get(mmap.image)
            if comm is not None and os.path.basename(mmap.path).startswith(comm[:15]):
                del self._unnamed_images[mmap.image]
                self.writer.update_process(self._image(mmap.image).row_id, command=mmap.path)
            self._image(mmap.image).resolver.add_mapping(
                Mapping(mmap.start, mmap.start + mmap.length, mmap.pgoff, mmap.path,
                        mmap.build_id.hex() if mmap.build_id else None)
            )

    def _write_python_meta(self) -> None:
        """How the Python frames were read (docs/schema.md, meta `python_*`)."""
        assert self._python is not None
        stats = self.sampler.python_stats()
        resolvers = {id(image.resolver): image.resolver for image in self._images.values()}
        runtimes = sorted({f"{'.'.join(map(str, r.version))} {r.path}"
                           for r in self._python.runtimes.values()})
        walks = stats["walks"]
        meta: dict[str, object] = {
            "python_runtimes": "\n".join(runtimes),
            # "bpf": frames read at sample time (python_bpf_*), "drain": read from outside
            # when the sample is drained (python_walks...), python_bpf_error says why
            "python_mode": stats["mode"],
            "python_bpf_error": stats["bpf_error"],
            "python_bpf_attached": stats["bpf_attached"],
            "python_drain_attached": stats["attached"],
            "python_bpf_missing": stats["bpf_missing"],
            "python_bpf_empty": stats["bpf_empty"],
            "python_bpf_fault": stats["bpf_fault"],
            "python_bpf_truncated": stats["bpf_truncated"],
            "python_bpf_freed": stats["bpf_freed"],
            "python_bpf_replaced": stats["bpf_replaced"],
            "python_bpf_ip_mismatch": stats["bpf_ip_mismatch"],
            "python_bpf_unpaired_records": stats["bpf_unpaired"],
            "python_bpf_ring_full": stats["bpf_ring_full"],
            # 3.11/3.12: the innermost _PyCFrame was being set up: read from the caller's
            "python_bpf_outer": stats["bpf_outer"],
            "python_bpf_pair_dt_ns": f"{stats['bpf_dt_min_ns']}..{stats['bpf_dt_max_ns']}",
            # samples of an interpreter's process taken before rsprof found the interpreter
            # (its start-up, while libpython was being mapped): native frames only
            "python_before_reader": stats["before_reader"],
            # off-CPU samples: read at the switch-out by the program ("bpf"), or at drain
            # time ("drain": python_offcpu_bpf_error says why); preempted ones then keep
            # their native frames (python_offcpu_unread_preempted)
            "python_offcpu_mode": "bpf" if stats["bpf_switch"] else "drain",
            "python_offcpu_bpf_error": stats["bpf_switch_error"],
            "python_offcpu_bpf_attached": stats["bpf_switch_attached"],
            "python_offcpu_bpf_missing": stats["bpf_switch_missing"],
            "python_offcpu_bpf_switches": stats["bpf_switches"],
            "python_offcpu_unread_preempted": stats["off_unread_preempted"],
            "python_offcpu_unread_ran": stats["off_unread_ran"],
            # the switch rate passed --off-cpu-kernel-max-rate: the program stopped reading
            # (s after the start; '' while it reads), and the off-CPU samples since
            "python_offcpu_shed_s": (round(max(0.0, stats["bpf_switch_shed_ns"] / 1e9
                                               - self._started), 3)
                                     if stats["bpf_switch_shed_ns"] else ""),
            "python_offcpu_shed_unread": stats["off_shed_unread"],
            "python_walks": walks,
            "python_spliced": sum(r.python_spliced for r in resolvers.values()),
            "python_between": sum(r.python_between for r in resolvers.values()),
            # chains that changed while read (or garbage): the sample keeps native frames
            "python_dropped": stats["dropped"],
            "python_retried": stats["retries"],
            "python_unpaired": sum(r.python_unpaired for r in resolvers.values()),
            "python_late": stats["late"],
            "python_stale_us_mean": round(stats["stale_ns_sum"] / walks / 1000, 1) if walks else 0,
            "python_stale_us_p50": _log2_quantile(stats["stale_log2_us"], 0.5),
            "python_stale_us_p90": _log2_quantile(stats["stale_log2_us"], 0.9),
            "python_stale_us_max": stats["stale_ns_max"] // 1000,
            "python_stale_over_1ms": stats["stale_over_1ms"],
            "python_walk_us_mean": round(stats["walk_ns_sum"] / walks / 1000, 1) if walks else 0,
        }
        if self.options.gil:
            # --gil: CPU samples left out (the thread did not hold the GIL), and those kept
            # without knowing (no BPF record, or the GIL could not be read)
            meta["python_gil_dropped"] = stats["gil_dropped"]
            self._totals.gil_dropped = stats["gil_dropped"]
            meta["python_gil_unknown"] = stats["gil_unknown"]
        if meta["python_offcpu_shed_s"] != "" and \
                self._python_meta.get("python_offcpu_shed_s", "") == "":
            self.warn(f"Python frames of off-CPU samples are not read after"
                      f" {meta['python_offcpu_shed_s']:.1f} s: the switch-outs passed"
                      f" --off-cpu-kernel-max-rate {self.options.offcpu_kernel_max_rate:,}/s"
                      " (each read costs the target microseconds); later waits show native"
                      " frames")
        if meta != self._python_meta:
            self._python_meta = meta
            self.writer.set_meta(meta)

    def _read_python_names(self) -> set[int]:
        """Reads the Python names of the Python threads (collector/pythreads.py; once per
        checkpoint, off the drain); returns the tids whose name is new or changed, so an
        idle thread renamed gets its row updated too."""
        if self._python is None:
            return set()
        changed = set()
        for tid, name in self._python.thread_names().items():
            if self._python_names.get(tid) != name:
                self._python_names[tid] = name
                changed.add(tid)
        return changed

    def _new_tids(self) -> list[int]:
        """Threads never written yet, so the threads table lists idle ones too."""
        fresh = [tid for tid in self._thread_names if tid not in self._written_tids]
        self._written_tids.update(fresh)
        return fresh

    def _follow_missed_threads(self) -> None:
        """Opens events for threads created during attach by a thread that had none yet.
        A thread missing from the sampler's list may only lack its FORK record, which the
        kernel writes just after the thread becomes visible: look twice before opening."""
        missing = self._untracked_threads()
        if missing:
            time.sleep(0.005)
            self.sampler.poll(0)
            for tid in missing & self._untracked_threads():
                self._open_thread(tid)

    def _untracked_threads(self) -> set[int]:
        tracked = set(self.sampler.threads())
        return {
            tid for tid in process.thread_ids(self.target.pid)
            if tid not in tracked and tid not in self._exited
        }

    # -- processes -----------------------------------------------------------------------

    def _image(self, image: int, pid: int | None = None) -> _Image:
        """The image's record; one never announced (its FORK record was lost) gets an empty
        resolver, filled from /proc/PID/maps if the process is still there."""
        found = self._images.get(image)
        if found is None:
            self._process_event("fork", image, pid or 0, 0, 0, None)
            found = self._images[image]
        return found

    def _process_event(
        self, kind: str, image: int, pid: int, ppid: int, parent_image: int, name: str | None
    ) -> None:
        if kind == "exit":
            self._exited_pids.add(pid)
            exited = self._images.get(image)
            if exited is not None:
                self.writer.update_process(exited.row_id, exited=True)
            return
        parent = self._images.get(parent_image)
        base = parent.resolver if parent is not None else self.resolver
        resolver = base.for_new_image(pid, forked=kind == "fork" and parent is not None)
        if parent is None and pid:
            try:
                for mapping in read_executable_maps(pid):
                    resolver.add_mapping(mapping)
            except OSError:
                pass  # gone already: its stacks stay unresolved addresses
        if kind == "fork":
            command = parent.command if parent is not None else name
        else:
            command = name
            ppid = parent.ppid if parent is not None and parent.ppid is not None else ppid
        row = self.writer.add_process(
            pid, ppid or None, parent.row_id if parent is not None else None, command
        )
        self._images[image] = _Image(row, pid, ppid or None, command, resolver)
        self._image_of_pid[pid] = image

    def _measure_target(self, checkpoint: Checkpoint) -> None:
        if self._psutil is None:
            return
        try:
            with self._psutil.oneshot():
                checkpoint.target_cpu_pct = self._psutil.cpu_percent(None)
                checkpoint.target_rss_bytes = self._psutil.memory_info().rss
        except psutil.Error:
            self._psutil = None

    def _target_alive(self) -> bool:
        """The target, or (following) any process it started, still runs. The sampler knows
        the followed processes whose EXIT it has not drained; /proc has the last word, in
        case an EXIT record was lost."""
        if self.child is not None and self.child.poll() is None:
            return True
        return any(process.is_alive(pid) for pid in self.sampler.processes())


def _freeze_garbage_collection() -> None:
    """Takes what exists now out of the cyclic garbage collector's sight, until the recording
    ends (Recorder.run unfreezes it). The recorder's caches (frames, locations, stacks: three
    tracked objects per frame) only grow, and every full collection walked them all again:
    under a flood of new heap stacks the collector took 31 % of the checkpoints' time
    (2.8 s of 8.9 s; 131 Ki new stacks, 245-280 k tracked objects). Frozen objects are still
    freed by reference counting; only a cycle that becomes garbage later waits for the end
    of the recording (measured: none after 204 checkpoints of a Python target, 27 objects
    after a shell script's 200 children). The young generations are collected first, so
    that what died in a cycle during this checkpoint is not frozen with the rest."""
    gc.collect(1)
    gc.freeze()


def _owner(pid: int) -> int | None:
    """The uid a process runs as (its rings' owner), None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _remove_left_ring(name: str, inode: int) -> None:
    """Removes the name of a ring read to its end whose image is gone (exited, or exec'd):
    a process that exited before it was attached, or exec'd, left it there for us."""
    path = f"/dev/shm/{name}"
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass


def _log2_quantile(histogram: list[int], q: float) -> int:
    """Upper bound (us) of the bucket holding quantile q: [0] < 1 us, [k] < 2^k us."""
    total = sum(histogram)
    seen = 0
    for bucket, count in enumerate(histogram):
        seen += count
        if total and seen >= q * total:
            return 1 << bucket
    return 0


def _raise_priority() -> None:
    """A target with hundreds of busy threads would otherwise starve the recorder (CFS gives
    it 1/N of a core): `-d 8s` took 15-30 s with 300 spinning threads. Like `perf record -r`,
    but with a nice value (never real-time: a stuck recorder must not freeze the machine).
    Needs CAP_SYS_NICE; without it, nothing changes."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > -10:
            os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass


def _raise_fd_limit() -> None:
    """A perf event fd per thread of the target (and per CPU event of a follow): a target
    of 1,500 threads stopped `rsprof -p` with "perf_event_open: Too many open files" under
    the usual soft limit of 1,024. The soft limit goes up to the hard one, as `perf record`
    does. Called once a launched target is forked (held before its exec): it keeps the
    user's limit."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        pass


def _parent_pid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None
