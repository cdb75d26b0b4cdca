"""The output pane (`o`, issue 24 item 2): what the program `rsprof run` started wrote, read
from the profile's target_output as the file gets it, on the fixture profile (tui_fixture.py).
The pane under a real `rsprof run` is tests/system/test_tui_tmux.py's."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

from rsprof.tui.app import RsprofApp
from rsprof.tui.widgets.output import NOTHING, OutputPanel
from rsprof.tui.widgets.table import ProfileTable
from textual.pilot import Pilot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import START_MS, append_checkpoints, build_profile, drive, make_app, press, settle


def test_output_pane_shows_the_programs_output_live(tmp_path: Path) -> None:
    """o opens the pane: target_output's lines in order, stderr red, a line split across
    chunks joined, `\\r` progress kept as its last state; new chunks appear as the file
    gets them; Tab focuses it, Esc closes it. Without output it says why."""
    path = build_profile(tmp_path / "out.db", 10, state="recording")

    def write(*chunks: tuple[str, bytes]) -> None:
        conn = sqlite3.connect(path)
        conn.executemany("INSERT INTO target_output (time_ms, stream, data) VALUES (?, ?, ?)",
                         [(START_MS, stream, data) for stream, data in chunks])
        conn.commit()
        conn.close()

    def lines(panel: OutputPanel) -> list[str]:
        return [strip.text.rstrip() for strip in panel.lines]

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        panel = main.query_one(OutputPanel)
        await press(pilot, "o")
        assert panel.display and lines(panel) == [NOTHING]
        write(("stdout", b"out 0\nout "), ("stderr", b"err 0\n"), ("stdout", b"1\n"),
              ("stdout", b"progress 10%\rprogress 100%\n"))
        append_checkpoints(path, 11)
        for _ in range(100):
            await pilot.pause(0.05)
            if len(lines(panel)) >= 3:
                break
        await settle(pilot)
        assert lines(panel) == ["out 0", "err 0", "out 1", "progress 100%"]
        styles = [str(seg.style) for seg in panel.lines[1]._segments if seg.text.strip()]
        assert any("red" in s for s in styles)
        write(("stderr", b"err 1\n"))
        for _ in range(100):
            await pilot.pause(0.05)
            if "err 1" in lines(panel):
                break
        assert lines(panel)[-1] == "err 1"
        shown = lines(panel)
        panel.add(app.source.output(0))  # a read that overlapped another: nothing twice
        await settle(pilot)
        assert lines(panel) == shown
        await press(pilot, "tab")
        assert panel.has_focus
        await press(pilot, "escape")
        assert not panel.display and main.query_one(ProfileTable).has_focus

    drive(make_app(path, live=True, refresh_interval=0.05), scenario, size=(100, 30))
