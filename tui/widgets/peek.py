"""The callers/callees panel (`e`): pprof's peek for the selected function."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from rsprof.storage.live import Neighbour, PeekInfo
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..format import fmt_count, fmt_pct, fmt_seconds, short_functions


def peek_table(peek: PeekInfo | None, window: str, wall: bool = False) -> Table | Text:
    """The panel's table; `wall`: the values are nanoseconds of wall time (Wall view)."""
    if peek is None:
        return Text(" no function selected", "dim")
    table = Table(box=None, padding=(0, 1), expand=True, show_edge=False)
    table.add_column("Time" if wall else "Samples", justify="right", no_wrap=True)

    def value(n: int) -> str:
        return fmt_seconds(n / 1e9) if wall else fmt_count(n)

    table.add_column("% of it", justify="right", no_wrap=True)
    table.add_column("Function", no_wrap=True, overflow="ellipsis", ratio=3)
    table.add_column("Location", no_wrap=True, overflow="ellipsis", ratio=2)

    shown = short_functions([peek.function, *(n.function for n in peek.callers),
                             *(n.function for n in peek.callees)])

    def add(title: str, items: tuple[Neighbour, ...], none: str) -> None:
        table.add_row("", "", Text(title, "bold dim"), "")
        if not items:
            table.add_row("", "", Text(none, "dim italic"), "")
        for n in items:
            # Text, never a str: Rich reads a str cell as markup, and `[kernel]` vanished.
            table.add_row(value(n.samples), fmt_pct(n.pct), Text(shown[n.function]),
                          Text(n.location))

    base = peek.all_samples or 1
    table.title = Text.assemble(
        " ", (shown[peek.function], "bold"),
        (f"  self {fmt_pct(100.0 * peek.self_samples / base)}"
         f"  total {fmt_pct(100.0 * peek.total_samples / base)}  ({window})", "dim"),
    )
    table.title_justify = "left"
    add("callers", peek.callers, "(none: it starts its stacks)")
    table.add_row(
        value(peek.total_samples), "100.0%",
        Text.assemble(("▶ ", "bold"), (shown[peek.function], "bold")), Text(peek.location),
        style="on grey23",
    )
    add("callees", peek.callees, "(none: all self time)")
    return table


class PeekPanel(VerticalScroll, can_focus=True):
    """Scrollable: a function with many callers does not push its callees away."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.peek: PeekInfo | None = None
        self.window = ""
        self.wall = False
        self._body = Static("", id="peek-body")

    def compose(self):  # type: ignore[no-untyped-def]
        yield self._body

    def show(self, peek: PeekInfo | None, window: str, wall: bool = False) -> None:
        if (peek, window, wall) != (self.peek, self.window, self.wall):
            self.peek, self.window, self.wall = peek, window, wall
            self._body.update(peek_table(peek, window, wall))
