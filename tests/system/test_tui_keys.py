"""Every key of the TUI, driven with Textual's pilot (`App.run_test`), each checking its effect."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from rsprof.tui.app import RsprofApp
from rsprof.tui.screens import ThreadPicker
from textual.pilot import Pilot
from textual.widgets import OptionList

# tests/ is not a package: make its helpers importable under plain `pytest` too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import (
    build_profile,
    drive,
    make_app,
    parts,
    press,
    settle,
)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_profile(tmp_path_factory.mktemp("tui") / "fixture.db")










def test_row_navigation_j_k_g_G(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        _, table, _, _ = parts(app)
        assert table.cursor == 0
        await press(pilot, "j", "j")
        assert table.cursor == 2 and table.selected
        assert table.selected.function == "matrix_multiply"
        await press(pilot, "k")
        assert table.selected and table.selected.function == "compute_hash"
        await press(pilot, "G")
        assert table.cursor == len(table.rows) - 1 and table.selected.function == "idle_wait"
        await press(pilot, "g")
        assert table.cursor == 0
        await press(pilot, "down", "down", "up")
        assert table.cursor == 1

    drive(make_app(profile), scenario)


def test_thread_picker_names_the_process_of_each_thread(tmp_path: Path) -> None:
    """A recording that followed children: the picker says which process each thread is in,
    so one child's samples can be picked out."""
    from conftest import build_target, run_rsprof

    alpha = build_target("phase.c", ("-DPHASE=alpha",))
    path = tmp_path / "children.db"
    result = run_rsprof("run", "-q", "--no-heap", "-o", str(path), "--", "sh", "-c",
                        f"{alpha} 200; true")
    assert result.returncode == 0, result.stderr

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        await settle(pilot)
        await press(pilot, "t")
        assert isinstance(app.screen, ThreadPicker)
        options = app.screen.query_one(OptionList)
        labels = [str(options.get_option_at_index(i).prompt)
                  for i in range(options.option_count)]
        assert any("pid " in label and alpha.name in label for label in labels), labels
        assert any("pid " in label and " sh" in label for label in labels), labels

    drive(make_app(path), scenario, size=(120, 30))


