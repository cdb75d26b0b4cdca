"""What the followed file answers with: immutable rows and results the TUI draws."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

TREND_LEN = 12
"""Checkpoints kept per row for the Trend sparkline."""


@dataclass(frozen=True, slots=True)
class ProfileInfo:
    """What `meta` says about the recording."""

    pid: int | None = None
    process_name: str = ""
    cmdline: str = ""
    start_time_ms: int | None = None
    end_time_ms: int | None = None
    state: str = ""
    stop_reason: str | None = None
    heap_mode: str = "none"
    interval_ms: int = 1000
    target_exit_code: int | None = None
    kernel_sampled: bool = True  # False: time in the kernel was not allowed to be sampled
    python: bool = False  # a CPython whose frames were read (the TUI hides its runtime)
    launched: bool = False  # started by `rsprof run`: stopping the recording ends it
    # `rsprof -p` loaded the heap shim into the running process: its heap is known since
    # then (local HH:MM:SS; meta heap_attached_at), "" otherwise.
    heap_since_attach: str = ""
    heap_off_reason: str = ""  # why heap tracking could not start in it (meta)
    cpu_freq_hz: int = 99  # a CPU sample stands for 1 / cpu_freq_hz s on the CPU (wall time)
    offcpu_event: str = ""  # meta offcpu_event: '' when off-CPU time was not recorded
    offcpu_error: str = ""  # meta offcpu_error: why it could not be


@dataclass(frozen=True, slots=True)
class CheckpointSummary:
    """Totals over every checkpoint read so far."""

    count: int = 0
    last_id: int = 0
    first_timestamp_ms: int | None = None
    last_timestamp_ms: int | None = None
    samples: int = 0
    lost_samples: int = 0
    last_samples: int = 0
    target_cpu_pct: float | None = None
    target_rss_bytes: int | None = None


class CpuRow(NamedTuple):
    """One function (a name in a module: `storage.granularity`'s "functions" entry, as
    `rsprof top cpu` counts them).

    self: samples whose innermost frame is in the function; total: samples with the
    function anywhere on the stack, once per sample even under recursion (`top`'s Self and
    Total). live: total samples in the last checkpoint interval; trend: total samples in
    each of the last checkpoints. Percentages are of every sample of the thread shown
    (before the filters, as pprof's).

    (A NamedTuple: the table may hold 10 000 of them, rebuilt at every refresh.)"""

    key: int
    function: str
    location: str
    self_samples: int
    total_samples: int
    live_samples: int
    self_pct: float
    total_pct: float
    live_pct: float
    trend: tuple[int, ...]


class HeapRow(NamedTuple):
    """One allocation call site (`storage.granularity`'s "lines" entry of the trimmed
    stack's leaf, as `rsprof top heap` keys sites).

    free_bytes, free_count: the blocks allocated here that were freed (by any thread), as
    `top heap`'s Frees counts them. growing: `top heap`'s Growing (`storage.analysis.
    growing_sites`): the site's live bytes, whole process, never fell and rose over the
    last checkpoints read."""

    key: int
    function: str
    location: str
    live_bytes: int
    alloc_bytes: int
    alloc_count: int
    free_bytes: int
    free_count: int
    trend: tuple[int, ...]
    growing: bool = False


class OutputChunk(NamedTuple):
    """What the launched target wrote, as read from one of its ptys (`target_output`)."""

    id: int
    time_ms: int
    stream: str  # 'stdout' | 'stderr'
    data: bytes


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    tid: int
    name: str
    samples: int
    exited: bool
    pid: int | None = None  # its process (a recording that followed children has several)
    process: str = ""  # that process's command, its latest program


@dataclass(frozen=True, slots=True)
class Neighbour:
    """A caller or callee of a peeked function: samples with that call edge on the stack."""

    key: int
    function: str
    location: str
    samples: int
    pct: float  # of the peeked function's total samples


@dataclass(frozen=True, slots=True)
class PeekInfo:
    """pprof's peek for one function: its self and total samples, who calls it, whom it calls."""

    key: int
    function: str
    location: str
    self_samples: int
    total_samples: int
    all_samples: int  # every sample of the range and thread (the percentages' base)
    callers: tuple[Neighbour, ...]
    callees: tuple[Neighbour, ...]


@dataclass(frozen=True, slots=True)
class CallNode:
    """A node of the top-down call tree: `path` is the function keys from the root."""

    path: tuple[int, ...]
    key: int
    function: str
    location: str
    total_samples: int
    self_samples: int
    children: tuple[CallNode, ...]
    base_samples: int = 0  # the root: every sample before the filters (percentages' base)


@dataclass(frozen=True, slots=True)
class HeapTimeline:
    """Live bytes of the whole heap over time: (ms since start, bytes) at bucket ends,
    each bucket its highest value, so a short peak is never averaged away. Live bytes are
    what the allocator shim saw allocated and not yet freed (not the process's RSS)."""

    points: tuple[tuple[float, int], ...]
    peak_bytes: int
    peak_offset_ms: int | None  # when the peak was first reached, since the start
    current_bytes: int


@dataclass(frozen=True, slots=True)
class Series:
    """A chart's data: `points` are (seconds since recording start, value), one per bucket."""

    start_ms: int
    end_ms: int
    bucket_ms: int
    points: tuple[tuple[float, float], ...]


def location_text(file: str, line: int) -> str:
    """`file:line` as the Location column shows it; `?` when unknown."""
    if not file:
        return "?"
    return f"{file}:{line}" if line else file
