"""rsprof.storage.live.functions: function keys (granularity's "functions"), how a function
is named (its hottest line), and the per-filter cache of what each stack becomes."""

from __future__ import annotations

from rsprof.storage.callgraph import call_tree
from rsprof.storage.filters import FrameFilter
from rsprof.storage.live.functions import NO_FILTER, FilteredStacks, FunctionLabels

from unit.synthetic import LIBC, frame, line

PARSE_40 = frame(line("parse", "p.c", 40, location_id=1), address=0x10)
PARSE_41 = frame(line("parse", "p.c", 41, location_id=2), address=0x20)
HASH = frame(line("round", "h.h", 3, location_id=3), line("hash", "h.c", 9, location_id=4),
             address=0x30)
MAIN = frame(line("main", "m.c", 1, location_id=5), address=0x40)
LIBC_PARSE = frame(line("parse", "", 0, location_id=6), module=LIBC, address=0x50)


def test_paths_are_function_keys_leaf_first() -> None:
    labels = FunctionLabels()
    first = labels.path((PARSE_40, MAIN))
    assert [labels.name(k) for k in first.path] == ["parse", "main"]
    assert labels.path((PARSE_41, MAIN)).path == first.path  # one function, two lines
    inlined = labels.path((HASH, MAIN))
    assert [labels.name(k) for k in inlined.path] == ["round", "hash", "main"]
    assert inlined.leaf_line == HASH.lines[0]
    recursive = labels.path((PARSE_40, PARSE_41, MAIN))
    assert recursive.distinct == first.path and len(recursive.path) == 3
    other_module = labels.path((LIBC_PARSE,)).path[0]
    assert other_module != first.path[0] and labels.name(other_module) == "parse"
    assert labels.path(()).path == () and labels.path(()).leaf_line is None
    assert labels.name(99) == "?" and labels.location(99) == "?"


def test_a_function_is_located_at_its_hottest_line() -> None:
    labels = FunctionLabels()
    key = labels.path((PARSE_40,)).path[0]
    labels.path((PARSE_41,))
    assert labels.location(key) == "p.c:40"  # before any count: the first line seen
    labels.count_leaf(key, PARSE_41.lines[0], 3)
    assert labels.location(key) == "p.c:41"
    labels.count_leaf(key, PARSE_40.lines[0], 2)
    assert labels.location(key) == "p.c:41"
    labels.count_leaf(key, PARSE_40.lines[0], 2)
    assert labels.location(key) == "p.c:40"
    labels.forget_counts()
    assert labels.location(key) == "p.c:40"
    labels.count_leaf(key, PARSE_41.lines[0], 1)
    assert labels.location(key) == "p.c:41"


def test_tree_names_its_nodes() -> None:
    labels = FunctionLabels()
    a, b = labels.path((PARSE_40, MAIN)), labels.path((HASH, MAIN))
    tree = labels.tree(call_tree([(a.path, 3), (b.path, 1)]), "all samples", base=10)
    assert (tree.function, tree.total_samples, tree.base_samples) == ("all samples", 4, 10)
    (main,) = tree.children
    assert (main.function, main.location, main.path) == ("main", "m.c:1", (a.path[-1],))
    assert [(c.function, c.total_samples) for c in main.children] == [("parse", 3), ("hash", 1)]


def test_filtered_stacks_are_made_once_per_stack_and_filter() -> None:
    made: list[tuple[str, ...]] = []

    def make(frames: tuple) -> tuple[str, ...]:  # type: ignore[type-arg]
        names = tuple(f.lines[0].function for f in frames)
        made.append(names)
        return names

    cache: FilteredStacks[tuple[str, ...]] = FilteredStacks()
    hide = FrameFilter.compile(hide="parse")
    assert cache.get(1, (PARSE_40, MAIN), hide, make) == ("main",)
    assert cache.get(1, (PARSE_40, MAIN), hide, make) == ("main",)
    assert cache.get(2, (PARSE_40,), hide, make) is None  # dropped: nothing left
    assert made == [("main",)]
    assert cache.get(1, (PARSE_40, MAIN), FrameFilter.compile(hide="parse"), make) == ("main",)
    assert len(made) == 1  # an equal filter is the same filter
    assert cache.get(1, (PARSE_40, MAIN), NO_FILTER, make) == ("parse", "main")
    assert len(made) == 2  # another filter starts over
