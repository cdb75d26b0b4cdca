"""rsprof.storage.granularity: what one report row is at each of pprof's granularities, its
label, and how EntryTable numbers a stack's frames."""

from __future__ import annotations

import pytest
from rsprof.storage.granularity import GRANULARITIES, Entry, EntryTable, entry
from rsprof.storage.samples import Frame, Sample

from unit.synthetic import APP, LIBC, frame, line

WORK = frame(line("work", "src/work.c", 12), address=0x1234)
LIBC_FRAME = frame(line("memcpy", "", 0), module=LIBC, address=0x7F00)


@pytest.mark.parametrize(("granularity", "the_frame", "expected"), [
    ("functions", WORK, Entry("work", "", 0, APP)),
    ("files", WORK, Entry("", "src/work.c", 0, "")),
    ("lines", WORK, Entry("work", "src/work.c", 12, APP)),
    ("addresses", WORK, Entry("work", "src/work.c", 12, APP, 0x1234)),
    ("functions", LIBC_FRAME, Entry("memcpy", "", 0, LIBC)),
    ("files", LIBC_FRAME, Entry("", LIBC, 0, LIBC)),  # no source file: the module
    ("lines", LIBC_FRAME, Entry("memcpy", "", 0, LIBC)),
    ("addresses", LIBC_FRAME, Entry("memcpy", "", 0, LIBC, 0x7F00)),
])
def test_entry(granularity: str, the_frame: Frame, expected: Entry) -> None:
    assert entry(the_frame, the_frame.lines[0], granularity) == expected


def test_unknown_granularity_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown granularity 'symbols'"):
        entry(WORK, WORK.lines[0], "symbols")
    assert GRANULARITIES == ("functions", "files", "lines", "addresses")


@pytest.mark.parametrize(("the_entry", "label"), [
    (Entry("work", "", 0, APP), "work"),
    (Entry("work", "src/work.c", 12, APP), "work src/work.c:12"),
    (Entry("work", "src/work.c", 0, APP), "work"),
    (Entry("", "src/work.c", 0, ""), "src/work.c"),
    (Entry("", "", 0, LIBC), LIBC),
    (Entry("work", "src/work.c", 12, APP, 0x1234), "0x1234 work src/work.c:12"),
    (Entry("memcpy", "", 0, LIBC, 0x7F00), "0x7f00 memcpy"),
])
def test_label(the_entry: Entry, label: str) -> None:
    assert the_entry.label == label


# Two addresses in `work` (lines 12 and 13), one in `work` of another module, and an inlined
# `step` in `work` at line 14.
A = frame(line("work", "w.c", 12), address=0x10)
B = frame(line("work", "w.c", 13), address=0x20)
C = frame(line("work", "w.c", 12), module=LIBC, address=0x10)
D = frame(line("step", "w.h", 2), line("work", "w.c", 14), address=0x30)
MAIN = frame(line("main", "m.c", 1), address=0x40)


@pytest.mark.parametrize(("granularity", "distinct"), [
    ("functions", {"A": 0, "B": 0, "C": 1, "D": (2, 0), "MAIN": 3}),
    ("files", {"A": 0, "B": 0, "C": 0, "D": (1, 0), "MAIN": 2}),
    ("lines", {"A": 0, "B": 1, "C": 2, "D": (3, 4), "MAIN": 5}),
    ("addresses", {"A": 0, "B": 1, "C": 2, "D": (3, 4), "MAIN": 5}),
])
def test_entry_table_numbers_each_entry_once(granularity: str,
                                             distinct: dict[str, int | tuple[int, int]]) -> None:
    table = EntryTable(granularity)
    got: dict[str, int | tuple[int, ...]] = {}
    for name, the_frame in (("A", A), ("B", B), ("C", C), ("D", D), ("MAIN", MAIN)):
        numbers = tuple(n for n, _line in table.frame_entries(the_frame))
        got[name] = numbers[0] if len(numbers) == 1 else numbers
    assert got == distinct
    assert len(table.entries) == len({e for e in table.entries})
    # A stack is its frames' numbers, leaf first, inline levels each their own.
    sample = Sample((D, B, MAIN), [1])
    expected = [*(distinct["D"] if isinstance(distinct["D"], tuple) else (distinct["D"],)),
                distinct["B"], distinct["MAIN"]]
    assert table.stack(sample) == expected


def test_frame_entries_are_remembered_per_frame_object() -> None:
    table = EntryTable("lines")
    first = table.frame_entries(D)
    assert table.frame_entries(D) is first
    equal_frame = frame(line("step", "w.h", 2), line("work", "w.c", 14), address=0x30)
    assert [n for n, _ in table.frame_entries(equal_frame)] == [n for n, _ in first]
