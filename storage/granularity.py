"""Report entries at pprof's granularities: what one row of `top`, `peek` or `diff` is.

- functions: a function (in its module): the default, as in pprof;
- files: a source file (the module when the file is unknown);
- lines: a function at one source line;
- addresses: one instruction address with the function and line it belongs to.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rsprof.storage.samples import Frame, Line, Sample

GRANULARITIES = ("functions", "files", "lines", "addresses")


@dataclass(frozen=True, slots=True)
class Entry:
    """One report entry. Fields a granularity does not use are empty."""

    function: str
    file: str
    line: int
    module: str
    address: int = 0

    @property
    def label(self) -> str:
        """How pprof's text reports name the entry."""
        place = f"{self.file}:{self.line}" if self.file and self.line else self.file
        if not self.function:
            return place or self.module
        if self.address:
            return f"0x{self.address:x} {self.function} {place}".rstrip()
        if self.line:
            return f"{self.function} {place}"
        return self.function


def entry(frame: Frame, line: Line, granularity: str) -> Entry:
    if granularity == "functions":
        return Entry(line.function, "", 0, frame.module)
    if granularity == "files":
        return Entry("", line.file or frame.module, 0, "" if line.file else frame.module)
    if granularity == "lines":
        return Entry(line.function, line.file, line.line, frame.module)
    if granularity == "addresses":
        return Entry(line.function, line.file, line.line, frame.module, frame.address)
    raise ValueError(f"unknown granularity {granularity!r}: use {', '.join(GRANULARITIES)}")


class EntryTable:
    """Entries numbered once per frame object: reports count with small ints instead of
    hashing frames and entries for every sample (the hot loop of `top` on big profiles)."""

    def __init__(self, granularity: str) -> None:
        self.granularity = granularity
        self.entries: list[Entry] = []
        self._numbers: dict[Entry, int] = {}
        self._frames: dict[int, tuple[Frame, list[tuple[int, Line]]]] = {}

    def frame_entries(self, frame: Frame) -> list[tuple[int, Line]]:
        """(entry number, line) for each inline level of the frame, innermost first."""
        known = self._frames.get(id(frame))
        if known is not None:
            return known[1]
        numbered = []
        for line in frame.lines:
            e = entry(frame, line, self.granularity)
            number = self._numbers.get(e)
            if number is None:
                number = self._numbers[e] = len(self.entries)
                self.entries.append(e)
            numbered.append((number, line))
        # The frame is kept referenced so its id() cannot be reused by another object.
        self._frames[id(frame)] = (frame, numbered)
        return numbered

    def stack(self, sample: Sample) -> list[int]:
        """The sample's stack as entry numbers, leaf first, each inline level its own."""
        return self.path(sample.frames)

    def path(self, frames: Iterable[Frame]) -> list[int]:
        """Frames (leaf first) as entry numbers, each inline level its own."""
        return [number for frame in frames for number, _ in self.frame_entries(frame)]
