"""The two header lines: mode, file, elapsed time, samples, process; view tabs and status."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from ..format import fmt_bytes, fmt_count, fmt_elapsed
from ..model import View

MODE_STYLES = {
    "RECORDING": "bold white on red",
    "PAUSED": "bold black on yellow",
    "VIEW": "bold white on blue",
    "STOPPED": "bold white on grey35",
}


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
    filter: str = ""
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    show_target: bool = False
    notice: str = ""  # e.g. "target exited (code 0)"


def header_text(state: HeaderState) -> Text:
    sep = (" │ ", "dim")
    line1 = Text.assemble(
        (" rsprof ", "bold"),
        (f" {state.mode} ", MODE_STYLES.get(state.mode, "bold reverse")),
        " ",
        (state.file_name, "bold"),
        "  ",
        fmt_elapsed(state.elapsed_ms),
        sep,
        f"{fmt_count(state.samples)} samples",
        sep,
        (f"{fmt_count(state.lost_samples)} lost", "yellow" if state.lost_samples else ""),
        sep,
        (state.process_name or "?", "bold"),
        f" PID {state.pid}" if state.pid is not None else "",
    )
    tabs = [(View.CPU, " 1 CPU "), (View.MEMORY, " 2 Memory ")]
    line2 = Text(" ")
    for view, label in tabs:
        line2.append(label, "bold reverse" if view is state.view else "dim")
        line2.append(" ")
    line2.append_text(Text.assemble(sep, f"thread {state.thread}"))
    if state.show_target:
        cpu = f"{state.cpu_pct:.1f}%" if state.cpu_pct is not None else "-"
        rss = fmt_bytes(state.rss_bytes) if state.rss_bytes is not None else "-"
        line2.append_text(Text.assemble(sep, f"CPU {cpu}", sep, f"RSS {rss}"))
    if state.filter:
        line2.append_text(Text.assemble(sep, ("filter ", "dim"), (state.filter, "bold")))
    if state.notice:
        line2.append_text(Text.assemble(sep, (state.notice, "bold red")))
    text = Text("\n").join([line1, line2])
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


class ProfileHeader(Static):
    """Shows a `HeaderState`."""

    DEFAULT_CSS = "ProfileHeader { height: 2; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.state: HeaderState | None = None

    def show(self, state: HeaderState) -> None:
        if state != self.state:
            self.state = state
            self.update(header_text(state))

    @property
    def plain(self) -> str:
        return header_text(self.state).plain if self.state else ""
