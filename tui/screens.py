"""Modal screens: the help page (`?`) and the thread picker (`t`)."""

from __future__ import annotations

import os
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from rsprof.storage.live import ThreadInfo
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from .format import fmt_count

KEYS: tuple[tuple[str, str], ...] = (
    ("q, Ctrl-Q", "quit (live: asks first, then stops and finalizes the recording)"),
    ("Esc", "close filter, chart, callers, output, flame (back to the tree) or tree; else q"),
    ("Ctrl-C", "stop the recording and quit"),
    ("1 / 2", "CPU view / Memory view"),
    ("3", "Wall view: on-CPU + off-CPU time, where threads run and wait (top wall)"),
    ("m", "toggle between the two views"),
    ("f", "call tree (CPU, Wall) / allocation tree (Memory)"),
    ("Space, → / ←", "tree: toggle, open / close a node"),
    ("F", "flame graph (icicle) of the thread, window and filter shown"),
    ("←→ ↑↓, ⏎ / u", "flame: move along a row, to parent / child; zoom in / out"),
    ("e", "callers and callees of the selected function"),
    ("o", "the program's output (stdout, stderr in red), live (rsprof run keeps it)"),
    ("w", "CPU, Wall view: whole recording or the zoom/pan window"),
    ("c / Enter", "open or close the chart of the selected row"),
    ("j / k, ↓ / ↑", "next / previous row"),
    ("Ctrl-d / Ctrl-u", "half a page down / up"),
    ("g / G", "first / last row"),
    ("h / l", "pan the chart (or window) back / forward in time"),
    ("+ / -", "zoom the chart (or window) in / out (5s … 1d)"),
    ("b", "bar or line chart"),
    ("z", "chart's y axis from zero, or fitted to the data"),
    ("r", "CPU Trend: one scale for the column, or per row"),
    ("Tab", "move focus: table, chart, callers, output (arrows scroll them)"),
    ("/", "focus: samples through a frame matching a regex (--focus; Esc clears)"),
    ("H", "hide or show start-up and interpreter frames (--hide-runtime; on for Python)"),
    ("s / S", "sort by the next column / reverse (or click a header)"),
    ("t", "show one thread, or all threads"),
    ("p", "pause the display (live mode; recording goes on)"),
    ("x / X", "export the view to pprof / speedscope beside the profile"),
    ("?", "this help"),
)


class HelpScreen(ModalScreen[None]):
    """Every key, in a box; any of Esc, q, ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        table = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for keys, action in KEYS:
            table.add_row(keys, action)
        with VerticalScroll(id="help-box"):
            yield Static("rsprof keys", id="help-title")
            yield Static(table)
            yield Static("Esc, q or ? closes this help", id="help-hint")


ALL_THREADS = "all"


class ThreadPicker(ModalScreen[str | None]):
    """A small list: all threads, then each thread with its CPU samples. Returns the
    option id (`all` or a tid) or None if cancelled."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "dismiss", "Cancel"),
        Binding("j", "cursor(1)", show=False),
        Binding("k", "cursor(-1)", show=False),
        Binding("g", "edge(0)", show=False),
        Binding("G", "edge(1)", show=False),
    ]

    def __init__(self, threads: list[ThreadInfo], current: int | None) -> None:
        super().__init__()
        self.threads = threads
        self.current = current

    def compose(self) -> ComposeResult:
        options = [Option("All threads", id=ALL_THREADS)]
        # A recording that followed children: each thread says which process it is in.
        several = len({t.pid for t in self.threads if t.pid is not None}) > 1
        # Python names (`ThreadPoolExecutor-0_12`) outgrow the kernel's 15 characters: the
        # column fits the longest, up to 32 (longer ones end in an ellipsis).
        width = max([16, *(min(len(t.name), 32) for t in self.threads)])
        for t in sorted(self.threads, key=lambda t: (-t.samples, t.tid)):
            exited = " (exited)" if t.exited else ""
            name = t.name or "?"
            if len(name) > width:
                name = name[:width - 1] + "…"
            label = f"{t.tid:>7}  {name:<{width}} {fmt_count(t.samples):>9} samples{exited}"
            if several and t.pid is not None:
                program = os.path.basename(t.process.split(" ", 1)[0]) if t.process else "?"
                label += f"  pid {t.pid} {program}"
            options.append(Option(label, id=str(t.tid)))
        with Vertical(id="thread-box"):
            yield Static("Show samples of", id="thread-title")
            yield OptionList(*options, id="thread-list")

    def on_mount(self) -> None:
        option_list = self.query_one(OptionList)
        wanted = ALL_THREADS if self.current is None else str(self.current)
        try:
            option_list.highlighted = option_list.get_option_index(wanted)
        except Exception:  # the thread is no longer listed
            option_list.highlighted = 0
        option_list.focus()

    def action_cursor(self, delta: int) -> None:
        option_list = self.query_one(OptionList)
        if delta > 0:
            option_list.action_cursor_down()
        else:
            option_list.action_cursor_up()

    def action_edge(self, last: int) -> None:
        option_list = self.query_one(OptionList)
        option_list.highlighted = option_list.option_count - 1 if last else 0

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    async def action_dismiss(self, result: object = None) -> None:
        self.dismiss(None)


class ConfirmQuit(ModalScreen[bool]):
    """Asks before a key ends a live recording (perf top asks too): a stray Esc must not
    end the program `rsprof run` started. y or Enter: quit; n, Esc or q: stay."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,enter", "answer(True)", "Yes"),
        Binding("n,escape,q", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(Text(f"{self.question}  y/n"), id="confirm-quit")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
