"""rsprof.storage.live.cpu: the TUI's CPU numbers of a followed file. They must be what
`rsprof top cpu` selects with the same thread, window and filters (issue 25, item 1): a
table of selections, each compared with storage.analysis over storage.selection, on a
synthetic profile of 30 checkpoints (summed in SQL, then the last ones one by one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rsprof.storage.analysis import cpu_rows
from rsprof.storage.filters import FrameFilter
from rsprof.storage.live.cpu import CpuModel
from rsprof.storage.live.follow import FollowedFile
from rsprof.storage.live.functions import NO_FILTER, WHOLE_RECORDING, FunctionLabels
from rsprof.storage.reader import Profile
from rsprof.storage.samples import TimeRange
from rsprof.storage.selection import SampleQuery, select

from unit.synthetic import LIBC, START_MS, Synth, live_model

CHECKPOINTS = 30
TREND = 4


def pattern(i: int) -> dict[str, tuple[int, int]]:
    """Stack name -> (tid, count) in checkpoint i (1-based)."""
    return {"parse": (1, 5 if i % 3 else 1), "memcpy": (1, 2), "hash": (2, i % 4),
            "spin": (2, 3 if i <= 20 else 0), "fib": (1, 1 + i % 2)}


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    synth = Synth(tmp_path_factory.mktemp("cpu") / "p.db")
    stacks = {
        "parse": synth.stack(("parse", "parser.c", 40), "main"),
        "memcpy": synth.stack(("memcpy", "", 0, LIBC), ("parse", "parser.c", 41), "main"),
        "hash": synth.stack([("hash_round", "hash.h", 3), ("compute_hash", "hash.c", 9)],
                            "main"),
        "spin": synth.stack("spin", "worker", ("start_thread", "", 0, LIBC)),
        "fib": synth.stack("fib", "fib", "fib", "main"),
    }
    for i in range(1, CHECKPOINTS + 1):
        synth.checkpoint({(stacks[name], tid): count
                          for name, (tid, count) in pattern(i).items() if count})
    return synth.finish()


def model(path: Path, tid: int | None = None) -> CpuModel:
    return live_model(CpuModel, path, TREND, tid)


SELECTIONS = [
    pytest.param(None, WHOLE_RECORDING, NO_FILTER, id="whole"),
    pytest.param(1, WHOLE_RECORDING, NO_FILTER, id="thread"),
    pytest.param(None, TimeRange(5, 12), NO_FILTER, id="window"),
    pytest.param(2, TimeRange(None, 22), NO_FILTER, id="thread-window"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(focus="parse"), id="focus"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(focus=r"hash\.h"),
                 id="focus-inlined-file"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(ignore="libc"), id="ignore-module"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(hide="memcpy|hash_round"),
                 id="hide"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(show="main|fib"), id="show"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(hide_runtime=True),
                 id="hide-runtime"),
    pytest.param(1, TimeRange(10, None), FrameFilter.compile(focus="main", hide="parse"),
                 id="everything"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(focus="nothing-is-named-so"),
                 id="selects-nothing"),
]


@pytest.mark.parametrize(("tid", "time_range", "filters"), SELECTIONS)
def test_rows_are_top_cpus(profile: Path, tid: int | None, time_range: TimeRange,
                           filters: FrameFilter) -> None:
    cpu = model(profile, tid)
    got = {(r.function, r.self_samples, r.total_samples, round(r.self_pct, 2),
            round(r.total_pct, 2)) for r in cpu.rows(filters, time_range)}
    with Profile(profile) as opened:
        selection = select(opened, SampleQuery("cpu", tid, time_range, filters))
    expected = {(r.function, r.self, r.total, r.self_pct, r.total_pct)
                for r in cpu_rows(selection)}
    assert got == expected


def test_recursion_counts_once_and_locations_are_the_hottest_line(profile: Path) -> None:
    rows = {r.function: r for r in model(profile).rows()}
    fib = sum(pattern(i)["fib"][1] for i in range(1, CHECKPOINTS + 1))
    assert (rows["fib"].self_samples, rows["fib"].total_samples) == (fib, fib)
    assert rows["parse"].location == "parser.c:40"  # more self samples than line 41
    assert rows["memcpy"].location == "?"


def test_live_and_trend_are_the_last_checkpoints(profile: Path) -> None:
    rows = {r.function: r for r in model(profile).rows()}
    last = range(CHECKPOINTS - TREND + 1, CHECKPOINTS + 1)
    assert rows["parse"].trend == tuple(pattern(i)["parse"][1] + 2 for i in last)  # + memcpy
    assert rows["spin"].trend == (0,) * TREND and rows["spin"].live_samples == 0
    final = pattern(CHECKPOINTS)
    assert rows["main"].live_samples == sum(n for name, (_t, n) in final.items()
                                            if name != "spin")
    assert rows["main"].live_pct == pytest.approx(100.0)


def test_reading_in_steps_equals_reading_at_once(profile: Path) -> None:
    followed = FollowedFile(profile)
    followed.read_meta()
    followed.read_checkpoints()
    cpu = CpuModel(followed, FunctionLabels(), TREND)
    for last in (1, 2, 7, 29, 30):
        cpu.read(last)
    assert sorted(cpu.rows()) == sorted(model(profile).rows())


def test_call_tree(profile: Path) -> None:
    tree = model(profile).call_tree(WHOLE_RECORDING, NO_FILTER)
    total = sum(n for i in range(1, CHECKPOINTS + 1) for _t, n in pattern(i).values())
    assert tree.total_samples == tree.base_samples == total
    assert [c.function for c in tree.children] == ["main", "start_thread"]
    main = tree.children[0]
    fib = next(c for c in main.children if c.function == "fib")
    assert [c.function for c in fib.children] == ["fib"]  # recursion nests
    assert fib.children[0].children[0].self_samples == fib.total_samples
    focused = model(profile).call_tree(WHOLE_RECORDING, FrameFilter.compile(focus="spin"))
    assert focused.base_samples == total
    assert focused.total_samples == 60 and [c.function for c in focused.children] == [
        "start_thread"]


def test_peek(profile: Path) -> None:
    cpu = model(profile)
    parse = next(r.key for r in cpu.rows() if r.function == "parse")
    info = cpu.peek(parse, WHOLE_RECORDING, NO_FILTER)
    memcpy = 2 * CHECKPOINTS
    own = sum(pattern(i)["parse"][1] for i in range(1, CHECKPOINTS + 1))
    assert (info.self_samples, info.total_samples) == (own, own + memcpy)
    assert [(n.function, n.samples) for n in info.callers] == [("main", own + memcpy)]
    assert [(n.function, n.samples, round(n.pct, 2)) for n in info.callees] == [
        ("memcpy", memcpy, round(100 * memcpy / (own + memcpy), 2))]


def test_series_is_total_percent_per_bucket(profile: Path) -> None:
    cpu = model(profile)
    spin = next(r.key for r in cpu.rows() if r.function == "spin")
    series = cpu.series(spin, START_MS, START_MS + 30_000, 10_000, NO_FILTER)

    def share(checkpoints: range) -> float:
        """spin's samples over all samples of the bucket's checkpoints."""
        counts = [pattern(i) for i in checkpoints]
        return 100.0 * sum(c["spin"][1] for c in counts) / sum(
            n for c in counts for _t, n in c.values())

    assert [t for t, _v in series.points] == [10.0, 20.0, 30.0]
    assert [v for _t, v in series.points] == pytest.approx(
        [share(range(1, 11)), share(range(11, 21)), 0.0])
    assert cpu.series(spin, START_MS + 40_000, START_MS + 50_000, 1000, NO_FILTER).points == ()
