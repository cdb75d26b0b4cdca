"""Stacks in function keys, for the CPU and heap views alike: a function is
`storage.granularity`'s "functions" entry (a name in a module, as `rsprof top` counts
it), numbered once for the file's lifetime, and named with its hottest line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Generic, NamedTuple, TypeVar

from rsprof.storage.callgraph import TreeNode
from rsprof.storage.filters import FrameFilter
from rsprof.storage.granularity import EntryTable
from rsprof.storage.live.rows import CallNode, location_text
from rsprof.storage.samples import Frame, Line, TimeRange

# The selection's defaults (as `rsprof top` without --since/--until or filters): the views'
# fast paths, which need no per-stack work, are taken for exactly these.
WHOLE_RECORDING = TimeRange()
NO_FILTER = FrameFilter()
T = TypeVar("T")


class CallPath(NamedTuple):
    """A stack in function keys: leaf first, each inline level its own entry."""

    path: tuple[int, ...]
    distinct: tuple[int, ...]  # each function once (inclusive counts)
    leaf_line: Line | None  # the innermost line (the hottest line of a function is its)


_EMPTY = CallPath((), (), None)


class FunctionLabels:
    """Function keys (`EntryTable("functions")` numbers, stable for the file's lifetime)
    and how the views name them: the function, and the `file:line` of its hottest line."""

    def __init__(self) -> None:
        self.entries = EntryTable("functions")
        self._first_line: list[Line] = []
        self._best_line: dict[int, Line] = {}
        self._line_samples: dict[int, int] = {}

    def path(self, frames: tuple[Frame, ...]) -> CallPath:
        if not frames:
            return _EMPTY
        numbered = [pair for frame in frames for pair in self.entries.frame_entries(frame)]
        for number, line in numbered:
            if number >= len(self._first_line):
                self._first_line.extend([line] * (number + 1 - len(self._first_line)))
        path = tuple(number for number, _line in numbered)
        return CallPath(path, tuple(dict.fromkeys(path)), numbered[0][1])

    def count_leaf(self, key: int, line: Line, samples: int) -> None:
        """The hottest line of a function is where most of its self samples fall."""
        total = self._line_samples.get(line.location_id, 0) + samples
        self._line_samples[line.location_id] = total
        best = self._best_line.get(key)
        if best is None or (best.location_id != line.location_id
                            and total > self._line_samples.get(best.location_id, 0)):
            self._best_line[key] = line

    def forget_counts(self) -> None:
        self._best_line.clear()
        self._line_samples.clear()

    def name(self, key: int) -> str:
        return self.entries.entries[key].function if 0 <= key < len(self.entries.entries) else "?"

    def location(self, key: int) -> str:
        if not 0 <= key < len(self._first_line):
            return "?"
        line = self._best_line.get(key) or self._first_line[key]
        return location_text(line.file, line.line)

    def tree(self, root: TreeNode, root_name: str, base: int = 0) -> CallNode:
        def convert(node: TreeNode, path: tuple[int, ...]) -> CallNode:
            name, where = ((root_name, "") if node.key < 0
                           else (self.name(node.key), self.location(node.key)))
            return CallNode(
                path, node.key, name, where, node.total, node.self,
                tuple(convert(c, (*path, c.key)) for c in node.sorted_children()),
            )

        return replace(convert(root, ()), base_samples=base)


class FilteredStacks(Generic[T]):
    """What each stack becomes under the view's filters (a call path, a heap call site...),
    computed once per stack and filter: a new filter starts over. The frame-level caches of
    FrameFilter.stack live as long as the filter does."""

    def __init__(self) -> None:
        self._filter = NO_FILTER
        self._made: dict[int, T | None] = {}  # stack id -> result; None: the sample is dropped
        self._verdicts: dict[int, bool | None] = {}
        self._rewritten: dict[int, Frame | None] = {}

    def get(self, stack_id: int, frames: tuple[Frame, ...], filters: FrameFilter,
            make: Callable[[tuple[Frame, ...]], T]) -> T | None:
        if filters != self._filter:
            self._filter = filters
            self._made, self._verdicts, self._rewritten = {}, {}, {}
        if stack_id not in self._made:
            kept = filters.stack(frames, self._verdicts, self._rewritten)
            self._made[stack_id] = None if kept is None else make(kept)
        return self._made[stack_id]
