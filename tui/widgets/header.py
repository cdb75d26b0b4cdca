"""The two header lines: mode, notice, elapsed time, samples, file, process; view tabs,
thread, the target's CPU % and RSS, filter.

Nothing ever wraps: each line is laid out for the widget's width. Fields have priorities;
the least important are dropped first and the file name is shortened with an ellipsis
(keeping its end), so at 80 columns the mode, a "target exited" notice, the elapsed time,
the tabs, the thread, CPU % and RSS always show.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

from ..format import fit_start, fmt_bytes, fmt_count, fmt_elapsed
from ..model import View

MODE_STYLES = {
    "RECORDING": "bold white on red",
    "PAUSED": "bold black on yellow",
    "VIEW": "bold white on blue",
    "STOPPED": "bold white on grey35",
    "LOADING": "bold reverse",
}
SEP = " │ "


@dataclass(frozen=True, slots=True)
class HeaderState:
    mode: str
    file_name: str
    elapsed_ms: float
    samples: int
    lost_samples: int
    process_name: str
    pid: int | None
    view: View
    thread: str = "all"
    filter: str = ""  # the filter box's `--focus` regex
    window: str = ""  # the CPU view's time window (`w`), e.g. "last 1m"; "" for everything
    runtime_hidden: bool = False  # start-up and interpreter frames folded out (H)
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    show_target: bool = False
    notice: str = ""  # e.g. "target exited (exit code 0)"
    tab_suffix: str = ""  # e.g. " tree": the CPU view's current mode
    kernel_sampled: bool = True  # False: say that time in the kernel is missing
    heap_since: str = ""  # `rsprof -p` loaded the heap shim at this time (HH:MM:SS)
    wall: bool = False  # the file has off-CPU time: the Wall view's tab is shown


@dataclass(slots=True)
class _Field:
    text: Text
    priority: int  # higher stays longer
    elide: bool = False  # the one field that may be shortened (the file name)
    sep: bool = True  # preceded by " │ " when not first


def _layout(fields: list[_Field], width: int) -> Text:
    """Drops the lowest-priority fields until the line fits, then shortens the elidable one."""
    kept = list(fields)

    def length(items: list[_Field]) -> int:
        return sum(cell_len(f.text.plain) + (len(SEP) if f.sep and i else 0)
                   for i, f in enumerate(items))

    elidable = next((f for f in kept if f.elide), None)
    floor = elidable.priority if elidable is not None else 0
    # 1. fields less important than the file name go; 2. the file name gets shorter (down
    # to 12 cells); 3. more important fields go, least important first.
    while length(kept) > width and len(kept) > 1:
        lowest = min(kept, key=lambda f: (f.priority, -kept.index(f)))
        if lowest.priority < floor:
            kept.remove(lowest)
            continue
        if elidable is not None and elidable in kept:
            room = cell_len(elidable.text.plain) - (length(kept) - width)
            if room >= 12:  # a file name shortened to less than this says nothing
                elidable.text = Text(fit_start(elidable.text.plain, room),
                                     style=elidable.text.style)
                break
        kept.remove(lowest)
    line = Text()
    for i, f in enumerate(kept):
        if i and f.sep:
            line.append(SEP, "dim")
        line.append_text(f.text)
    line.truncate(width, overflow="ellipsis")
    return line


def header_lines(state: HeaderState, width: int) -> tuple[Text, Text]:
    mode = Text(f" {state.mode} ", MODE_STYLES.get(state.mode, "bold reverse"))
    line1 = [
        _Field(Text(" rsprof ", "bold"), 1, sep=False),
        _Field(mode, 100, sep=False),
    ]
    if state.notice:
        line1.append(_Field(Text(" " + state.notice, "bold red"), 90, sep=False))
    line1 += [
        _Field(Text(" " + fmt_elapsed(state.elapsed_ms)), 80, sep=False),
        _Field(Text(f"{fmt_count(state.samples)} samples"), 70),
        _Field(Text(state.file_name, "bold"), 60, elide=True),
        _Field(Text(f"{fmt_count(state.lost_samples)} lost",
                    "yellow" if state.lost_samples else ""), 40 if state.lost_samples else 5),
        _Field(Text.assemble((state.process_name or "?", "bold"),
                             f" PID {state.pid}" if state.pid is not None else ""), 20),
    ]
    tabs = Text(" ")
    views = [(View.CPU, "1 CPU"), (View.MEMORY, "2 Memory")]
    if state.wall or state.view is View.WALL:
        views.append((View.WALL, "3 Wall"))
    for view, label in views:
        suffix = state.tab_suffix if view is state.view else ""
        tabs.append(f" {label}{suffix} ", "bold reverse" if view is state.view else "dim")
        tabs.append(" ")
    line2 = [_Field(tabs, 100, sep=False), _Field(Text(f"thread {state.thread}"), 90)]
    if state.show_target:
        cpu = f"{state.cpu_pct:.1f}%" if state.cpu_pct is not None else "-"
        rss = fmt_bytes(state.rss_bytes) if state.rss_bytes is not None else "-"
        line2 += [_Field(Text(f"CPU {cpu}"), 80), _Field(Text(f"RSS {rss}"), 70)]
    if not state.kernel_sampled:
        line2.append(_Field(Text("no kernel time", "yellow"), 50))
    if state.heap_since:
        # Blocks allocated before the attach are unknown: the Memory view's live bytes and
        # leaks are "allocated since attach and still live".
        since = Text.assemble(("heap since attach ", "dim"), (state.heap_since, "bold"))
        line2.append(_Field(since, 85 if state.view is View.MEMORY else 45))
    if state.window:
        line2.append(_Field(Text.assemble(("window ", "dim"), (state.window, "bold")), 65))
    if state.filter:
        line2.append(_Field(Text.assemble(("focus ", "dim"), (state.filter, "bold")), 60))
    if state.runtime_hidden:
        line2.append(_Field(Text("runtime hidden (H)", style="dim"), 55))
    return _layout(line1, width), _layout(line2, width)


def header_text(state: HeaderState, width: int = 1000) -> Text:
    line1, line2 = header_lines(state, width)
    text = Text("\n").join([line1, line2])
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


class ProfileHeader(Static):
    """Shows a `HeaderState`, laid out again when the terminal is resized."""

    DEFAULT_CSS = "ProfileHeader { height: 2; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.state: HeaderState | None = None

    def show(self, state: HeaderState) -> None:
        # The clock shows whole seconds: a state that differs only below the second draws
        # the same header, so it is not drawn again (while recording, every key's redraw
        # laid the two lines out again: profiled as the UI thread's biggest cost after the
        # table with the chart open).
        state = replace(state, elapsed_ms=state.elapsed_ms // 1000 * 1000)
        if state != self.state:
            self.state = state
            self.refresh()

    def render(self) -> Text:
        if self.state is None:
            return Text("")
        return header_text(self.state, max(1, self.size.width))

    @property
    def plain(self) -> str:
        if self.state is None:
            return ""
        return header_text(self.state, max(1, self.size.width)).plain
