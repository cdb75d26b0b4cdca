"""`rsprof diff OLD NEW`: per-function deltas between two profiles, biggest change first.

CPU is compared in shares (percent of each profile's samples), so runs of different length
or sampling rate compare; heap in bytes. Functions are matched by name only, so two builds
of one program (different paths, different build ids) line up. A function present in only
one profile is marked "new" or "gone".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rsprof.storage.analysis import cpu_rows
from rsprof.storage.reader import Profile
from rsprof.storage.selection import WHOLE_CPU_PROFILE, SampleQuery, select


@dataclass(slots=True)
class CpuDelta:
    function: str
    old_self_pct: float
    new_self_pct: float
    delta_self_pct: float
    old_total_pct: float
    new_total_pct: float
    delta_total_pct: float
    status: str  # "new", "gone" or ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True)
class HeapDelta:
    function: str
    old_inuse_bytes: int
    new_inuse_bytes: int
    delta_inuse_bytes: int
    old_alloc_bytes: int
    new_alloc_bytes: int
    delta_alloc_bytes: int
    status: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _status(in_old: bool, in_new: bool) -> str:
    return "new" if not in_old else "gone" if not in_new else ""


def cpu_diff(old: Profile, new: Profile, query: SampleQuery = WHOLE_CPU_PROFILE) -> list[CpuDelta]:
    shares: list[dict[str, tuple[float, float]]] = []
    for profile in (old, new):
        per_function: dict[str, tuple[float, float]] = {}
        for row in cpu_rows(select(profile, query)):
            self_pct, total_pct = per_function.get(row.function, (0.0, 0.0))
            # The same name in two modules (rare) adds up; total is at most 100 either way.
            per_function[row.function] = (self_pct + row.self_pct,
                                          min(100.0, max(total_pct, row.total_pct)))
        shares.append(per_function)
    before, after = shares
    deltas = []
    for function in before.keys() | after.keys():
        old_self, old_total = before.get(function, (0.0, 0.0))
        new_self, new_total = after.get(function, (0.0, 0.0))
        deltas.append(CpuDelta(function, old_self, new_self, round(new_self - old_self, 2),
                               old_total, new_total, round(new_total - old_total, 2),
                               _status(function in before, function in after)))
    deltas.sort(key=lambda d: (-abs(d.delta_self_pct), -abs(d.delta_total_pct), d.function))
    return deltas


def heap_diff(
    old: Profile, new: Profile, query: SampleQuery = WHOLE_CPU_PROFILE
) -> list[HeapDelta]:
    """Heap per call-site function: bytes in use at the end and bytes allocated."""
    heap_query = SampleQuery("heap", query.tid, query.time_range, query.filters)
    sides: list[dict[str, tuple[int, int]]] = []
    for profile in (old, new):
        per_function: dict[str, tuple[int, int]] = {}
        for sample in select(profile, heap_query).samples.samples:
            function = sample.frames[0].lines[0].function
            inuse, alloc = per_function.get(function, (0, 0))
            per_function[function] = (inuse + sample.values[3], alloc + sample.values[1])
        sides.append(per_function)
    before, after = sides
    deltas = []
    for function in before.keys() | after.keys():
        old_inuse, old_alloc = before.get(function, (0, 0))
        new_inuse, new_alloc = after.get(function, (0, 0))
        deltas.append(HeapDelta(function, old_inuse, new_inuse, new_inuse - old_inuse,
                                old_alloc, new_alloc, new_alloc - old_alloc,
                                _status(function in before, function in after)))
    deltas.sort(key=lambda d: (-abs(d.delta_inuse_bytes), -abs(d.delta_alloc_bytes),
                               d.function))
    return deltas
