"""rsprof.storage.live.heap: the TUI's heap numbers of a followed file. A call site is the
first user frame (allocator and runtime frames trimmed), keyed by line; with a thread, that
thread's allocations; with filters, what `rsprof top heap` selects with the same options:
a table of selections compared with storage.analysis over storage.selection."""

from __future__ import annotations

from pathlib import Path

import pytest
from rsprof.storage.analysis import rank_heap
from rsprof.storage.filters import FrameFilter
from rsprof.storage.live.functions import NO_FILTER
from rsprof.storage.live.heap import HeapModel
from rsprof.storage.live.rows import location_text
from rsprof.storage.reader import Profile
from rsprof.storage.selection import SampleQuery, select

from unit.synthetic import LIBC, START_MS, Synth, live_model

STDCXX = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
VECTOR = "/usr/include/c++/12/bits/vector.tcc"
CHECKPOINTS = 30
TREND = 4
MIB = 1 << 20


def pattern(i: int) -> dict[str, tuple[int, tuple[int, int, int, int]]]:
    """Stack -> (allocating tid, (alloc bytes, allocs, freed bytes, frees)) in checkpoint i."""
    rows = {"leak": (1, (8192, 2, 0, 0)), "buffer": (2, (65536, 16, 49152, 12)),
            "leak_other_line": (2, (100, 1, 0, 0))}
    if i == 1:
        rows["config"] = (1, (MIB, 3, 0, 0))
    if i == 10:
        rows["config"] = (1, (0, 0, MIB // 2, 1))
    return rows


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    synth = Synth(tmp_path_factory.mktemp("heap") / "p.db")
    malloc = ("malloc", "", 0, LIBC)
    stacks = {
        "leak": synth.stack(malloc, ("leaky_insert", "cache.c", 55), "main"),
        "buffer": synth.stack(malloc, ("operator new(unsigned long)", "", 0, STDCXX),
                              [("std::vector<int>::_M_realloc_insert", VECTOR, 439),
                               ("make_buffer", "buffer.c", 12)], "main"),
        "config": synth.stack(("calloc", "", 0, LIBC), ("load_config", "config.c", 9), "main"),
        "leak_other_line": synth.stack(malloc, ("leaky_insert", "cache.c", 56), "worker"),
    }
    for i in range(1, CHECKPOINTS + 1):
        rows = pattern(i)
        by_tid: dict[int, dict[int, tuple[int, int, int, int]]] = {}
        for name, (tid, values) in rows.items():
            by_tid.setdefault(tid, {})[stacks[name]] = values
        synth.checkpoint(heap={stacks[name]: values for name, (_tid, values) in rows.items()},
                         heap_by_tid=by_tid)
    return synth.finish()


def model(path: Path, tid: int | None = None) -> HeapModel:
    return live_model(HeapModel, path, TREND, tid)


@pytest.mark.parametrize(("tid", "filters"), [
    pytest.param(None, NO_FILTER, id="whole"),
    pytest.param(1, NO_FILTER, id="thread-1"),
    pytest.param(2, NO_FILTER, id="thread-2"),
    pytest.param(None, FrameFilter.compile(focus="make_buffer"), id="focus"),
    pytest.param(None, FrameFilter.compile(ignore="config"), id="ignore"),
    pytest.param(None, FrameFilter.compile(hide="leaky"), id="hide-the-site"),
    pytest.param(None, FrameFilter.compile(show="main|worker"), id="show"),
    pytest.param(2, FrameFilter.compile(focus=r"cache\.c"), id="thread-and-focus"),
])
def test_rows_are_top_heaps(profile: Path, tid: int | None, filters: FrameFilter) -> None:
    got = {(r.function, r.location, r.live_bytes, r.alloc_bytes, r.alloc_count, r.free_bytes,
            r.free_count) for r in model(profile, tid).rows(filters)}
    with Profile(profile) as opened:
        selection = select(opened, SampleQuery("heap", tid, filters=filters))
    expected = {(r.function, location_text(r.file, r.line), r.live_bytes, r.total_alloc_bytes,
                 r.alloc_count, r.total_free_bytes, r.free_count)
                for r in rank_heap(selection, set(), granularity="lines")}
    assert got == expected


def test_call_sites_skip_the_allocator_and_inlined_library_code(profile: Path) -> None:
    rows = {(r.function, r.location): r for r in model(profile).rows()}
    assert set(rows) == {("leaky_insert", "cache.c:55"), ("leaky_insert", "cache.c:56"),
                         ("make_buffer", "buffer.c:12"), ("load_config", "config.c:9")}
    config = rows["load_config", "config.c:9"]
    assert (config.live_bytes, config.alloc_count, config.free_count) == (MIB // 2, 3, 1)
    leak = rows["leaky_insert", "cache.c:55"]
    assert leak.live_bytes == 8192 * CHECKPOINTS
    assert leak.trend == tuple(8192 * i for i in range(CHECKPOINTS - TREND + 1,
                                                        CHECKPOINTS + 1))
    assert rows["load_config", "config.c:9"].trend == (MIB // 2,) * TREND  # flat since 10


def test_timeline(profile: Path) -> None:
    heap = model(profile)
    per_checkpoint = [sum(a - f for _t, (a, _n, f, _m) in pattern(i).values())
                      for i in range(1, CHECKPOINTS + 1)]
    live = [sum(per_checkpoint[:i + 1]) for i in range(CHECKPOINTS)]
    timeline = heap.timeline(points=CHECKPOINTS)
    assert [v for _t, v in timeline.points] == live
    assert timeline.current_bytes == live[-1]
    assert timeline.peak_bytes == max(live) == live[8]  # before load_config freed half
    assert timeline.peak_offset_ms == 9 * 1000
    merged = heap.timeline(points=3)  # each bucket its highest value
    assert [v for _t, v in merged.points] == [max(live[0:10]), max(live[10:20]),
                                             max(live[20:30])]
    assert [t for t, _v in merged.points] == [10_000.0, 20_000.0, 30_000.0]


def test_tree_by_live_and_by_allocated_bytes(profile: Path) -> None:
    heap = model(profile)
    live = heap.tree()
    assert live.total_samples == live.base_samples == model(profile).timeline().current_bytes
    allocated = heap.tree(allocated=True)
    assert allocated.total_samples == sum(a for i in range(1, CHECKPOINTS + 1)
                                          for _t, (a, _n, _f, _m) in pattern(i).values())
    assert [c.function for c in live.children] == ["main", "worker"]


def test_series_is_a_sites_live_bytes(profile: Path) -> None:
    heap = model(profile)
    config = next(r.key for r in heap.rows() if r.function == "load_config")
    series = heap.series(config, START_MS, START_MS + 20_000, 5000)
    assert [v for _t, v in series.points] == [MIB, MIB // 2, MIB // 2, MIB // 2]  # at bucket ends


def test_has_data_and_by_thread(profile: Path, tmp_path: Path) -> None:
    heap = model(profile)
    assert heap.has_data and heap.by_thread
    synth = Synth(tmp_path / "cpu-only.db")
    synth.checkpoint({(synth.stack("work"), 1): 1})
    empty = model(synth.finish())
    assert not empty.has_data and empty.rows() == []
    assert {v for _t, v in empty.timeline().points} == {0}
