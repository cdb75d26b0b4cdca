"""Heap tracking: reads the target's shim ring (if it has one) into checkpoints."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rsprof.collector import process
from rsprof.collector.frames import FrameResolver
from rsprof.storage.callsite import call_site_position
from rsprof.storage.writer import Checkpoint, HeapCallSite, HeapDelta

from rsprof._native import HeapBatch, HeapReader, PyFrameReader

# Finds the PyFrameReader of the tracked process (the same one whose function ids the CPU
# samples carry), None when it has no supported CPython or Python frames are off; raises
# PythonNotYet while the process is not known to the sampler yet (asked again later).
PythonLookup = Callable[[], PyFrameReader | None]
# How long allocations with Python frames wait for their process's frame reader before
# they are kept with native stacks only (the ring buffers them meanwhile).
PYTHON_WAIT_S = 2.0
# At the end of a recording, how often a ring whose writer has not committed a record
# reserved before the stop is read again (HeapTracker.settle).
SETTLE_POLL_S = 0.001

# Ring header flags (native/heapring.h) by which the shim says that part of the heap escapes
# it, and what each costs the profile.
HF_MALLOC_ELSEWHERE = 1 << 5
HF_ALLOC_API = 1 << 6
MISSED = (
    (HF_MALLOC_ELSEWHERE,
     "its malloc is not the heap shim's (the executable or a library loaded before the shim "
     "defines it): allocations through it are not seen"),
    (HF_ALLOC_API,
     "it loads jemalloc's mallocx, tcmalloc's tc_* or mimalloc's mi_* functions: calls the "
     "program makes to them directly are not seen (malloc, free, new and delete are)"),
)


@dataclass
class HeapParts:
    """What the heap trackers add up for one checkpoint (mutable while they fill it; the
    checkpoint gets it once they are done)."""

    # (pid, tid) -> stack_id -> delta, by the process and thread that allocated
    deltas: dict[tuple[int, int], dict[int, HeapDelta]] = field(default_factory=dict)
    call_sites: dict[int, HeapCallSite] = field(default_factory=dict)  # of those stacks
    events: int = 0
    lost: int = 0
    # Frees of blocks the reader never saw allocated (allocated before the shim came, when
    # it was injected into a running process): counted, never subtracted from live bytes.
    unknown_frees: int = 0

    def into(self, checkpoint: Checkpoint) -> None:
        checkpoint.heap = {key: deltas for key, deltas in self.deltas.items() if deltas}
        checkpoint.heap_call_sites = self.call_sites
        checkpoint.heap_events = self.events
        checkpoint.heap_lost_events = self.lost

    def live_bytes_change(self) -> int:
        """Bytes allocated minus bytes freed in this checkpoint, all processes."""
        return sum(d.alloc_bytes - d.free_bytes
                   for deltas in self.deltas.values() for d in deltas.values())


class PythonNotYet(Exception):
    """The process's image is not known yet: look for its frame reader again later."""


class HeapTracker:
    """Wraps the C HeapReader: frees are charged to the allocating stack in C; here the new
    stacks are symbolized and each is given its call site."""

    def __init__(
        self, reader: HeapReader, resolver: FrameResolver,
        warn: Callable[[str], None] | None = None, python: PythonLookup | None = None,
    ) -> None:
        self.reader = reader
        self._python_lookup = python
        self._python_since: float | None = None  # first asked, while the image was unknown
        self.python_reader: PyFrameReader | None = None
        self._warn = warn
        # Set when the ring turned out corrupt or truncated: its heap data from then on is
        # dropped (one warning), the CPU recording goes on.
        self.dropped: str | None = None
        self._last_taken = False
        self.resolver = resolver
        # The sampler's image of the process that made the ring (set by the recorder;
        # None when the process was gone before the ring was attached).
        self.image: int | None = None
        self._native_to_stored: dict[int, int] = {}
        self._site_of_stack: dict[int, HeapCallSite] = {}
        self.sample_bytes = 0
        self.mode = "full"
        self.shim_flags = 0  # the ring header's flags, as of the last take()
        # The drain thread polls while the main thread takes: the reader is not shared-safe.
        self._lock = threading.Lock()
        # (new stacks, seconds) the last fill() spent symbolizing and storing them: the
        # recorder sizes every reader's budget of new stacks per take() by it.
        self.last_resolve: tuple[int, float] = (0, 0.0)
        # The last take() came while the reader had spent its budget of new stacks: more
        # waits in the ring (read by the polls after that take).
        self.deferred = False

    @classmethod
    def attach(
        cls, pid: int, name: str, resolver: FrameResolver,
        warn: Callable[[str], None] | None = None, python: PythonLookup | None = None,
    ) -> HeapTracker | None:
        """None when pid's ring `name` (in /dev/shm) is gone or not usable. Anything there
        that is not a valid ring (a FIFO, a directory, a symlink, another user's file, a bad
        header, a ring another rsprof reads) is refused through `warn`, one line, never
        raised: the CPU recording goes on."""
        try:
            reader = HeapReader.attach(pid, name)
        except FileNotFoundError:
            return None  # gone meanwhile (its process exited and removed it)
        except (OSError, ValueError) as error:
            if warn is not None:
                warn(f"heap ring of PID {pid} not used: {error}")
            return None
        return cls(reader, resolver, warn, python)

    def drain(self, max_laps: int = 256) -> None:
        """Reads the ring until it is empty (one poll reads at most one lap of it)."""
        for _ in range(max_laps):
            with self._lock:
                # The main thread may have closed it (its process exec'd or exited).
                if self.reader.closed:
                    return
                if self.dropped is not None:
                    # Keep handing the ring back unread: the target must neither fill it
                    # nor wait at exit for a reader that stopped reading.
                    self.reader.discard()
                    return
                try:
                    polled = self.reader.poll()
                    if self.reader.python_wanted:
                        # An allocation with Python frames: they are decoded against the
                        # process's frame reader, found now (None: native stacks only).
                        if not self._set_python():
                            return  # not known yet: the next drain asks again
                        continue
                    if polled == 0:
                        return
                except ValueError as error:  # the target's ring is untrusted input
                    self._drop(str(error))
                    return
                except MemoryError:
                    return  # the record is retried by the next poll

    def settle(self, mark: int, deadline: float) -> bool:
        """Reads until every record reserved below `mark` (the writers' cursor when the
        recording stopped) has been read. A writer stopped between its reservation and its
        commit (preempted for milliseconds on a loaded machine) stops the reader at its
        record, and every record after it, committed already, would have been left in the
        ring that the end of the recording removes. True once read, or once nothing more
        can come here (the ring closed or dropped, its process gone, the rest deferred to
        the next take or waiting for the frame reader); False at `deadline` (monotonic)."""
        while True:
            self.drain()
            with self._lock:
                reader = self.reader
                if (reader.closed or self.dropped is not None or reader.deferred
                        or reader.python_wanted or reader.read_pos >= mark):
                    return True
            if not process.is_alive(reader.pid):
                return True  # its last reservation will never be committed
            if time.monotonic() >= deadline:
                return False
            time.sleep(SETTLE_POLL_S)

    def set_budget(self, new_stacks: int) -> None:
        """New stacks one take() announces at most (clamped by the reader to 1 .. 65536)."""
        with self._lock:
            if not self.reader.closed:
                self.reader.new_stack_budget = new_stacks

    def python_stats(self) -> dict[str, int] | None:
        """New stacks with all, some or none of their Python frames decoded (totals since
        attach); None when the shim reads no Python frames in this process."""
        with self._lock:
            if self.reader.closed:
                return None
            stats = self.reader.python_stats()
        if not stats.pop("shim"):
            return None
        return stats

    def _set_python(self) -> bool:
        """Gives the reader its frame reader (or None); False to be asked again later."""
        reader = None
        if self._python_lookup is not None:
            try:
                reader = self._python_lookup()
            except PythonNotYet:
                now = time.monotonic()
                if self._python_since is None:
                    self._python_since = now
                if now - self._python_since < PYTHON_WAIT_S:
                    return False
            except OSError:
                reader = None
        self.python_reader = reader
        self.reader.set_python(reader)
        return True

    def _drop(self, reason: str) -> None:
        """Called with the lock held: stops reading a corrupt ring, keeps the recording."""
        self.dropped = reason
        if self._warn is not None:
            self._warn(f"{reason}; heap data from then on dropped, CPU recording goes on")

    @staticmethod
    def sweep_stale() -> None:
        """Removes rings nobody will read from /dev/shm: those killed processes left, and
        exited or exec'd images' rings whose session is gone (never blocks: anything that
        is not a regular file of ours is skipped)."""
        try:
            HeapReader.sweep_stale()
        except (OSError, ValueError):
            pass

    def take(self) -> HeapBatch | None:
        """What the ring delivered since the last take; None once a dropped ring's last
        batch was taken."""
        with self._lock:
            if self._last_taken:
                return None
            # Everything read before a corrupt record is valid: taken once more, then
            # nothing from this ring.
            self._last_taken = self.dropped is not None
            if not self.reader.closed:
                self.shim_flags = self.reader.shim_flags
                self.deferred = self.dropped is None and self.reader.deferred
            return self.reader.take()

    def missed(self) -> list[str]:
        """What the shim found escapes it in this process (MISSED), as of the last take()."""
        return [message for flag, message in MISSED if self.shim_flags & flag]

    def fill(self, parts: HeapParts, batch: HeapBatch) -> bool:
        """Adds a batch from take() to what one checkpoint collects from all the trackers,
        its new stacks resolved with `resolver` as it is now. True when the ring is done:
        the process exited, or exec'd (its new image, if it has the shim, makes a new
        ring)."""
        self.sample_bytes = batch.sample_bytes
        self.mode = "sampled" if self.sample_bytes else "full"
        if self.shim_flags & HF_MALLOC_ELSEWHERE:
            # Never a "full" profile that the program's own malloc left empty.
            self.mode = "partial"
        if self.python_reader is not None:
            # Function ids in the stacks are this reader's: the resolver names them by it.
            self.resolver.python = self.python_reader
        # The shim read each allocation's Python frames then and there, under the GIL.
        # Its first address is the shim's return address into malloc's caller.
        started = time.monotonic()
        stored = self.resolver.resolve_stacks(batch.new_stacks, python_read_late=False,
                                              leaf_is_return=True)
        self._native_to_stored.update(stored)
        for stack_id in stored.values():
            self._site_of_stack.setdefault(stack_id, self._call_site(stack_id))
        self.last_resolve = (len(batch.new_stacks), time.monotonic() - started)
        # Added to what the checkpoint has already (an exec'd process's old and new rings
        # may both be read in one interval), in place: a shell script's hundred children
        # are a hundred trackers in one checkpoint.
        # Per allocating thread: the C reader charges every event to its stack's total and
        # to its (stack, thread) entry alike, so the thread rows add up to the stack's.
        pid = self.reader.pid
        for native_id, tid, alloc_bytes, alloc_count, free_bytes, free_count in (
            batch.thread_sites
        ):
            stack_id = self._native_to_stored[native_id]
            parts.deltas.setdefault((pid, tid), {}).setdefault(stack_id, HeapDelta()).add(
                HeapDelta(alloc_bytes, alloc_count, free_bytes, free_count))
            parts.call_sites[stack_id] = self._site_of_stack[stack_id]
        parts.events += batch.events
        # Lost by the shim (ring full) or dropped by the reader's bounds (a flood).
        parts.lost += batch.lost + batch.dropped
        parts.unknown_frees += batch.unknown_frees
        return bool(batch.exited or batch.execed)

    def _call_site(self, stack_id: int) -> HeapCallSite:
        """The stack's call site (`storage.callsite`'s rule), chosen here once: readers
        cut the stack there and sum sites by its location."""
        frame_ids = self.resolver.ids.stack_frames[stack_id]
        frames = [self.resolver.frame_info[fid] for fid in frame_ids]
        # An allocation made by Python code is charged to the Python line that made it
        # (as memray does): the innermost Python frame, whatever interpreter or extension
        # C code lies between it and malloc (the full stack keeps those).
        python = next((i for i, fid in enumerate(frame_ids)
                       if self.resolver.is_python_frame(fid)), None)
        position = (python, 0) if python is not None else call_site_position(frames)
        if position is None:
            position = (0, 0)  # no location at all: the leaf (named by its address)
        frame, depth = position
        return HeapCallSite(frame, depth,
                            self.resolver.ids.location_id(frames[frame][1][depth]))

    def close(self) -> None:
        with self._lock:
            self.reader.close()  # idempotent
