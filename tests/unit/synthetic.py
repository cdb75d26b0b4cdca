"""Synthetic profiles and address spaces for the unit tests.

`Synth` writes a profile with the real writer (storage.writer.ProfileWriter), so the
files are exactly what a recording makes; `FakeSymbolizer` stands in for ELF and DWARF
reading so that the collector's rules run on made-up mappings."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from rsprof.collector.symbols.model import SourceFrame
from rsprof.storage.callsite import call_site_position
from rsprof.storage.intern import LocationKey
from rsprof.storage.live.follow import FollowedFile
from rsprof.storage.live.functions import FunctionLabels
from rsprof.storage.samples import Frame, Line
from rsprof.storage.schema import VIEWS
from rsprof.storage.writer import Checkpoint, HeapCallSite, HeapDelta, ProfileWriter

START_MS = 1_700_000_000_000
PID = 100
APP = "/bin/app"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"

# A function as a test names it: "name" (in APP, file "app.c", line 1), or
# (name, file, line) or (name, file, line, module path).
Fn = str | tuple[str, str, int] | tuple[str, str, int, str]


def _parts(fn: Fn) -> tuple[str, str, int, str]:
    if isinstance(fn, str):
        return fn, "app.c", 1, APP
    if len(fn) == 3:
        return fn[0], fn[1], fn[2], APP
    return fn  # type: ignore[return-value]


class Synth:
    """A profile written checkpoint by checkpoint: stacks are lists of functions leaf
    first; a list of functions is one frame with an inline chain (innermost first)."""

    def __init__(self, path: Path, *, meta: Mapping[str, object] | None = None) -> None:
        self.path = path
        self.writer = ProfileWriter(path)
        self.writer.set_meta({"pid": PID, "process_name": "app", "start_time_ms": START_MS,
                              "cpu_freq_hz": 100, "interval_ms": 1000, "heap_mode": "full",
                              "state": "recording", **(meta or {})})
        self._modules: dict[str, int] = {}
        self._frames: dict[tuple[tuple[str, str, int, str], ...], int] = {}
        # as the collector knows them: frame -> (module path, inline chain); stack -> frames
        self._frame_info: dict[int, tuple[str, tuple[LocationKey, ...]]] = {}
        self._stack_info: dict[int, list[tuple[str, tuple[LocationKey, ...]]]] = {}
        self._next_address = 0x401000
        self.time_ms = START_MS

    def module(self, path: str) -> int:
        if path not in self._modules:
            self._modules[path] = self.writer.ids.module_id(path, None)
        return self._modules[path]

    def frame(self, chain: Fn | list[Fn]) -> int:
        """One frame: a function, or a list of them (an inline chain, innermost first)."""
        fns = chain if isinstance(chain, list) else [chain]
        key = tuple(_parts(fn) for fn in fns)
        found = self._frames.get(key)
        if found is None:
            module = self.module(key[0][3])
            locations = [LocationKey(name, file, line, self.module(path))
                         for name, file, line, path in key]
            address = self._next_address
            self._next_address += 0x10
            found = self._frames[key] = self.writer.ids.frame_id(
                address, module, address - 0x400000, locations)
            self._frame_info[found] = (key[0][3], tuple(locations))
        return found

    def stack(self, *fns: Fn | list[Fn]) -> int:
        frame_ids = [self.frame(fn) for fn in fns]
        found = self.writer.ids.stack_id(frame_ids)
        self._stack_info[found] = [self._frame_info[f] for f in frame_ids]
        return found

    def site(self, stack_id: int) -> HeapCallSite:
        """The heap call site, by the collector's rule (collector/heap.py)."""
        frames = self._stack_info[stack_id]
        frame, depth = call_site_position(frames) or (0, 0)
        return HeapCallSite(frame, depth, self.writer.ids.location_id(frames[frame][1][depth]))

    def checkpoint(self, cpu: Mapping[tuple[int, int], int] | None = None,
                   heap: Mapping[int, tuple[int, int, int, int]] | None = None, *,
                   heap_by_tid: Mapping[int, Mapping[int, tuple[int, int, int, int]]]
                   | None = None, threads: Mapping[int, str] | None = None,
                   step_ms: int = 1000,
                   offcpu: Mapping[tuple[int, int, str], tuple[int, int]] | None = None,
                   ) -> int:
        """cpu: (stack, tid) -> count; heap: stack -> (alloc bytes, allocs, freed bytes,
        frees), all by the main thread (tid PID) unless heap_by_tid splits it: tid -> the
        same per stack, adding up to `heap`; offcpu: (stack, tid, state) -> (switch-outs,
        ns off the CPU), as `offcpu_stack_samples` keeps them."""
        self.time_ms += step_ms
        cpu = dict(cpu or {})
        offcpu = dict(offcpu or {})
        tids = ({tid for _stack, tid in cpu} | set(heap_by_tid or {})
                | {tid for _stack, tid, _state in offcpu})
        names = {tid: f"t{tid}" for tid in tids} | dict(threads or {})
        split = dict(heap_by_tid or {PID: heap or {}})
        totals: dict[int, list[int]] = {}
        for per in split.values():
            for stack, values in per.items():
                totals[stack] = [a + b for a, b in zip(totals.get(stack, [0] * 4), values,
                                                       strict=True)]
        assert heap is None or totals == {s: list(v) for s, v in heap.items()}, (
            "heap_by_tid must add up to heap")
        deltas = {(PID, tid): {s: HeapDelta(*v) for s, v in per.items()}
                  for tid, per in split.items() if per}
        return self.writer.write_checkpoint(Checkpoint(
            timestamp_ms=self.time_ms, samples=sum(cpu.values()), cpu=cpu, heap=deltas,
            heap_call_sites={stack: self.site(stack) for stack in totals},
            threads=names, thread_pids={tid: PID for tid in names}, offcpu=offcpu))

    def finish(self) -> Path:
        self.writer.finish("duration")
        return self.path


def line(function: str, file: str = "app.c", number: int = 1, location_id: int = 0) -> Line:
    return Line(location_id, function, function, file, number)


def frame(*lines: Line | str, module: str = APP, address: int = 0x1000, id: int = 0) -> Frame:
    """A storage.samples Frame with its inline chain innermost first."""
    chain = tuple(line(x) if isinstance(x, str) else x for x in lines)
    return Frame(id, address, module, address, None, chain)


def frames(*names: str, module: str = APP) -> tuple[Frame, ...]:
    """A stack leaf first, one distinct frame object per function."""
    return tuple(frame(name, module=module, address=0x1000 + 16 * i, id=i)
                 for i, name in enumerate(names))


class FakeModule:
    """collector.symbols.Module's interface over a table: vaddr ranges -> inline chain
    (innermost first), as (start, end, [(function, file, line), ...])."""

    def __init__(self, table: Iterable[tuple[int, int, Sequence[tuple[str, str, int]]]],
                 *, build_id: str | None = None, code: bytes = b"") -> None:
        self.table = list(table)
        self.build_id = build_id
        self.code = code
        self.lookups: list[int] = []

    def file_offset_to_vaddr(self, offset: int) -> int:
        return offset

    def symbolize(self, vaddrs: Sequence[int]) -> list[tuple[SourceFrame, ...]]:
        out = []
        for vaddr in vaddrs:
            self.lookups.append(vaddr)
            chain = next((c for lo, hi, c in self.table if lo <= vaddr < hi), None)
            out.append(tuple(SourceFrame(f, file, n, None) for f, file, n in chain) if chain
                       else (SourceFrame(f"app+0x{vaddr:x}", "", 0, None),))
        return out

    def bytes_before(self, offset: int, count: int) -> bytes:
        return self.code[max(0, offset - count):offset]


class FakeSymbolizer:
    cache_dir = None

    def __init__(self, modules: Mapping[str, FakeModule]) -> None:
        self.modules = dict(modules)

    def module(self, path: str) -> FakeModule | None:
        return self.modules.get(path)


def small_profile(path: Path, meta: Mapping[str, object] | None = None) -> Path:
    """Two threads, four stacks, ten checkpoints of CPU and a leaking heap site:
    work (tid 1) 6 per checkpoint, parse <- work 3, memcpy (libc) <- parse 1 (tid 2);
    heap: leak <- main allocates 1000 bytes a checkpoint, never frees; churn frees all."""
    synth = Synth(path, meta=meta)
    work = synth.stack(("work", "app.c", 10), "main")
    parse = synth.stack(("parse", "parse.c", 20), ("work", "app.c", 11), "main")
    memcpy = synth.stack(("memcpy", "", 0, LIBC), ("parse", "parse.c", 21), "main")
    malloc = ("malloc", "", 0, LIBC)
    leak = synth.stack(malloc, ("leak", "leak.c", 5), "main")
    churn = synth.stack(malloc, ("churn", "churn.c", 7), "main")
    for _ in range(10):
        synth.checkpoint({(work, 1): 6, (parse, 1): 3, (memcpy, 2): 1},
                         {leak: (1000, 1, 0, 0), churn: (500, 5, 500, 5)},
                         heap_by_tid={1: {leak: (1000, 1, 0, 0)}, 2: {churn: (500, 5, 500, 5)}},
                         threads={1: "main-thread", 2: "worker"})
    return synth.finish()


# schema 1's view over its per-site table (its heap was four tables; schema 2 keeps one)
_SCHEMA_1_HEAP_SAMPLES = """CREATE VIEW heap_samples AS
SELECT h.location_id AS location_id, l.function AS function, l.file AS file, l.line AS line,
       SUM(h.alloc_bytes) AS total_alloc_bytes, SUM(h.free_bytes) AS total_free_bytes,
       SUM(h.alloc_count) AS total_allocs, SUM(h.free_count) AS total_frees,
       SUM(h.alloc_bytes) - SUM(h.free_bytes) AS live_bytes,
       MAX(h.checkpoint_id) AS last_checkpoint_id
FROM heap_site_samples h JOIN locations l ON l.id = h.location_id
GROUP BY h.location_id"""


def schema_1_copy(source: Path, dest: Path, *, by_thread: bool = True) -> Path:
    """A copy of a profile laid out as rsprof wrote schema 1: the heap per stack, process,
    thread and call site in four tables and no stored call site per stack; without
    `by_thread`, as files were before the allocating process and thread were kept."""
    shutil.copy(source, dest)
    conn = sqlite3.connect(dest)
    tables = ["heap_stack_samples", "heap_site_samples"]
    if by_thread:
        tables += ["heap_process_samples", "heap_thread_samples"]
    for name in tables:
        conn.execute(f"CREATE TABLE {name}_1 AS SELECT * FROM {name}")
    for name in ("heap_sites", "heap_samples", "heap_stack_samples", "heap_process_samples",
                 "heap_thread_samples", "heap_site_samples"):
        conn.execute(f"DROP VIEW {name}")
    for name in tables:
        conn.execute(f"ALTER TABLE {name}_1 RENAME TO {name}")
    conn.execute("DROP TABLE heap_deltas")
    conn.execute("DROP TABLE heap_call_sites")
    conn.execute(_SCHEMA_1_HEAP_SAMPLES)
    conn.execute(f"CREATE VIEW heap_sites AS {VIEWS['heap_sites']}")
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    return dest


class _LiveModel(Protocol):
    def reset(self, thread: int | None) -> None: ...
    def read(self, last: int) -> None: ...


LiveModel = TypeVar("LiveModel", bound=_LiveModel)


def live_model(kind: Callable[[FollowedFile, FunctionLabels, int], LiveModel], path: Path,
               trend: int, tid: int | None = None) -> LiveModel:
    """The TUI's CPU or heap model (`kind`) of a finished file, every checkpoint read."""
    followed = FollowedFile(path)
    followed.read_meta()
    followed.read_checkpoints()
    model = kind(followed, FunctionLabels(), trend)
    model.reset(tid)
    model.read(followed.last_id)
    return model
