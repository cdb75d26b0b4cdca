"""The main screen: header, function table, optional chart, filter input, footer.

Data flow: a timer (live mode) or a key press asks for an update; one worker thread at a
time runs `model.build_snapshot()` (refreshing the LiveProfile, sorting, querying the
chart); its result is drawn on the UI thread. Requests made while a worker runs are
coalesced into one more run. A key whose snapshot was quick to build the last time
(`INLINE_BUILD_S`) builds it on the UI thread instead (see `request_update`).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from click import ClickException
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Input, Static

from .export import ExportFailed, export_view
from .format import fmt_offset, fmt_seconds
from .model import (
    COLUMNS,
    HEAP_TREE_COLUMNS,
    TREE_COLUMNS,
    ZOOM_LEVELS,
    Query,
    Row,
    ScreenState,
    Snapshot,
    TreeRow,
    View,
    build_snapshot,
    column,
    max_pan,
    next_sort,
    runtime_hidden,
)
from .screens import ALL_THREADS, ConfirmQuit, HelpScreen, ThreadPicker
from .widgets.chart import ChartState, ProfileChart
from .widgets.flame import FlameView
from .widgets.footer import FitFooter
from .widgets.header import HeaderState, ProfileHeader
from .widgets.output import OutputPanel
from .widgets.peek import PeekPanel
from .widgets.table import ProfileTable, visible_columns
from .widgets.timeline import HeapTimelineView

if TYPE_CHECKING:
    from rsprof.storage.selection import SampleQuery

    from .app import RsprofApp

NO_HEAP = (
    "No heap data in this profile.\n\n"
    "Heap tracking needs rsprof's allocator shim in the target: start the program with "
    "`rsprof run -- CMD` (or `LD_PRELOAD=$(rsprof preload) CMD`), or attach with "
    "`rsprof -p PID` without --no-heap, which loads it into the running process."
)


def no_heap_text(off_reason: str) -> str:
    """The Memory view's page without heap data; why, when an attach could not load the
    shim (meta heap_off_reason)."""
    if not off_reason:
        return NO_HEAP
    return (f"No heap data in this profile.\n\nHeap tracking was off: {off_reason}.\n\n"
            "The CPU profile was recorded.")


RECORDER_GONE_INTERVALS = 10
"""VIEW mode: a file that says "recording" but got no checkpoint for this many intervals
(and at least 30 s) has lost its recorder (killed, machine rebooted)."""

EARLY_TICK_S = 0.05
"""How often the file is looked at until its first checkpoint (then: refresh_interval)."""

FOLLOW_DELAY_S = 0.06
"""How long after the selection moves the chart and callers panel follow it."""

INLINE_BUILD_S = 0.015
"""A key's snapshot is built on the UI thread, not in a worker, when the same kind of
snapshot (`_build_kind`) took less than this the last time it was built: the key's whole
change (new columns, panels, header) is then drawn in one frame. Through the worker the
key's own changes were drawn in a first frame and the data 7-10 ms later, and Textual's
screen timer holds a second change that close to the first for one to two frame periods
(17-33 ms at 60 fps): most of a view key's latency, profiled on `rsprof demo`."""

# Ctrl-C: the TUI's exit code that tells the recording session "interrupted" (as a shell
# reports SIGINT), where q and Esc mean "the user quit".
EXIT_INTERRUPTED = 130


class MainScreen(Screen[None]):
    # The footer shows the keys that matter in the current mode (check_action hides the
    # others); `?` lists every key.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("escape", "escape", "Back/Quit", show=False),
        Binding("1", "view('cpu')", "CPU", show=False),
        Binding("2", "view('memory')", "Memory", show=False),
        Binding("3", "view('wall')", "Wall", show=False),
        Binding("m", "toggle_view", "Toggle view", show=False),
        Binding("f", "toggle_tree", "Tree"),
        Binding("F", "toggle_flame", "Flame"),
        Binding("e", "toggle_peek", "Callers"),
        Binding("o", "toggle_output", "Output", show=False),
        Binding("c,enter", "toggle_chart", "Chart"),
        Binding("space", "expand", "Fold", show=False),
        Binding("right", "expand(1)", "Expand", show=False),
        Binding("left", "expand(0)", "Collapse", show=False),
        Binding("w", "toggle_window", "Window", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse", show=False),
        Binding("t", "pick_thread", "Thread"),
        Binding("p", "pause", "Pause"),
        Binding("b", "bar", "Bar/line"),
        Binding("H", "toggle_runtime", "Runtime", show=False),
        Binding("plus,equals_sign", "zoom(-1)", "Zoom", key_display="+/-"),
        Binding("minus", "zoom(1)", "Zoom out", show=False),
        Binding("h", "pan(1)", "Pan", key_display="h/l"),
        Binding("l", "pan(-1)", "Pan forward", show=False),
        Binding("z", "from_zero", "Y from 0", show=False),
        Binding("r", "trend_scale", "Trend scale", show=False),
        Binding("tab", "switch_focus", "Focus", show=False),
        Binding("x", "export('pprof')", "Export", show=False),
        Binding("X", "export('speedscope')", "Export speedscope", show=False),
        Binding("question_mark", "help", "Help"),
    ]
    CHART_ACTIONS: ClassVar[set[str]] = {"bar", "from_zero"}

    def __init__(self) -> None:
        super().__init__()
        self.state = ScreenState()
        self.snapshot: Snapshot | None = None
        self._job_running = False
        self._job_pending: bool | None = None  # None: nothing pending, else "refresh" flag
        self._job_started = 0.0
        self._follow_timer: Timer | None = None
        self._last_follow = 0.0  # when the chart and callers last followed the selection
        self.last_update_s = 0.0  # request to drawn widgets, for the benchmark
        self._no_heap_shown = NO_HEAP  # the text on the "no heap" page
        # seconds the last snapshot of each kind took to build (`_build_kind`), without
        # the file's refresh: decides where the next one is built (`request_update`)
        self._build_s: dict[tuple[object, ...], float] = {}

    @property
    def rsprof(self) -> RsprofApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield ProfileHeader(id="header")
        with Vertical(id="body"):
            yield HeapTimelineView(id="timeline")
            yield ProfileTable(id="table")
            yield FlameView(id="flame")
            yield Static(NO_HEAP, id="no-heap")
            yield ProfileChart(id="chart")
            yield PeekPanel(id="peek")
            yield OutputPanel(id="output")
        yield Input(placeholder="focus: a regex of a function, file or module (--focus)",
                    id="filter")
        yield FitFooter()

    def on_mount(self) -> None:
        self.query_one("#filter", Input).cursor_blink = not self.app.is_headless
        self.query_one(ProfileTable).focus()
        self._show_header()
        self.request_update(refresh=True)
        self.set_interval(self.rsprof.refresh_interval, self._tick)
        # Until the file has a checkpoint, look for it more often: the first screen with
        # data comes as soon as the recorder commits it, not up to a tick later.
        self._early_timer: Timer | None = self.set_interval(EARLY_TICK_S, self._early_tick)

    # -- updates ----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return (self._job_running or self._job_pending is not None
                or self._follow_timer is not None)

    @staticmethod
    def function_key(row: Row | None) -> int | None:
        """The storage key of the function a row shows (a tree line: its node's function)."""
        if row is None:
            return None
        return row.path[-1] if isinstance(row, TreeRow) else row.key

    def current_query(self) -> Query:
        if self.state.flame_open:
            key = self.query_one(FlameView).selected_key
        else:
            key = self.function_key(self.query_one(ProfileTable).selected)
        timeline = self.query_one(HeapTimelineView).size.width or self.app.size.width
        return self.state.query(key, max(1, timeline - 2))

    def request_update(self, *, refresh: bool = False) -> None:
        """Builds a new snapshot in a worker; coalesces requests made while one runs.

        A request that reads nothing new from the file (a key, not a timer tick) is built
        here, on the UI thread, when no worker runs and its kind of snapshot was quick
        the last time (`INLINE_BUILD_S`). The worker keeps everything else: the file's
        refresh, another thread's data, and big profiles, whose snapshots take longer
        (0.1-1 s for 10,000 functions) and must not hold the keys."""
        if self._job_running:
            self._job_pending = bool(self._job_pending) or refresh
            return
        query = self.current_query()
        self._job_started = time.perf_counter()
        if not refresh and self._inline(query):
            try:
                snapshot = self._timed_build(query)
            except Exception as exc:  # keep the UI alive; show what went wrong
                self._failed(exc)
                return
            self._draw(snapshot)
            return
        self._job_running = True
        self._build(query, refresh)

    @staticmethod
    def _build_kind(query: Query) -> tuple[object, ...]:
        """What a snapshot's cost depends on, beside the profile's size: the view, the
        table, tree or flame, a filter or time window (a regex over every frame, a
        range of samples), the chart's and callers panel's queries."""
        return (query.view, query.tree, query.flame, bool(query.filter),
                query.window is not None, query.chart is not None, query.peek is not None)

    def _inline(self, query: Query) -> bool:
        source = self.rsprof.source
        if self.snapshot is None or source.thread != query.thread:
            return False
        took = self._build_s.get(self._build_kind(query))
        return took is not None and took < INLINE_BUILD_S

    def _timed_build(self, query: Query) -> Snapshot:
        """build_snapshot without the file's refresh; remembers how long it took."""
        start = time.perf_counter()
        snapshot = build_snapshot(self.rsprof.source, query, refresh=False)
        self._build_s[self._build_kind(query)] = time.perf_counter() - start
        return snapshot

    @work(thread=True, group="snapshot")
    def _build(self, query: Query, refresh: bool) -> None:
        app = self.rsprof
        source = app.source
        previous = self.snapshot
        if source.thread != query.thread:
            source.set_thread(query.thread)
            refresh = True
            previous = None
        try:
            if refresh and previous is not None and previous.query == query:
                # A timer tick with nothing new in the file (checkpoints come once a
                # second, ticks twice): nothing to rebuild or redraw.
                if not source.refresh():
                    self.app.call_from_thread(self._unchanged)
                    return
                refresh = False
            if refresh:
                snapshot = build_snapshot(source, query, refresh=True)
            else:
                snapshot = self._timed_build(query)
        except Exception as exc:  # keep the UI alive; show what went wrong
            self.app.call_from_thread(self._failed, exc)
            return
        self.app.call_from_thread(self._apply, snapshot)

    def _unchanged(self) -> None:
        self._job_running = False
        self._show_header()
        self._run_pending()

    def _failed(self, exc: Exception) -> None:
        self._job_running = False
        self.notify(f"could not read the profile: {exc}", severity="error", timeout=10)
        self._run_pending()

    def _run_pending(self) -> None:
        if self._job_pending is not None:
            refresh, self._job_pending = self._job_pending, None
            self.request_update(refresh=refresh)

    def _early_tick(self) -> None:
        snap = self.snapshot
        if snap is not None and (snap.summary.count or snap.info.state == "finished"):
            if self._early_timer is not None:
                self._early_timer.stop()
                self._early_timer = None
            return
        self._tick()

    def _tick(self) -> None:
        if self.state.paused:
            return
        snap = self.snapshot
        following = self.rsprof.live or snap is None or snap.info.state == "recording"
        if following and not self.busy:
            self.request_update(refresh=True)
        if self.state.output_open:
            self._read_output()
        self._show_header()

    def _apply(self, snapshot: Snapshot) -> None:
        self._job_running = False
        if snapshot.query != self.current_query() and self._job_pending is None:
            self._job_pending = False  # the UI changed meanwhile: build once more
        self._draw(snapshot)  # while paused the data is frozen (no refresh), not the keys
        self._run_pending()

    def _draw(self, snapshot: Snapshot) -> None:
        previous, self.snapshot = self.snapshot, snapshot
        q = snapshot.query
        table = self.query_one(ProfileTable)
        no_heap = q.view is View.MEMORY and not snapshot.heap_available
        table.display = not no_heap and not q.flame
        flame = self.query_one(FlameView)
        flame.display = q.flame and not no_heap
        if q.flame:
            unit = {View.MEMORY: "bytes", View.WALL: "ns"}.get(q.view, "samples")
            flame.show(snapshot.flame, unit=unit, reset=previous is None)
        page = self.query_one("#no-heap", Static)
        page.display = no_heap
        text = no_heap_text(snapshot.info.heap_off_reason)
        if no_heap and text != self._no_heap_shown:
            self._no_heap_shown = text
            page.update(text)
        timeline = self.query_one(HeapTimelineView)
        timeline.display = q.view is View.MEMORY and not no_heap
        timeline.show(snapshot.timeline)
        if snapshot.filter_error:
            empty = f"the filter is not a regex: {snapshot.filter_error}"
        elif q.filter:
            empty = f"no sample goes through a frame matching “{q.filter}” (--focus)"
        else:
            empty = "no samples yet" if q.view.timed else "no allocations yet"
        if q.tree:
            columns = TREE_COLUMNS if q.view.timed else HEAP_TREE_COLUMNS
        else:
            columns = COLUMNS[q.view]
        table.set_rows(columns, snapshot.rows, "" if q.tree else q.sort, q.descending,
                       empty_text=empty, trend_top=snapshot.trend_top, names=snapshot.names)
        chart = self.query_one(ProfileChart)
        chart.display = self.state.chart_open and not no_heap
        if self.state.chart_open and q.chart is not None:
            chart.show(self._chart_state(snapshot))
        peek = self.query_one(PeekPanel)
        peek.display = self.state.peek_open and q.view.timed
        if peek.display:
            peek.show(snapshot.peek, snapshot.window_label, wall=q.view is View.WALL)
        # A hidden widget cannot keep focus: after the "no heap" page (or a closed panel)
        # the keys go back to the table, never to nothing.
        focused = self.focused
        if flame.display and (focused is None or not focused.display):
            flame.focus()
        elif table.display and (focused is None or not focused.display):
            table.focus()
        self._show_header()
        self._announce_exit(previous, snapshot)
        self.last_update_s = time.perf_counter() - self._job_started

    def _chart_state(self, snapshot: Snapshot) -> ChartState:
        q = snapshot.query
        assert q.chart is not None
        row = next((r for r in snapshot.rows if self.function_key(r) == q.chart.key), None)
        name = (row.name if isinstance(row, TreeRow) else row.function) if row else "?"
        if q.flame:
            node = self.query_one(FlameView).selected_node
            name = node.function if node is not None and node.key == q.chart.key else name
        metric = {View.MEMORY: "live bytes", View.WALL: "Total % of wall time"}.get(
            q.view, "Total % of samples")
        back = q.chart.pan * q.chart.window_ms / 2000
        where = f", {fmt_offset(back)} back" if q.chart.pan else ""
        style = "bar" if self.state.bar else "line"
        zero = ", y from 0" if self.state.from_zero else ""
        info = snapshot.info
        t0 = info.start_time_ms
        if t0 is None:
            t0 = (snapshot.summary.first_timestamp_ms or 0) - info.interval_ms
        return ChartState(
            title=f"{name} · {metric} · {q.chart.zoom_label} window{where} · {style}{zero}",
            series=snapshot.series,
            t0_ms=t0,
            bytes=q.view is View.MEMORY,
            bar=self.state.bar,
            from_zero=self.state.from_zero,
            ylabel="% wall time" if q.view is View.WALL else "% samples",
        )

    def _announce_exit(self, previous: Snapshot | None, snapshot: Snapshot) -> None:
        if not self.rsprof.live or previous is None:
            return
        was, now = self._exit_notice(previous), self._exit_notice(snapshot)
        if now and not was:
            self.notify(now + "; every number stays on screen", timeout=8)

    def _exit_notice(self, snapshot: Snapshot) -> str:
        info = snapshot.info
        code = f" (exit code {info.target_exit_code})" if info.target_exit_code is not None else ""
        if info.state == "finished" and info.stop_reason == "target-exited":
            return "target exited" + code
        if self.rsprof.live and info.state == "finished":
            return f"recording stopped: {info.stop_reason or 'finished'}"
        if self._recorder_gone(snapshot):
            return "stopped (recorder gone)"
        return ""

    def _recorder_gone(self, snapshot: Snapshot) -> bool:
        """The file says "recording" but nobody writes it. Live mode: the recorder is the
        process that started this TUI, so it is gone when our parent changed. VIEW mode:
        no checkpoint for RECORDER_GONE_INTERVALS intervals (and 30 s)."""
        info, last = snapshot.info, snapshot.summary.last_timestamp_ms
        if info.state != "recording":
            return False
        if self.rsprof.live:
            return self.rsprof.recorder_pid is not None and os.getppid() != self.rsprof.recorder_pid
        newest = last if last is not None else info.start_time_ms
        if newest is None:
            return False
        quiet_ms = self.rsprof.clock() * 1000 - newest
        return quiet_ms > max(30_000, RECORDER_GONE_INTERVALS * info.interval_ms)

    def _show_header(self) -> None:
        header = self.query_one(ProfileHeader)
        snap = self.snapshot
        app = self.rsprof
        name = os.path.basename(app.source.path)
        if snap is None:
            header.show(HeaderState("LOADING", name, 0, 0, 0, "", None, self.state.view))
            return
        info, summary = snap.info, snap.summary
        notice = self._exit_notice(snap)
        recording = info.state == "recording" and not notice
        if app.live:
            mode = "PAUSED" if self.state.paused else ("RECORDING" if recording else "STOPPED")
        else:
            mode = "VIEW"
        start = info.start_time_ms
        if start is None:
            start = (summary.first_timestamp_ms or 0) - info.interval_ms
        if recording:
            end = app.clock() * 1000
        else:
            end = info.end_time_ms or summary.last_timestamp_ms or start
        cpu, rss = summary.target_cpu_pct, summary.target_rss_bytes
        thread = "all"
        if snap.query.thread is not None:
            names = {t.tid: t.name for t in snap.threads}
            thread = f"{snap.query.thread} {names.get(snap.query.thread, '')}".strip()
            if self.state.view is View.MEMORY and not snap.heap_by_thread:
                # A file from before the heap kept its thread: say so instead of pretending
                # to filter.
                thread += " (heap: all)"
        elapsed = max(0.0, end - start)
        if self.state.paused and header.state is not None:
            elapsed = header.state.elapsed_ms  # frozen with the data
        header.show(
            HeaderState(
                mode=mode,
                file_name=name,
                elapsed_ms=elapsed,
                samples=summary.samples,
                lost_samples=summary.lost_samples,
                process_name=info.process_name,
                pid=info.pid,
                view=self.state.view,
                thread=thread,
                filter=self.state.filter,
                window=(snap.window_label if snap.query.window is not None
                        and snap.query.view.timed else ""),
                cpu_pct=cpu,
                rss_bytes=rss,
                show_target=app.live or info.state == "recording",
                notice=notice,
                tab_suffix=(" flame" if self.state.flame_open
                            else " tree" if self.state.tree_open else ""),
                kernel_sampled=info.kernel_sampled,
                runtime_hidden=runtime_hidden(self.state.hide_runtime, info),
                heap_since=info.heap_since_attach,
                wall=snap.wall_available,
            )
        )

    # -- actions ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        state = self.state
        if action in self.CHART_ACTIONS:
            return state.chart_open
        if action in ("zoom", "pan"):
            return state.chart_open or (state.window_on and state.view.timed)
        if action == "pause":
            return self.rsprof.live
        if action in ("toggle_peek", "toggle_window"):
            return state.view.timed
        if action == "toggle_chart":
            # the Memory chart is per call site; the allocation tree's nodes are functions
            return not ((state.tree_open or state.flame_open) and state.view is View.MEMORY)
        if action == "expand":
            return state.tree_open and not state.flame_open
        if action in ("cycle_sort", "reverse_sort"):
            return not (state.tree_open or state.flame_open)
        return True

    # Footer ranks (higher stays when the footer is too narrow for every key of the mode).
    FOOTER_RANKS: ClassVar[dict[str, int]] = {
        "quit": 100, "help": 90, "toggle_chart": 70, "pause": 65, "toggle_tree": 60,
        "toggle_flame": 58, "pick_thread": 55, "zoom_in": 78, "zoom_out": 77,
        "toggle_peek": 50, "toggle_output": 45, "filter": 40, "cycle_sort": 30, "bar": 20,
        "zoom": 20, "pan": 20,
    }

    def footer_priority(self, action: str) -> int:
        """How much a key matters in the current mode (FitFooter keeps the highest)."""
        if self.state.chart_open and action in ("zoom", "pan", "bar"):
            return 80  # the chart's own keys, while it is open
        return self.FOOTER_RANKS.get(action, 10)

    def action_quit(self) -> None:
        """q, Esc with nothing open, Ctrl-Q: while a live recording runs, ask first (for a
        program `rsprof run` started, quitting ends it); else quit."""
        info = self.snapshot.info if self.snapshot is not None else None
        live = getattr(self.app, "live", False) and info is not None and (
            info.state == "recording")
        if not live or any(isinstance(s, ConfirmQuit) for s in self.app.screen_stack):
            self.app.exit(0, return_code=0)
            return
        assert info is not None
        target = f"{info.process_name or 'the program'} (PID {info.pid})"
        question = (f"Stop recording and end {target}?" if info.launched else
                    f"Stop recording? {target} keeps running.")

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.exit(0, return_code=0)

        self.app.push_screen(ConfirmQuit(question), answered)



    def action_view(self, view: str) -> None:
        snap = self.snapshot
        if View(view) is View.WALL and snap is not None and not snap.wall_available:
            # The Wall view would be the CPU view again: say why there is nothing to add.
            self.notify(f"Wall view: {snap.no_wall_reason}", timeout=6)
            return
        if View(view) is not self.state.view:
            self.state = replace(self.state, view=View(view), pan=0)
            self.refresh_bindings()
            self._show_header()
            self.request_update()

    def _view_name(self) -> str:
        return "Wall view" if self.state.view is View.WALL else "CPU view"

    def action_toggle_view(self) -> None:
        self.action_view(View.MEMORY if self.state.view is View.CPU else View.CPU)

    def action_toggle_chart(self) -> None:
        self.state = replace(self.state, chart_open=not self.state.chart_open)
        chart = self.query_one(ProfileChart)
        chart.display = self.state.chart_open
        if not self.state.chart_open and chart.has_focus:
            self._primary().focus()
        self.refresh_bindings()
        self.request_update()

    def action_toggle_runtime(self) -> None:
        """H: start-up and interpreter frames folded out, or shown (storage/runtime.py)."""
        info = self.snapshot.info if self.snapshot is not None else None
        shown = runtime_hidden(self.state.hide_runtime, info) if info is not None else False
        self.state = replace(self.state, hide_runtime=not shown)
        self.request_update()

    def action_bar(self) -> None:
        self.state = replace(self.state, bar=not self.state.bar)
        self.request_update()

    def action_from_zero(self) -> None:
        self.state = replace(self.state, from_zero=not self.state.from_zero)
        self.request_update()

    def action_zoom(self, step: int) -> None:
        zoom = max(0, min(len(ZOOM_LEVELS) - 1, self.state.zoom + step))
        pan = self.state.pan
        if self.snapshot is not None:
            pan = min(pan, max_pan(self.snapshot.summary, zoom))
        self.state = replace(self.state, zoom=zoom, pan=pan)
        self.request_update()

    def action_pan(self, step: int) -> None:
        limit = max_pan(self.snapshot.summary, self.state.zoom) if self.snapshot else 0
        self.state = replace(self.state, pan=max(0, min(limit, self.state.pan + step)))
        self.request_update()

    def _primary(self) -> ProfileTable | FlameView:
        """What the keys go to when no panel has focus: the flame view or the table."""
        if self.state.flame_open:
            return self.query_one(FlameView)
        return self.query_one(ProfileTable)

    def action_switch_focus(self) -> None:
        """Tab: the table (or tree, flame), then the chart and the callers panel when they
        are open, in turn. The callers panel scrolls with the arrow keys once focused (at
        80x24 it shows a few of its rows)."""
        primary, chart = self._primary(), self.query_one(ProfileChart)
        peek = self.query_one(PeekPanel)
        ring: list[Widget] = [primary]
        if self.state.chart_open and chart.display:
            ring.append(chart)
        if self.state.peek_open and peek.display:
            ring.append(peek)
        output = self.query_one(OutputPanel)
        if self.state.output_open:
            ring.append(output)
        at = next((i for i, widget in enumerate(ring) if widget.has_focus), -1)
        ring[(at + 1) % len(ring)].focus()

    def action_cycle_sort(self) -> None:
        view = self.state.view
        width = self.query_one(ProfileTable).scrollable_content_region.width
        shown = {c.key for c in visible_columns(COLUMNS[view], width)} if width else None
        new = next_sort(view, self.state.sort[0], shown)
        self.state = self.state.with_sort(new, column(view, new).numeric)
        self.notify(f"sorted by {column(view, new).label}", timeout=1.5)
        self.request_update()

    def action_trend_scale(self) -> None:
        self.state = replace(self.state, trend_per_row=not self.state.trend_per_row)
        self.notify("Trend: each row its own scale" if self.state.trend_per_row
                    else "Trend: one scale for the column", timeout=2)
        self.request_update()

    def action_reverse_sort(self) -> None:
        key, descending = self.state.sort
        self.state = self.state.with_sort(key, not descending)
        self.request_update()

    @on(ProfileTable.HeaderClicked)
    def _sort_by_header(self, event: ProfileTable.HeaderClicked) -> None:
        key, descending = self.state.sort
        if event.column == key:
            self.state = self.state.with_sort(key, not descending)
        else:
            self.state = self.state.with_sort(
                event.column, column(self.state.view, event.column).numeric)
        self.request_update()

    @on(ProfileTable.CursorMoved)
    def _selection_changed(self) -> None:
        # The chart and callers panel follow the selection a moment later: the moved
        # highlight is drawn first, and holding `j` redraws the chart once, not per row.
        # A move after a quiet moment is followed at once (the chart for a new row came
        # 60 ms later than it could); moves in quick succession (holding j) once, after.
        if self.state.chart_open or self.state.peek_open:
            now = time.monotonic()
            if self._follow_timer is None and now - self._last_follow >= FOLLOW_DELAY_S:
                self._last_follow = now
                # After the frame: a quick snapshot is built on the UI thread
                # (request_update), which would otherwise come before the highlight.
                self.call_after_refresh(self.request_update)
                return
            if self._follow_timer is not None:
                self._follow_timer.stop()
            self._follow_timer = self.set_timer(FOLLOW_DELAY_S, self._follow_selection)

    def _follow_selection(self) -> None:
        self._follow_timer = None
        self._last_follow = time.monotonic()
        self.request_update()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()
        self.refresh_bindings()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.state = replace(self.state, filter=event.value.strip())
        self._show_header()
        self.request_update()

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        box = self.query_one("#filter", Input)
        if not box.value:
            box.display = False
        self._primary().focus()

    def _clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.display = False
        self.state = replace(self.state, filter="")
        self._primary().focus()
        self.refresh_bindings()
        self._show_header()
        self.request_update()

    def action_escape(self) -> None:
        """Closes what is open, innermost first (filter box, chart, callers panel, tree,
        filter); with nothing open it quits, as `q` does (rsprof's keys)."""
        box = self.query_one("#filter", Input)
        if box.has_focus:
            self._clear_filter()
        elif self.state.chart_open:
            self.action_toggle_chart()
        elif self.state.peek_open:
            self.action_toggle_peek()
        elif self.state.output_open:
            self.action_toggle_output()
        elif self.state.flame_open:
            self.action_toggle_flame()
        elif self.state.tree_open:
            self.action_toggle_tree()
        elif self.state.filter:
            self._clear_filter()
        else:
            self.action_quit()

    def action_toggle_flame(self) -> None:
        """The icicle of what the tree shows (thread, window, filter) instead of the table;
        it replaces the tree too."""
        opening = not self.state.flame_open
        # The flame replaces the tree; closing it returns to the view it was opened from.
        self.state = replace(self.state, flame_open=opening,
                             tree_open=False if opening else self.state.flame_from_tree,
                             flame_from_tree=self.state.tree_open if opening else False)
        if self.state.flame_open:
            if self.state.chart_open and self.state.view is View.MEMORY:
                self.action_toggle_chart()  # the Memory chart is per call site
        flame = self.query_one(FlameView)
        flame.display = self.state.flame_open
        (flame if self.state.flame_open else self.query_one(ProfileTable)).focus()
        self.refresh_bindings()
        self._show_header()
        self.request_update()

    @on(FlameView.Selected)
    def _flame_selection_changed(self) -> None:
        self._selection_changed()

    def action_toggle_tree(self) -> None:
        self.state = replace(self.state, flame_open=False, tree_open=not self.state.tree_open)
        self.query_one(FlameView).display = False
        if self.state.tree_open and self.state.chart_open and self.state.view is View.MEMORY:
            self.action_toggle_chart()
        self.query_one(ProfileTable).focus()
        self.refresh_bindings()
        self._show_header()
        self.request_update()

    def action_toggle_peek(self) -> None:
        self.state = replace(self.state, peek_open=not self.state.peek_open)
        panel = self.query_one(PeekPanel)
        panel.display = self.state.peek_open
        if not self.state.peek_open and panel.has_focus:
            self._primary().focus()
        self.refresh_bindings()
        self.request_update()

    def action_toggle_output(self) -> None:
        """o: the program's output (stdout and stderr, as `rsprof run` kept it), live."""
        self.state = replace(self.state, output_open=not self.state.output_open)
        panel = self.query_one(OutputPanel)
        panel.display = self.state.output_open
        if self.state.output_open:
            self._read_output()
        elif panel.has_focus:
            self._primary().focus()
        self.refresh_bindings()

    @work(thread=True, group="output", exclusive=True)
    def _read_output(self) -> None:
        """Reads the output chunks the pane has not shown (the file's target_output)."""
        panel = self.query_one(OutputPanel)
        source = self.rsprof.source
        ended = self.snapshot is not None and self.snapshot.info.state == "finished"
        try:
            chunks = source.output(panel.last_id)
        except Exception as exc:  # keep the UI alive; say what went wrong
            self.app.call_from_thread(
                self.notify, f"could not read the output: {exc}", severity="error")
            return
        self.app.call_from_thread(panel.add, chunks, ended=ended and len(chunks) < 2000)

    def action_toggle_window(self) -> None:
        self.state = replace(self.state, window_on=not self.state.window_on)
        self.refresh_bindings()
        self.notify(
            f"{self._view_name()}: last {ZOOM_LEVELS[self.state.zoom][0]} (+/- zoom, h/l pan)"
            if self.state.window_on else f"{self._view_name()}: whole recording", timeout=3)
        self.request_update()

    def action_expand(self, state: int | None = None) -> None:
        """Space toggles the selected tree node; → opens it, ← closes it (or, on a closed
        or leaf node, moves to its parent)."""
        table = self.query_one(ProfileTable)
        row = table.selected
        if not isinstance(row, TreeRow):
            return
        want = (not row.expanded) if state is None else bool(state)
        if not want and not row.expanded and state is not None and len(row.path) > 1:
            parent = row.path[:-1]
            index = next((i for i, r in enumerate(table.rows)
                          if isinstance(r, TreeRow) and r.path == parent), None)
            if index is not None:
                table._move(index)
            return
        if not row.has_children or want == row.expanded:
            return
        self.state = self.state.with_node(row.path, want)
        self.request_update()

    def action_pause(self) -> None:
        self.state = replace(self.state, paused=not self.state.paused)
        self._show_header()
        if not self.state.paused:
            self.request_update(refresh=True)

    def action_pick_thread(self) -> None:
        threads = self.snapshot.threads if self.snapshot else []

        def chosen(result: str | None) -> None:
            if result is None:
                return
            tid = None if result == ALL_THREADS else int(result)
            if tid != self.state.thread:
                self.state = replace(self.state, thread=tid)
                self._show_header()
                self.request_update()

        self.app.push_screen(ThreadPicker(threads, self.state.thread), chosen)

    def action_export(self, fmt: str) -> None:
        """Writes what the view shows (`Snapshot.selection`) beside the profile, as
        `rsprof export` with the same thread, window and filter."""
        snap = self.snapshot
        if snap is None:
            return
        if snap.selection is None:
            self.notify(f"nothing exported: {snap.filter_error}", severity="error", timeout=8)
            return
        self.notify(f"exporting {snap.selection.kind} to {fmt}…", timeout=2)
        self._export(fmt, snap.selection)

    @work(thread=True, group="export", exclusive=True)
    def _export(self, fmt: str, selection: SampleQuery) -> None:
        try:
            path, count = export_view(self.rsprof.source.path, fmt=fmt, selection=selection)
        except ExportFailed as exc:
            message = exc.message if isinstance(exc, ClickException) else str(exc)
            self.app.call_from_thread(
                self.notify, f"export failed: {message}", severity="error", timeout=8)
            return
        if selection.kind == "wall":  # the first sample type: nanoseconds of wall time
            amount = f"{fmt_seconds(count / 1e9)} of wall time"
        else:
            amount = f"{count:,} {'samples' if selection.kind == 'cpu' else 'allocations'}"
        self.app.call_from_thread(self.notify, f"wrote {path} ({amount})", timeout=10)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())
