"""The recording loop: sample every thread, checkpoint every interval, finalize on any stop.

Two threads share the work. A drain thread keeps the kernel rings empty (`poll` releases
the GIL while it waits, and parsing and stack de-duplication happen in C). The main thread
wakes once per interval, takes the aggregated batch, symbolizes what is new and commits
one checkpoint, so slow symbolization never makes the kernel drop samples.
"""

from __future__ import annotations

import errno
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import psutil
from rsprof.collector import process
from rsprof.collector.errors import PERMISSION_HINT, PermissionDenied, ProcessNotFound
from rsprof.collector.frames import FrameResolver
from rsprof.collector.heap import HeapTracker
from rsprof.collector.maps import Mapping, read_executable_maps
from rsprof.collector.process import Target
from rsprof.collector.symbols import Symbolizer
from rsprof.storage.writer import Checkpoint, ProfileWriter

from rsprof import __version__
from rsprof._native import PerfSampler


@dataclass(slots=True)
class RecordOptions:
    freq_hz: int = 99
    interval_s: float = 1.0
    duration_s: float | None = None
    ring_kib: int = 128
    heap: bool = True  # read the heap shim's ring when the target has one


@dataclass(slots=True)
class RecordResult:
    stop_reason: str
    checkpoints: int
    samples: int
    lost_samples: int
    threads: int
    heap_mode: str


class Recorder:
    """Records one target into one profile file."""

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
        self._heap: HeapTracker | None = None
        self._thread_names: dict[int, str | None] = {}
        self._exited: set[int] = set()
        self._psutil: psutil.Process | None = None
        self._totals = RecordResult("", 0, 0, 0, 0, "none")
        self._drain_error: BaseException | None = None
        self._drain_stop = threading.Event()
        self._native_to_stored: dict[int, int] = {}
        self._written_tids: set[int] = set()
        # Called once sampling is enabled; `rsprof run` releases the held child from here.
        self.on_attached: Callable[[], None] | None = None
        self._heap_meta_written = False
        # Problems that cost part of the data but not the recording (a refused or corrupt
        # heap ring, a module whose debug info could not be read): each said once, through
        # on_warning (the CLI prints it), and kept in meta `warnings` (docs/schema.md).
        self.on_warning: Callable[[str], None] | None = None
        self.warnings: list[str] = []
        self._warnings_written = 0
        self._warn_lock = threading.Lock()
        symbolizer.on_warning = self.warn  # corrupt debug info: fewer symbols, said once

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
        self._sampler = PerfSampler(pid, self.options.freq_hz, self.options.ring_kib)
        tids = process.thread_ids(pid)
        if not tids:
            raise ProcessNotFound(f"no process with PID {pid}")
        opened = 0
        for tid in tids:
            if self._open_thread(tid):
                opened += 1
        if opened == 0:
            raise ProcessNotFound(f"PID {pid} exited before it could be sampled")
        # A launched child is still the waiting shell: its real mappings arrive as MMAP2
        # records when it execs, and the shell's must not linger in the address space.
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
        if self.options.heap:
            HeapTracker.sweep_stale()
            self._heap = HeapTracker.attach(pid, self.resolver, self.warn)
        self.sampler.enable()
        if self.on_attached is not None:
            self.on_attached()

    def _open_thread(self, tid: int) -> bool:
        try:
            self.sampler.add_thread(tid)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EPERM):
                raise PermissionDenied(
                    f"perf_event_open on PID {self.target.pid} refused: permission denied;"
                    f" {PERMISSION_HINT}"
                ) from error
            if error.errno == errno.ESRCH:
                return False  # the thread exited between listing and opening
            raise
        self._thread_names.setdefault(tid, process.thread_name(self.target.pid, tid))
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
                "start_time": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
                "start_time_ms": int(now * 1000),
                "cpu_freq_hz": self.options.freq_hz,
                "cpu_event": "cpu-clock",
                "interval_ms": int(self.options.interval_s * 1000),
                "heap_mode": self._heap.mode if self._heap else "none",
                "heap_sample_bytes": self._heap.sample_bytes if self._heap else 0,
                "state": "recording",
            }
        )
        self.writer.commit()

    # -- loop ----------------------------------------------------------------------------

    def run(self) -> RecordResult:
        try:
            self._attach()
        except ProcessLookupError as error:  # ESRCH from any step: the target left
            raise ProcessNotFound(
                f"PID {self.target.pid} exited while rsprof was attaching ({error})"
            ) from error
        self._write_start_meta()
        drain = threading.Thread(target=self._drain_loop, name="rsprof-drain", daemon=True)
        drain.start()
        started = time.monotonic()
        next_checkpoint = started + self.options.interval_s
        deadline = started + self.options.duration_s if self.options.duration_s else None
        try:
            while True:
                wake = next_checkpoint if deadline is None else min(next_checkpoint, deadline)
                if self.stop_event.wait(max(0.0, wake - time.monotonic())):
                    break
                if self._drain_error is not None:
                    raise self._drain_error
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self.request_stop("duration")
                    break
                if self._checkpoint():
                    self.request_stop("target-exited")
                    break
                next_checkpoint += self.options.interval_s
                if next_checkpoint < now:  # fell behind (e.g. a long cold symbolization)
                    next_checkpoint = now + self.options.interval_s
        finally:
            self._stop_drain(drain)
        self._checkpoint(final=True)
        self.sampler.close()
        if self._heap:
            self._heap.close()
            # A target killed without a chance to unlink its ring leaves it behind.
            HeapTracker.sweep_stale()
        result = self._totals
        result.stop_reason = self.stop_reason or "interrupted"
        result.threads = len(self._thread_names)
        result.heap_mode = self._heap.mode if self._heap else "none"
        return result

    def _drain_loop(self) -> None:
        try:
            while not self._drain_stop.is_set():
                # The heap ring fills in milliseconds under an allocation storm: with a
                # heap attached, wake often and drain it until it is empty.
                self.sampler.poll(5 if self._heap else 50)
                if self._heap is None and self.options.heap:
                    # A launched target creates its ring only after exec, and a short one
                    # may be gone before the first checkpoint: look for it on every poll.
                    self._heap = HeapTracker.attach(self.target.pid, self.resolver, self.warn)
                if self._heap:
                    self._heap.drain()
                # Notice the target's exit within one poll, not at the next checkpoint: a
                # short command under `rsprof run` must not cost a whole interval.
                if not self._target_alive():
                    self.request_stop("target-exited")
                    return
        except BaseException as error:  # surfaced to the main loop, never lost
            self._drain_error = error
            self.stop_event.set()

    def _stop_drain(self, drain: threading.Thread) -> None:
        self._drain_stop.set()
        drain.join()
        self.sampler.poll(0)
        if self._heap:
            self._heap.drain()

    def _checkpoint(self, final: bool = False) -> bool:
        """Writes one checkpoint; returns True when the target has exited."""
        batch = self.sampler.take()
        for start, length, pgoff, path, build_id in batch.mmaps:
            self.resolver.add_mapping(
                Mapping(start, start + length, pgoff, path, build_id.hex() if build_id else None)
            )
        for tid in batch.new_threads:
            self._thread_names.setdefault(tid, process.thread_name(self.target.pid, tid))
        for tid, name in batch.comms:
            self._thread_names[tid] = name
        if not final:
            self._follow_missed_threads()
        stack_ids = self.resolver.resolve_stacks(batch.new_stacks)
        self._native_to_stored.update(stack_ids)
        cpu: dict[tuple[int, int], int] = {}
        for native_id, tid, count in batch.counts:
            key = (self._native_to_stored[native_id], tid)
            cpu[key] = cpu.get(key, 0) + count
        seen_tids = {tid for (_, tid) in cpu}
        self._exited.update(batch.exited_threads)
        checkpoint = Checkpoint(
            timestamp_ms=int(time.time() * 1000),
            samples=batch.samples,
            lost_samples=batch.lost,
            cpu=cpu,
            threads={tid: self._thread_names.get(tid) for tid in seen_tids | set(self._new_tids())},
            exited_threads=batch.exited_threads,
        )
        if self._heap:
            self._heap.fill_checkpoint(checkpoint)
            if not self._heap_meta_written:
                self._heap_meta_written = True
                self.writer.set_meta(
                    {"heap_mode": self._heap.mode, "heap_sample_bytes": self._heap.sample_bytes}
                )
        self._measure_target(checkpoint)
        if len(self.warnings) != self._warnings_written:
            self._warnings_written = len(self.warnings)
            self.writer.set_meta({"warnings": "\n".join(self.warnings)})
        self.writer.write_checkpoint(checkpoint)
        totals = self._totals
        totals.checkpoints += 1
        totals.samples += batch.samples
        totals.lost_samples += batch.lost
        return bool(batch.target_exited) or not self._target_alive()

    def _new_tids(self) -> list[int]:
        """Threads never written yet, so the threads table lists idle ones too."""
        fresh = [tid for tid in self._thread_names if tid not in self._written_tids]
        self._written_tids.update(fresh)
        return fresh

    def _follow_missed_threads(self) -> None:
        """Catches threads the FORK records could not announce (created during attach)."""
        tracked = set(self.sampler.threads())
        for tid in process.thread_ids(self.target.pid):
            if tid not in tracked and tid not in self._exited:
                self._open_thread(tid)

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
        if self.child is not None:
            return self.child.poll() is None
        try:
            return psutil.Process(self.target.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
