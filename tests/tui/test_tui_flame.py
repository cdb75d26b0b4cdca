"""The flame view (`F`): an icicle of the call tree (CPU) or the allocation tree (Memory) of
the thread, time window and filter shown; its keys, and its layout's arithmetic."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from rsprof.storage.live import CallNode
from rsprof.tui.app import RsprofApp
from rsprof.tui.widgets.chart import ProfileChart
from rsprof.tui.widgets.flame import FlameView, layout
from rsprof.tui.widgets.header import ProfileHeader
from rsprof.tui.widgets.peek import PeekPanel
from rsprof.tui.widgets.table import ProfileTable
from textual.pilot import Pilot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import (
    append_checkpoints,
    build_profile,
    cpu_pattern,
    drive,
    make_app,
    press,
    settle,
)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_profile(tmp_path_factory.mktemp("flame") / "rsprof.demo.261123101530.db")


def status(flame: FlameView) -> str:
    return flame.render_line(flame.size.height - 1).text


def test_flame_keys(profile: Path) -> None:
    """F opens it on the root; j/k go down to the heaviest child and up, l/h along a row;
    Enter zooms in, u zooms out; e and c follow the selected frame; Esc closes it."""
    total = sum(c for i in range(1, 121) for _t, _f, c in cpu_pattern(i))

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        flame, table = main.query_one(FlameView), main.query_one(ProfileTable)
        await press(pilot, "F")
        assert flame.display and not table.display and flame.has_focus
        assert "1 CPU flame" in main.query_one(ProfileHeader).plain
        assert flame.selected_node is not None and flame.selected_node.key < 0  # the root
        assert f"total 100.0% ({total:,} samples)" in status(flame)
        await press(pilot, "j", "j")  # main, then its heaviest child
        node = flame.selected_node
        assert node is not None and node.function == "compute_hash"
        first_row = flame.render_line(0).text
        assert first_row.startswith("▏all samples 100.0%")
        # compute_hash's box is 51.7 % of main's 80 cells (its inclusive share)
        assert f"{100 * node.total_samples / total:.1f}%" in status(flame)
        boxes = layout(flame.root, 80) if flame.root else []
        widths = {b.node.function: b.width for b in boxes[2]}
        assert abs(widths["compute_hash"] - 80 * node.total_samples / total) <= 1
        await press(pilot, "l")
        second = flame.selected_node
        assert second is not None and second.function == "matrix_multiply"
        await press(pilot, "h", "e")  # callers and callees of compute_hash
        panel = main.query_one(PeekPanel)
        assert panel.display and panel.peek is not None
        assert panel.peek.function == "compute_hash"
        await press(pilot, "l")  # the panel follows the flame's selection
        assert panel.peek.function == "matrix_multiply"
        await press(pilot, "e", "enter")  # zoom into matrix_multiply
        assert flame.zoom == second.path
        assert flame.render_line(0).text.startswith("▏matrix_multiply 21.1%")
        await press(pilot, "u")  # one level out: main spans the width
        assert flame.zoom == second.path[:1]
        assert "matrix_multiply" in status(flame) and "│ zoom: main" in status(flame)
        await press(pilot, "u", "k")  # out again, then main
        assert flame.zoom == () and flame.selected_node is not None
        assert flame.selected_node.function == "main"
        await press(pilot, "c")
        chart = main.query_one(ProfileChart)
        assert chart.display and chart.state is not None
        assert chart.state.title.startswith("main ·")
        await press(pilot, "tab")
        assert chart.has_focus
        await press(pilot, "tab")
        assert flame.has_focus
        await press(pilot, "escape")  # the chart first
        assert not chart.display and flame.display
        await press(pilot, "escape")
        assert not flame.display and table.display and table.has_focus

    drive(make_app(profile), scenario)


def test_flame_follows_thread_and_memory(profile: Path) -> None:
    """The thread picker narrows it (worker-2 has no compute_hash); in the Memory view it
    draws live bytes of the allocation tree, of the thread picked."""

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        flame = main.query_one(FlameView)
        # the picker lists threads by samples: all, 4243, 4244, 4242
        await press(pilot, "F", "t", "j", "j", "enter")  # thread 4244 worker-2
        assert "thread 4244" in main.query_one(ProfileHeader).plain
        assert flame.root is not None
        names = {c.function for c in flame.root.children[0].children}
        assert "compute_hash" not in names and "matrix_multiply" in names
        await press(pilot, "t", "k", "k", "enter", "2")  # all threads, Memory view
        assert flame.display and flame.bytes and flame.root is not None
        assert "(1.5 MiB)" in status(flame)
        await press(pilot, "t", "j", "enter")  # thread 4243: leaky_cache_insert only
        assert flame.root is not None
        assert flame.root.total_samples == 8192 * 120
        await press(pilot, "c")  # the Memory chart is per call site: not in the flame
        assert not main.query_one(ProfileChart).display

    drive(make_app(profile), scenario)


def test_flame_live_keeps_zoom_and_selection(tmp_path: Path) -> None:
    """While the file is being recorded the icicle follows it (storage only), and the zoom
    and the selected frame stay on their call paths."""
    path = build_profile(tmp_path / "live.db", 30, state="recording")

    def samples(upto: int) -> int:
        return sum(c for i in range(1, upto + 1) for _t, _f, c in cpu_pattern(i))

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        flame = app.main.query_one(FlameView)
        await press(pilot, "F", "j", "enter", "j")  # zoom into main, select compute_hash
        assert flame.root is not None and flame.root.total_samples == samples(30)
        zoom, selected = flame.zoom, flame.selected
        append_checkpoints(path, 45)
        await pilot.pause(0.3)  # the timer (every 0.05 s here) picks it up
        await settle(pilot)
        assert flame.root is not None and flame.root.total_samples == samples(45)
        assert (flame.zoom, flame.selected) == (zoom, selected)
        node = flame.selected_node
        assert node is not None and node.function == "compute_hash"
        assert f"({node.total_samples:,} samples)" in status(flame)

    drive(make_app(path, live=True, refresh_interval=0.05), scenario)


def node(key: int, total: int, *children: CallNode, path: tuple[int, ...] = ()) -> CallNode:
    return CallNode(path, key, f"f{key}", "", total, total - sum(c.total_samples
                                                                  for c in children), children)


def test_layout_shares_and_cells() -> None:
    """Children share their parent's cells by total, left to right, heaviest first; a frame
    under one cell is not drawn, nor anything under it."""
    leaf = node(4, 1, path=(1, 4))
    root = node(-1, 1000, node(1, 600, leaf, path=(1,)), node(2, 399, path=(2,)),
                node(3, 1, path=(3,)))
    rows = layout(root, 100)
    assert [(b.node.key, b.x, b.width) for b in rows[0]] == [(-1, 0, 100)]
    assert [(b.node.key, b.x, b.width) for b in rows[1]] == [(1, 0, 60), (2, 60, 40)]
    assert len(rows) == 2  # f3 and f4 are 0.1 % of 100 cells: not drawn
    deep = root
    for depth in range(300):  # a deep stack: no recursion limit
        deep = node(depth, 10, deep)
    assert len(layout(deep, 80)) == 200  # capped
