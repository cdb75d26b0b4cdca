"""The function table: a Line API widget that draws only the rows on screen.

Textual's DataTable rebuilds every row on update (about 1.3 s for 10 000 rows); this
table keeps the sorted row objects and formats only the visible ones when drawing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..format import align_right, fit_end, fit_start
from ..model import Column, Row, TreeRow, cell_text


def column_widths(columns: Sequence[Column], width: int) -> list[int]:
    """Fixed columns keep their width; flexible ones share the rest (one space between)."""
    fixed = sum(c.width for c in columns) + len(columns)  # a leading space per column
    flex_total = sum(c.flex for c in columns if not c.width) or 1
    left = max(0, width - fixed)
    widths = []
    given = 0
    flexible = [c for c in columns if not c.width]
    for c in columns:
        if c.width:
            widths.append(c.width)
        elif c is flexible[-1]:
            widths.append(max(4, left - given))
        else:
            w = max(4, left * c.flex // flex_total)
            given += w
            widths.append(w)
    return widths


def follow(rows: Sequence[Row], key: int | None, path: tuple[int, ...], cursor: int) -> int:
    """The index of the row to select after `rows` replaced the table's rows: the row of
    `key`; else (a tree node gone) of the nearest ancestor of `path` shown; else the row at
    `cursor`, the old position (or the last row)."""
    if key is not None:
        index = {r.key: i for i, r in enumerate(rows)}
        if key in index:
            return index[key]
        for depth in range(len(path) - 1, 0, -1):
            i = index.get(hash(path[:depth]))
            if i is not None:
                return i
    return min(cursor, max(0, len(rows) - 1))


def visible_columns(columns: Sequence[Column], width: int) -> tuple[Column, ...]:
    """The columns a table `width` cells wide shows (Column.min_table)."""
    return tuple(c for c in columns if c.min_table <= width)


class ProfileTable(ScrollView, can_focus=True):
    """Rows of a `Snapshot` with a header line that stays on top; the cursor follows a key."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j,down", "cursor(1)", "Down", show=False),
        Binding("k,up", "cursor(-1)", "Up", show=False),
        Binding("ctrl+d", "half_page(1)", "½ page down", show=False),
        Binding("ctrl+u", "half_page(-1)", "½ page up", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("g,home", "top", "Top", show=False),
        Binding("G,end", "bottom", "Bottom", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "profile-table--header",
        "profile-table--sorted",
        "profile-table--cursor",
        "profile-table--cursor-blurred",
        "profile-table--trend",
        "profile-table--empty",
    }
    DEFAULT_CSS = """
    ProfileTable { scrollbar-size-vertical: 1; overflow-x: hidden; }
    """

    cursor = reactive(0, always_update=True, init=False, repaint=False)  # watch_cursor draws

    class CursorMoved(Message):
        """The selected row changed (key None: the table is empty)."""

        def __init__(self, key: int | None) -> None:
            super().__init__()
            self.key = key

    class HeaderClicked(Message):
        def __init__(self, column: str) -> None:
            super().__init__()
            self.column = column

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.columns: tuple[Column, ...] = ()
        self.rows: Sequence[Row] = ()
        self.sort_key = ""
        self.descending = True
        self.empty_text = ""
        self.trend_top: float | None = None
        self.names: Mapping[str, str] = {}
        self._selected_key: int | None = None
        # per kind of table (its columns): (key, tree path, cursor, scroll) while not shown
        self._saved: dict[tuple[Column, ...], tuple[int | None, tuple[int, ...], int, int]] = {}
        self._styles: dict[str, Style] | None = None  # see _style()

    def notify_style_update(self) -> None:
        self._styles = None  # CSS or theme changed: the styles are looked up again
        super().notify_style_update()

    def _style(self, name: str) -> Style:
        """The widget's base style, or it plus a component class's (`+class`: the component
        class's alone). Computing them walks
        the DOM (40 % of drawing a line, profiled while holding `j`): cached until the
        styles change."""
        styles = self._styles
        if styles is None:
            base = self.rich_style
            styles = {"": base}
            for c in self.COMPONENT_CLASSES:
                styles["+" + c] = own = self.get_component_rich_style(c)
                styles[c] = base + own
            self._styles = styles
        return styles[name]

    # -- data -----------------------------------------------------------------------------

    def set_rows(
        self,
        columns: tuple[Column, ...],
        rows: Sequence[Row],
        sort_key: str,
        descending: bool,
        *,
        empty_text: str = "",
        trend_top: float | None = None,
        names: Mapping[str, str] | None = None,
    ) -> None:
        """Replaces the rows. The selection follows the item (docs/tui.md, "Selection"):
        the cursor stays on the same key (function, call site, tree node) if it is still
        there; a tree node that went away gives way to its nearest shown ancestor, a row
        of a table to the row now at its position. Each kind of table (the views' tables
        and trees: `columns`) keeps its own selection and scroll position while another
        is shown.

        The scroll position is left alone (a refresh must not undo mouse-wheel scrolling)."""
        view_changed = columns != self.columns
        if (not view_changed and rows == self.rows and sort_key == self.sort_key
                and descending == self.descending and empty_text == self.empty_text
                and trend_top == self.trend_top and (names or {}) == self.names):
            # Rebuilt for another reason (the chart or the callers panel following the
            # selection, a checkpoint that changed nothing shown): nothing to redraw.
            self.rows = rows
            return
        old = self.selected
        path = old.path if isinstance(old, TreeRow) else ()
        key, cursor, scroll = self._selected_key, self.cursor, None
        if view_changed:
            if self.columns:
                self._saved[self.columns] = (key, path, cursor, round(self.scroll_offset.y))
            key, path, cursor, scroll = self._saved.get(columns, (None, (), 0, 0))
        self.columns, self.rows = columns, rows
        self.sort_key, self.descending, self.empty_text = sort_key, descending, empty_text
        self.trend_top = trend_top
        self.names = names or {}
        index = follow(rows, key, path, cursor)
        size = Size(self.size.width, len(rows) + 1)
        if size != self.virtual_size:  # a new virtual size lays the screen out again
            self.virtual_size = size
        if scroll is not None:
            self.scroll_to(y=scroll, animate=False, immediate=True)
        self._move(index, force_message=view_changed, scroll=view_changed)
        self.refresh()

    @property
    def selected(self) -> Row | None:
        return self.rows[self.cursor] if 0 <= self.cursor < len(self.rows) else None

    @property
    def page_rows(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def _move(self, index: int, *, force_message: bool = False, scroll: bool = True) -> None:
        index = max(0, min(index, len(self.rows) - 1)) if self.rows else 0
        self.cursor = index
        key = self.rows[index].key if self.rows else None
        top = round(self.scroll_offset.y)
        if not scroll:
            pass
        elif index < top:
            self.scroll_to(y=index, animate=False, immediate=True)
        elif index >= top + self.page_rows:
            self.scroll_to(y=index - self.page_rows + 1, animate=False, immediate=True)
        if key != self._selected_key or force_message:
            self._selected_key = key
            self.post_message(self.CursorMoved(key))

    def watch_cursor(self, old: int, new: int) -> None:
        # Only the two lines whose highlight changed are drawn again (row i is virtual
        # line i + 1, under the header): a `j` costs two lines, not the whole table
        # (3.7 ms for 12 rows at 80x24). A move that scrolls redraws everything anyway.
        self.refresh_line(old + 1)
        self.refresh_line(new + 1)

    # -- actions --------------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        self._move(self.cursor + delta)

    def action_half_page(self, direction: int) -> None:
        self._move(self.cursor + direction * max(1, self.page_rows // 2))

    def action_page(self, direction: int) -> None:
        self._move(self.cursor + direction * self.page_rows)

    def action_top(self) -> None:
        self._move(0)

    def action_bottom(self) -> None:
        self._move(len(self.rows) - 1)

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            x = 0
            for col, width in zip(self.shown_columns, self._widths(), strict=True):
                if x <= event.x < x + width + 1:
                    if col.sortable:
                        self.post_message(self.HeaderClicked(col.key))
                    return
                x += width + 1
            return
        index = round(self.scroll_offset.y) + event.y - 1
        if 0 <= index < len(self.rows):
            self._move(index)

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.rows) + 1)

    # -- drawing --------------------------------------------------------------------------

    @property
    def shown_columns(self) -> tuple[Column, ...]:
        """The columns drawn at the table's width."""
        return visible_columns(self.columns, self.scrollable_content_region.width)

    def _widths(self) -> list[int]:
        return column_widths(self.shown_columns, self.scrollable_content_region.width)

    def _cells(self, texts: Sequence[str], widths: list[int], header: bool) -> list[str]:
        out = []
        for col, text, width in zip(self.shown_columns, texts, widths, strict=True):
            if col.numeric:
                out.append(" " + align_right(text, width))
            elif col.cut == "start" and not header:
                out.append(" " + fit_start(text, width))
            else:
                out.append(" " + fit_end(text, width))
        return out

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self._style("")
        if not self.columns:
            return Strip.blank(width, base)
        widths = self._widths()
        if y == 0:
            return self._header_strip(widths, width)
        index = round(self.scroll_offset.y) + y - 1
        if not self.rows and y == 1 and self.empty_text:
            style = self._style("profile-table--empty")
            return Strip([Segment(fit_end(" " + self.empty_text, width), style)], width)
        if index >= len(self.rows):
            return Strip.blank(width, base)
        row = self.rows[index]
        style = base
        if index == self.cursor:
            name = "profile-table--cursor" if self.has_focus else "profile-table--cursor-blurred"
            style = self._style(name)
        trend = self._style("+profile-table--trend")
        columns = self.shown_columns
        texts = [cell_text(c, row, self.trend_top, self.names) for c in columns]
        cells = self._cells(texts, widths, header=False)
        segments = [
            Segment(text, style + trend if col.key == "trend" else style)
            for col, text in zip(columns, cells, strict=True)
        ]
        return Strip(segments).adjust_cell_length(width, style)

    def _header_strip(self, widths: list[int], width: int) -> Strip:
        style = self._style("profile-table--header")
        sorted_style = style + self._style("+profile-table--sorted")
        labels = []
        columns = self.shown_columns
        for col in columns:
            if col.key == self.sort_key:
                labels.append(col.label + (" ▼" if self.descending else " ▲"))
            else:
                labels.append(col.label)
        cells = self._cells(labels, widths, header=True)
        segments = [
            Segment(text, sorted_style if col.key == self.sort_key else style)
            for col, text in zip(columns, cells, strict=True)
        ]
        return Strip(segments).adjust_cell_length(width, style)
