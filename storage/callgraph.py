"""Stack-shaped reports: `rsprof traces` (each distinct stack with its weight, as
`pprof -traces`) and `rsprof peek` (an entry's callers and callees, as `pprof -peek`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from rsprof.storage.granularity import Entry, EntryTable
from rsprof.storage.selection import Selection


@dataclass(slots=True)
class Trace:
    value: int
    percent: float
    tid: int | None
    thread_name: str
    stack: list[Entry]  # leaf first

    def as_dict(self) -> dict[str, object]:
        return {"value": self.value, "percent": self.percent, "tid": self.tid,
                "thread": self.thread_name, "stack": [e.label for e in self.stack]}


def traces(selection: Selection, *, value_index: int, granularity: str = "lines",
           per_thread: bool = True) -> list[Trace]:
    """Distinct stacks, heaviest first (ties by stack text, so output is stable)."""
    table = EntryTable(granularity)
    merged: dict[tuple[tuple[int, ...], int | None, str], int] = {}
    for sample in selection.samples.samples:
        value = sample.values[value_index]
        if not value:
            continue
        thread = (sample.tid, sample.thread_name) if per_thread else (None, "")
        key = (tuple(table.stack(sample)), *thread)
        merged[key] = merged.get(key, 0) + value
    found = [Trace(value, selection.percent(value, value_index), tid, name,
                   [table.entries[number] for number in stack])
             for (stack, tid, name), value in merged.items()]
    found.sort(key=lambda t: (-abs(t.value), [e.label for e in t.stack], t.tid or 0))
    return found


@dataclass(slots=True)
class Edge:
    entry: Entry
    value: int
    percent: float  # of the peeked entry's total

    def as_dict(self) -> dict[str, object]:
        return {"name": self.entry.label, "value": self.value, "percent": self.percent}


@dataclass(slots=True)
class Peek:
    entry: Entry
    flat: int
    flat_pct: float
    total: int
    total_pct: float
    callers: list[Edge] = field(default_factory=list)
    callees: list[Edge] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.entry.label, "function": self.entry.function,
                "file": self.entry.file, "line": self.entry.line, "module": self.entry.module,
                "flat": self.flat, "flat_pct": self.flat_pct, "total": self.total,
                "total_pct": self.total_pct,
                "callers": [e.as_dict() for e in self.callers],
                "callees": [e.as_dict() for e in self.callees]}


def peek(selection: Selection, pattern: re.Pattern[str], *, value_index: int,
         granularity: str = "functions") -> list[Peek]:
    """Every entry whose label matches `pattern`, with the entries directly calling it and
    called by it. An edge counts once per sample, even when recursion repeats it; a leaf's
    self value shows as flat, and stacks starting at the entry have no caller row."""
    table = EntryTable(granularity)
    flat: dict[int, int] = {}
    total: dict[int, int] = {}
    callers: dict[int, dict[int, int]] = {}
    callees: dict[int, dict[int, int]] = {}
    matches: dict[int, bool] = {}
    for sample in selection.samples.samples:
        value = sample.values[value_index]
        if not value:
            continue
        stack = table.stack(sample)
        for e in stack:
            if e not in matches:
                matches[e] = bool(pattern.search(table.entries[e].label))
        count_neighbours(stack, value, matches.__getitem__, flat, total, callers, callees)
    result = []
    for e, cum in total.items():
        result.append(Peek(
            entry=table.entries[e], flat=flat.get(e, 0),
            flat_pct=selection.percent(flat.get(e, 0), value_index),
            total=cum, total_pct=selection.percent(cum, value_index),
            callers=_edges(callers.get(e, {}), cum, table),
            callees=_edges(callees.get(e, {}), cum, table)))
    result.sort(key=lambda p: (-abs(p.total), p.entry.label))
    return result


def count_neighbours(
    stack: Sequence[int],
    value: int,
    wanted: Callable[[int], bool],
    flat: dict[int, int],
    total: dict[int, int],
    callers: dict[int, dict[int, int]],
    callees: dict[int, dict[int, int]],
) -> None:
    """Adds one sample (`stack` leaf first, weight `value`) to the peek counts of every
    entry `wanted` accepts: flat when it is the leaf, total once per sample, and each
    (entry, caller) and (entry, callee) edge once per sample even under recursion. Shared by
    `peek` and the TUI's callers/callees panel (`storage.live`)."""
    seen_callers: set[tuple[int, int]] = set()
    seen_callees: set[tuple[int, int]] = set()
    counted: set[int] = set()
    last = len(stack) - 1
    for position, e in enumerate(stack):
        if not wanted(e):
            continue
        if position == 0:
            flat[e] = flat.get(e, 0) + value
        if e not in counted:
            counted.add(e)
            total[e] = total.get(e, 0) + value
        caller = stack[position + 1] if position < last else None
        callee = stack[position - 1] if position > 0 else None
        _add_edge(callers, e, caller, value, seen_callers)
        _add_edge(callees, e, callee, value, seen_callees)


@dataclass(slots=True)
class TreeNode:
    """One node of a top-down call tree: a function reached by one call path."""

    key: int  # the function's key (an entry number)
    total: int = 0  # samples with this path on the stack
    self: int = 0  # samples with this path as the whole stack
    children: dict[int, TreeNode] = field(default_factory=dict)

    def sorted_children(self) -> list[TreeNode]:
        """Heaviest first; ties by key, so the order is stable between refreshes."""
        return sorted(self.children.values(), key=lambda n: (-n.total, n.key))


def call_tree(stacks: Iterable[tuple[Sequence[int], int]]) -> TreeNode:
    """A top-down tree (root: every sample) of stacks given leaf first with their weight.
    A node's total counts each sample once: a path visits a node at most once, so recursion
    shows as nested nodes, as in pprof's and perf's trees."""
    root = TreeNode(-1)
    for stack, value in stacks:
        if not value:
            continue
        root.total += value
        node = root
        for key in reversed(stack):
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = TreeNode(key)
            child.total += value
            node = child
        node.self += value
    return root


def _add_edge(edges: dict[int, dict[int, int]], e: int, other: int | None, value: int,
              seen: set[tuple[int, int]]) -> None:
    # Once per sample per (entry, neighbour): a recursive stack repeats the same pair.
    if other is None or (e, other) in seen:
        return
    seen.add((e, other))
    bucket = edges.setdefault(e, {})
    bucket[other] = bucket.get(other, 0) + value


def _edges(weights: dict[int, int], whole: int, table: EntryTable) -> list[Edge]:
    edges = [Edge(table.entries[e], value, round(100.0 * value / whole, 2) if whole else 0.0)
             for e, value in weights.items()]
    edges.sort(key=lambda edge: (-abs(edge.value), edge.entry.label))
    return edges
