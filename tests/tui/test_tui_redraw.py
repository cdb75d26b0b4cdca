"""What a key costs the UI thread: a cursor move redraws the two table lines whose highlight
changed, and the chart following the selection redraws no table line (measured while
holding `j`, a full redraw per key was the UI thread's main cost with the chart open); a
view key whose snapshot is quick to build is drawn with its data in one go, without a
worker; the Memory view's timeline is a few spans per line, not one per cell."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rsprof.storage.live import HeapTimeline
from rsprof.tui import main_screen
from rsprof.tui.main_screen import MainScreen
from rsprof.tui.model import Query, View
from rsprof.tui.widgets.chart import ProfileChart
from rsprof.tui.widgets.table import ProfileTable
from rsprof.tui.widgets.timeline import BLOCKS, timeline_text
from textual.strip import Strip

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import build_profile, make_app, settle


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_profile(tmp_path_factory.mktemp("redraw") / "rsprof.demo.261123101530.db")


def test_cursor_move_redraws_two_lines(profile: Path, monkeypatch: Any) -> None:
    drawn: list[int] = []
    original = ProfileTable.render_line

    def counting(self: ProfileTable, y: int) -> Strip:
        drawn.append(y)
        return original(self, y)

    monkeypatch.setattr(ProfileTable, "render_line", counting)
    app = make_app(profile)

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            table = app.main.query_one(ProfileTable)
            for chart in (False, True):
                if chart:
                    await pilot.press("c")
                    await settle(pilot)
                    assert app.main.query_one(ProfileChart).display
                for key in "jjkj":
                    drawn.clear()
                    before = table.cursor
                    await pilot.press(key)
                    await settle(pilot)  # the chart, if open, has followed the selection
                    assert table.cursor != before
                    # lines 1 + index of the old and the new cursor row, nothing else
                    assert sorted(set(drawn)) == sorted({before + 1, table.cursor + 1})
                    assert len(drawn) == 2

    asyncio.run(main())


def test_quick_view_key_built_without_a_worker(profile: Path, monkeypatch: Any) -> None:
    """`m` to a view whose snapshot took less than INLINE_BUILD_S the last time is built
    on the UI thread: the new columns are there once the key is handled, no worker ran. A
    kind of snapshot not built yet, or one that took longer, goes to the worker."""
    built: list[Query] = []
    original = MainScreen._build

    def counting(self: MainScreen, query: Query, refresh: bool) -> Any:
        built.append(query)
        return original(self, query, refresh)

    monkeypatch.setattr(MainScreen, "_build", counting)
    app = make_app(profile)

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            table = app.main.query_one(ProfileTable)
            # The first Memory and CPU snapshots of this kind: worker (nothing timed yet)
            for key, view in (("m", View.MEMORY), ("m", View.CPU)):
                built.clear()
                await pilot.press(key)
                await settle(pilot)
                assert [q.view for q in built] == [view]
            for key, label in (("m", "Live"), ("m", "Self %")):
                built.clear()
                await pilot.press(key)  # handled, not settled: no worker to wait for
                assert not built and table.columns[0].label == label
            monkeypatch.setattr(main_screen, "INLINE_BUILD_S", 0.0)  # every build "slow"
            built.clear()
            await pilot.press("m")
            await settle(pilot)
            assert [q.view for q in built] == [View.MEMORY]
            assert table.columns[0].label == "Live"

    asyncio.run(main())


def test_timeline_spans() -> None:
    """Each bar line is at most three spans (cyan, the peak's column, cyan) and draws the
    same cells as one span per cell did."""
    values = [1000 * (i % 17) + 500 for i in range(60)]
    peak_col = values.index(max(values))
    timeline = HeapTimeline(points=tuple((i * 1000.0, v) for i, v in enumerate(values)),
                            peak_bytes=max(values), peak_offset_ms=peak_col * 1000,
                            current_bytes=values[-1])
    lines = timeline_text(timeline, 80).split("\n")
    assert len(lines) == 4
    for line in lines[1:]:
        assert len(line.spans) <= 3
        bars = line.plain[1:]
        assert len(bars) == len(values) and set(bars) <= set(BLOCKS)
        for col in range(len(values)):
            style = line.get_style_at_offset(Console(), col + 1)
            assert str(style) == ("bold yellow" if col == peak_col else "cyan")
