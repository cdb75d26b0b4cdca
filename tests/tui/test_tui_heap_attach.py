"""The TUI on a profile whose heap `rsprof -p` recorded by loading the shim into the running
process (issue 22 item 2): the header says since when the heap is known; a profile whose
attach could not load it says why on the Memory view's page."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rsprof.tui.app import RsprofApp
from rsprof.tui.widgets.header import ProfileHeader
from rsprof.tui.widgets.table import ProfileTable
from textual.pilot import Pilot
from textual.widgets import Static

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import build_profile, make_app, settle

ATTACHED = datetime(2026, 11, 26, 18, 4, 5, 250000, tzinfo=UTC)


def _meta(path: Path, **values: str) -> Path:
    with sqlite3.connect(path) as conn:
        conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())
    return path


def _run(app: RsprofApp, keys: str, check: Any) -> None:
    async def main() -> None:
        async with app.run_test(size=(100, 24)) as pilot:
            await settle(pilot)
            for key in keys:
                await pilot.press(key)
                await settle(pilot)
            check(app, pilot)

    asyncio.run(main())


def test_header_says_heap_since_attach(tmp_path: Path) -> None:
    path = _meta(build_profile(tmp_path / "attached.db", 20), heap_since="attach",
                 heap_attached_at=ATTACHED.isoformat(timespec="milliseconds"))
    local = ATTACHED.astimezone().strftime("%H:%M:%S")

    def check(app: RsprofApp, _pilot: Pilot[Any]) -> None:
        header = app.main.query_one(ProfileHeader).plain
        assert f"heap since attach {local}" in header, header
        assert app.main.query_one(ProfileTable).display  # the Memory view's rows

    _run(make_app(path), "2", check)
    _run(make_app(path), "", check)  # the CPU view says it too, where there is room


def test_no_attach_no_since(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "run.db", 20)

    def check(app: RsprofApp, _pilot: Pilot[Any]) -> None:
        assert "since attach" not in app.main.query_one(ProfileHeader).plain

    _run(make_app(path), "2", check)


def test_memory_page_says_why_heap_was_off(tmp_path: Path) -> None:
    reason = "ptrace refused: it is traced by PID 77 (strace)"
    path = _meta(build_profile(tmp_path / "refused.db", 20, heap_mode="none"),
                 heap_off_reason=reason)

    def check(app: RsprofApp, _pilot: Pilot[Any]) -> None:
        page = app.main.query_one("#no-heap", Static)
        assert page.display
        text = str(page.render())
        assert f"Heap tracking was off: {reason}." in text, text
        assert "since attach" not in app.main.query_one(ProfileHeader).plain

    _run(make_app(path), "2", check)
