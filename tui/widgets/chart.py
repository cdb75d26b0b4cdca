"""The chart of the selected row over time (textual-plotext)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rsprof.storage.live import Series
from textual.binding import Binding, BindingType
from textual_plotext import PlotextPlot

from ..format import bytes_unit, fmt_offset


@dataclass(frozen=True, slots=True)
class ChartState:
    title: str
    series: Series | None
    t0_ms: int  # recording start: x is seconds since then
    bytes: bool  # heap (bytes) or CPU (%)
    bar: bool = False
    from_zero: bool = False


class ProfileChart(PlotextPlot, can_focus=True):
    """A line or bar chart of one `Series`; `h`/`l` (or arrows) pan when focused."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "screen.pan(1)", "Pan left", show=False),
        Binding("right", "screen.pan(-1)", "Pan right", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state: ChartState | None = None

    def show(self, state: ChartState) -> None:
        if state == self.state:
            return
        self.state = state
        plt = self.plt
        plt.clear_figure()
        plt.title(state.title)
        series = state.series
        if series is None:
            self.refresh()
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
            plt.ylabel("% samples")
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
        self.refresh()
