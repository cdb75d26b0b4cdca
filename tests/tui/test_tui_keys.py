"""Every key of the TUI, driven with Textual's pilot (`App.run_test`), each checking its effect."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from rsprof.storage.live import CpuRow
from rsprof.tui.app import RsprofApp
from rsprof.tui.main_screen import MainScreen
from rsprof.tui.model import TreeRow, View
from rsprof.tui.screens import ConfirmQuit, HelpScreen, ThreadPicker
from rsprof.tui.widgets.header import ProfileHeader
from rsprof.tui.widgets.peek import PeekPanel
from rsprof.tui.widgets.table import ProfileTable
from rsprof.tui.widgets.timeline import HeapTimelineView
from textual.pilot import Pilot
from textual.widgets import Input, OptionList, Static

# tests/ is not a package: make its helpers importable under plain `pytest` too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tui_fixture import (
    FAKE_NOW,
    LONG_NAME,
    START_MS,
    append_checkpoints,
    build_profile,
    cpu_pattern,
    drive,
    finish,
    make_app,
    parts,
    press,
    settle,
)
from unit.synthetic import schema_1_copy


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_profile(tmp_path_factory.mktemp("tui") / "fixture.db")


def names(table: ProfileTable) -> list[str]:
    return [r.function for r in table.rows]


def tree(table: ProfileTable) -> list[TreeRow]:
    rows = [r for r in table.rows if isinstance(r, TreeRow)]
    assert len(rows) == len(table.rows)
    return rows


def chosen(table: ProfileTable) -> TreeRow:
    row = table.selected
    assert isinstance(row, TreeRow)
    return row


def cpu(table: ProfileTable) -> list[CpuRow]:
    rows = [r for r in table.rows if isinstance(r, CpuRow)]
    assert len(rows) == len(table.rows)
    return rows


def test_view_keys_1_2_m(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, header = parts(app)
        # Total % (inclusive) first: the program's own main leads, then its hot functions
        assert main.state.view is View.CPU and names(table)[:2] == ["main", "compute_hash"]
        assert "VIEW" in header and "8,940 samples" in header and "demo PID 4242" in header
        await press(pilot, "2")
        assert main.state.view is View.MEMORY and names(table)[0] == "leaky_cache_insert"
        assert table.columns[0].label == "Live"
        await press(pilot, "1")
        assert main.state.view is View.CPU
        assert [c.label for c in table.columns][:3] == ["Self %", "Total %", "Live %"]
        await press(pilot, "m")
        assert main.state.view is View.MEMORY
        await press(pilot, "m")
        assert main.state.view is View.CPU

    drive(make_app(profile), scenario)


def test_half_page_ctrl_d_ctrl_u(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        _, table, _, _ = parts(app)
        half = table.page_rows // 2
        assert 0 < half and 2 * half < len(table.rows)
        await press(pilot, "ctrl+d")
        assert table.cursor == half
        await press(pilot, "ctrl+d")
        assert table.cursor == 2 * half
        await press(pilot, "ctrl+u")
        assert table.cursor == half

    drive(make_app(profile), scenario, size=(80, 10))


def test_chart_c_enter_escape_b_z_tab(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, chart, _ = parts(app)
        assert not chart.display
        await press(pilot, "c")
        assert main.state.chart_open and chart.display and chart.state is not None
        assert chart.state.title.startswith("main · Total % of samples · 1m window · line")
        assert chart.state.series is not None and len(chart.state.series.points) == 60
        assert {y for _x, y in chart.state.series.points} == {100.0}  # main is on every stack
        await press(pilot, "j")  # the chart follows the selection
        assert chart.state.title.startswith("compute_hash")
        await press(pilot, "b")
        assert chart.state.bar and "· bar" in chart.state.title
        await press(pilot, "z")
        assert chart.state.from_zero and "y from 0" in chart.state.title
        await press(pilot, "tab")
        assert chart.has_focus
        await press(pilot, "tab")
        assert table.has_focus
        await press(pilot, "escape")
        assert not main.state.chart_open and not chart.display
        await press(pilot, "enter")
        assert main.state.chart_open and chart.display
        await press(pilot, "enter")
        assert not main.state.chart_open

    drive(make_app(profile), scenario)


def test_zoom_and_pan(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        _, _, chart, _ = parts(app)
        await press(pilot, "c")
        assert chart.state and " 1m window" in chart.state.title
        await press(pilot, "plus")
        assert chart.state and " 30s window" in chart.state.title
        assert chart.state.series and len(chart.state.series.points) == 30
        await press(pilot, "minus", "minus")
        assert chart.state and " 5m window" in chart.state.title
        await press(pilot, "minus", "minus", "minus", "minus", "minus", "minus")
        assert chart.state and " 1d window" in chart.state.title  # the widest level
        await press(pilot, *["plus"] * 10)
        assert chart.state and " 5s window" in chart.state.title  # the narrowest level
        last = chart.state.series.points[-1][0] if chart.state.series else None
        await press(pilot, "h")
        assert chart.state and "2s back" in chart.state.title
        assert chart.state.series and chart.state.series.points[-1][0] < (last or 0)
        await press(pilot, "h", "l")
        assert chart.state and "2s back" in chart.state.title
        await press(pilot, "l", "l")  # cannot pan past the newest checkpoint
        assert chart.state and "back" not in chart.state.title

    drive(make_app(profile), scenario)


def test_sort_s_and_header_click(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        assert table.sort_key == "total"
        await press(pilot, "s")
        assert table.sort_key == "live" and names(table)[:2] == ["main", "compute_hash"]
        assert names(table)[2] == "parse_input"  # 15 samples in the last interval
        await press(pilot, "s")
        assert table.sort_key == "function" and not table.descending
        assert names(table)[:2] == ["__memmove_avx_unaligned_erms", "compress_block"]
        await press(pilot, "S")  # reverses
        assert table.sort_key == "function" and table.descending
        await press(pilot, "s", "s")
        assert table.sort_key == "self" and names(table)[0] == "compute_hash"
        assert names(table)[-1] == "main"  # 1 self sample a checkpoint
        await press(pilot, "s")
        assert table.sort_key == "total"
        # click the Location header (x beyond the Function column), then again to reverse
        location_x = sum(w + 1 for w in table._widths()[:4]) + 2
        await pilot.click(ProfileTable, offset=(location_x, 0))
        await settle(pilot)
        assert table.sort_key == "location" and not table.descending
        await pilot.click(ProfileTable, offset=(location_x, 0))
        await settle(pilot)
        assert table.sort_key == "location" and table.descending
        await pilot.click(ProfileTable, offset=(5, 3))  # a row: selects it
        await settle(pilot)
        assert table.cursor == 2
        assert main.state.sorts[View.MEMORY.slot] == ("live_bytes", True)

    drive(make_app(profile), scenario)


def test_filter_slash_and_escape(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        await press(pilot, "slash")
        box = main.query_one("#filter", Input)
        assert box.display and box.has_focus
        await press(pilot, "h", "a", "s", "h")
        # `--focus hash`: the functions of the samples through a frame matching it (its
        # function, file or module), main included; percentages of every sample
        assert names(table) == ["compute_hash", "main", "hash_round"]
        assert "focus hash" in main.query_one(ProfileHeader).plain
        await press(pilot, "enter")  # keeps the filter, back to the table
        assert table.has_focus and names(table) == ["compute_hash", "main", "hash_round"]
        await press(pilot, "j")
        assert table.selected and table.selected.function == "hash_round"  # from main
        await press(pilot, "escape")
        assert len(table.rows) == 9 and not box.display and main.state.filter == ""
        await press(pilot, "slash", "x", "y", "z")
        assert table.rows == [] and "matching “xyz” (--focus)" in table.empty_text
        await press(pilot, "escape")
        assert len(table.rows) == 9
        # a module's path matches too: only libc's memmove and its caller
        await press(pilot, "slash", *"libc", "enter")
        assert names(table) == ["__memmove_avx_unaligned_erms", "main"]
        await press(pilot, "slash", "backspace", "backspace", "backspace", "backspace", "(")
        assert table.rows == [] and "not a valid regex" in table.empty_text

    drive(make_app(profile), scenario)


def test_thread_picker_t(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        await press(pilot, "t")
        assert isinstance(app.screen, ThreadPicker)
        options = app.screen.query_one(OptionList)
        labels = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert labels[0] == "All threads" and any("worker-2" in x for x in labels)
        # order: most samples first: worker-1, worker-2, demo
        await press(pilot, "j", "j", "enter")
        assert isinstance(app.screen, MainScreen)
        assert main.state.thread == 4244
        assert set(names(table)) == {"main", "matrix_multiply", "compress_block", LONG_NAME}
        assert "thread 4244 worker-2" in main.query_one(ProfileHeader).plain
        await press(pilot, "t", "escape")  # cancel keeps the choice
        assert main.state.thread == 4244
        await press(pilot, "t", "g", "enter")
        assert main.state.thread is None and len(table.rows) == 9

    drive(make_app(profile), scenario)


def test_help_question_mark(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        await press(pilot, "question_mark")
        assert isinstance(app.screen, HelpScreen)
        await press(pilot, "1")  # main-screen keys do nothing behind the help
        assert app.main.state.view is View.CPU
        await press(pilot, "escape")
        assert isinstance(app.screen, MainScreen)

    drive(make_app(profile), scenario)


def test_quit_q(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0 and not app.is_running

    drive(make_app(profile), scenario)


def test_no_heap_message(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "noheap.db", 20, heap_mode="none")

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        await press(pilot, "2")
        message = main.query_one("#no-heap", Static)
        assert message.display and not table.display
        text = str(message.render())
        assert "rsprof run -- CMD" in text and "LD_PRELOAD=$(rsprof preload) CMD" in text
        assert "rsprof -p PID" in text
        await press(pilot, "1")
        assert table.display and not message.display

    drive(make_app(path), scenario)


def test_live_follow_pause_and_target_exit(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "live.db", 60, state="recording")

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, header = parts(app)
        assert "RECORDING" in header and "00:02:05" in header  # from the fake clock
        cpu = round(sum(c for _t, _f, c in cpu_pattern(60)) * 100 / 99, 1)
        assert f"CPU {cpu:.1f}%" in header  # target_cpu_pct of checkpoint 60
        samples = main.snapshot.summary.samples if main.snapshot else 0
        append_checkpoints(path, 61)
        await pilot.pause(0.2)  # the timer (every 0.05 s here) picks it up
        await settle(pilot)
        assert main.snapshot and main.snapshot.summary.count == 61
        assert main.snapshot.summary.samples > samples
        await press(pilot, "p")
        assert "PAUSED" in main.query_one(ProfileHeader).plain
        shown = list(table.rows)
        append_checkpoints(path, 70)
        await pilot.pause(0.2)
        await settle(pilot)
        assert table.rows == shown  # frozen display
        assert main.snapshot and main.snapshot.summary.count == 61
        await press(pilot, "2", "1")  # keys still work on the frozen data
        assert main.snapshot and main.snapshot.summary.count == 61 and table.rows == shown
        await press(pilot, "p")
        await pilot.pause(0.2)
        await settle(pilot)
        assert "RECORDING" in main.query_one(ProfileHeader).plain
        assert main.snapshot and main.snapshot.summary.count == 70  # recording went on
        finish(path, "target-exited")
        await pilot.pause(0.2)
        await settle(pilot)
        text = main.query_one(ProfileHeader).plain
        assert "target exited" in text and "STOPPED" in text
        assert main.snapshot and main.snapshot.summary.count == 70 and len(table.rows) == 9

    drive(make_app(path, live=True, refresh_interval=0.05), scenario)


def test_p_is_for_live_mode_only(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        await press(pilot, "p")
        assert not app.main.state.paused and "VIEW" in app.main.query_one(ProfileHeader).plain

    drive(make_app(profile), scenario)


def test_target_exit_comes_from_the_file(tmp_path: Path) -> None:
    """The TUI learns that the target exited from what the recorder stores, like every
    other number (it polls no process itself)."""
    path = build_profile(tmp_path / "live.db", 30, state="recording")

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        assert "RECORDING" in main.query_one(ProfileHeader).plain
        db = sqlite3.connect(path)
        db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       [("state", "finished"), ("stop_reason", "target-exited"),
                        ("target_exit_code", "0")])
        db.commit()
        db.close()
        await pilot.pause(0.2)
        await settle(pilot)
        text = main.query_one(ProfileHeader).plain
        assert "target exited" in text and "STOPPED" in text
        samples = sum(c for i in range(1, 31) for _t, _f, c in cpu_pattern(i))
        assert f"{samples:,} samples" in text
        assert len(main.query_one(ProfileTable).rows) == 9  # numbers stay

    drive(make_app(path, live=True, refresh_interval=0.05), scenario)


def test_escape_quits_when_nothing_is_open(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        await press(pilot, "c", "e")  # Esc closes the innermost first: chart, then panel
        await press(pilot, "escape")
        assert not main.state.chart_open and main.state.peek_open and app.is_running
        await press(pilot, "escape")
        assert not main.state.peek_open and app.is_running
        await pilot.press("escape")
        await pilot.pause()
        assert app.return_code == 0 and not app.is_running

    drive(make_app(profile), scenario)


def test_ctrl_c_stops_and_quits(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "live.db", 10, state="recording")

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        await pilot.press("ctrl+c")
        await pilot.pause()
        # 130 tells the recording session "interrupted" (it stops and finalizes the file)
        assert app.return_value == 130 and app.return_code == 130 and not app.is_running

    drive(make_app(path, live=True), scenario)


def test_call_tree_f_space_arrows(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        await press(pilot, "f")
        assert main.state.tree_open and table.columns[2].label == "Function (call tree)"
        assert "1 CPU tree" in main.query_one(ProfileHeader).plain
        rows = tree(table)
        # hot paths start expanded (>= 10 %): main > compute_hash > hash_round
        assert [(r.name, len(r.path)) for r in rows[:3]] == [
            ("main", 1), ("compute_hash", 2), ("hash_round", 3)]
        assert rows[0].total_pct == pytest.approx(100)
        assert rows[1].total_pct == pytest.approx(51.68, abs=0.01)
        assert rows[1].self_pct == pytest.approx(39.60, abs=0.01)
        await press(pilot, "j", "space")  # collapse compute_hash
        assert [r.name for r in tree(table)[:3]] == ["main", "compute_hash", "matrix_multiply"]
        assert chosen(table).name == "compute_hash"
        await press(pilot, "right")  # open again
        assert tree(table)[2].name == "hash_round"
        await press(pilot, "j", "left")  # on a leaf: to its parent
        assert chosen(table).name == "compute_hash"
        await press(pilot, "k", "left")  # collapse main
        assert len(table.rows) == 1
        await press(pilot, "s")  # no sorting in the tree: children are heaviest first
        assert main.state.sorts[View.CPU.slot] == ("total", True)
        await press(pilot, "f")
        assert not main.state.tree_open and table.columns[0].label == "Self %"

    drive(make_app(profile), scenario)


def test_call_tree_follows_thread_and_window(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        await press(pilot, "t", "j", "j", "enter", "f")  # worker-2 (4244)
        assert main.state.thread == 4244
        names_ = [r.name for r in tree(table)]
        assert names_[0] == "main" and "compute_hash" not in names_
        assert tree(table)[1].name == "matrix_multiply"
        # worker-2 exits after checkpoint 90: the last minute has no samples of it
        await press(pilot, "w", "plus", "plus")  # the last 10 s only
        assert main.state.window_on and table.rows == []
        assert "window last 10s" in main.query_one(ProfileHeader).plain
        await press(pilot, "minus", "minus")  # the last minute: checkpoints 61..90 are in
        assert table.rows and tree(table)[0].name == "main"
        assert tree(table)[0].total_pct == pytest.approx(100)
        await press(pilot, "w", "t", "g", "enter")
        assert main.state.thread is None and tree(table)[1].name == "compute_hash"
        assert "window" not in main.query_one(ProfileHeader).plain

    drive(make_app(profile), scenario)


def test_callers_callees_e(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        await press(pilot, "j", "e")  # compute_hash
        panel = main.query_one(PeekPanel)
        assert panel.display and panel.peek is not None
        assert panel.peek.function == "compute_hash"
        assert [n.function for n in panel.peek.callers] == ["main"]
        assert [n.function for n in panel.peek.callees] == ["hash_round"]
        assert panel.peek.callees[0].samples == cpu(table)[3].self_samples  # hash_round
        await press(pilot, "j")  # the panel follows the selection
        assert panel.peek.function == "matrix_multiply" and panel.peek.callees == ()
        await press(pilot, "f", "e", "e")  # from the tree too
        assert panel.peek and panel.peek.function == "main"
        assert [n.function for n in panel.peek.callers] == ["main"]  # main -> main
        await press(pilot, "e")
        assert not panel.display

    drive(make_app(profile), scenario)


def test_memory_timeline_and_thread_note(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, _, _, _ = parts(app)
        await press(pilot, "2")
        timeline = main.query_one(HeapTimelineView)
        assert timeline.display and timeline.timeline is not None
        tl = timeline.timeline
        # leaky 8 KiB/s + make_buffer 16 KiB + load_config 1 MiB until 60 s, then half
        assert tl.peak_bytes == 8192 * 59 + 16384 + (1 << 20)
        assert tl.peak_offset_ms == 59_000
        assert tl.current_bytes == 8192 * 120 + 16384 + (1 << 19)
        assert "peak 1.5 MiB at 59s" in str(timeline.render())
        await press(pilot, "t", "j", "enter")  # thread 4243: the heap it allocated
        header = main.query_one(ProfileHeader).plain
        assert "thread 4243" in header and "(heap: all)" not in header
        table = main.query_one(ProfileTable)
        assert names(table) == ["leaky_cache_insert"]
        assert timeline.timeline is not None
        assert timeline.timeline.peak_bytes == timeline.timeline.current_bytes == 8192 * 120
        await press(pilot, "1")
        assert not timeline.display

    drive(make_app(profile), scenario)


def test_memory_thread_note_on_old_file(profile: Path, tmp_path: Path) -> None:
    """A file from before the heap kept its thread: the header says the heap is all threads'."""
    old = schema_1_copy(profile, tmp_path / "old.db", by_thread=False)

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        await press(pilot, "2", "t", "j", "enter")
        assert "(heap: all)" in main.query_one(ProfileHeader).plain
        assert len(names(main.query_one(ProfileTable))) == 3

    drive(make_app(old), scenario)


def test_keys_work_after_empty_memory_view(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "noheap.db", 20, heap_mode="none")

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        _, table, _, _ = parts(app)
        await press(pilot, "2", "1")
        assert table.has_focus
        await press(pilot, "j", "j")
        assert table.cursor == 2
        await press(pilot, "k")
        assert table.cursor == 1

    drive(make_app(path), scenario)


def test_scroll_position_kept_across_refreshes(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "live.db", 30, state="recording")

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        _, table, _, _ = parts(app)
        table.scroll_to(y=3, animate=False, immediate=True)  # what the mouse wheel does
        await settle(pilot)
        scrolled = table.scroll_offset.y
        assert scrolled > 0
        append_checkpoints(path, 32)
        await pilot.pause(0.2)
        await settle(pilot)
        assert app.main.snapshot and app.main.snapshot.summary.count == 32
        assert table.scroll_offset.y == scrolled  # a refresh does not snap back
        await press(pilot, "j")  # a key brings the cursor back into view
        assert table.scroll_offset.y <= table.cursor

    drive(make_app(path, live=True, refresh_interval=0.05), scenario, size=(80, 8))


@pytest.mark.parametrize("width", [80, 100, 160])
def test_header_never_wraps(tmp_path: Path, width: int) -> None:
    path = build_profile(tmp_path / "rsprof.myserver-with-a-long-name.261123101530.db", 30,
                         state="recording")

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        db = sqlite3.connect(path)
        db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       [("state", "finished"), ("stop_reason", "target-exited"),
                        ("target_exit_code", "3")])
        db.commit()
        db.close()
        await press(pilot, "t", "j", "enter")  # a named thread makes line 2 longer
        await pilot.pause(0.2)
        await settle(pilot)
        lines = app.main.query_one(ProfileHeader).plain.split("\n")
        assert len(lines) == 2 and all(len(line) <= width for line in lines)
        assert "STOPPED" in lines[0] and "target exited (exit code 3)" in lines[0]
        assert "00:00:30" in lines[0]
        assert "1 CPU" in lines[1] and "2 Memory" in lines[1]
        assert "thread 4243 worker-1" in lines[1] and "CPU " in lines[1] and "RSS " in lines[1]
        if width >= 160:
            assert path.name in lines[0] and "demo PID 4242" in lines[0]

    drive(make_app(path, live=True, refresh_interval=0.05), scenario, size=(width, 24))


def test_view_of_a_file_whose_recorder_is_gone(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "gone.db", 30, state="recording")  # never finished
    assert FAKE_NOW * 1000 - (START_MS + 30_000) > 30_000  # the fake clock: 95 s later

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        text = app.main.query_one(ProfileHeader).plain
        assert "stopped (recorder gone)" in text and "VIEW" in text
        assert "00:00:30" in text  # the recording's length, not a running clock

    drive(make_app(path), scenario)


def test_export_x_writes_the_view(tmp_path: Path) -> None:
    import gzip
    import json

    from rsprof.storage.pprof import profile_pb2

    path = build_profile(tmp_path / "rsprof.demo.231114221320.db")

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        await press(pilot, "t", "j", "j", "enter")  # worker-2 (4244)
        await press(pilot, "x")
        await app.workers.wait_for_complete()
        written = tmp_path / "rsprof.demo.231114221320.cpu.pb.gz"
        assert written.exists()
        pb = profile_pb2.Profile()
        pb.ParseFromString(gzip.decompress(written.read_bytes()))
        threads = {t.tid: t.samples for t in app.main.snapshot.threads}  # type: ignore[union-attr]
        assert sum(s.value[0] for s in pb.sample) == threads[4244]
        await press(pilot, "x")  # never overwrites: a second file
        await app.workers.wait_for_complete()
        assert (tmp_path / "rsprof.demo.231114221320.cpu.2.pb.gz").exists()
        await press(pilot, "2", "X")  # the Memory view: heap, speedscope
        await app.workers.wait_for_complete()
        doc = json.loads((tmp_path / "rsprof.demo.231114221320.heap.speedscope.json").read_text())
        assert doc["profiles"]

    drive(make_app(path), scenario)


def test_memory_allocation_tree_f(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        await press(pilot, "2", "f")
        assert main.state.tree_open and table.columns[0].label == "Total"
        assert "2 Memory tree" in main.query_one(ProfileHeader).plain
        rows = tree(table)
        # total = live bytes allocated under the node; self = at the call site itself
        live = {"leaky_cache_insert": 8192 * 120, "load_config": 1 << 19, "make_buffer": 16384}
        assert rows[0].name == "main" and rows[0].total_value == sum(live.values())
        assert rows[0].self_value == 0
        assert {r.name: r.self_value for r in rows[1:]} == live
        assert [r.name for r in rows[1:]] == list(live)  # heaviest first
        await press(pilot, "c")  # the chart is per call site: not in the allocation tree
        assert not main.state.chart_open
        await press(pilot, "f", "c")
        assert main.state.chart_open

    drive(make_app(profile), scenario)


def test_trend_scale_r(profile: Path) -> None:
    from rsprof.tui.model import TREND, cell_text

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        assert table.trend_top == max(max(r.trend) for r in cpu(table))
        row = cpu(table)[-1]  # idle_wait: 2 % of the samples
        assert set(cell_text(TREND, row, table.trend_top)) == {"▁"}  # small on one scale
        await press(pilot, "r")
        assert main.state.trend_per_row and table.trend_top is None
        assert set(cell_text(TREND, row, table.trend_top)) != {"▁"}  # its own scale

    drive(make_app(profile), scenario)


def test_live_tui_whose_recorder_is_gone(tmp_path: Path) -> None:
    """`rsprof.tui --live` learns its recorder's PID (its parent); a parent that changed
    (the recorder was killed) makes a "recording" file a stopped one."""
    import os

    path = build_profile(tmp_path / "live.db", 30, state="recording")
    app = make_app(path, live=True, refresh_interval=0.05)
    app.recorder_pid = os.getppid()

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        assert "RECORDING" in app.main.query_one(ProfileHeader).plain
        app.recorder_pid = -1  # as if our parent were no longer the recorder
        await pilot.pause(0.2)
        await settle(pilot)
        text = app.main.query_one(ProfileHeader).plain
        assert "STOPPED" in text and "stopped (recorder gone)" in text

    drive(app, scenario)


def test_chart_axis_spans_a_short_recording(tmp_path: Path) -> None:
    """A 1 min window over an 11 s recording: the axis starts at the recording's start,
    so its labels are not a run of `0s`."""
    import re

    path = build_profile(tmp_path / "short.db", 11)

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        _, _, chart, _ = parts(app)
        await press(pilot, "c")
        text = re.sub(r"\x1b\[[0-9;]*m", "", chart.plt.build())
        labels = re.findall(r"\b\d+s\b", text.splitlines()[-2] + " " + text.splitlines()[-1])
        assert labels.count("0s") <= 1 and "11s" in labels, text

    drive(make_app(path), scenario)


def test_call_tree_with_filter(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main, table, _, _ = parts(app)
        await press(pilot, "f", "slash", "r", "o", "u", "n", "d", "enter")
        # only the stacks through hash_round; percentages stay of every sample
        assert [r.name for r in tree(table)] == ["main", "compute_hash", "hash_round"]
        assert tree(table)[0].total_pct == pytest.approx(12.08, abs=0.01)
        assert "focus round" in main.query_one(ProfileHeader).plain
        await press(pilot, "slash", "x", "y", "z", "enter")
        assert table.rows == [] and "matching “xyz”" in table.empty_text
        await press(pilot, "escape")  # closes the tree (innermost), then clears the filter
        assert not main.state.tree_open and main.state.filter == "xyz"
        await press(pilot, "escape")
        assert main.state.filter == "" and len(table.rows) == 9

    drive(make_app(profile), scenario)


def test_header_says_when_kernel_time_is_not_sampled(tmp_path: Path) -> None:
    path = build_profile(tmp_path / "nokernel.db", 10)
    db = sqlite3.connect(path)
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('kernel_sampled', '0')")
    db.commit()
    db.close()

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        await settle(pilot)
        assert "no kernel time" in app.main.query_one(ProfileHeader).plain

    drive(make_app(path), scenario, size=(120, 24))


def test_keys_replace_the_screen_state(profile: Path) -> None:
    """UI state is one frozen value that each key replaces: a worker's query never changes
    under it, and a state kept from before a key still says what it said."""
    import dataclasses

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        before = main.state
        await press(pilot, "s", "f", "slash", "h", "a", "s", "h", "enter", "2")
        assert before == type(before)() and before.sort == ("total", True)
        after = main.state
        assert after.view is View.MEMORY and after.tree_open and after.filter == "hash"
        assert after.sorts[View.CPU.slot] == ("live", True)  # each view keeps its own
        with pytest.raises(dataclasses.FrozenInstanceError):
            after.filter = ""  # type: ignore[misc]

    drive(make_app(profile), scenario)


@pytest.mark.parametrize("launched", [True, False])
@pytest.mark.parametrize("key", ["q", "escape", "ctrl+q"])
def test_no_key_ends_a_live_recording_without_asking(tmp_path: Path, key: str,
                                                     launched: bool) -> None:
    """While a live recording runs, q, Esc with nothing open and Ctrl-Q ask first (issue 24:
    a stray Esc ended the program `rsprof run` had started); n (or Esc, q) stays, y quits.
    The question says whether the program ends (run) or keeps running (attached)."""
    path = build_profile(tmp_path / "live.db", 10, state="recording")
    db = sqlite3.connect(path)
    db.execute("INSERT OR REPLACE INTO meta VALUES ('target_launched', ?)", (str(int(launched)),))
    db.commit()
    db.close()

    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        await press(pilot, key)
        assert app.is_running and isinstance(app.screen, ConfirmQuit)
        asked = app.screen.question
        assert ("end demo (PID 4242)" in asked) == launched, asked
        assert ("keeps running" in asked) == (not launched), asked
        await press(pilot, "n")
        assert app.is_running and not isinstance(app.screen, ConfirmQuit)
        await press(pilot, key, "escape")  # Esc in the question: no
        assert app.is_running and not isinstance(app.screen, ConfirmQuit)
        await press(pilot, key)
        await pilot.press("y")
        await pilot.pause()
        assert app.return_code == 0 and not app.is_running

    drive(make_app(path, live=True), scenario)


def test_a_finished_file_quits_at_once(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0 and not app.is_running

    drive(make_app(profile, live=True), scenario)


def test_escape_from_the_flame_returns_to_the_tree_it_was_opened_from(profile: Path) -> None:
    async def scenario(pilot: Pilot[Any], app: RsprofApp) -> None:
        main = app.main
        await press(pilot, "f", "F")
        assert main.state.flame_open and not main.state.tree_open
        await press(pilot, "escape")
        assert main.state.tree_open and not main.state.flame_open  # back to the tree
        await press(pilot, "escape")
        assert not main.state.tree_open and app.is_running  # then the table
        await press(pilot, "F", "escape")
        assert not main.state.tree_open and not main.state.flame_open  # table: table

    drive(make_app(profile), scenario)
