"""What the TUI shows, computed off the UI thread: views, columns, sorting, chart windows.

`build_snapshot()` runs in a worker thread: it refreshes the data source, then filters,
sorts and (if a chart is open) queries the chart series. The UI thread only draws the
immutable `Snapshot` it returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from operator import attrgetter
from typing import Any, Literal, NamedTuple, Protocol

from rsprof.storage.filters import FrameFilter
from rsprof.storage.live import (
    CallNode,
    CheckpointSummary,
    CpuRow,
    HeapRow,
    HeapTimeline,
    OutputChunk,
    PeekInfo,
    ProfileInfo,
    Series,
    ThreadInfo,
)
from rsprof.storage.samples import TimeRange
from rsprof.storage.selection import SampleQuery

from .format import fmt_bytes, fmt_count, fmt_offset, fmt_pct, short_functions, sparkline


class TreeRow(NamedTuple):
    """One visible line of the call tree: a node and how deep it is."""

    key: int  # hash of `path`: stable across refreshes, so the cursor stays on the node
    path: tuple[int, ...]
    function: str  # indented, with ▸ / ▾ / · in front
    name: str
    location: str
    self_pct: float
    total_pct: float
    has_children: bool
    expanded: bool
    self_value: int = 0  # samples (CPU) or bytes (Memory)
    total_value: int = 0


Row = CpuRow | HeapRow | TreeRow


class View(StrEnum):
    CPU = "cpu"
    MEMORY = "memory"
    WALL = "wall"  # on-CPU + off-CPU time (`rsprof top wall`): the CPU view's shape

    @property
    def slot(self) -> int:
        """Its place in per-view triples (`ScreenState.sorts`)."""
        return _SLOTS[self]

    @property
    def timed(self) -> bool:
        """A view of time per function and stack (CPU, Wall): table, tree, flame, callers,
        charts and window alike; Memory is of call sites and bytes."""
        return self is not View.MEMORY


_SLOTS = {View.CPU: 0, View.MEMORY: 1, View.WALL: 2}


class DataSource(Protocol):
    """What the TUI reads; `storage.live.LiveProfile` is the real one."""

    path: str
    thread: int | None

    @property
    def info(self) -> ProfileInfo: ...
    @property
    def has_heap_data(self) -> bool: ...
    @property
    def heap_by_thread(self) -> bool: ...

    def refresh(self) -> bool: ...
    def set_thread(self, tid: int | None) -> None: ...
    def summary(self) -> CheckpointSummary: ...
    def threads(self) -> list[ThreadInfo]: ...
    def time_range(self, start_ms: int, end_ms: int) -> TimeRange: ...
    @property
    def has_offcpu_data(self) -> bool: ...

    def no_offcpu_reason(self) -> str: ...
    def cpu_rows(self, filters: FrameFilter = ..., time_range: TimeRange = ..., *,
                 wall: bool = ...) -> list[CpuRow]: ...
    def heap_rows(self, filters: FrameFilter = ...) -> list[HeapRow]: ...
    def cpu_series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int,
                   filters: FrameFilter = ..., *, wall: bool = ...) -> Series: ...
    def call_tree(self, time_range: TimeRange = ..., filters: FrameFilter = ..., *,
                  wall: bool = ...) -> CallNode: ...
    def peek(self, key: int, time_range: TimeRange = ...,
             filters: FrameFilter = ..., *, wall: bool = ...) -> PeekInfo: ...
    def heap_timeline(self, points: int = 120) -> HeapTimeline: ...
    def heap_tree(self, filters: FrameFilter = ..., allocated: bool = False) -> CallNode: ...
    def heap_series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int,
                    filters: FrameFilter = ...) -> Series: ...
    def output(self, after_id: int = 0, limit: int = 2000) -> list[OutputChunk]: ...


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int = 0  # fixed width in cells; 0 = a share (`flex`) of what is left
    flex: int = 0
    numeric: bool = True  # right-aligned, sorted largest first
    sortable: bool = True
    cut: Literal["end", "start"] = "end"  # where a long value is cut
    # shown only when the table is at least this wide (cells): narrow terminals drop the
    # least needed columns whole instead of squeezing the names (0: always)
    min_table: int = 0


WIDE_TABLE = 100
"""The Memory view's Allocated column shows from this table width (80 columns keep Live,
Allocs, Frees, Growing, the names and Trend)."""


TREND = Column("trend", "Trend", 12, numeric=False, sortable=False)
FUNCTION = Column("function", "Function", flex=3, numeric=False)
LOCATION = Column("location", "Location", flex=2, numeric=False, cut="start")

COLUMNS: dict[View, tuple[Column, ...]] = {
    View.CPU: (
        Column("self", "Self %", 8),
        Column("total", "Total %", 9),
        Column("live", "Live %", 8),
        FUNCTION,
        LOCATION,
        TREND,
    ),
    # The CPU view's columns, of the wall time (on + off CPU) of the thread shown, and the
    # time itself as `top wall` states it, where the table is wide enough
    View.WALL: (
        Column("self", "Self %", 8),
        Column("total", "Total %", 9),
        Column("total_time", "Time", 10, min_table=WIDE_TABLE),
        Column("live", "Live %", 8),
        FUNCTION,
        LOCATION,
        TREND,
    ),
    View.MEMORY: (
        Column("live_bytes", "Live", 10),
        Column("alloc_bytes", "Allocated", 11, min_table=WIDE_TABLE),
        Column("alloc_count", "Allocs", 9),
        Column("free_count", "Frees", 9),
        Column("growing", "Growing", 7),
        # the names get more of what is left than in the CPU view: 80 columns keep a
        # call site's function (`remember_request`) whole
        Column("function", "Function", flex=4, numeric=False),
        LOCATION,
        TREND,
    ),
}
TREE_COLUMNS: tuple[Column, ...] = (
    Column("total", "Total %", 8, sortable=False),
    Column("self", "Self %", 8, sortable=False),
    Column("function", "Function (call tree)", flex=3, numeric=False, sortable=False),
    Column("location", "Location", flex=2, numeric=False, sortable=False, cut="start"),
)
HEAP_TREE_COLUMNS: tuple[Column, ...] = (
    Column("total_bytes", "Total", 10, sortable=False),
    Column("self_bytes", "Self", 10, sortable=False),
    Column("function", "Function (allocation tree)", flex=3, numeric=False, sortable=False),
    Column("location", "Location", flex=2, numeric=False, sortable=False, cut="start"),
)
# Total (inclusive) first: a program's own functions (main, its workers) lead the table,
# not only the leaf it spends its time in.
DEFAULT_SORT = {View.CPU: "total", View.MEMORY: "live_bytes", View.WALL: "total"}

_CELLS: dict[str, Callable[[Any, float | None], str]] = {
    "self": lambda r, _t: fmt_pct(r.self_pct),
    "total": lambda r, _t: fmt_pct(r.total_pct),
    "live": lambda r, _t: fmt_pct(r.live_pct),
    "function": lambda r, _t: r.function,
    "location": lambda r, _t: r.location,
    # CPU: one scale for the whole column (top), so a 0.1 % function looks it. Heap: each
    # row from its own minimum to maximum, so a slow leak shows as a ramp.
    "trend": lambda r, top: (
        sparkline(r.trend, top=top or None)
        if isinstance(r, CpuRow)
        else sparkline(r.trend, from_zero=False)
    ),
    "live_bytes": lambda r, _t: fmt_bytes(r.live_bytes),
    "alloc_bytes": lambda r, _t: fmt_bytes(r.alloc_bytes),
    "alloc_count": lambda r, _t: fmt_count(r.alloc_count),
    "free_count": lambda r, _t: fmt_count(r.free_count),
    "growing": lambda r, _t: "▲ yes" if r.growing else "",
    "total_time": lambda r, _t: f"{r.total_samples / 1e9:.3f}s",  # as `top wall`
    "total_bytes": lambda r, _t: fmt_bytes(r.total_value),
    "self_bytes": lambda r, _t: fmt_bytes(r.self_value),
}
_SORT_KEYS: dict[str, Callable[[Any], Any]] = {
    "self": lambda r: (r.self_samples, r.total_samples),
    "total": lambda r: (r.total_samples, r.self_samples),
    "live": lambda r: (r.live_samples, r.total_samples),
    "function": lambda r: r.function.lower(),
    "location": attrgetter("location"),
    "total_time": lambda r: (r.total_samples, r.self_samples),
    "live_bytes": attrgetter("live_bytes"),
    "alloc_bytes": attrgetter("alloc_bytes"),
    "alloc_count": attrgetter("alloc_count"),
    "free_count": attrgetter("free_count"),
    "growing": lambda r: (r.growing, r.live_bytes),
}


def cell_text(column: Column, row: Row, trend_top: float | None = None,
              names: Mapping[str, str] | None = None) -> str:
    """A cell's text; `names` maps functions to their display names (short_functions)."""
    if names and column.key == "function":
        return names.get(row.function, row.function)
    return _CELLS[column.key](row, trend_top)


def column(view: View, key: str) -> Column:
    return next(c for c in COLUMNS[view] if c.key == key)


def next_sort(view: View, key: str, shown: Collection[str] | None = None) -> str:
    """The sortable column after `key` (`s` cycles through them; through those `shown`,
    when given: the table's width may leave some out)."""
    keys = [c.key for c in COLUMNS[view] if c.sortable and (shown is None or c.key in shown)]
    return keys[(keys.index(key) + 1) % len(keys)] if key in keys else keys[0]


def sort_rows(rows: list[Row], key: str, descending: bool) -> list[Row]:
    """Sorts by column `key`. The sort is stable and rows arrive in key order, so ties
    keep a fixed order (by row key) between refreshes."""
    rows.sort(key=_SORT_KEYS[key], reverse=descending)
    return rows


# -- charts ---------------------------------------------------------------------------------

ZOOM_LEVELS: tuple[tuple[str, int], ...] = (
    ("5s", 5_000),
    ("10s", 10_000),
    ("30s", 30_000),
    ("1m", 60_000),
    ("5m", 300_000),
    ("15m", 900_000),
    ("1h", 3_600_000),
    ("6h", 21_600_000),
    ("1d", 86_400_000),
)
DEFAULT_ZOOM = 3  # 1m
CHART_POINTS = 120  # at most this many buckets per chart


@dataclass(frozen=True, slots=True)
class ChartRequest:
    key: int
    zoom: int = DEFAULT_ZOOM  # index into ZOOM_LEVELS
    pan: int = 0  # half-windows back from the newest checkpoint (0: follow the newest)

    @property
    def zoom_label(self) -> str:
        return ZOOM_LEVELS[self.zoom][0]

    @property
    def window_ms(self) -> int:
        return ZOOM_LEVELS[self.zoom][1]

    def window(self, last_ts: int, interval_ms: int) -> tuple[int, int, int]:
        """(start_ms, end_ms, bucket_ms) for a recording whose newest checkpoint is last_ts."""
        end = last_ts - self.pan * self.window_ms // 2
        interval = max(1, interval_ms)
        bucket = interval * max(1, math.ceil(self.window_ms / (interval * CHART_POINTS)))
        return end - self.window_ms, end, bucket


def max_pan(summary: CheckpointSummary, zoom: int) -> int:
    """How far back `h` can pan: until the window's end reaches the first checkpoint."""
    if summary.first_timestamp_ms is None or summary.last_timestamp_ms is None:
        return 0
    span = summary.last_timestamp_ms - summary.first_timestamp_ms
    return max(0, math.ceil(span / (ZOOM_LEVELS[zoom][1] / 2)))


# -- call tree ------------------------------------------------------------------------------

AUTO_EXPAND_PCT = 10.0
"""Tree nodes with at least this share of the samples start expanded (the hot paths)."""


def flatten_tree(
    root: CallNode,
    expanded: frozenset[tuple[int, ...]],
    collapsed: frozenset[tuple[int, ...]],
) -> list[TreeRow]:
    """The visible lines of the tree, depth first, heaviest child first."""
    # Percentages of every sample (before a focus), as `top --filter` gives them.
    whole = max(root.base_samples, root.total_samples) or 1
    visible: list[tuple[CallNode, int, float, bool, bool]] = []
    stack: list[tuple[CallNode, int]] = [(c, 0) for c in reversed(root.children)]
    while stack:  # iterative: deep recursion in the target must not overflow ours
        node, depth = stack.pop()
        pct = 100.0 * node.total_samples / whole
        has = bool(node.children)
        is_open = has and (
            node.path in expanded or (node.path not in collapsed and pct >= AUTO_EXPAND_PCT)
        )
        visible.append((node, depth, pct, has, is_open))
        if is_open:
            stack.extend((c, depth + 1) for c in reversed(node.children))
    shown = short_functions(node.function for node, *_ in visible)
    rows: list[TreeRow] = []
    for node, depth, pct, has, is_open in visible:
        marker = ("▾ " if is_open else "▸ ") if has else "· "
        rows.append(TreeRow(
            hash(node.path), node.path, " " * depth + marker + shown[node.function],
            node.function, node.location, 100.0 * node.self_samples / whole, pct, has,
            is_open, node.self_samples, node.total_samples,
        ))
    return rows


# -- snapshots ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    """Everything the UI asks of one snapshot."""

    view: View = View.CPU
    sort: str = "total"
    descending: bool = True
    filter: str = ""  # the filter box: a `--focus` regex, as typed
    thread: int | None = None
    chart: ChartRequest | None = None
    tree: bool = False  # the call tree (CPU, Wall) or allocation tree (Memory), not the table
    expanded: frozenset[tuple[int, ...]] = frozenset()
    collapsed: frozenset[tuple[int, ...]] = frozenset()
    peek: int | None = None  # function key whose callers and callees to show
    window: tuple[int, int] | None = None  # CPU/Wall (zoom, pan) window; None: everything
    timeline_points: int = 0  # Memory view: the heap timeline's width in cells (0: none)
    trend_per_row: bool = False  # CPU Trend: each row its own scale, not the column's
    flame: bool = False  # the icicle of the call tree (CPU) or allocation tree (Memory)
    # start-up and interpreter frames folded out (storage/runtime.py); None: as the
    # recording suggests (on for a Python program, where they fill the first screen)
    hide_runtime: bool | None = None


Nodes = frozenset[tuple[int, ...]]
"""Tree nodes (paths of function keys from the root)."""
PerView = tuple[Nodes, Nodes, Nodes]
_NO_NODES: PerView = (frozenset(), frozenset(), frozenset())


@dataclass(frozen=True, slots=True)
class ScreenState:
    """Every choice the keys make on the main screen, in one frozen value: a key replaces
    it (`dataclasses.replace`), never changes it, so what a worker builds from (`query()`)
    cannot change under it. Sorts and the tree nodes the user opened or closed are kept per
    view (`View.slot`), so each view keeps its own when the other is shown."""

    view: View = View.CPU
    sorts: tuple[tuple[str, bool], ...] = (
        (DEFAULT_SORT[View.CPU], True), (DEFAULT_SORT[View.MEMORY], True),
        (DEFAULT_SORT[View.WALL], True))
    filter: str = ""  # the filter box: a `--focus` regex, as typed
    thread: int | None = None
    tree_open: bool = False  # the call tree (CPU) or allocation tree (Memory) for the table
    flame_open: bool = False  # the icicle instead of the table (or tree)
    flame_from_tree: bool = False  # the flame was opened from the tree: Esc goes back there
    chart_open: bool = False
    peek_open: bool = False  # the callers and callees panel
    output_open: bool = False  # the program's output (o)
    window_on: bool = False  # the CPU view covers the zoom/pan window, not everything
    zoom: int = DEFAULT_ZOOM  # index into ZOOM_LEVELS
    pan: int = 0  # half-windows back from the newest checkpoint
    bar: bool = False  # the chart: bars, not a line
    from_zero: bool = False  # the chart's y axis starts at 0
    trend_per_row: bool = False
    paused: bool = False
    hide_runtime: bool | None = None  # H; None: on for Python programs (runtime_hidden())
    expanded: PerView = _NO_NODES
    collapsed: PerView = _NO_NODES

    @property
    def sort(self) -> tuple[str, bool]:
        """(column key, descending) of the view shown."""
        return self.sorts[self.view.slot]

    def with_sort(self, key: str, descending: bool) -> ScreenState:
        sorts = list(self.sorts)
        sorts[self.view.slot] = (key, descending)
        return replace(self, sorts=tuple(sorts))

    def with_node(self, path: tuple[int, ...], is_open: bool) -> ScreenState:
        """The state with tree node `path` of the view shown opened or closed."""
        i = self.view.slot
        expanded, collapsed = list(self.expanded), list(self.collapsed)
        if is_open:
            expanded[i], collapsed[i] = expanded[i] | {path}, collapsed[i] - {path}
        else:
            expanded[i], collapsed[i] = expanded[i] - {path}, collapsed[i] | {path}
        return replace(self, expanded=(expanded[0], expanded[1], expanded[2]),
                       collapsed=(collapsed[0], collapsed[1], collapsed[2]))

    def query(self, selected_key: int | None, timeline_points: int) -> Query:
        """What the next snapshot is built for: this state, the function (or call site) of
        the selected row, and the heap timeline's width in cells."""
        sort, descending = self.sort
        chart = None
        if self.chart_open and selected_key is not None:
            chart = ChartRequest(selected_key, self.zoom, self.pan)
        timed = self.view.timed
        i = self.view.slot
        return Query(
            self.view, sort, descending, self.filter, self.thread, chart,
            tree=self.tree_open,
            expanded=self.expanded[i] if self.tree_open else frozenset(),
            collapsed=self.collapsed[i] if self.tree_open else frozenset(),
            peek=selected_key if self.peek_open and timed else None,
            window=(self.zoom, self.pan) if self.window_on else None,
            timeline_points=timeline_points if not timed else 0,
            trend_per_row=self.trend_per_row,
            flame=self.flame_open,
            hide_runtime=self.hide_runtime,
        )


@dataclass(frozen=True)
class Snapshot:
    query: Query
    info: ProfileInfo
    summary: CheckpointSummary
    rows: Sequence[Row]
    # The samples the view shows, as `rsprof top/peek/export` select them: what `x` exports.
    # None when the filter box holds no valid regex (`filter_error` says why).
    selection: SampleQuery | None
    threads: list[ThreadInfo]
    heap_available: bool
    series: Series | None = None
    peek: PeekInfo | None = None
    timeline: HeapTimeline | None = None
    trend_top: float | None = None  # the CPU Trend column's shared scale
    window_label: str = "whole recording"
    heap_by_thread: bool = False  # the file keeps the allocating thread (thread picker works)
    flame: CallNode | None = None  # the tree the flame view draws (query.flame)
    # Display names of the table rows' functions (short_functions); keys stay full names.
    names: Mapping[str, str] = field(default_factory=dict)
    filter_error: str = ""
    # The Wall view has off-CPU time to add (else `3` says why: `no_wall_reason`)
    wall_available: bool = False
    no_wall_reason: str = ""


def query_window(query: Query, summary: CheckpointSummary, interval_ms: int) -> (
        tuple[int | None, int | None, str]):
    """(start_ms, end_ms, label) of the CPU (or Wall) view's time window."""
    if query.window is None or summary.last_timestamp_ms is None or not query.view.timed:
        return None, None, "whole recording"
    zoom, pan = query.window
    request = ChartRequest(0, zoom, pan)
    start, end, _bucket = request.window(summary.last_timestamp_ms, interval_ms)
    back = f", {fmt_offset(pan * request.window_ms / 2000)} back" if pan else ""
    return start, end, f"last {request.zoom_label}{back}"


def runtime_hidden(asked: bool | None, info: ProfileInfo) -> bool:
    """Whether start-up and interpreter frames are folded out: as the user toggled (H), else
    for a Python program, whose first screen they fill (py-spy top shows none of them)."""
    return info.python if asked is None else asked


def compile_filter(text: str, hide_runtime: bool = False) -> tuple[FrameFilter, str]:
    """The filter box's text as `--focus` takes it, or no filter and why it is not a
    regex (the box is read as the user types: `foo(` is on its way to `foo(int)`);
    hide_runtime as `--hide-runtime`."""
    try:
        return FrameFilter.compile(focus=text or None, hide_runtime=hide_runtime), ""
    except ValueError as error:
        return FrameFilter(hide_runtime=hide_runtime), str(error)


def build_snapshot(
    source: DataSource, query: Query, *, refresh: bool = True
) -> Snapshot:
    """Refreshes `source` (new checkpoints only) and computes what `query` asks for."""
    if refresh:
        source.refresh()
    info = source.info
    summary = source.summary()
    start, end, window_label = query_window(query, summary, info.interval_ms)
    filters, filter_error = compile_filter(query.filter,
                                           runtime_hidden(query.hide_runtime, info))
    cpu = query.view.timed  # CPU or Wall: the same queries, of samples or of time
    wall = query.view is View.WALL
    time_range = (source.time_range(start, end) if start is not None and end is not None
                  else TimeRange())
    # A file from before the heap kept its thread shows (and exports) the whole heap.
    tid = query.thread if cpu or source.heap_by_thread else None
    selected_range = time_range
    if (info.state == "recording" and time_range == TimeRange()
            and summary.last_timestamp_ms is not None):
        # The file grows after this snapshot: the view (and its export) ends at the last
        # checkpoint read, as `--until` says it.
        selected_range = source.time_range(summary.last_timestamp_ms,
                                           summary.last_timestamp_ms)
        selected_range = TimeRange(None, selected_range.until_s)
    selection = None if filter_error else SampleQuery(
        kind="wall" if wall else "cpu" if cpu else "heap", tid=tid, time_range=selected_range,
        filters=filters)
    rows: list[Row]
    trend_top = None
    flame = None
    if filter_error:
        rows = []
    elif query.flame:
        # The icicle replaces the table: no rows to build.
        flame = (source.call_tree(time_range, filters, wall=wall) if cpu
                 else source.heap_tree(filters))
        rows = []
    elif query.tree:
        root = (source.call_tree(time_range, filters, wall=wall) if cpu
                else source.heap_tree(filters))
        rows = list(flatten_tree(root, query.expanded, query.collapsed))
    elif cpu:
        rows = list(source.cpu_rows(filters, time_range, wall=wall))
    else:
        rows = list(source.heap_rows(filters))
    heap_available = info.heap_mode not in ("", "none") and source.has_heap_data
    if not query.tree:
        sort_rows(rows, query.sort, query.descending)
    if cpu and not query.tree and not query.trend_per_row:
        trend_top = max((max(r.trend) for r in rows if isinstance(r, CpuRow)), default=0)
    series = None
    if query.chart is not None and summary.last_timestamp_ms is not None:
        c_start, c_end, bucket = query.chart.window(summary.last_timestamp_ms, info.interval_ms)
        if cpu:
            series = source.cpu_series(query.chart.key, c_start, c_end, bucket, filters,
                                       wall=wall)
        else:
            series = source.heap_series(query.chart.key, c_start, c_end, bucket, filters)
    peek = None
    if query.peek is not None and cpu:
        peek = source.peek(query.peek, time_range, filters, wall=wall)
    timeline = None
    if query.view is View.MEMORY and query.timeline_points and heap_available:
        timeline = source.heap_timeline(query.timeline_points)
    return Snapshot(
        query=query,
        info=info,
        summary=summary,
        rows=rows,
        selection=selection,
        threads=source.threads(),
        heap_available=heap_available,
        series=series,
        peek=peek,
        timeline=timeline,
        trend_top=trend_top,
        window_label=window_label,
        heap_by_thread=source.heap_by_thread,
        flame=flame,
        names={} if query.tree else short_functions(r.function for r in rows),
        filter_error=filter_error,
        wall_available=source.has_offcpu_data,
        no_wall_reason=source.no_offcpu_reason(),
    )
