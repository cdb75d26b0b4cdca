"""rsprof.collector.symbols.dwarf_py: the pyelftools stand-in for the C DWARF reader gives
the C reader's answers, on the installed demo binary (small, built with -g: it ships with
rsprof), and joins paths as binutils does."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from rsprof.collector.symbols.dwarf import DwarfIndex
from rsprof.collector.symbols.dwarf_py import PyDwarfReader, _join
from rsprof.collector.symbols.elf import ElfFile

import rsprof

DEMO = os.path.join(os.path.dirname(rsprof.__file__), "bin", "rsprof-demo")


@pytest.mark.parametrize(("comp_dir", "directory", "name", "joined"), [
    ("/src", None, "a.c", "/src/a.c"),
    ("/src", "lib", "a.c", "/src/lib/a.c"),
    ("/src", "/usr/include", "stdio.h", "/usr/include/stdio.h"),
    ("/src/", "lib/", "a.c", "/src/lib/a.c"),
    ("/src", ".", "a.c", "/src/./a.c"),
    (None, "lib", "a.c", "lib/a.c"),
    (None, None, "a.c", "a.c"),
    ("/src", "lib", "/abs/a.c", "/abs/a.c"),
    ("/src", None, None, None),
])
def test_join(comp_dir: str | None, directory: str | None, name: str | None,
              joined: str | None) -> None:
    assert _join(comp_dir, directory, name) == joined


@pytest.fixture(scope="module")
def readers() -> Iterator[tuple[DwarfIndex, DwarfIndex]]:
    elf = ElfFile(DEMO)
    native, python = DwarfIndex(elf, native=True), DwarfIndex(elf, native=False)
    assert isinstance(python._reader, PyDwarfReader)
    yield native, python
    python._reader.close()


def test_units_ranges_and_dies_agree(readers: tuple[DwarfIndex, DwarfIndex]) -> None:
    native, python = (r._reader for r in readers)
    assert python.units() == native.units() and python.units()
    assert python.aranges() == native.aranges()
    for unit in python.units():
        assert python.unit_ranges(unit) == native.unit_ranges(unit)
        assert python.line_table(unit) == native.line_table(unit)
        for reader in (python, native):  # a unit's offset is its header's, no DIE's
            with pytest.raises(KeyError):
                reader.die(unit)
        pending = [python._cus[unit].get_top_DIE().offset]
        while pending:  # every DIE of the unit, as the C reader decodes it
            offset = pending.pop()
            assert tuple(python.die(offset)) == tuple(native.die(offset)), hex(offset)
            children = python.children(offset)
            assert children == native.children(offset)
            pending.extend(children)


def test_lookups_agree(readers: tuple[DwarfIndex, DwarfIndex]) -> None:
    native, python = readers
    low = min(lo for lo, _hi, _unit in native._reader.aranges())
    high = max(hi for _lo, hi, _unit in native._reader.aranges())
    addresses = list(range(low - 4, high + 4))
    expected = native.lookup(addresses)
    found = python.lookup(addresses)
    assert found.keys() == expected.keys()
    assert len(found) >= high - low
    for address, result in expected.items():
        assert (found[address].line, found[address].scopes) == (result.line, result.scopes)
    assert any(result.scopes for result in found.values())
