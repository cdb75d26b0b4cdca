"""rsprof.storage.live.wall: the TUI's wall-clock numbers of a followed file (issue 23). They
must be what `rsprof top wall` selects with the same thread, window and filters: on-CPU
time (a CPU sample is one period) plus off-CPU time, with the off-CPU state as the leaf."""

from __future__ import annotations

from pathlib import Path

import pytest
from rsprof.storage.analysis import cpu_rows
from rsprof.storage.filters import FrameFilter
from rsprof.storage.live import LiveProfile
from rsprof.storage.live.follow import FollowedFile
from rsprof.storage.live.functions import NO_FILTER, WHOLE_RECORDING, FunctionLabels
from rsprof.storage.live.wall import WallModel, offcpu_key, split_offcpu_key
from rsprof.storage.reader import Profile
from rsprof.storage.samples import TimeRange
from rsprof.storage.selection import SampleQuery, select

from unit.synthetic import START_MS, Synth, live_model

CHECKPOINTS = 20
TREND = 4
FREQ = 100  # cpu_freq_hz: a CPU sample is 10 ms
PERIOD_NS = 10_000_000


def cpu_pattern(i: int) -> dict[str, tuple[int, int]]:
    """Stack name -> (tid, CPU samples) in checkpoint i."""
    return {"compute": (1, 5), "parse": (2, 2 + i % 3), "spin": (2, 4 if i <= 10 else 0)}


def offcpu_pattern(i: int) -> dict[tuple[str, str], tuple[int, int]]:
    """(stack name, state) -> (tid, ns off the CPU) in checkpoint i."""
    return {("sleep", "S"): (1, 150_000_000), ("read", "D"): (2, 20_000_000 * (i % 2)),
            ("compute", "R"): (1, 3_000_000)}


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    synth = Synth(tmp_path_factory.mktemp("wall") / "p.db",
                  meta={"cpu_freq_hz": FREQ, "offcpu_event": "sched:sched_switch"})
    stacks = {
        "compute": synth.stack("compute", "worker", "main"),
        "parse": synth.stack(("parse", "parser.c", 40), "main"),
        "spin": synth.stack("spin", "main"),
        # an off-CPU stack starts at the kernel, which the state's frame replaces
        "sleep": synth.stack("[kernel]", ("nanosleep", "", 0, "/usr/lib/libc.so.6"),
                             "nap", "worker", "main"),
        "read": synth.stack("[kernel]", "read_file", "main"),
    }
    for i in range(1, CHECKPOINTS + 1):
        synth.checkpoint(
            {(stacks[name], tid): n for name, (tid, n) in cpu_pattern(i).items() if n},
            offcpu={(stacks[name], tid, state): (1, ns)
                    for (name, state), (tid, ns) in offcpu_pattern(i).items() if ns})
    return synth.finish()


def model(path: Path, tid: int | None = None) -> WallModel:
    return live_model(WallModel, path, TREND, tid)


SELECTIONS = [
    pytest.param(None, WHOLE_RECORDING, NO_FILTER, id="whole"),
    pytest.param(1, WHOLE_RECORDING, NO_FILTER, id="thread"),
    pytest.param(2, WHOLE_RECORDING, NO_FILTER, id="other-thread"),
    pytest.param(None, TimeRange(5, 12), NO_FILTER, id="window"),
    pytest.param(1, TimeRange(None, 8), NO_FILTER, id="thread-window"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(focus="worker"), id="focus"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(focus=r"\[sleeping\]"),
                 id="focus-state"),
    pytest.param(None, WHOLE_RECORDING, FrameFilter.compile(hide="nanosleep"), id="hide"),
]


@pytest.mark.parametrize(("tid", "time_range", "filters"), SELECTIONS)
def test_rows_are_top_walls(profile: Path, tid: int | None, time_range: TimeRange,
                            filters: FrameFilter) -> None:
    wall = model(profile, tid)
    got = {(r.function, r.self_samples, r.total_samples, round(r.self_pct, 2),
            round(r.total_pct, 2)) for r in wall.rows(filters, time_range)}
    with Profile(profile) as opened:
        selection = select(opened, SampleQuery("wall", tid, time_range, filters))
    expected = {(r.function, r.self, r.total, r.self_pct, r.total_pct)
                for r in cpu_rows(selection)}
    assert got and got == expected


def test_wall_is_cpu_periods_plus_offcpu_ns(profile: Path) -> None:
    rows = {r.function: r for r in model(profile, 1).rows()}
    cpu = sum(cpu_pattern(i)["compute"][1] for i in range(1, CHECKPOINTS + 1)) * PERIOD_NS
    sleeping = 150_000_000 * CHECKPOINTS
    preempted = 3_000_000 * CHECKPOINTS
    # preempted on the CPU: no [kernel] leaf, the state's frame tops the stack
    assert (rows["compute"].self_samples, rows["compute"].total_samples) == (
        cpu, cpu + preempted)
    assert "[kernel]" not in rows  # replaced by the state
    assert rows["[sleeping]"].self_samples == sleeping
    assert rows["nap"].total_samples == sleeping and rows["nap"].self_samples == 0
    assert rows["[preempted]"].self_samples == preempted
    whole = cpu + sleeping + preempted
    assert rows["main"].total_samples == whole
    assert rows["[sleeping]"].self_pct == pytest.approx(100 * sleeping / whole)


def test_keys_keep_stack_and_state_apart() -> None:
    assert split_offcpu_key(offcpu_key(12345, "S")) == (12345, "S")
    assert offcpu_key(1, "S") != offcpu_key(1, "R") and offcpu_key(1, "S") < 0


def test_reading_in_steps_equals_reading_at_once(profile: Path) -> None:
    followed = FollowedFile(profile)
    followed.read_meta()
    followed.read_checkpoints()
    wall = WallModel(followed, FunctionLabels(), TREND)
    for last in (1, 3, 17, 20):
        wall.read(last)
    assert sorted(wall.rows()) == sorted(model(profile).rows())


def test_live_and_trend_are_the_last_checkpoints(profile: Path) -> None:
    rows = {r.function: r for r in model(profile).rows()}
    last = range(CHECKPOINTS - TREND + 1, CHECKPOINTS + 1)
    assert rows["[uninterruptible wait]"].trend == tuple(20_000_000 * (i % 2) for i in last)
    assert rows["spin"].live_samples == 0


def test_tree_peek_and_series(profile: Path) -> None:
    wall = model(profile, 1)
    tree = wall.call_tree(WHOLE_RECORDING, NO_FILTER)
    main = tree.children[0]
    worker = next(c for c in main.children if c.function == "worker")
    nap = next(c for c in worker.children if c.function == "nap")
    assert nap.children[0].function == "nanosleep"
    assert nap.children[0].children[0].function == "[sleeping]"
    key = next(r.key for r in wall.rows() if r.function == "nap")
    peek = wall.peek(key, WHOLE_RECORDING, NO_FILTER)
    assert [n.function for n in peek.callers] == ["worker"]
    assert [n.function for n in peek.callees] == ["nanosleep"]
    series = wall.series(key, START_MS, START_MS + 20_000, 10_000, NO_FILTER)
    per = 100 * 150_000_000 / (150_000_000 + 3_000_000 + 5 * PERIOD_NS)
    assert [v for _t, v in series.points] == pytest.approx([per, per])


def test_live_profile_reads_wall_on_demand(profile: Path, tmp_path: Path) -> None:
    live = LiveProfile(profile)
    live.refresh()
    assert live.has_offcpu_data and live.no_offcpu_reason() == ""
    assert live.wall.last_id == 0  # not read until asked for
    rows = {r.function: r for r in live.cpu_rows(wall=True)}
    assert rows["[sleeping]"].self_samples == 150_000_000 * CHECKPOINTS
    assert {r.function for r in live.cpu_rows()} == {"compute", "worker", "main", "parse",
                                                      "spin"}
    live.set_thread(2)
    live.refresh()
    assert "[sleeping]" not in {r.function for r in live.cpu_rows(wall=True)}
    live.close()


def test_no_offcpu_reason(tmp_path: Path) -> None:
    synth = Synth(tmp_path / "none.db", meta={"offcpu_event": ""})
    synth.checkpoint({(synth.stack("main"), 1): 3})
    live = LiveProfile(synth.finish())
    live.refresh()
    assert not live.has_offcpu_data
    assert live.no_offcpu_reason() == "no off-CPU time: recorded with --no-off-cpu"
    live.close()
    synth = Synth(tmp_path / "refused.db", meta={"offcpu_error": "tracepoint refused"})
    synth.checkpoint({(synth.stack("main"), 1): 3})
    live = LiveProfile(synth.finish())
    live.refresh()
    assert live.no_offcpu_reason() == "off-CPU time was not recorded: tracepoint refused"
    live.close()
