"""rsprof.collector.heap: what HeapTracker makes of a heap ring's batches (a fake reader,
a real FrameResolver over a made-up address space): deltas per stored stack, process and
thread, each stack's call site (the same one the reports' rule picks from the stored
stack), the heap mode, a corrupt ring dropped with one warning."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rsprof.collector.frames import FrameResolver
from rsprof.collector.heap import (
    HF_ALLOC_API,
    HF_MALLOC_ELSEWHERE,
    MISSED,
    HeapParts,
    HeapTracker,
    PythonNotYet,
)
from rsprof.collector.maps import Mapping
from rsprof.storage.reader import Profile
from rsprof.storage.samples import load_samples
from rsprof.storage.writer import Checkpoint, ProfileWriter

from unit.synthetic import FakeModule, FakeSymbolizer

APP, LIBC = 0x400000, 0x7F0000000000
FUNCTIONS = {
    "/bin/app": [(0x1000, 0x1100, [("leaky_insert", "cache.c", 55)]),
                 (0x2000, 0x2100, [("std::vector<int>::push_back", "/usr/include/c++/12/v.h", 9),
                                   ("make_buffer", "buffer.c", 12)]),
                 (0x3000, 0x3100, [("main", "main.c", 3)])],
    "/usr/lib/x86_64-linux-gnu/libc.so.6": [(0x100, 0x200, [("malloc", "", 0)])],
}
MALLOC, LEAK, BUFFER, MAIN = LIBC + 0x150, APP + 0x1050, APP + 0x2050, APP + 0x3050


class FakeReader:
    """rsprof._native.HeapReader's surface as HeapTracker uses it."""

    def __init__(self, pid: int = 42) -> None:
        self.pid = pid
        self.closed = False
        self.python_wanted = False
        self.polls: list[Any] = []  # what each poll() does: a count or an exception
        self.discarded = 0
        self.shim_flags = 0
        self.deferred = False
        self.batches: list[Any] = []
        self.python: Any = "unset"

    def poll(self) -> int:
        found = self.polls.pop(0) if self.polls else 0
        if isinstance(found, BaseException):
            raise found
        return found

    def discard(self) -> None:
        self.discarded += 1

    def take(self) -> Any:
        return self.batches.pop(0) if self.batches else None

    def set_python(self, reader: Any) -> None:
        self.python = reader
        self.python_wanted = False

    def close(self) -> None:
        self.closed = True


def batch(new_stacks: list[tuple[int, list[int]]], sites: list[tuple[int, ...]],
          thread_sites: list[tuple[int, ...]] | None = None, **extra: int) -> Any:
    """A take() result; the per-thread split (stack, tid, values) defaults to every site's
    activity by thread 42, as the C reader splits what it sums per stack."""
    values = {"sample_bytes": 0, "events": len(sites), "lost": 0, "dropped": 0, "exited": 0,
              "execed": 0, "unknown_frees": 0} | extra
    if thread_sites is None:
        thread_sites = [(site[0], 42, *site[1:]) for site in sites]
    return SimpleNamespace(new_stacks=new_stacks, sites=sites, thread_sites=list(thread_sites),
                           **values)


@pytest.fixture
def tracker(tmp_path: Path) -> HeapTracker:
    symbolizer = FakeSymbolizer({path: FakeModule(table) for path, table in FUNCTIONS.items()})
    resolver = FrameResolver(0, ProfileWriter(tmp_path / "p.db"), symbolizer)  # type: ignore[arg-type]
    resolver.add_mapping(Mapping(APP, APP + 0x10000, 0, "/bin/app"))
    resolver.add_mapping(Mapping(LIBC, LIBC + 0x1000, 0, "/usr/lib/x86_64-linux-gnu/libc.so.6"))
    return HeapTracker(FakeReader(), resolver)  # type: ignore[arg-type]


def site_name(tracker: HeapTracker, parts: HeapParts, stack_id: int) -> str:
    names = {lid: name for name, lid in (
        (key[0], lid) for key, lid in tracker.resolver.ids._locations.items())}
    return names[parts.call_sites[stack_id].location_id]


def test_deltas_sites_processes_and_threads(tracker: HeapTracker) -> None:
    parts = HeapParts()
    done = tracker.fill(parts, batch(
        [(1, [MALLOC, LEAK, MAIN]), (2, [MALLOC, BUFFER, MAIN])],
        [(1, 4096, 2, 0, 0), (2, 100, 1, 100, 1)],
        [(1, 7, 4096, 2, 0, 0), (2, 8, 100, 1, 100, 1)], events=5, lost=1, dropped=2))
    assert not done
    leak, buffer = (tracker._native_to_stored[i] for i in (1, 2))
    assert parts.deltas[(42, 7)][leak].alloc_bytes == 4096
    assert parts.deltas[(42, 8)][buffer].free_count == 1
    # the heap stack's leaf is a return address: malloc's caller is looked up at the call
    assert site_name(tracker, parts, leak) == "leaky_insert"
    assert site_name(tracker, parts, buffer) == "make_buffer"  # the inlined std:: code is not
    assert parts.deltas[(42, 8)][buffer].free_bytes == 100
    assert parts.call_sites[leak].position == 1  # malloc's caller, under malloc
    assert (parts.events, parts.lost) == (5, 3)
    # a second batch adds to the same checkpoint; a known stack is not resolved again
    tracker.fill(parts, batch([], [(1, 4096, 2, 0, 0)], [(1, 7, 4096, 2, 0, 0)], exited=1,
                              unknown_frees=3))
    assert parts.deltas[(42, 7)][leak].alloc_bytes == 8192
    assert parts.unknown_frees == 3  # frees of blocks allocated before an attach (issue 22)
    assert parts.live_bytes_change() == 8192
    checkpoint = Checkpoint(timestamp_ms=1)
    parts.deltas[(43, 43)] = {}
    parts.into(checkpoint)
    assert set(checkpoint.heap) == {(42, 7), (42, 8)}  # threads with nothing are left out
    assert checkpoint.heap_call_sites == parts.call_sites and checkpoint.heap_events == 6


def test_recorded_sites_are_the_reports_sites(tracker: HeapTracker) -> None:
    """The call site chosen at record time (heap_call_sites) is the leaf of the stacks the
    reports read, and heap_site_samples sums by it."""
    parts = HeapParts()
    stacks = [(1, [MALLOC, LEAK, MAIN]), (2, [MALLOC, BUFFER, MAIN]), (3, [MALLOC, MAIN]),
              (4, [MALLOC])]
    tracker.fill(parts, batch(stacks, [(i, 64, 1, 0, 0) for i, _ in stacks]))
    writer = tracker.resolver.writer
    checkpoint = Checkpoint(timestamp_ms=1)
    parts.into(checkpoint)
    writer.write_checkpoint(checkpoint)
    writer.finish("test")
    with Profile(writer.path) as profile:
        samples = load_samples(profile, "heap").samples
        recorded = dict(profile.rows("SELECT location_id, live_bytes FROM heap_site_samples"))
    reported = {s.frames[0].lines[0].location_id for s in samples}
    assert reported == set(recorded) == {site.location_id for site in parts.call_sites.values()}
    assert len(reported) == 4  # main itself; libc's malloc when nothing else is there


@pytest.mark.parametrize(("sample_bytes", "flags", "mode", "missed"), [
    (0, 0, "full", 0),
    (4096, 0, "sampled", 0),
    (0, HF_MALLOC_ELSEWHERE, "partial", 1),
    (4096, HF_MALLOC_ELSEWHERE | HF_ALLOC_API, "partial", 2),
    (0, HF_ALLOC_API, "full", 1),
])
def test_heap_mode_and_what_escapes_the_shim(tracker: HeapTracker, sample_bytes: int,
                                             flags: int, mode: str, missed: int) -> None:
    reader: Any = tracker.reader
    reader.shim_flags = flags
    reader.batches = [batch([], [], sample_bytes=sample_bytes)]
    tracker.fill(HeapParts(), tracker.take())  # type: ignore[arg-type]
    assert tracker.mode == mode
    assert len(tracker.missed()) == missed
    assert tracker.missed() == [m for flag, m in MISSED if flags & flag]


def test_an_exec_or_exit_ends_the_ring(tracker: HeapTracker) -> None:
    assert tracker.fill(HeapParts(), batch([], [], execed=1))
    assert tracker.fill(HeapParts(), batch([], [], exited=1))


def test_a_corrupt_ring_is_dropped_once_and_handed_back(tracker: HeapTracker) -> None:
    warnings: list[str] = []
    tracker._warn = warnings.append
    reader = tracker.reader
    reader.polls = [3, ValueError("bad record at 0x40")]  # type: ignore[attr-defined]
    reader.batches = [batch([], []), batch([], [])]  # type: ignore[attr-defined]
    tracker.drain()
    assert tracker.dropped == "bad record at 0x40"
    assert warnings == ["bad record at 0x40; heap data from then on dropped, CPU recording"
                        " goes on"]
    assert tracker.take() is not None  # what was read before the bad record, once
    assert tracker.take() is None
    tracker.drain()
    tracker.drain()
    assert reader.discarded == 2  # type: ignore[attr-defined]
    assert len(warnings) == 1


def test_python_frames_wait_for_the_frame_reader(tracker: HeapTracker,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [PythonNotYet(), "reader"]
    clock = iter([100.0])

    def lookup() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr("rsprof.collector.heap.time.monotonic", lambda: next(clock, 100.5))
    tracker._python_lookup = lookup
    reader = tracker.reader
    reader.python_wanted = True  # type: ignore[misc]
    reader.polls = [1, 1]  # type: ignore[attr-defined]
    tracker.drain()  # not known yet: asked again at the next drain
    assert reader.python == "unset"  # type: ignore[attr-defined]
    tracker.drain()
    assert reader.python == "reader" == tracker.python_reader  # type: ignore[attr-defined]


def test_python_frames_given_up_after_the_wait(tracker: HeapTracker,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter([100.0, 103.0])
    monkeypatch.setattr("rsprof.collector.heap.time.monotonic", lambda: next(times))

    def lookup() -> Any:
        raise PythonNotYet()

    tracker._python_lookup = lookup
    tracker.reader.python_wanted = True  # type: ignore[misc]
    tracker.reader.polls = [1, 1, 1]  # type: ignore[attr-defined]
    tracker.drain()
    assert tracker.reader.python == "unset"  # type: ignore[attr-defined]
    tracker.drain()  # over PYTHON_WAIT_S: native stacks only from now on
    assert tracker.reader.python is None  # type: ignore[attr-defined]
