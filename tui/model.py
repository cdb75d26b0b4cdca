"""What the TUI shows, computed off the UI thread: views, columns, sorting, chart windows.

`build_snapshot()` runs in a worker thread: it refreshes the data source, then filters,
sorts and (if a chart is open) queries the chart series. The UI thread only draws the
immutable `Snapshot` it returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from operator import attrgetter
from typing import Any, Literal, Protocol

from rsprof.storage.live import (
    CheckpointSummary,
    CpuRow,
    HeapRow,
    ProfileInfo,
    Series,
    ThreadInfo,
)

from .format import fmt_bytes, fmt_count, fmt_pct, sparkline

Row = CpuRow | HeapRow


class View(StrEnum):
    CPU = "cpu"
    MEMORY = "memory"


class DataSource(Protocol):
    """What the TUI reads; `storage.live.LiveProfile` is the real one."""

    path: str
    info: ProfileInfo
    thread: int | None

    @property
    def has_heap_data(self) -> bool: ...

    def refresh(self) -> bool: ...
    def set_thread(self, tid: int | None) -> None: ...
    def summary(self) -> CheckpointSummary: ...
    def threads(self) -> list[ThreadInfo]: ...
    def cpu_rows(self) -> list[CpuRow]: ...
    def heap_rows(self) -> list[HeapRow]: ...
    def cpu_series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int) -> Series: ...
    def heap_series(self, key: int, start_ms: int, end_ms: int, bucket_ms: int) -> Series: ...


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int = 0  # fixed width in cells; 0 = a share (`flex`) of what is left
    flex: int = 0
    numeric: bool = True  # right-aligned, sorted largest first
    sortable: bool = True
    cut: Literal["end", "start"] = "end"  # where a long value is cut


TREND = Column("trend", "Trend", 12, numeric=False, sortable=False)
FUNCTION = Column("function", "Function", flex=3, numeric=False)
LOCATION = Column("location", "Location", flex=2, numeric=False, cut="start")

COLUMNS: dict[View, tuple[Column, ...]] = {
    View.CPU: (
        Column("total", "Total %", 9),
        Column("live", "Live %", 9),
        FUNCTION,
        LOCATION,
        TREND,
    ),
    View.MEMORY: (
        Column("live_bytes", "Live", 10),
        Column("alloc_bytes", "Allocated", 11),
        Column("alloc_count", "Allocs", 9),
        FUNCTION,
        LOCATION,
        TREND,
    ),
}
DEFAULT_SORT = {View.CPU: "total", View.MEMORY: "live_bytes"}

_CELLS: dict[str, Callable[[Any], str]] = {
    "total": lambda r: fmt_pct(r.total_pct),
    "live": lambda r: fmt_pct(r.live_pct),
    "function": lambda r: r.function,
    "location": lambda r: r.location,
    "trend": lambda r: sparkline(r.trend, from_zero=isinstance(r, CpuRow)),
    "live_bytes": lambda r: fmt_bytes(r.live_bytes),
    "alloc_bytes": lambda r: fmt_bytes(r.alloc_bytes),
    "alloc_count": lambda r: fmt_count(r.alloc_count),
}
_SORT_KEYS: dict[str, Callable[[Any], Any]] = {
    "total": attrgetter("samples"),
    "live": attrgetter("live_samples"),
    "function": lambda r: r.function.lower(),
    "location": attrgetter("location"),
    "live_bytes": attrgetter("live_bytes"),
    "alloc_bytes": attrgetter("alloc_bytes"),
    "alloc_count": attrgetter("alloc_count"),
}


def cell_text(column: Column, row: Row) -> str:
    return _CELLS[column.key](row)


def column(view: View, key: str) -> Column:
    return next(c for c in COLUMNS[view] if c.key == key)


def next_sort(view: View, key: str) -> str:
    """The sortable column after `key` (`s` cycles through them)."""
    keys = [c.key for c in COLUMNS[view] if c.sortable]
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


# -- snapshots ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    """Everything the UI asks of one snapshot."""

    view: View = View.CPU
    sort: str = "total"
    descending: bool = True
    filter: str = ""
    thread: int | None = None
    chart: ChartRequest | None = None


@dataclass(frozen=True)
class Snapshot:
    query: Query
    info: ProfileInfo
    summary: CheckpointSummary
    rows: Sequence[Row]
    total_rows: int  # before the name filter
    threads: list[ThreadInfo]
    heap_available: bool
    series: Series | None = None


def build_snapshot(
    source: DataSource, query: Query, *, refresh: bool = True
) -> Snapshot:
    """Refreshes `source` (new checkpoints only) and computes what `query` asks for."""
    if refresh:
        source.refresh()
    info = source.info
    summary = source.summary()
    rows: list[Row]
    if query.view is View.CPU:
        rows = list(source.cpu_rows())
    else:
        rows = list(source.heap_rows())
    heap_available = info.heap_mode not in ("", "none") and source.has_heap_data
    total = len(rows)
    if query.filter:
        needle = query.filter.lower()
        rows = [r for r in rows if needle in r.function.lower()]
    sort_rows(rows, query.sort, query.descending)
    series = None
    if query.chart is not None and summary.last_timestamp_ms is not None:
        start, end, bucket = query.chart.window(summary.last_timestamp_ms, info.interval_ms)
        if query.view is View.CPU:
            series = source.cpu_series(query.chart.key, start, end, bucket)
        else:
            series = source.heap_series(query.chart.key, start, end, bucket)
    return Snapshot(
        query=query,
        info=info,
        summary=summary,
        rows=rows,
        total_rows=total,
        threads=source.threads(),
        heap_available=heap_available,
        series=series,
    )
