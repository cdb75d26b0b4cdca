"""The output pane (`o`): what the program `rsprof run` started wrote, live.

The recording process reads the program's stdout and stderr from two ptys and saves them in
the profile at each checkpoint (`target_output`, rsprof/output.py); this pane reads them
from there through `LiveProfile.output()`, only the chunks it has not seen, and keeps the
last MAX_LINES lines. stderr lines are red.
"""

from __future__ import annotations

from rich.text import Text
from rsprof.storage.live import OutputChunk
from textual.widgets import RichLog

MAX_LINES = 5000

NOTHING = ("no output: the program wrote nothing yet, or it was not started by `rsprof run`"
           " (only its output is captured)")


def _clean(line: str) -> str:
    """A line as a terminal would leave it: a carriage return rewrites the line (progress
    bars), so only what follows the last one stays."""
    line = line.removesuffix("\r")
    return line.rsplit("\r", 1)[-1]


class OutputPanel(RichLog, can_focus=True):
    """Lines in the order the program wrote them; a line still being written (no newline
    yet) shows once it ends, or when the program's output ends."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=MAX_LINES, wrap=False, markup=False,
                         highlight=False, auto_scroll=True)
        self.last_id = 0  # the newest target_output id shown
        self.lines_shown = 0
        self._partial: dict[str, bytes] = {}
        self._empty_note = False

    def add(self, chunks: list[OutputChunk], *, ended: bool = False) -> None:
        """Appends the chunks read that are newer than last_id; `ended`: the recording is
        over, so a last line without its newline is shown too."""
        # Reads overlap (a tick's read can start before the last one's chunks are added):
        # a chunk already shown is not shown again.
        chunks = [chunk for chunk in chunks if chunk.id > self.last_id]
        if chunks and self._empty_note:
            self.clear()
            self._empty_note = False
        for chunk in chunks:
            self.last_id = max(self.last_id, chunk.id)
            data = self._partial.pop(chunk.stream, b"") + chunk.data
            *whole, rest = data.split(b"\n")
            for line in whole:
                self._line(chunk.stream, line)
            if rest:
                self._partial[chunk.stream] = rest
        if ended:
            for stream, rest in list(self._partial.items()):
                self._line(stream, rest)
            self._partial.clear()
        if not self.lines_shown and not self._empty_note:
            self.write(Text(NOTHING, "dim italic"))
            self._empty_note = True

    def _line(self, stream: str, data: bytes) -> None:
        text = Text.from_ansi(_clean(data.decode("utf-8", errors="replace")))
        if stream == "stderr":
            text.stylize("red")
        self.write(text)
        self.lines_shown += 1
