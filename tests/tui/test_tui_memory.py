"""The Memory view's Frees and Growing columns (issue 24 item 6), and the selection rule
every view shares (docs/tui.md, "Selection"), on the fixture profile (tui_fixture.py)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from rsprof.storage.analysis import growing_sites, top_heap
from rsprof.storage.live import HeapRow, LiveProfile
from rsprof.storage.reader import Profile
from rsprof.tui.app import RsprofApp
from rsprof.tui.model import TreeRow, View
from rsprof.tui.widgets.flame import FlameView
from rsprof.tui.widgets.table import ProfileTable
from textual.pilot import Pilot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import START_MS, append_checkpoints, build_profile, drive, make_app, press


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_profile(tmp_path_factory.mktemp("mem") / "fixture.db")


def heap_rows(source: LiveProfile, tid: int | None = None) -> dict[str, HeapRow]:
    source.set_thread(tid)
    source.refresh()
    return {r.function: r for r in source.heap_rows()}


def add_quiet_checkpoints(path: Path, upto: int) -> None:
    """Checkpoints with CPU samples and no heap activity (live bytes stay where they are)."""
    conn = sqlite3.connect(path)
    last = conn.execute("SELECT MAX(id) FROM checkpoints").fetchone()[0]
    for i in range(last + 1, upto + 1):
        conn.execute("INSERT INTO checkpoints VALUES (?, ?, 1, 0, 0, 0, 1.0, 50000000)",
                     (i, START_MS + i * 1000))
        conn.execute("INSERT INTO cpu_stack_samples VALUES (?, 1, 4242, 1)", (i,))
        conn.commit()
    conn.close()


# -- the query ------------------------------------------------------------------------------


@pytest.mark.parametrize("checkpoints", [1, 4, 30, 120])
def test_frees_and_growing_equal_top_heap(tmp_path: Path, checkpoints: int) -> None:
    """Each call site's Frees and Growing are `rsprof top heap`'s (storage.analysis)."""
    path = build_profile(tmp_path / "p.db", checkpoints)
    source = LiveProfile(path)
    try:
        rows = heap_rows(source)
    finally:
        source.close()
    with Profile(path) as p:
        expected = {r.function: r for r in top_heap(p, limit=None)}
    assert rows.keys() == expected.keys()
    for name, row in rows.items():
        want = expected[name]
        assert (row.free_count, row.free_bytes, row.growing, row.live_bytes, row.alloc_count) \
            == (want.free_count, want.total_free_bytes, want.growing, want.live_bytes,
                want.alloc_count), name
    # the fixture's leak grows from the third checkpoint on; nothing else ever grows
    assert {n for n, r in rows.items() if r.growing} == (
        {"leaky_cache_insert"} if checkpoints >= 3 else set())
    if checkpoints >= 60:
        assert rows["load_config"].free_count == 1  # half of its MiB freed at 60
    assert rows["make_buffer"].free_count == 16 * checkpoints


def test_growing_is_of_the_checkpoints_read(tmp_path: Path) -> None:
    """A site stops growing once its live bytes stay flat over the last checkpoints; the
    rows say what the checkpoints read so far say, not what the file says since."""
    path = build_profile(tmp_path / "live.db", 10, state="recording")
    source = LiveProfile(path)
    try:
        assert heap_rows(source)["leaky_cache_insert"].growing
        add_quiet_checkpoints(path, 20)
        # not refreshed yet: still what checkpoint 10 said
        assert {r.function for r in source.heap_rows() if r.growing} == {"leaky_cache_insert"}
        rows = heap_rows(source)  # flat for 10 checkpoints: no longer growing
        assert not any(r.growing for r in rows.values())
        with Profile(path) as p:
            assert growing_sites(p) == set()
            assert growing_sites(p, last=10) == {10}  # the leak's location id
        append_checkpoints(path, 24)  # the fixture's pattern again: 8 KiB a checkpoint
        assert heap_rows(source)["leaky_cache_insert"].growing
    finally:
        source.close()


def test_frees_per_allocating_thread(profile: Path) -> None:
    """With a thread picked, Frees counts the frees of the blocks that thread allocated
    (make_buffer's are split between 4242 and 4244); Growing stays the whole process's, as
    `top heap --tid` marks it."""
    source = LiveProfile(profile)
    try:
        every = heap_rows(source)
        main_thread = heap_rows(source, 4242)
        worker = heap_rows(source, 4243)
    finally:
        source.close()
    assert main_thread["make_buffer"].free_count * 2 == every["make_buffer"].free_count
    assert main_thread.keys() == {"make_buffer", "load_config"}
    assert worker.keys() == {"leaky_cache_insert"} and worker["leaky_cache_insert"].growing


# -- the view -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_memory_view_columns(profile: Path, size: tuple[int, int]) -> None:
    """Frees and Growing show at 80 columns (Allocated from 100 up); `s` cycles the columns
    shown; sorting by Growing puts the growing site first."""

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        table = main.query_one(ProfileTable)
        await press(pilot, "2")
        labels = [c.label for c in table.shown_columns]
        wide = size[0] >= 100
        assert labels == ["Live", *(["Allocated"] if wide else []), "Allocs", "Frees",
                          "Growing", "Function", "Location", "Trend"]
        lines = [table.render_line(y).text for y in range(4)]
        assert "Frees" in lines[0] and "Growing" in lines[0]
        leak = next(line for line in lines if "leaky_cache" in line)
        assert "▲ yes" in leak and " 0 " in leak  # never freed
        churn = next(line for line in lines if "make_buffer" in line)
        assert "1,920" in churn and "▲" not in churn
        sorts = []
        for _ in range(6 if wide else 5):
            await press(pilot, "s")
            sorts.append(main.state.sort[0])
        assert sorts == [*(["alloc_bytes"] if wide else []), "alloc_count", "free_count",
                         "growing", "function", "location"]
        await press(pilot, "s")  # Live again, then on to Growing
        assert main.state.sort == ("live_bytes", True)
        await press(pilot, *(["s"] * (4 if wide else 3)))
        assert main.state.sort == ("growing", True)
        assert table.rows[0].function == "leaky_cache_insert"
        await press(pilot, "S")  # reversed: the growing site last
        assert table.rows[-1].function == "leaky_cache_insert"

    drive(make_app(profile), scenario, size=size)


# -- the selection rule ---------------------------------------------------------------------


def test_selection_follows_the_item_in_every_view(profile: Path) -> None:
    """Sorting moves the cursor with its row; each table and tree keeps its selection while
    another view is shown (1/2/m, f)."""

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        table = main.query_one(ProfileTable)
        await press(pilot, "j")  # compute_hash
        assert table.selected is not None and table.selected.function == "compute_hash"
        await press(pilot, "s")  # sorted by Live %: the row moved, the cursor with it
        assert table.selected.function == "compute_hash"
        await press(pilot, "2", "j", "j")  # Memory: make_buffer (third by Live)
        assert table.selected is not None and table.selected.function == "make_buffer"
        await press(pilot, "s")  # by Allocs: make_buffer is first now, and still selected
        assert table.cursor == 0 and table.selected.function == "make_buffer"
        await press(pilot, "m")
        assert main.state.view is View.CPU and table.selected.function == "compute_hash"
        await press(pilot, "f", "j", "j")  # tree: main > compute_hash > hash_round
        row = table.selected
        assert isinstance(row, TreeRow) and row.name == "hash_round"
        await press(pilot, "f")  # the table, as it was left
        assert table.selected.function == "compute_hash"
        await press(pilot, "f")  # and the tree
        assert isinstance(table.selected, TreeRow) and table.selected.name == "hash_round"
        await press(pilot, "f", "2")
        assert table.selected.function == "make_buffer"

    drive(make_app(profile), scenario)


def test_selection_of_a_node_gone_goes_to_its_caller(profile: Path) -> None:
    """In the tree, a node the filter drops gives way to its nearest caller shown, as in the
    flame view; in a table, to the row now at its position."""

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        table = main.query_one(ProfileTable)
        await press(pilot, "f", "j", "j")
        assert isinstance(table.selected, TreeRow) and table.selected.name == "hash_round"
        # a frame of src/hash.c matches (compute_hash) but not hash.h (hash_round)
        await press(pilot, "slash", *"matrix", "enter")
        row = table.selected  # compute_hash's path is gone: its caller, main
        assert isinstance(row, TreeRow) and row.name == "main" and table.cursor == 0
        await press(pilot, "escape", "escape")  # filter, then the tree
        await press(pilot, "G")  # the table's last row
        last = table.cursor
        await press(pilot, "slash", *"hash", "enter")  # three rows left: the last of them
        assert table.cursor == len(table.rows) - 1 < last
        assert main.state.filter == "hash"

    drive(make_app(profile), scenario)


def test_flame_keeps_each_views_selection(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        flame = app.main.query_one(FlameView)
        await press(pilot, "F", "j", "j", "l")  # main > matrix_multiply
        cpu_node = flame.selected_node
        assert cpu_node is not None and cpu_node.function == "matrix_multiply"
        await press(pilot, "m")  # the allocation flame: its own selection (its root)
        assert flame.bytes and flame.selected == ()
        await press(pilot, "j")
        memory = flame.selected
        assert memory != ()
        await press(pilot, "m")
        assert not flame.bytes and flame.selected_node is not None
        assert flame.selected_node.function == "matrix_multiply"
        await press(pilot, "m")
        assert flame.selected == memory

    drive(make_app(profile), scenario)
