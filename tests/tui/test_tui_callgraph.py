"""The TUI's call-graph numbers (storage.live) against `rsprof top` and `rsprof peek`
(storage.analysis, storage.callgraph): the same words mean the same numbers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from rsprof.storage.analysis import top_cpu
from rsprof.storage.callgraph import peek
from rsprof.storage.live import CallNode, LiveProfile
from rsprof.storage.reader import Profile
from rsprof.storage.samples import TimeRange
from rsprof.storage.selection import SampleQuery, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import START_MS, build_profile


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_profile(tmp_path_factory.mktemp("cg") / "rsprof.demo.231114221320.db")


@pytest.mark.parametrize("tid", [None, 4243, 4244])
def test_self_and_total_equal_top_cpu(profile: Path, tid: int | None) -> None:
    lp = LiveProfile(profile)
    lp.set_thread(tid)
    lp.refresh()
    live = {r.function: r for r in lp.cpu_rows()}
    with Profile(profile) as p:
        rows, whole = top_cpu(p, limit=None, sort_by_total=True, query=SampleQuery(tid=tid))
    assert {r.function for r in rows} == set(live)
    for r in rows:
        assert (live[r.function].self_samples, live[r.function].total_samples) == (r.self, r.total)
        assert live[r.function].total_pct == pytest.approx(100 * r.total / whole)
    # sorted by Total, the TUI's default, the order is top --cum's
    order = sorted(live.values(), key=lambda r: (-r.total_samples, -r.self_samples))
    assert [r.total_samples for r in order] == [r.total for r in rows]


def test_peek_equals_rsprof_peek(profile: Path) -> None:
    lp = LiveProfile(profile)
    lp.refresh()
    keys = {r.function: r.key for r in lp.cpu_rows()}
    with Profile(profile) as p:
        selection = select(p, SampleQuery())
        for name in ("main", "compute_hash", "hash_round", "matrix_multiply"):
            (expected,) = peek(selection, re.compile(f"^{re.escape(name)}$"), value_index=0)
            got = lp.peek(keys[name])
            assert (got.self_samples, got.total_samples) == (expected.flat, expected.total)
            assert [(n.function, n.samples) for n in got.callers] == [
                (e.entry.function, e.value) for e in expected.callers]
            assert [(n.function, n.samples) for n in got.callees] == [
                (e.entry.function, e.value) for e in expected.callees]


def _walk(node: CallNode) -> list[CallNode]:
    out = [node]
    for child in node.children:
        out.extend(_walk(child))
    return out


def test_call_tree_totals(profile: Path) -> None:
    lp = LiveProfile(profile)
    lp.refresh()
    root = lp.call_tree()
    assert root.total_samples == lp.summary().samples
    for node in _walk(root):
        # a node's total is its own samples plus its children's (each sample on one path)
        assert node.total_samples == node.self_samples + sum(
            c.total_samples for c in node.children)
        totals = [c.total_samples for c in node.children]
        assert totals == sorted(totals, reverse=True)
    (main,) = root.children
    assert main.function == "main" and main.total_samples == root.total_samples
    # main -> main (the fixture's recursion) is a nested node, not double-counted at the top
    assert [c.function for c in main.children].count("main") == 1
    live = {r.function: r for r in lp.cpu_rows()}
    by_name: dict[str, int] = {}
    for node in _walk(root)[1:]:
        by_name[node.function] = by_name.get(node.function, 0) + node.self_samples
    assert by_name == {f: r.self_samples for f, r in live.items() if r.self_samples}


def test_windowed_tree_and_peek(profile: Path) -> None:
    lp = LiveProfile(profile)
    lp.refresh()
    # checkpoints 101..120 (`--since 100s --until 120s`): worker-2 exited after 90
    window_range = lp.time_range(START_MS + 100_000, START_MS + 120_000)
    assert window_range == TimeRange(100.0, 120.0)
    root = lp.call_tree(window_range)
    names = {n.function for n in _walk(root)}
    assert "matrix_multiply" not in names and "compute_hash" in names
    key = {r.function: r.key for r in lp.cpu_rows()}["compute_hash"]
    window = lp.peek(key, window_range)
    assert window.all_samples == root.total_samples
    assert 0 < window.total_samples < lp.peek(key).total_samples


def test_heap_tree_equals_top_heap(profile: Path) -> None:
    from rsprof.storage.analysis import top_heap

    lp = LiveProfile(profile)
    lp.refresh()
    root = lp.heap_tree()
    with Profile(profile) as p:
        sites = top_heap(p, limit=None)
    selfs: dict[str, int] = {}
    for node in _walk(root)[1:]:
        selfs[node.function] = selfs.get(node.function, 0) + node.self_samples
    assert {f: b for f, b in selfs.items() if b} == {
        s.function: s.live_bytes for s in sites if s.live_bytes}
    assert root.total_samples == sum(s.live_bytes for s in sites)
    allocated = lp.heap_tree(allocated=True)
    assert allocated.total_samples == sum(s.total_alloc_bytes for s in sites)


def test_heap_timeline(tmp_path: Path) -> None:
    from tui_fixture import append_checkpoints

    path = build_profile(tmp_path / "p.db", 30, state="recording")
    lp = LiveProfile(path)
    lp.refresh()

    def expected(i: int) -> int:  # the fixture's live bytes after checkpoint i
        return 8192 * i + 16384 + ((1 << 20) if i < 60 else (1 << 19))

    tl = lp.heap_timeline(30)
    assert [v for _t, v in tl.points] == [expected(i) for i in range(1, 31)]
    assert tl.points[0][0] == 1000.0 and tl.current_bytes == expected(30)
    append_checkpoints(path, 120)  # read incrementally: the same as a fresh reader
    lp.refresh()
    fresh = LiveProfile(path)
    fresh.refresh()
    assert lp.heap_timeline(40) == fresh.heap_timeline(40)
    tl = lp.heap_timeline(40)  # 120 checkpoints in 40 buckets: each its highest value
    assert len(tl.points) == 40 and tl.points[19][1] == expected(59)
    assert (tl.peak_bytes, tl.peak_offset_ms) == (expected(59), 59_000)
    short = lp.heap_timeline(240)  # more cells than checkpoints: each repeated
    assert len(short.points) == 240 and short.points[0][1] == short.points[1][1]


@pytest.mark.parametrize("tid, focus", [(None, None), (4242, None), (4244, None),
                                        (None, "buffer|config")])
def test_heap_rows_equal_top_heap(profile: Path, tid: int | None, focus: str | None) -> None:
    """The Memory table's call sites and numbers are `rsprof top heap`'s with the same
    thread (the allocating one) and filter."""
    from rsprof.storage.analysis import top_heap
    from rsprof.storage.filters import FrameFilter

    filters = FrameFilter.compile(focus=focus)
    lp = LiveProfile(profile)
    lp.set_thread(tid)
    lp.refresh()
    live = {(r.function, r.location): (r.live_bytes, r.alloc_bytes, r.alloc_count, r.free_bytes,
                                       r.free_count) for r in lp.heap_rows(filters)}
    with Profile(profile) as p:
        rows = top_heap(p, limit=None, query=SampleQuery("heap", tid=tid, filters=filters))
        if tid is None and focus is None:  # the writer's site table says the same
            assert {(r.function, r.line) for r in top_heap(p, limit=None)} == {
                (r.function, r.line) for r in rows}
    assert live == {(r.function, f"{r.file}:{r.line}"): (
        r.live_bytes, r.total_alloc_bytes, r.alloc_count, r.total_free_bytes, r.free_count)
        for r in rows}
    assert live
