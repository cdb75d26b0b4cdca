"""What a key costs the UI thread: a cursor move redraws the two table lines whose highlight
changed, and the chart following the selection redraws no table line (measured while
holding `j`, a full redraw per key was the UI thread's main cost with the chart open)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from rsprof.tui.widgets.chart import ProfileChart
from rsprof.tui.widgets.table import ProfileTable
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
