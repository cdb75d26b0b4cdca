"""The Wall view (`3`, issue 23): on-CPU + off-CPU time per function, per thread and for the
whole process, with the CPU view's table, tree, flame and callers. Its numbers are `rsprof
top wall --json`'s for the same selection; without off-CPU time the key says why."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rsprof.storage.live import CpuRow
from rsprof.tui.app import RsprofApp
from rsprof.tui.model import TreeRow, View
from rsprof.tui.widgets.flame import FlameView
from rsprof.tui.widgets.header import ProfileHeader
from rsprof.tui.widgets.peek import PeekPanel, peek_table
from textual.pilot import Pilot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import top_json
from tui_fixture import build_profile, drive, make_app, parts, press

SLEEP_NS = 600_000_000  # per checkpoint (tui_fixture.offcpu_pattern)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_profile(tmp_path_factory.mktemp("wall") / "rsprof.demo.261123101530.db",
                         60, offcpu=True)


def top_wall(path: Path, *options: str) -> dict[str, dict[str, Any]]:
    """`rsprof top wall FILE --json -n 0` by function."""
    return {row["function"]: row for row in top_json(path, "wall", *options)}


@pytest.mark.parametrize("tid", [None, 4242, 4243])
def test_wall_table_is_top_wall(profile: Path, tid: int | None) -> None:
    seen: dict[str, CpuRow] = {}

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _chart, _header = parts(app)
        if tid is not None:
            main.state = replace(main.state, thread=tid)
        await press(pilot, "3")
        assert main.state.view is View.WALL and main.snapshot is not None
        assert main.snapshot.selection is not None and main.snapshot.selection.kind == "wall"
        seen.update({r.function: r for r in table.rows if isinstance(r, CpuRow)})
        assert "3 Wall" in main.query_one(ProfileHeader).plain

    drive(make_app(profile), scenario)
    expected = top_wall(profile, *(["--tid", str(tid)] if tid is not None else []))
    assert set(seen) == set(expected)
    for name, row in expected.items():
        got = seen[name]
        assert (got.self_samples, got.total_samples) == (row["self"], row["total"])
        assert round(got.total_pct, 2) == row["total_pct"]
    if tid == 4243:
        assert "[sleeping]" not in seen and "[preempted]" in seen
    else:
        assert seen["[sleeping]"].self_samples == 60 * SLEEP_NS
        assert seen["[sleeping]"].location == "?"  # as `top wall`: no file, no line


def test_tree_flame_and_callers(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _chart, _header = parts(app)
        await press(pilot, "3", "f")
        names = [r.name for r in table.rows if isinstance(r, TreeRow)]
        assert names[:3] == ["main", "idle_wait", "[sleeping]"]  # the heaviest path, open
        await press(pilot, "F")
        flame = main.query_one(FlameView)
        assert flame.display and flame.unit == "ns" and flame.root is not None
        status = flame.render_line(flame.size.height - 1).text
        assert status.startswith(" all wall time") and " s)" in status  # time, not samples
        await press(pilot, "escape", "escape")  # back to the tree, then the table
        rows = [r for r in table.rows if isinstance(r, CpuRow)]
        index = next(i for i, r in enumerate(rows) if r.function == "idle_wait")
        table._move(index)
        await press(pilot, "e")
        assert main.query_one(PeekPanel).display
        peek = main.snapshot.peek if main.snapshot else None
        assert peek is not None and peek.function == "idle_wait"
        assert [n.function for n in peek.callees] == ["[sleeping]"]
        assert peek.callees[0].samples == 60 * SLEEP_NS
        console = Console(width=120, record=True, color_system=None)
        console.print(peek_table(peek, "whole recording", wall=True))
        text = console.export_text()
        assert "Time" in text and "36.00 s" in text  # [sleeping]: 60 x 600 ms, as time

    drive(make_app(profile), scenario, size=(120, 40))


def test_cpu_view_unchanged_beside_wall(profile: Path) -> None:
    """The CPU view counts samples, with no off-CPU row, before and after the Wall view."""
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _chart, _header = parts(app)
        before = list(table.rows)
        assert not any(r.function.startswith("[") for r in before if isinstance(r, CpuRow))
        await press(pilot, "3", "1")
        assert main.state.view is View.CPU and list(table.rows) == before

    drive(make_app(profile), scenario)


def test_key_says_why_without_offcpu_data(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "rsprof.demo.261123101530.db", 10)
    said: list[str] = []

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, _table, _chart, header = parts(app)
        assert "Wall" not in header
        main.notify = lambda message, **_kw: said.append(message)  # type: ignore[method-assign]
        await press(pilot, "3")
        assert main.state.view is View.CPU

    drive(make_app(path), scenario)
    assert said == ["Wall view: no off-CPU time: recorded with --no-off-cpu"]
