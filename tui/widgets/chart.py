"""The chart of the selected row over time (textual-plotext)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from rsprof.storage.live import Series
from textual import work
from textual.binding import Binding, BindingType
from textual.strip import Strip
from textual_plotext import Plot, PlotextPlot

from ..format import bytes_unit, fmt_offset


@dataclass(frozen=True, slots=True)
class ChartState:
    title: str
    series: Series | None
    t0_ms: int  # recording start: x is seconds since then
    bytes: bool  # heap (bytes) or CPU (%)
    bar: bool = False
    from_zero: bool = False
    ylabel: str = "% samples"  # of a percentage chart (the Wall view's: % wall time)


class ProfileChart(PlotextPlot, can_focus=True):
    """A line or bar chart of one `Series`; `h`/`l` (or arrows) pan when focused."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "screen.pan(1)", "Pan left", show=False),
        Binding("right", "screen.pan(-1)", "Pan right", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state: ChartState | None = None
        # The plot is built off the UI thread, down to the lines drawn (plotext, parsing its
        # ANSI output and cutting it into lines took 10-20 ms at 80x24, which a key pressed
        # meanwhile had to wait for): render_line() returns the lines built for the current
        # (state, size, theme), or the previous ones while a worker builds them.
        self._built: tuple[tuple[object, ...], list[Strip]] | None = None
        self._pending: tuple[object, ...] | None = None
        self._plot_lock = threading.Lock()  # self.plt is used by one thread at a time

    def show(self, state: ChartState) -> None:
        if state == self.state:
            return
        self.state = state
        if self.app.is_headless or not self.display:
            self.refresh()  # tests and snapshots: built in render(), deterministically
        else:
            self._request(self._key())

    def _key(self) -> tuple[object, ...]:
        return (self.state, self.size.width, self.size.height,
                self._get_plotext_theme_name(self.app.theme))

    def _request(self, key: tuple[object, ...]) -> None:
        if key != self._pending:
            self._pending = key
            self._build_in_worker(key)

    @work(thread=True, group="chart-build")
    def _build_in_worker(self, key: tuple[object, ...]) -> None:
        text = self._build(key)
        self.app.call_from_thread(self._built_in_worker, key, text)

    def _built_in_worker(self, key: tuple[object, ...], lines: list[Strip]) -> None:
        if self._pending == key:
            self._pending = None
        self._built = (key, lines)
        if key == self._key():
            self.refresh()

    def _lines(self) -> list[Strip]:
        key = self._key()
        built = self._built
        if built is not None and built[0] == key:
            return built[1]
        if built is not None and not self.app.is_headless:
            self._request(key)  # a new size or selection: drawn when built
            return built[1]
        lines = self._build(key)  # the first draw, and every draw in tests
        self._built = (key, lines)
        return lines

    def render_line(self, y: int) -> Strip:
        lines = self._lines()
        width = self.size.width
        if 0 <= y < len(lines):
            return lines[y].crop_extend(0, width, self.rich_style)
        return Strip.blank(width, self.rich_style)

    def _build(self, key: tuple[object, ...]) -> list[Strip]:
        state, width, height, theme = key
        assert state is None or isinstance(state, ChartState)
        assert isinstance(width, int) and isinstance(height, int) and isinstance(theme, str)
        with self._plot_lock:
            plt = self.plt
            plt.clear_figure()
            if state is not None:
                self._configure(plt, state)
            plt.plotsize(width, height)
            plt._set_size(width, height)  # as PlotextPlot.render does (its issue 5)
            plt.theme(theme)
            text = Text.from_ansi(plt.build())
        console = self.app.console
        options = console.options.update(width=width, height=height, no_wrap=True)
        return [Strip(line, width) for line in console.render_lines(text, options, pad=True)]

    @staticmethod
    def _configure(plt: Plot, state: ChartState) -> None:
        plt.title(state.title)
        series = state.series
        if series is None:
            return
        x1 = (series.end_ms - state.t0_ms) / 1000
        # A window longer than the recording starts at the recording's start: the axis
        # then spans what exists (no run of "0s" labels for the time before it).
        x0 = max((series.start_ms - state.t0_ms) / 1000, 0.0 if x1 > 0 else x1 - 1)
        xs = [p[0] for p in series.points]
        ys = [p[1] for p in series.points]
        if state.bytes:
            unit, size = bytes_unit(max(ys, default=0))
            ys = [y / size for y in ys]
            plt.ylabel(unit)
        else:
            plt.ylabel(state.ylabel)
        if xs:
            if state.bar:
                # Full-width bars: at 0.8 the gaps between them fall on cell boundaries
                # irregularly (some bars touch, some do not).
                plt.bar(xs, ys, width=1.0, marker="█")
            else:
                plt.plot(xs, ys, marker="braille")
        else:
            plt.text("no checkpoints in this window", x=(x0 + x1) / 2, y=0.5, alignment="center")
        plt.xlim(x0, x1)
        ticks = [x0 + (x1 - x0) * i / 4 for i in range(5)]
        plt.xticks(ticks, [fmt_offset(max(0.0, t)) for t in ticks])
        top = max(ys, default=0.0)
        if state.from_zero or not xs:
            plt.ylim(0, top * 1.05 if top > 0 else 1)
        elif top == min(ys):
            plt.ylim(max(0.0, top - 1), top + 1)
