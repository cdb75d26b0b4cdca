"""The callers panel (tui/widgets/peek.py) on synthetic data: names and locations are text,
never Rich markup (issue 24: `[kernel]` was blanked, read as a markup tag)."""

from __future__ import annotations

from rich.console import Console
from rsprof.storage.live import Neighbour, PeekInfo
from rsprof.tui.widgets.peek import peek_table


def _rendered(peek: PeekInfo) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(peek_table(peek, "whole recording"))
    return console.export_text()


def test_names_with_brackets_are_shown_as_they_are() -> None:
    callee = Neighbour(2, "[kernel]", "", 30, 60.0)
    other = Neighbour(3, "std::array<int, 3>::operator[]", "[vdso]:0", 10, 20.0)
    caller = Neighbour(4, "[bold]not markup[/bold]", "app.c:[7]", 50, 100.0)
    peek = PeekInfo(1, "read_file", "io.c:12", 0, 50, 100, (caller,), (callee, other))
    text = _rendered(peek)
    for shown in ("[kernel]", "operator[]", "[vdso]:0", "[bold]not markup[/bold]", "app.c:[7]",
                  "read_file"):
        assert shown in text, (shown, text)
