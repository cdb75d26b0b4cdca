"""Incremental, read-only reader of a profile file: every query the TUI makes.

`LiveProfile` follows one file (`follow.FollowedFile`: meta, checkpoints, threads, frames)
and keeps the CPU (`cpu.CpuModel`) and heap (`heap.HeapModel`) numbers of the thread
shown, and its wall-clock numbers (`wall.WallModel`) once they are first asked for (they
read every CPU sample again: a session that never opens the Wall view does not pay).
Each `refresh()` reads only the checkpoints newer than the last one it saw; older history
is never kept per checkpoint: charts and time windows query the file.

It reads through the reports' model: stacks are `storage.samples` frames, functions and
call sites are `storage.granularity` entries, filters are `storage.filters.FrameFilter`
and windows `storage.samples.TimeRange`; so what a view shows is what `rsprof top`,
`peek` and `export` select with the same options (`tui.model.Snapshot.selection`).

All public methods take one lock, so a LiveProfile may be used from any thread (one at a
time); its connection is opened with `check_same_thread=False` for that reason.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from rsprof.storage.filters import FrameFilter
from rsprof.storage.live.cpu import CpuModel
from rsprof.storage.live.follow import FollowedFile
from rsprof.storage.live.functions import NO_FILTER, WHOLE_RECORDING, FunctionLabels
from rsprof.storage.live.heap import HeapModel
from rsprof.storage.live.rows import (
    TREND_LEN,
    CallNode,
    CheckpointSummary,
    CpuRow,
    HeapRow,
    HeapTimeline,
    Neighbour,
    OutputChunk,
    PeekInfo,
    ProfileInfo,
    Series,
    ThreadInfo,
)
from rsprof.storage.live.wall import WallModel
from rsprof.storage.samples import TimeRange

__all__ = [
    "NO_FILTER", "TREND_LEN", "WHOLE_RECORDING", "CallNode", "CheckpointSummary", "CpuRow",
    "HeapRow", "HeapTimeline", "LiveProfile", "Neighbour", "OutputChunk", "PeekInfo",
    "ProfileInfo", "Series", "ThreadInfo",
]


class LiveProfile:
    """Follows one profile file; see the module docstring."""

    def __init__(self, path: str | Path, *, trend_len: int = TREND_LEN) -> None:
        self._lock = threading.RLock()
        self.file = FollowedFile(path)
        self.path = self.file.path
        self.trend_len = trend_len
        self.thread: int | None = None
        labels = FunctionLabels()
        self.cpu = CpuModel(self.file, labels, trend_len)
        self.heap = HeapModel(self.file, labels, trend_len)
        # its own labels: a function's hottest line is where its time goes, not its samples
        self.wall = WallModel(self.file, FunctionLabels(), trend_len)
        self._wall_wanted = False
        self._offcpu_seen = False

    @property
    def info(self) -> ProfileInfo:
        return self.file.info

    def close(self) -> None:
        with self._lock:
            self.file.conn.close()

    def set_thread(self, tid: int | None) -> None:
        """Restricts CPU and heap numbers to one thread (None: all threads); the heap by
        the thread that allocated, when the file keeps it (`heap_by_thread`). The next
        `refresh()` re-reads the file for that thread."""
        with self._lock:
            if tid != self.thread:
                self.thread = tid
                self.cpu.reset(tid)
                self.heap.reset(tid)
                self.wall.reset(tid)

    def refresh(self) -> bool:
        """Reads what was committed since the last call. Returns True if anything was new."""
        with self._lock:
            try:
                self.file.conn.execute("BEGIN")
            except sqlite3.OperationalError:
                return False
            try:
                return self._refresh_locked()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # the recorder has not created the schema yet
                    return False
                raise
            finally:
                self.file.conn.execute("COMMIT")

    def _refresh_locked(self) -> bool:
        changed = self.file.read_meta()
        new = self.file.read_checkpoints()
        last = self.file.last_id
        if self.cpu.last_id < last:
            self.cpu.read(last)
            changed = True
        if self.heap.last_id < last:
            self.heap.read(last)
        if self._wall_wanted and self.wall.last_id < last and self._has_offcpu_table():
            self.wall.read(last)
            changed = True
        if new:
            self.file.read_threads()
        return bool(changed or new)

    # -- results ------------------------------------------------------------------------------

    def summary(self) -> CheckpointSummary:
        with self._lock:
            return self.file.summary()

    def threads(self) -> list[ThreadInfo]:
        with self._lock:
            return self.file.threads()

    @property
    def heap_by_thread(self) -> bool:
        with self._lock:
            return self.heap.by_thread

    @property
    def has_heap_data(self) -> bool:
        with self._lock:
            return self.heap.has_data

    def _has_offcpu_table(self) -> bool:
        return self.file.has_table("offcpu_stack_samples")

    @property
    def has_offcpu_data(self) -> bool:
        """The file holds off-CPU time (some `offcpu_stack_samples` row): the Wall view has
        more to show than the CPU view."""
        with self._lock:
            if not self._offcpu_seen and self._has_offcpu_table():
                self._offcpu_seen = bool(self.file.rows(
                    "SELECT 1 FROM offcpu_stack_samples LIMIT 1"))
            return self._offcpu_seen

    def no_offcpu_reason(self) -> str:
        """Why the file has no off-CPU time ('' when it has some), as the TUI says it."""
        if self.has_offcpu_data:
            return ""
        info = self.file.info
        if info.offcpu_error:
            return f"off-CPU time was not recorded: {info.offcpu_error}"
        if not self._has_offcpu_table():
            return "no off-CPU time: the file is from before rsprof recorded it"
        if not info.offcpu_event:
            return "no off-CPU time: recorded with --no-off-cpu"
        return "no off-CPU time yet: no thread has waited"

    def _model(self, wall: bool) -> CpuModel:
        """The CPU model, or the wall model read up to the last checkpoint read."""
        if not wall:
            return self.cpu
        self._wall_wanted = True
        last = self.file.last_id
        if self.wall.last_id < last and self._has_offcpu_table():
            self.wall.read(last)
        return self.wall

    def cpu_rows(self, filters: FrameFilter = NO_FILTER,
                 time_range: TimeRange = WHOLE_RECORDING, *, wall: bool = False) -> list[CpuRow]:
        """Functions by CPU samples, or (`wall`) by wall-clock nanoseconds."""
        with self._lock:
            return self._model(wall).rows(filters, time_range)

    def call_tree(self, time_range: TimeRange = WHOLE_RECORDING,
                  filters: FrameFilter = NO_FILTER, *, wall: bool = False) -> CallNode:
        with self._lock:
            return self._model(wall).call_tree(time_range, filters)

    def peek(self, key: int, time_range: TimeRange = WHOLE_RECORDING,
             filters: FrameFilter = NO_FILTER, *, wall: bool = False) -> PeekInfo:
        with self._lock:
            return self._model(wall).peek(key, time_range, filters)

    def cpu_series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int,
                   filters: FrameFilter = NO_FILTER, *, wall: bool = False) -> Series:
        with self._lock:
            return self._model(wall).series(key, start_ms, end_ms, bucket_ms, filters)

    def heap_rows(self, filters: FrameFilter = NO_FILTER) -> list[HeapRow]:
        with self._lock:
            return self.heap.rows(filters)

    def heap_tree(self, filters: FrameFilter = NO_FILTER, allocated: bool = False) -> CallNode:
        with self._lock:
            return self.heap.tree(filters, allocated)

    def heap_timeline(self, points: int = 120) -> HeapTimeline:
        with self._lock:
            return self.heap.timeline(points)

    def heap_series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int,
                    filters: FrameFilter = NO_FILTER) -> Series:
        with self._lock:
            return self.heap.series(key, start_ms, end_ms, bucket_ms, filters)

    def output(self, after_id: int = 0, limit: int = 2000) -> list[OutputChunk]:
        """What the target wrote (`target_output`: `rsprof run` keeps it, saved at each
        checkpoint), the chunks after id `after_id` in order, at most `limit`."""
        with self._lock:
            if not self.file.has_table("target_output"):
                return []
            return [OutputChunk(*row) for row in self.file.rows(
                "SELECT id, time_ms, stream, data FROM target_output WHERE id > ?"
                " ORDER BY id LIMIT ?", (after_id, limit))]

    def time_range(self, start_ms: int, end_ms: int) -> TimeRange:
        """A window of absolute timestamps as `--since/--until` give it (seconds from the
        recording's start)."""
        with self._lock:
            origin = self.file.recording_start_ms
            return TimeRange(max(0.0, (start_ms - origin) / 1000), (end_ms - origin) / 1000)
