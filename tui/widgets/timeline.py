"""The Memory view's whole-heap timeline: live bytes over the recording, with its peak."""

from __future__ import annotations

from rich.text import Text
from rsprof.storage.live import HeapTimeline
from textual.widgets import Static

from ..format import fmt_bytes, fmt_offset

BLOCKS = " ▁▂▃▄▅▆▇█"
ROWS = 3  # bar rows: 3 rows of 8 levels


def timeline_text(timeline: HeapTimeline | None, width: int) -> Text:
    """A caption line, then ROWS rows of bars (one column per bucket, scaled from zero)."""
    if timeline is None or not timeline.points:
        return Text(" heap in use: no checkpoints yet", "dim")
    peak_at = fmt_offset(timeline.peak_offset_ms / 1000) if timeline.peak_offset_ms else "?"
    end = fmt_offset(timeline.points[-1][0] / 1000)
    caption = Text.assemble(
        (" heap in use ", "bold"),
        fmt_bytes(timeline.current_bytes),
        ("  peak ", "dim"),
        (fmt_bytes(timeline.peak_bytes), "bold yellow"),
        (" at ", "dim"),
        peak_at,
        ("  over 0s…" + end, "dim"),
    )
    caption.truncate(width, overflow="ellipsis")
    values = [v for _t, v in timeline.points][-max(1, width - 1) :]
    top = max(timeline.peak_bytes, max(values, default=0), 1)
    # From zero, unless the heap never drops below half its peak: then from its lowest
    # value (said in the caption), so the changes are not squeezed into the top row.
    low = min(values, default=0)
    bottom = low if low > top / 2 else 0
    if bottom:
        caption.append(f"  (axis from {fmt_bytes(bottom)})", "dim")
        caption.truncate(width, overflow="ellipsis")
    levels = ROWS * (len(BLOCKS) - 1)
    span = max(1, top - bottom)
    heights = [max(1, round((v - bottom) / span * levels)) if v > 0 else 0 for v in values]
    peak_col = max(range(len(values)), key=values.__getitem__) if values else -1
    lines = [caption]
    for row in range(ROWS - 1, -1, -1):
        line = Text(" ")
        chars = [BLOCKS[max(0, min(len(BLOCKS) - 1, h - row * (len(BLOCKS) - 1)))]
                 for h in heights]
        # One span per run of a style, not one per cell: the screen draws the same cells,
        # and turning 3 x 120 one-cell spans into strips took about a fifth of the UI
        # thread while `m` (to the Memory view and back) was pressed (py-spy).
        if 0 <= peak_col:
            line.append("".join(chars[:peak_col]), "cyan")
            line.append(chars[peak_col], "bold yellow")
            line.append("".join(chars[peak_col + 1:]), "cyan")
        else:
            line.append("".join(chars), "cyan")
        lines.append(line)
    return Text("\n").join(lines)


class HeapTimelineView(Static):
    """Shows a `HeapTimeline`; the snapshot asks for one bucket per cell of width."""

    DEFAULT_CSS = "HeapTimelineView { height: 4; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.timeline: HeapTimeline | None = None

    def show(self, timeline: HeapTimeline | None) -> None:
        if timeline != self.timeline:
            self.timeline = timeline
            self.refresh()

    def render(self) -> Text:
        return timeline_text(self.timeline, max(1, self.size.width))
