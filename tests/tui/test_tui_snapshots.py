"""SVG snapshots of the TUI (pytest-textual-snapshot) from the fixed fixture profile.

Update after an intended change with `python -m pytest tests/tui/test_tui_snapshots.py
--snapshot-update`, then look at the SVGs before committing them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

# tests/ is not a package: make its helpers importable under plain `pytest` too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import build_profile, make_app, settle

SIZES = pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A realistic name: rsprof's default is rsprof.<process>.<yymmddHHMMSS>.db
    return build_profile(tmp_path_factory.mktemp("snap") / "rsprof.myserver.261123101530.db")


def keys(*presses: str) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        for key in presses:
            await pilot.press(key)
            await settle(pilot)

    return run_before


@SIZES
def test_cpu_view(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(profile), terminal_size=size, run_before=keys())


@SIZES
def test_memory_view(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(profile), terminal_size=size, run_before=keys("2"))


@SIZES
def test_chart_open(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(profile), terminal_size=size, run_before=keys("j", "c"))


@SIZES
def test_filter_active(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    run_before = keys("slash", "h", "a", "s", "h")
    assert snap_compare(make_app(profile), terminal_size=size, run_before=run_before)


@SIZES
def test_call_tree(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(profile), terminal_size=size, run_before=keys("f"))


@SIZES
def test_callers_callees(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(profile), terminal_size=size, run_before=keys("j", "e"))


@SIZES
def test_live_target_exited(
    snap_compare: Any, tmp_path: Path, size: tuple[int, int]
) -> None:
    path = build_profile(tmp_path / "rsprof.myserver.261123101530.db", 60,
                         stop_reason="target-exited")
    app = make_app(path, live=True)
    assert snap_compare(app, terminal_size=size, run_before=keys())


@SIZES
def test_memory_tree(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(profile), terminal_size=size, run_before=keys("2", "f"))


@SIZES
def test_flame_view(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    # root, main, compute_hash selected (the widest frame under main)
    assert snap_compare(make_app(profile), terminal_size=size, run_before=keys("F", "j", "j"))


@SIZES
def test_flame_zoomed(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    # matrix_multiply (main's second child) zoomed to the full width
    run_before = keys("F", "j", "j", "l", "enter")
    assert snap_compare(make_app(profile), terminal_size=size, run_before=run_before)


@SIZES
def test_memory_thread(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    # thread 4243 (worker-1) picked: the heap it allocated (leaky_cache_insert only)
    run_before = keys("2", "t", "j", "enter")
    assert snap_compare(make_app(profile), terminal_size=size, run_before=run_before)


@SIZES
def test_memory_flame(snap_compare: Any, profile: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(profile), terminal_size=size, run_before=keys("2", "F"))


@pytest.fixture(scope="module")
def offcpu_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_profile(tmp_path_factory.mktemp("snap-wall") / "rsprof.myserver.261123101530.db",
                         offcpu=True)


@SIZES
def test_wall_view(snap_compare: Any, offcpu_profile: Path, size: tuple[int, int]) -> None:
    """`3`: on-CPU + off-CPU time; [sleeping] (idle_wait's off-CPU time) leads it."""
    assert snap_compare(make_app(offcpu_profile), terminal_size=size, run_before=keys("3"))


@SIZES
def test_wall_tree(snap_compare: Any, offcpu_profile: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(offcpu_profile), terminal_size=size,
                        run_before=keys("3", "f"))
