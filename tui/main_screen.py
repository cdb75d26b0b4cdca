"""The main screen: header, function table, optional chart, filter input, footer.

Data flow: a timer (live mode) or a key press asks for an update; one worker thread at a
time runs `model.build_snapshot()` (refreshing the LiveProfile, sorting, querying the
chart); its result is drawn on the UI thread. Requests made while a worker runs are
coalesced into one more run.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from .format import fmt_offset
from .model import (
    COLUMNS,
    DEFAULT_SORT,
    DEFAULT_ZOOM,
    ZOOM_LEVELS,
    ChartRequest,
    Query,
    Snapshot,
    View,
    build_snapshot,
    column,
    max_pan,
    next_sort,
)
from .screens import ALL_THREADS, HelpScreen, ThreadPicker
from .widgets.chart import ChartState, ProfileChart
from .widgets.header import HeaderState, ProfileHeader
from .widgets.table import ProfileTable

if TYPE_CHECKING:
    from .app import RsprofApp

NO_HEAP = (
    "No heap data in this profile.\n\n"
    "Heap tracking needs rsprof's allocator shim in the target: start the program with "
    "`rsprof run -- CMD`, or with `LD_PRELOAD=$(rsprof preload) CMD` and attach with "
    "`rsprof -p PID`."
)


class MainScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "app.quit", "Quit"),
        Binding("1", "view('cpu')", "CPU"),
        Binding("2", "view('memory')", "Memory"),
        Binding("m", "toggle_view", "Toggle view", show=False),
        Binding("c,enter", "toggle_chart", "Chart"),
        Binding("slash", "filter", "Filter"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("t", "pick_thread", "Thread"),
        Binding("p", "pause", "Pause"),
        Binding("b", "bar", "Bar/line"),
        Binding("plus,equals_sign", "zoom(-1)", "Zoom", key_display="+/-"),
        Binding("minus", "zoom(1)", "Zoom out", show=False),
        Binding("h", "pan(1)", "Pan", key_display="h/l"),
        Binding("l", "pan(-1)", "Pan forward", show=False),
        Binding("z", "from_zero", "Y from 0", show=False),
        Binding("tab", "switch_focus", "Focus", show=False),
        Binding("escape", "escape", "Close"),
        Binding("question_mark", "help", "Help"),
    ]
    CHART_ACTIONS: ClassVar[set[str]] = {"bar", "zoom", "pan", "from_zero"}

    def __init__(self) -> None:
        super().__init__()
        self.view = View.CPU
        self.sorts: dict[View, tuple[str, bool]] = {v: (DEFAULT_SORT[v], True) for v in View}
        self.filter_text = ""
        self._filter_shown = False
        self.thread: int | None = None
        self.chart_open = False
        self.zoom = DEFAULT_ZOOM
        self.pan_steps = 0
        self.bar = False
        self.from_zero = False
        self.paused = False
        self.snapshot: Snapshot | None = None
        self._job_running = False
        self._job_pending: bool | None = None  # None: nothing pending, else "refresh" flag
        self._job_started = 0.0
        self.last_update_s = 0.0  # request to drawn widgets, for the benchmark

    @property
    def rsprof(self) -> RsprofApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield ProfileHeader(id="header")
        with Vertical(id="body"):
            yield ProfileTable(id="table")
            yield Static(NO_HEAP, id="no-heap")
            yield ProfileChart(id="chart")
        yield Input(placeholder="filter by function name", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#filter", Input).cursor_blink = not self.app.is_headless
        self.query_one(ProfileTable).focus()
        self._show_header()
        self.request_update(refresh=True)
        self.set_interval(self.rsprof.refresh_interval, self._tick)

    # -- updates ----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._job_running or self._job_pending is not None

    def current_query(self) -> Query:
        sort, descending = self.sorts[self.view]
        chart = None
        table = self.query_one(ProfileTable)
        if self.chart_open and table.selected is not None:
            chart = ChartRequest(table.selected.key, self.zoom, self.pan_steps)
        return Query(self.view, sort, descending, self.filter_text, self.thread, chart)

    def request_update(self, *, refresh: bool = False) -> None:
        """Builds a new snapshot in a worker; coalesces requests made while one runs."""
        if self._job_running:
            self._job_pending = bool(self._job_pending) or refresh
            return
        self._job_running = True
        self._job_started = time.perf_counter()
        self._build(self.current_query(), refresh)

    @work(thread=True, group="snapshot")
    def _build(self, query: Query, refresh: bool) -> None:
        app = self.rsprof
        source = app.source
        if source.thread != query.thread:
            source.set_thread(query.thread)
            refresh = True
        try:
            snapshot = build_snapshot(source, query, refresh=refresh)
        except Exception as exc:  # keep the UI alive; show what went wrong
            self.app.call_from_thread(self._failed, exc)
            return
        self.app.call_from_thread(self._apply, snapshot)

    def _failed(self, exc: Exception) -> None:
        self._job_running = False
        self.notify(f"could not read the profile: {exc}", severity="error", timeout=10)
        self._run_pending()

    def _run_pending(self) -> None:
        if self._job_pending is not None:
            refresh, self._job_pending = self._job_pending, None
            self.request_update(refresh=refresh)

    def _tick(self) -> None:
        if self.paused:
            return
        snap = self.snapshot
        following = self.rsprof.live or snap is None or snap.info.state == "recording"
        if following and not self.busy:
            self.request_update(refresh=True)
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
        table.display = not no_heap
        self.query_one("#no-heap").display = no_heap
        if q.filter:
            empty = f"no function matches “{q.filter}”"
        else:
            empty = "no samples yet" if q.view is View.CPU else "no allocations yet"
        table.set_rows(COLUMNS[q.view], snapshot.rows, q.sort, q.descending, empty_text=empty)
        chart = self.query_one(ProfileChart)
        chart.display = self.chart_open and not no_heap
        if self.chart_open and q.chart is not None:
            chart.show(self._chart_state(snapshot))
        self._show_header()
        self._announce_exit(previous, snapshot)
        self.last_update_s = time.perf_counter() - self._job_started

    def _chart_state(self, snapshot: Snapshot) -> ChartState:
        q = snapshot.query
        assert q.chart is not None
        row = next((r for r in snapshot.rows if r.key == q.chart.key), None)
        name = row.function if row else "?"
        metric = "live bytes" if q.view is View.MEMORY else "CPU % of samples"
        back = q.chart.pan * q.chart.window_ms / 2000
        where = f", {fmt_offset(back)} back" if q.chart.pan else ""
        style = "bar" if self.bar else "line"
        zero = ", y from 0" if self.from_zero else ""
        info = snapshot.info
        t0 = info.start_time_ms
        if t0 is None:
            t0 = (snapshot.summary.first_timestamp_ms or 0) - info.interval_ms
        return ChartState(
            title=f"{name} · {metric} · {q.chart.zoom_label} window{where} · {style}{zero}",
            series=snapshot.series,
            t0_ms=t0,
            bytes=q.view is View.MEMORY,
            bar=self.bar,
            from_zero=self.from_zero,
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
        return ""

    def _show_header(self) -> None:
        header = self.query_one(ProfileHeader)
        snap = self.snapshot
        app = self.rsprof
        name = os.path.basename(app.source.path)
        if snap is None:
            header.show(HeaderState("LOADING", name, 0, 0, 0, "", None, self.view))
            return
        info, summary = snap.info, snap.summary
        notice = self._exit_notice(snap)
        recording = info.state == "recording" and not notice
        if app.live:
            mode = "PAUSED" if self.paused else ("RECORDING" if recording else "STOPPED")
        else:
            mode = "VIEW"
        start = info.start_time_ms
        if start is None:
            start = (summary.first_timestamp_ms or 0) - info.interval_ms
        if recording and (app.live or info.state == "recording"):
            end = app.clock() * 1000
        else:
            end = info.end_time_ms or summary.last_timestamp_ms or start
        cpu, rss = summary.target_cpu_pct, summary.target_rss_bytes
        thread = "all"
        if snap.query.thread is not None:
            names = {t.tid: t.name for t in snap.threads}
            thread = f"{snap.query.thread} {names.get(snap.query.thread, '')}".strip()
        elapsed = max(0.0, end - start)
        if self.paused and header.state is not None:
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
                view=self.view,
                thread=thread,
                filter=self.filter_text,
                cpu_pct=cpu,
                rss_bytes=rss,
                show_target=app.live or info.state == "recording",
                notice=notice,
            )
        )

    # -- actions ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.CHART_ACTIONS:
            return self.chart_open
        if action == "pause":
            return self.rsprof.live
        if action == "escape":
            return self.chart_open or bool(self.filter_text) or self._filter_shown
        return True

    def action_view(self, view: str) -> None:
        if View(view) is not self.view:
            self.view = View(view)
            self.pan_steps = 0
            self._show_header()
            self.request_update()

    def action_toggle_view(self) -> None:
        self.action_view(View.MEMORY if self.view is View.CPU else View.CPU)

    def action_toggle_chart(self) -> None:
        self.chart_open = not self.chart_open
        chart = self.query_one(ProfileChart)
        chart.display = self.chart_open
        if not self.chart_open and chart.has_focus:
            self.query_one(ProfileTable).focus()
        self.refresh_bindings()
        self.request_update()

    def action_bar(self) -> None:
        self.bar = not self.bar
        self.request_update()

    def action_from_zero(self) -> None:
        self.from_zero = not self.from_zero
        self.request_update()

    def action_zoom(self, step: int) -> None:
        self.zoom = max(0, min(len(ZOOM_LEVELS) - 1, self.zoom + step))
        if self.snapshot is not None:
            self.pan_steps = min(self.pan_steps, max_pan(self.snapshot.summary, self.zoom))
        self.request_update()

    def action_pan(self, step: int) -> None:
        limit = max_pan(self.snapshot.summary, self.zoom) if self.snapshot else 0
        self.pan_steps = max(0, min(limit, self.pan_steps + step))
        self.request_update()

    def action_switch_focus(self) -> None:
        table, chart = self.query_one(ProfileTable), self.query_one(ProfileChart)
        if self.chart_open and chart.display and table.has_focus:
            chart.focus()
        else:
            table.focus()

    def action_cycle_sort(self) -> None:
        key, _ = self.sorts[self.view]
        new = next_sort(self.view, key)
        self.sorts[self.view] = (new, column(self.view, new).numeric)
        self.request_update()

    @on(ProfileTable.HeaderClicked)
    def _sort_by_header(self, event: ProfileTable.HeaderClicked) -> None:
        key, descending = self.sorts[self.view]
        if event.column == key:
            self.sorts[self.view] = (key, not descending)
        else:
            self.sorts[self.view] = (event.column, column(self.view, event.column).numeric)
        self.request_update()

    @on(ProfileTable.CursorMoved)
    def _selection_changed(self) -> None:
        if self.chart_open:
            self.request_update()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = self._filter_shown = True
        box.focus()
        self.refresh_bindings()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self._show_header()
        self.request_update()

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        box = self.query_one("#filter", Input)
        if not box.value:
            box.display = self._filter_shown = False
        self.query_one(ProfileTable).focus()

    def _clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.display = self._filter_shown = False
        self.filter_text = ""
        self.query_one(ProfileTable).focus()
        self.refresh_bindings()
        self._show_header()
        self.request_update()

    def action_escape(self) -> None:
        box = self.query_one("#filter", Input)
        if box.has_focus or (self.filter_text and not self.chart_open):
            self._clear_filter()
        elif self.chart_open:
            self.action_toggle_chart()

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._show_header()
        if not self.paused:
            self.request_update(refresh=True)

    def action_pick_thread(self) -> None:
        threads = self.snapshot.threads if self.snapshot else []

        def chosen(result: str | None) -> None:
            if result is None:
                return
            tid = None if result == ALL_THREADS else int(result)
            if tid != self.thread:
                self.thread = tid
                self._show_header()
                self.request_update()

        self.app.push_screen(ThreadPicker(threads, self.thread), chosen)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())
