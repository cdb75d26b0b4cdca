"""A profile's samples in memory, as pprof models them: the one input every export and
every pprof-style analysis (filters, granularity, peek, traces, diff) works on.

A `Sample` is a call stack (leaf first) of `Frame`s with one value per sample type. A
`Frame` is one instruction address (pprof's Location); its `lines` are the functions at
that address, innermost inlined first (pprof's Location.line order). CPU samples keep their
thread; heap samples are per allocating stack (the shim does not record threads).

Heap stacks start at the call site: the shim's, allocator and C/C++/Rust runtime frames
above the first user frame are dropped by the rules in `storage.callsite`, so a stack's
leaf is the same call site `rsprof top heap` and `heap_samples` report.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rsprof.storage.callsite import call_site_position, is_interpreter_module, is_python_address
from rsprof.storage.errors import ProfileError
from rsprof.storage.reader import Profile
from rsprof.storage.schema import u64_from_sql

CPU_SAMPLE_TYPES = (("samples", "count"), ("cpu", "nanoseconds"))
# Off-CPU: the time each switched-out stack waited until its thread ran again, and how many
# switch-outs; wall: on-CPU (samples x period) plus off-CPU time, both kept apart too.
OFFCPU_SAMPLE_TYPES = (("offcpu", "nanoseconds"), ("switches", "count"))
WALL_SAMPLE_TYPES = (("wall", "nanoseconds"), ("cpu", "nanoseconds"), ("offcpu", "nanoseconds"))
# Kinds whose samples are per thread (all but heap)
THREAD_KINDS = ("cpu", "offcpu", "wall")
KINDS = ("cpu", "heap", "offcpu", "wall")
# Why a thread left the CPU (offcpu_stack_samples.state): the leaf frame of its off-CPU stack
OFFCPU_STATES = {
    "S": "[sleeping]",
    "D": "[uninterruptible wait]",
    "R": "[preempted]",
    "I": "[idle]",
    "T": "[stopped]",
}
# The `[kernel]` frame (collector.frames.KERNEL_FUNCTION: time in the kernel, an off-CPU
# stack's leaf before its state's frame) and the module of a waited-in kernel function
# (collector.kallsyms.KERNEL_MODULE).
KERNEL_FUNCTION = "[kernel]"
KERNEL_MODULE = "[kernel.kallsyms]"


def is_kernel_frame(frame: Frame) -> bool:
    """The kernel's time: the `[kernel]` frame, or a kernel function an off-CPU wait is in."""
    return bool(frame.lines and frame.lines[0].function == KERNEL_FUNCTION) or (
        frame.module == KERNEL_MODULE)


# A CPython thread asleep in the GIL's condition variable (take_gil, or drop_gil waiting for
# the switch): the leaf of its off-CPU stack instead of [sleeping] (offcpu_stack).
GIL_WAIT = "[waiting for the GIL]"
# glibc's and musl's condition-variable waits as symbols name them (the versioned and
# internal aliases: pthread_cond_timedwait, ___pthread_cond_timedwait64, ___pthread_cond_wait,
# pthread_cond_clockwait); not __pthread_cond_wait_common, which they call.
_COND_WAIT = re.compile(r"^_*pthread_cond_(timed|clock)?wait(64)?$")
HEAP_SAMPLE_TYPES = (
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
)


@dataclass(frozen=True, slots=True)
class Line:
    """One function at one source line (pprof's Line + Function)."""

    location_id: int
    function: str
    system_name: str  # mangled name; equals `function` when there is none
    file: str
    line: int


@dataclass(frozen=True, slots=True)
class Mapping:
    """One executable mapping of a module in the target (pprof's Mapping)."""

    id: int
    start: int
    end: int
    file_offset: int
    path: str
    build_id: str


@dataclass(frozen=True, slots=True)
class Frame:
    """One instruction address of a stack (pprof's Location). Heap stacks trimmed inside an
    inline chain get a frame with fewer lines: identity is the whole value, not `id`."""

    id: int
    address: int
    module: str  # module path, '' when no mapping covers the address
    module_offset: int
    mapping: Mapping | None
    lines: tuple[Line, ...]  # innermost inlined function first, never empty


@dataclass(slots=True)
class Sample:
    frames: tuple[Frame, ...]  # leaf first
    values: list[int]  # one per SampleSet.sample_types
    tid: int | None = None  # CPU: the sampled thread (heap samples are merged over threads)
    thread_name: str = ""
    freed: tuple[int, int] = (0, 0)  # heap: (objects, bytes) freed in the range
    pid: int | None = None  # CPU: the process of the sampled thread
    # CPU loaded per checkpoint: the checkpoint's interval (absolute Unix ms, start and end)
    # the samples were taken in; None when merged over the whole range.
    interval_ms: tuple[int, int] | None = None


@dataclass(slots=True)
class SampleSet:
    """Samples of one kind (cpu or heap) over a time range of one profile."""

    kind: str
    sample_types: tuple[tuple[str, str], ...]
    default_index: int  # the value reports use unless told otherwise
    samples: list[Sample]
    start_ms: int  # absolute Unix ms the range starts at
    end_ms: int  # absolute Unix ms the range ends at
    period_ns: int = 0  # CPU: nanoseconds one sample stands for; heap: 0
    meta: dict[str, str] = field(default_factory=dict)
    # pid -> process name (`comm` of the target, the command's program of a followed child)
    process_names: dict[int, str] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ms - self.start_ms) * 1_000_000

    def value_index(self, name: str | None) -> int:
        """Index of a sample type given by name (`inuse_space`) or number; default if None."""
        if name is None:
            return self.default_index
        names = [sample_type for sample_type, _ in self.sample_types]
        if name in names:
            return names.index(name)
        if name.isdigit() and int(name) < len(names):
            return int(name)
        raise ValueError(f"unknown sample index {name!r} for a {self.kind} profile:"
                         f" use one of {', '.join(names)}")

    def total(self, index: int | None = None) -> int:
        i = self.default_index if index is None else index
        return sum(sample.values[i] for sample in self.samples)


@dataclass(frozen=True, slots=True)
class TimeRange:
    """Seconds from the start of the recording; None = open end. A checkpoint belongs to
    the range when the middle of its interval does, so the resolution is the checkpoint
    interval (`-i`, 1 s by default)."""

    since_s: float | None = None
    until_s: float | None = None

    def describe(self) -> str:
        """As the options say it: "--since 10s --until 12s"."""
        parts = [f"{name} {value:g}s" for name, value in
                 (("--since", self.since_s), ("--until", self.until_s)) if value is not None]
        return " ".join(parts) or "(whole recording)"


def load_samples(
    profile: Profile,
    kind: str,
    *,
    time_range: TimeRange = TimeRange(),
    tid: int | None = None,
    pid: int | None = None,
    per_checkpoint: bool = False,
) -> SampleSet:
    """Every CPU (or heap) sample of `profile` in `time_range`, for one thread if `tid`, one
    process if `pid`. `per_checkpoint` keeps CPU samples of each checkpoint apart (with its
    interval) instead of merging them over the range: the resolution of a timeline."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: use {', '.join(KINDS)}")
    meta = profile.meta()
    checkpoints, start_ms, end_ms = _checkpoints_in_range(profile, meta, time_range)
    frames = FrameTable(profile)
    freq = int(meta.get("cpu_freq_hz") or 99)
    period_ns = 1_000_000_000 // max(1, freq)
    if kind == "cpu":
        samples = _cpu_samples(profile, frames, checkpoints, tid, pid, period_ns,
                               per_checkpoint=per_checkpoint)
        return SampleSet("cpu", CPU_SAMPLE_TYPES, 0, samples, start_ms, end_ms,
                         period_ns=period_ns, meta=meta, process_names=_process_names(profile))
    if kind in ("offcpu", "wall"):
        off = _offcpu_samples(profile, frames, checkpoints, tid, pid,
                              per_checkpoint=per_checkpoint)
        if kind == "offcpu":
            return SampleSet("offcpu", OFFCPU_SAMPLE_TYPES, 0, off, start_ms, end_ms,
                             period_ns=1, meta=meta, process_names=_process_names(profile))
        # wall: a CPU sample stands for one period of its thread's time on the CPU
        wall = [Sample(sample.frames, [sample.values[1], sample.values[1], 0], sample.tid,
                       sample.thread_name, pid=sample.pid, interval_ms=sample.interval_ms)
                for sample in _cpu_samples(profile, frames, checkpoints, tid, pid, period_ns,
                                           per_checkpoint=per_checkpoint)]
        wall += [Sample(sample.frames, [sample.values[0], 0, sample.values[0]], sample.tid,
                        sample.thread_name, pid=sample.pid, interval_ms=sample.interval_ms)
                 for sample in off]
        return SampleSet("wall", WALL_SAMPLE_TYPES, 0, wall, start_ms, end_ms,
                         period_ns=1, meta=meta, process_names=_process_names(profile))
    samples = _heap_samples(profile, frames, checkpoints, pid, tid)
    return SampleSet("heap", HEAP_SAMPLE_TYPES, 3, samples, start_ms, end_ms, meta=meta,
                     process_names=_process_names(profile))


def _process_names(profile: Profile) -> dict[int, str]:
    """The target's `comm` (meta), and for followed children their command's program name."""
    names: dict[int, str] = {}
    if profile.has("processes"):
        for pid, command in profile.rows("SELECT pid, COALESCE(command, '') FROM processes"
                                         " ORDER BY id"):
            program = command.split(" ", 1)[0].rsplit("/", 1)[-1]
            names.setdefault(int(pid), program or str(pid))
    meta = profile.meta()
    if str(meta.get("pid", "")).isdigit():
        names[int(meta["pid"])] = meta.get("process_name") or names.get(int(meta["pid"]), "")
    return names


def _checkpoints_in_range(
    profile: Profile, meta: dict[str, str], time_range: TimeRange
) -> tuple[list[tuple[int, bool]], int, int]:
    rows = profile.rows("SELECT id, timestamp_ms FROM checkpoints ORDER BY id")
    recording_start = int(meta.get("start_time_ms") or (rows[0][1] if rows else 0))
    return checkpoints_in_range(rows, recording_start, time_range)


def checkpoints_in_range(
    rows: Sequence[tuple[int, int]], recording_start: int, time_range: TimeRange
) -> tuple[list[tuple[int, bool]], int, int]:
    """(checkpoint id, inside the range) for every checkpoint up to the range's end, and the
    range's absolute start and end in Unix ms, from (id, timestamp_ms) rows in id order.
    Heap in-use numbers need the checkpoints before the range too: what was live at its
    start is still live unless freed. The TUI's followed file uses the same rule, so its
    time window and `--since/--until` select the same checkpoints."""
    since = time_range.since_s
    until = time_range.until_s
    result: list[tuple[int, bool]] = []
    previous_end = recording_start
    range_start: int | None = None
    range_end = recording_start
    for checkpoint_id, end in rows:
        middle_s = ((previous_end + end) / 2 - recording_start) / 1000
        interval_start = previous_end
        previous_end = end
        if until is not None and middle_s >= until:
            break
        inside = since is None or middle_s >= since
        result.append((checkpoint_id, inside))
        if inside:
            if range_start is None:
                range_start = interval_start
            range_end = end
    return result, range_start if range_start is not None else range_end, range_end


def _id_list(ids: Iterable[int]) -> str:
    return ",".join(str(int(i)) for i in ids) or "NULL"


def _cpu_samples(
    profile: Profile,
    frames: FrameTable,
    checkpoints: list[tuple[int, bool]],
    tid: int | None,
    pid: int | None,
    period_ns: int,
    *,
    per_checkpoint: bool = False,
) -> list[Sample]:
    inside = _id_list(cid for cid, within in checkpoints if within)
    # Files recorded before processes were followed have no threads.pid: all of it is the
    # one process in meta.
    has_pid = "pid" in {row[1] for row in profile.rows("PRAGMA table_info(threads)")}
    meta_pid = profile.meta().get("pid", "")
    default_pid = int(meta_pid) if meta_pid.isdigit() else None
    pid_column = "t.pid" if has_pid else "NULL"
    checkpoint_column = "s.checkpoint_id" if per_checkpoint else "0"
    sql = (
        f"SELECT s.stack_id, s.tid, COALESCE(t.name, ''), SUM(s.count), {pid_column},"
        f" {checkpoint_column} FROM cpu_stack_samples s"
        f" LEFT JOIN threads t ON t.tid = s.tid WHERE s.checkpoint_id IN ({inside})"
    )
    params: tuple[object, ...] = ()
    if tid is not None:
        sql += " AND s.tid = ?"
        params = (tid,)
    if pid is not None:
        if has_pid:
            sql += " AND t.pid = ?"
            params = (*params, pid)
        elif pid != default_pid:
            return []
    order = "s.checkpoint_id, " if per_checkpoint else ""
    rows = profile.rows(sql + f" GROUP BY {order}s.stack_id, s.tid"
                        f" ORDER BY {order}s.stack_id, s.tid", params)
    stacks = frames.stacks({row[0] for row in rows})
    intervals = _checkpoint_intervals(profile) if per_checkpoint else {}
    samples = []
    for stack_id, thread, name, count, thread_pid, checkpoint_id in rows:
        stack = stacks.get(stack_id)
        if stack and count:
            samples.append(Sample(stack, [count, count * period_ns], thread, name,
                                  pid=thread_pid if thread_pid is not None else default_pid,
                                  interval_ms=intervals.get(checkpoint_id)))
    return samples


def _offcpu_samples(
    profile: Profile,
    frames: FrameTable,
    checkpoints: list[tuple[int, bool]],
    tid: int | None,
    pid: int | None,
    *,
    per_checkpoint: bool = False,
) -> list[Sample]:
    """Off-CPU time per (stack, thread, state): values [nanoseconds, switch-outs]. The stack's
    [kernel] leaf (the thread waited in the kernel) becomes the state's frame: [sleeping],
    [uninterruptible wait], [preempted]."""
    if not profile.has("offcpu_stack_samples"):
        return []  # a file from before off-CPU time was recorded
    inside = _id_list(cid for cid, within in checkpoints if within)
    meta_pid = profile.meta().get("pid", "")
    default_pid = int(meta_pid) if meta_pid.isdigit() else None
    checkpoint_column = "s.checkpoint_id" if per_checkpoint else "0"
    sql = (
        f"SELECT s.stack_id, s.tid, COALESCE(t.name, ''), s.state, SUM(s.ns), SUM(s.switches),"
        f" t.pid, {checkpoint_column} FROM offcpu_stack_samples s"
        f" LEFT JOIN threads t ON t.tid = s.tid WHERE s.checkpoint_id IN ({inside})"
    )
    params: tuple[object, ...] = ()
    if tid is not None:
        sql += " AND s.tid = ?"
        params = (tid,)
    if pid is not None:
        sql += " AND COALESCE(t.pid, ?) = ?"
        params = (*params, default_pid, pid)
    order = "s.checkpoint_id, " if per_checkpoint else ""
    rows = profile.rows(sql + f" GROUP BY {order}s.stack_id, s.tid, s.state"
                        f" ORDER BY {order}s.stack_id, s.tid, s.state", params)
    stacks = frames.stacks({row[0] for row in rows})
    intervals = _checkpoint_intervals(profile) if per_checkpoint else {}
    samples = []
    for stack_id, thread, name, state, ns, switches, thread_pid, checkpoint_id in rows:
        stack = stacks.get(stack_id)
        if not stack or not (ns or switches):
            continue
        samples.append(Sample(offcpu_stack(stack, state), [ns, switches], thread, name,
                              pid=thread_pid if thread_pid is not None else default_pid,
                              interval_ms=intervals.get(checkpoint_id)))
    return samples


def state_frame(state: str) -> Frame:
    """The leaf of an off-CPU stack: why the thread was off the CPU."""
    function = OFFCPU_STATES.get(state, f"[off-cpu {state}]")
    return Frame(-1 - ord(state[:1] or "?"), 0, "[kernel]", 0, None,
                 (Line(0, function, function, "", 0),))


GIL_FRAME = Frame(-1 - ord("G"), 0, "[kernel]", 0, None, (Line(0, GIL_WAIT, GIL_WAIT, "", 0),))


def gil_wait_caller(stack: Sequence[Frame]) -> int | None:
    """Index in `stack` (leaf first, no state frame) of the frame that waited for the GIL:
    the first Python frame outside a condition-variable wait called directly by CPython's
    own module, or, without a Python frame (a thread attaching to the interpreter), that
    interpreter frame. None when the stack is not such a wait.

    On Linux CPython waits on a pthread condition variable only for the GIL (take_gil,
    and drop_gil's switch_cond): its locks (threading.Lock, Condition, Event, queue.get;
    3.13's PyMutex) wait on semaphores, time.sleep in clock_nanosleep, select in select or
    poll, so none of those match. Frame names, not addresses, decide: take_gil is static
    and stripped builds (Debian's python3.11) do not name it, while libc's wait keeps its
    exported name."""
    for i, frame in enumerate(stack):
        if is_python_address(frame.address):
            return None  # Python code ran at the wait: not the interpreter's own wait
        if not any(_COND_WAIT.match(line.function) for line in frame.lines):
            continue
        if i + 1 >= len(stack) or not is_interpreter_module(stack[i + 1].module) \
                or is_python_address(stack[i + 1].address):
            return None
        for j in range(i + 1, len(stack)):
            if is_python_address(stack[j].address):
                return j
        return i + 1
    return None


def offcpu_stack(stack: tuple[Frame, ...], state: str) -> tuple[Frame, ...]:
    """`stack` with its [kernel] leaf replaced by (or, without one, topped with) the state's
    frame. A sleep waiting for the GIL (gil_wait_caller) is [waiting for the GIL] instead,
    directly under the frame that waited: the interpreter's, libc's and the kernel's frames
    in between are dropped."""
    leaf = stack[0] if stack else None
    if leaf is not None and leaf.lines and leaf.lines[0].function == KERNEL_FUNCTION:
        stack = stack[1:]
    if state == "S":
        caller = gil_wait_caller(stack)
        if caller is not None:
            return (GIL_FRAME, *stack[caller:])
    return (state_frame(state), *stack)


def _checkpoint_intervals(profile: Profile) -> dict[int, tuple[int, int]]:
    """Checkpoint id -> (start, end) in Unix ms: a checkpoint's interval starts where the
    previous one ended (the first at the recording's start)."""
    meta = profile.meta()
    rows = profile.rows("SELECT id, timestamp_ms FROM checkpoints ORDER BY id")
    previous = int(meta.get("start_time_ms") or (rows[0][1] if rows else 0))
    intervals = {}
    for checkpoint_id, end in rows:
        intervals[checkpoint_id] = (min(previous, end), end)
        previous = end
    return intervals


def _heap_samples(
    profile: Profile, frames: FrameTable, checkpoints: list[tuple[int, bool]],
    pid: int | None = None,
    tid: int | None = None,
) -> list[Sample]:
    inside = {cid for cid, within in checkpoints if within}
    sums: dict[int, list[int]] = {}
    freed: dict[int, tuple[int, int]] = {}
    ids = _id_list(c for c, _ in checkpoints)
    if (tid is None and pid is not None and not profile.has("heap_deltas")
            and not profile.has("heap_process_samples")):
        if str(pid) != str(profile.meta().get("pid")):
            return []  # a file from before processes were followed: one process only
        pid = None
    table, where, params = heap_deltas_source(profile.has, pid=pid, tid=tid)
    rows = profile.rows(
        "SELECT checkpoint_id, stack_id, alloc_count, alloc_bytes, free_count, free_bytes"
        f" FROM {table} WHERE checkpoint_id IN ({ids}){where}", params
    )
    for checkpoint_id, stack_id, alloc_count, alloc_bytes, free_count, free_bytes in rows:
        values = sums.setdefault(stack_id, [0, 0, 0, 0])
        if checkpoint_id in inside:
            values[0] += alloc_count
            values[1] += alloc_bytes
            objects, size = freed.get(stack_id, (0, 0))
            freed[stack_id] = (objects + free_count, size + free_bytes)
        values[2] += alloc_count - free_count
        values[3] += alloc_bytes - free_bytes
    stacks = frames.stacks(sums.keys(), trim_to_call_site=True)
    samples = []
    for stack_id in sorted(sums):
        values = sums[stack_id]
        # A stack whose blocks were all allocated before the range and freed is not in it.
        values[2] = max(0, values[2])
        values[3] = max(0, values[3])
        stack = stacks.get(stack_id)
        if stack and any(values):
            samples.append(Sample(stack, values, freed=freed.get(stack_id, (0, 0))))
    # Stacks that trim to the same call-site chain are one sample, as in heap_samples.
    return _merge_identical(samples)


def heap_deltas_source(
    has: Callable[[str], bool], *, pid: int | None = None, tid: int | None = None
) -> tuple[str, str, tuple[int, ...]]:
    """Where a heap reader reads deltas: (table, WHERE terms each starting " AND ", their
    parameters), rows of (checkpoint_id, stack_id, alloc/free bytes and counts), for the
    allocations of thread `tid` and/or process `pid` (None: all). `has` says whether the
    file has a table or view of that name. Schema 2 keeps one table, `heap_deltas`; a file
    of schema 1 kept the split by process and by thread in tables of their own."""
    terms = ""
    params: tuple[int, ...] = ()
    if tid is not None:
        terms, params = " AND tid = ?", (tid,)
    if pid is not None:
        terms, params = terms + " AND pid = ?", (*params, pid)
    if has("heap_deltas"):
        return "heap_deltas", terms, params
    if tid is not None:
        if not has("heap_thread_samples"):
            raise ProfileError("this profile keeps no heap data per thread (recorded before"
                               " rsprof stored the allocating thread): drop --tid")
        return "heap_thread_samples", terms, params
    if pid is not None:
        return "heap_process_samples", terms, params
    return "heap_stack_samples", "", ()


def heap_site_rows(has: Callable[[str], bool]) -> str:
    """A FROM item of per-call-site heap deltas: rows of (checkpoint_id, location_id,
    alloc_bytes, alloc_count, free_bytes, free_count), one per delta row (GROUP BY what you
    need). Schema 2 joins the deltas to their stack's call site; schema 1 kept a table."""
    if has("heap_deltas"):
        return ("(SELECT d.checkpoint_id AS checkpoint_id, s.location_id AS location_id,"
                " d.alloc_bytes AS alloc_bytes, d.alloc_count AS alloc_count,"
                " d.free_bytes AS free_bytes, d.free_count AS free_count"
                " FROM heap_deltas d JOIN heap_call_sites s ON s.stack_id = d.stack_id)")
    return "heap_site_samples"


def _merge_identical(samples: list[Sample]) -> list[Sample]:
    merged: dict[tuple[tuple[Frame, ...], int | None], Sample] = {}
    for sample in samples:
        key = (sample.frames, sample.tid)
        found = merged.get(key)
        if found is None:
            merged[key] = sample
        else:
            found.values = [a + b for a, b in zip(found.values, sample.values, strict=True)]
            found.freed = (found.freed[0] + sample.freed[0], found.freed[1] + sample.freed[1])
    return list(merged.values())


class RowSource(Protocol):
    """What FrameTable reads through: a `Profile`, or the TUI's followed file."""

    def rows(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple]: ...  # type: ignore[type-arg]


class FrameTable:
    """Frames, their inline lines and mappings, each read once. A file still being
    recorded gains modules: an unknown module id re-reads the (small) module tables."""

    def __init__(self, profile: RowSource) -> None:
        self.profile = profile
        self._mappings: dict[int, list[Mapping]] = {}
        self._modules: dict[int, str] = {}
        self._read_modules()
        self._frames: dict[int, Frame] = {}
        self._stored_sites: bool | None = None  # the file has heap_call_sites (schema 2)

    def _read_modules(self) -> None:
        mappings: dict[int, list[Mapping]] = {}
        modules: dict[int, str] = {}
        for mapping_id, module_id, start, end, offset, path, build_id in self.profile.rows(
            "SELECT mp.id, mp.module_id, mp.start, mp.end, mp.file_offset, m.path,"
            " COALESCE(m.build_id, '') FROM mappings mp JOIN modules m ON m.id = mp.module_id"
            " ORDER BY mp.start"
        ):
            mappings.setdefault(module_id, []).append(
                Mapping(mapping_id, u64_from_sql(start), u64_from_sql(end),
                        u64_from_sql(offset), path, build_id)
            )
        for module_mappings in mappings.values():
            module_mappings.sort(key=lambda mapping: mapping.start)
        for module_id, path in self.profile.rows("SELECT id, path FROM modules"):
            modules[module_id] = path
        self._mappings = mappings
        self._modules = modules

    def _load_frames(self, frame_ids: set[int]) -> None:
        missing = frame_ids - self._frames.keys()
        if not missing:
            return
        lines: dict[int, list[Line]] = {}
        for frame_id, location_id, function, system_name, file, line in self.profile.rows(
            "SELECT fl.frame_id, l.id, l.function, COALESCE(l.system_name, l.function),"
            " l.file, l.line FROM frame_locations fl JOIN locations l ON l.id = fl.location_id"
            f" WHERE fl.frame_id IN ({_id_list(missing)}) ORDER BY fl.frame_id, fl.inline_depth"
        ):
            lines.setdefault(frame_id, []).append(Line(location_id, function, system_name, file,
                                                       line))
        rows = self.profile.rows(
            "SELECT id, address, module_id, COALESCE(module_offset, 0) FROM frames"
            f" WHERE id IN ({_id_list(missing)})")
        if any(row[2] is not None and row[2] not in self._modules for row in rows):
            self._read_modules()
        for frame_id, stored_address, module_id, stored_offset in rows:
            address, offset = u64_from_sql(stored_address), u64_from_sql(stored_offset)
            module = self._modules.get(module_id, "") if module_id is not None else ""
            chain = lines.get(frame_id) or [Line(0, f"0x{address:x}", f"0x{address:x}", "", 0)]
            self._frames[frame_id] = Frame(frame_id, address, module, offset,
                                           self._mapping_of(module_id, address), tuple(chain))

    def _mapping_of(self, module_id: int | None, address: int) -> Mapping | None:
        if module_id is None:
            return None
        candidates = self._mappings.get(module_id, [])
        for mapping in candidates:
            if mapping.start <= address < mapping.end:
                return mapping
        return candidates[0] if candidates else None

    def stacks(
        self, stack_ids: Iterable[int], *, trim_to_call_site: bool = False
    ) -> dict[int, tuple[Frame, ...]]:
        wanted = sorted(set(stack_ids))
        if not wanted:
            return {}
        positions: dict[int, list[int]] = {}
        for stack_id, frame_id in self.profile.rows(
            "SELECT stack_id, frame_id FROM stack_frames"
            f" WHERE stack_id IN ({_id_list(wanted)}) ORDER BY stack_id, position"
        ):
            positions.setdefault(stack_id, []).append(frame_id)
        self._load_frames({f for ids in positions.values() for f in ids})
        sites = self._call_sites(wanted) if trim_to_call_site else {}
        stacks: dict[int, tuple[Frame, ...]] = {}
        for stack_id, frame_ids in positions.items():
            stack = tuple(self._frames[f] for f in frame_ids)
            if trim_to_call_site:
                stack = cut_at(stack, sites[stack_id] if stack_id in sites
                               else _legacy_call_site(stack))
            stacks[stack_id] = stack
        return stacks

    def _call_sites(self, stack_ids: list[int]) -> dict[int, tuple[int, int]]:
        """The call sites the recorder chose for these heap stacks (heap_call_sites)."""
        if self._stored_sites is None:
            self._stored_sites = bool(self.profile.rows(
                "SELECT 1 FROM sqlite_master WHERE name = 'heap_call_sites'"))
        if not self._stored_sites:
            return {}
        return {stack_id: (position, depth) for stack_id, position, depth in self.profile.rows(
            "SELECT stack_id, position, inline_depth FROM heap_call_sites"
            f" WHERE stack_id IN ({_id_list(stack_ids)})")}


def _legacy_call_site(stack: tuple[Frame, ...]) -> tuple[int, int] | None:
    """A schema-1 file stored no call site per stack: chosen here by the same rule."""
    return call_site_position([(frame.module, frame.lines) for frame in stack],
                              [frame.address for frame in stack])


def cut_at(stack: tuple[Frame, ...], position: tuple[int, int] | None) -> tuple[Frame, ...]:
    """An allocating stack from its call site (frame index, inline index) outwards."""
    if position is None or position[0] >= len(stack):
        return stack
    frame_index, line_index = position
    site = stack[frame_index]
    if 0 < line_index < len(site.lines):
        site = Frame(site.id, site.address, site.module, site.module_offset, site.mapping,
                     site.lines[line_index:])
    return (site, *stack[frame_index + 1:])
