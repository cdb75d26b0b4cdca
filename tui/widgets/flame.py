"""The icicle (top-down flame graph) of the current filter: the roots on top, each frame as
wide as its inclusive share of its parent, so the widest boxes are where time goes."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rsprof.storage.live import CallNode
from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from ..format import fmt_bytes, fmt_seconds, short_function

# Warm colours as in flame graphs (hashed by function name, so a function keeps its colour
# across refreshes and zooms); dark text on them.
PALETTE = ("#d9822b", "#e0a040", "#c8643c", "#e6b85c", "#d06e50", "#dc9650", "#c98a3e",
           "#e2a868")
MIN_LABEL = 3  # a box narrower than this shows no text


@dataclass(frozen=True, slots=True)
class Box:
    """One frame drawn on one row: cells [x, x + width) of row `depth`."""

    node: CallNode
    depth: int
    x: int
    width: int


def layout(root: CallNode, width: int, max_depth: int = 200) -> list[list[Box]]:
    """The boxes of each row, left to right: `root` spans the width, children share their
    parent's cells by total samples (heaviest first, as the tree lists them); a frame
    narrower than one cell is not drawn (nor anything under it). Iterative: deep recursion
    in the target must not overflow ours."""
    rows: list[list[Box]] = []
    if width <= 0:
        return rows
    todo: list[tuple[CallNode, int, float, float]] = [(root, 0, 0.0, float(width))]
    while todo:
        node, depth, x0, x1 = todo.pop()
        left, right = round(x0), round(x1)
        if right - left < 1 or depth >= max_depth:
            continue
        while len(rows) <= depth:
            rows.append([])
        rows[depth].append(Box(node, depth, left, right - left))
        total = node.total_samples or 1
        x = x0
        children = []
        for child in node.children:
            w = (x1 - x0) * child.total_samples / total
            children.append((child, depth + 1, x, x + w))
            x += w
        todo.extend(reversed(children))
    for row in rows:
        row.sort(key=lambda b: b.x)
    return rows


def colour(name: str) -> str:
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


class FlameView(Widget, can_focus=True):
    """Icicle of a `CallNode` tree. `←`/`→` (`h`/`l`) move along a row, `↑`/`↓` (`k`/`j`)
    to the parent / the heaviest child, `Enter` zooms into the selected frame (it then
    spans the width), `u` / `Backspace` zooms back out. The last line describes the
    selected frame; its callers and callees (`e`) and the chart (`c`) follow it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,h", "move(-1)", "Prev", show=False),
        Binding("right,l", "move(1)", "Next", show=False),
        Binding("up,k", "up", "Parent", show=False),
        Binding("down,j", "down", "Child", show=False),
        Binding("enter", "zoom_in", "Zoom in", key_display="⏎"),
        Binding("u,backspace", "zoom_out", "Zoom out"),
    ]

    class Selected(Message):
        """The selected frame changed (its function key, for the chart and callers)."""

        def __init__(self, key: int | None) -> None:
            super().__init__()
            self.key = key

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.root: CallNode | None = None
        self.whole = 1  # samples (or bytes) the percentages are of
        self.bytes = False  # heap tree: values are bytes
        self.unit = "samples"  # what the values are: samples, bytes, ns (the Wall view)
        self.zoom: tuple[int, ...] = ()  # path of the frame shown full width
        self.selected: tuple[int, ...] = ()  # path of the selected frame
        self._rows: list[list[Box]] = []
        self._layout_key: tuple[object, ...] | None = None
        self._top = 0  # first row shown (deep stacks scroll)
        # per view (its unit): (zoom, selected, top) while another view is shown
        self._saved: dict[str, tuple[tuple[int, ...], tuple[int, ...], int]] = {}

    # -- data -------------------------------------------------------------------------------

    def show(self, root: CallNode | None, *, bytes_: bool = False, reset: bool = False,
             unit: str = "") -> None:
        """New data (a refresh): zoom and selection stay on the same paths when they still
        exist, else on the nearest ancestor that does. Another tree (another view: its
        `unit`, "bytes" with `bytes_`; or `reset`): the zoom and selection it had when last
        shown, else its root (each view keeps its own, as the tables do)."""
        unit = unit or ("bytes" if bytes_ else "samples")
        if reset or unit != self.unit:
            self._saved[self.unit] = (self.zoom, self.selected, self._top)
            self.zoom, self.selected, self._top = self._saved.get(unit, ((), (), 0))
        self.root, self.bytes, self.unit = root, unit == "bytes", unit
        self.whole = max(root.base_samples, root.total_samples, 1) if root else 1
        self.zoom = self._existing(self.zoom)
        if not self._within(self.selected, self.zoom):
            self.selected = self.zoom
        before = self.selected
        self.selected = self._existing(self.selected)
        self._layout_key = None
        self.refresh()
        if self.selected != before:
            self._announce()

    def _find(self, path: tuple[int, ...]) -> CallNode | None:
        node = self.root
        for key in path:
            if node is None:
                return None
            node = next((c for c in node.children if c.key == key), None)
        return node

    def _existing(self, path: tuple[int, ...]) -> tuple[int, ...]:
        while path and self._find(path) is None:
            path = path[:-1]
        return path

    @staticmethod
    def _within(path: tuple[int, ...], ancestor: tuple[int, ...]) -> bool:
        return path[: len(ancestor)] == ancestor

    @property
    def selected_node(self) -> CallNode | None:
        return self._find(self.selected)

    @property
    def selected_key(self) -> int | None:
        node = self.selected_node
        return node.key if node is not None and node.key >= 0 else None

    def _announce(self) -> None:
        self.post_message(self.Selected(self.selected_key))

    def _select(self, path: tuple[int, ...]) -> None:
        if path != self.selected:
            self.selected = path
            self._scroll_to_selected()
            self.refresh()
            self._announce()

    # -- layout -----------------------------------------------------------------------------

    def _boxes(self) -> list[list[Box]]:
        zoomed = self._find(self.zoom) if self.root is not None else None
        key = (id(self.root), self.zoom, self.size.width)
        if key != self._layout_key:
            self._layout_key = key
            self._rows = layout(zoomed, self.size.width) if zoomed is not None else []
        return self._rows

    def _graph_height(self) -> int:
        return max(1, self.size.height - 1)  # the last line describes the selection

    def _scroll_to_selected(self) -> None:
        depth = len(self.selected) - len(self.zoom)
        height = self._graph_height()
        if depth < self._top:
            self._top = depth
        elif depth >= self._top + height:
            self._top = depth - height + 1

    # -- keys -------------------------------------------------------------------------------

    def _selected_box(self) -> Box | None:
        rows = self._boxes()
        depth = len(self.selected) - len(self.zoom)
        if 0 <= depth < len(rows):
            for box in rows[depth]:
                if box.node.path == self.selected:
                    return box
        return None

    def action_move(self, step: int) -> None:
        rows = self._boxes()
        box = self._selected_box()
        if box is None:
            return
        row = rows[box.depth]
        i = row.index(box) + step
        if 0 <= i < len(row):
            self._select(row[i].node.path)

    def action_up(self) -> None:
        if len(self.selected) > len(self.zoom):
            self._select(self.selected[:-1])

    def action_down(self) -> None:
        box = self._selected_box()
        rows = self._boxes()
        if box is None or box.depth + 1 >= len(rows):
            return
        under = [b for b in rows[box.depth + 1] if self._within(b.node.path, self.selected)]
        if under:
            self._select(under[0].node.path)  # the heaviest (leftmost) child

    def action_zoom_in(self) -> None:
        if self.selected_node is not None and self.selected != self.zoom:
            self.zoom = self.selected  # it spans the width now (a leaf too: its label shows)
            self._top = 0
            self.refresh()

    def action_zoom_out(self) -> None:
        if self.zoom:
            self.zoom = self.zoom[:-1]
            self._scroll_to_selected()
            self.refresh()

    def on_click(self, event: events.Click) -> None:
        rows = self._boxes()
        depth = self._top + event.y
        if event.y < self._graph_height() and depth < len(rows):
            for box in rows[depth]:
                if box.x <= event.x < box.x + box.width:
                    self._select(box.node.path)
                    return

    def on_resize(self) -> None:
        self._scroll_to_selected()

    # -- drawing ----------------------------------------------------------------------------

    def _pct(self, node: CallNode) -> float:
        return 100.0 * node.total_samples / self.whole

    def _value(self, value: int) -> str:
        if self.unit == "ns":
            return fmt_seconds(value / 1e9)
        return fmt_bytes(value) if self.bytes else f"{value:,} samples"

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == self.size.height - 1 or self.root is None:
            return self._status(width, base) if y == self.size.height - 1 else Strip.blank(
                width, base)
        rows = self._boxes()
        depth = self._top + y
        if depth >= len(rows):
            return Strip.blank(width, base)
        segments: list[Segment] = []
        x = 0
        for box in rows[depth]:
            if box.x > x:
                segments.append(Segment(" " * (box.x - x), base))
            node = box.node
            label = f"{short_function(node.function)} {self._pct(node):.1f}%"
            if box.width < MIN_LABEL:
                text = "▏" + " " * (box.width - 1) if box.width > 1 else "▏"
            else:
                text = ("▏" + label)[: box.width].ljust(box.width)
                if len(label) + 1 > box.width and box.width > MIN_LABEL:
                    text = text[: box.width - 1] + "…"
            style = Style(color="#1a1a1a", bgcolor=colour(node.function))
            if node.path == self.selected:
                style = Style(color="#ffffff", bgcolor="#2060c0", bold=True)
            segments.append(Segment(text, base + style))
            x = box.x + box.width
        return Strip(segments).adjust_cell_length(width, base)

    def _status(self, width: int, base: Style) -> Strip:
        node = self.selected_node
        if node is None:
            text = " no samples yet" if self.root is not None else ""
        else:
            share = self._pct(node)
            self_share = 100.0 * node.self_samples / self.whole
            where = f" │ {node.location}" if node.location else ""  # cut first when narrow
            zoom = ""
            if self.zoom and self.zoom != self.selected:
                zoomed = self._find(self.zoom)
                zoom = f" │ zoom: {zoomed.function}" if zoomed else ""
            text = (f" {node.function} │ total {share:.1f}%"
                    f" ({self._value(node.total_samples)}) self {self_share:.1f}%{zoom}{where}")
        if len(text) > width:
            text = text[: max(0, width - 1)] + "…"
        style = base + Style(bold=True)
        return Strip([Segment(text.ljust(width), style)], width)
