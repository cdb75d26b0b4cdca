"""rsprof.collector.maps: the address space (later mappings replace what they overlap) and
/proc/PID/maps parsing (on this process)."""

from __future__ import annotations

import os

import pytest
from rsprof.collector.maps import AddressSpace, Mapping, read_executable_maps

A = Mapping(0x1000, 0x2000, 0, "/a")
B = Mapping(0x3000, 0x4000, 0x1000, "/b")


def space(*mappings: Mapping) -> AddressSpace:
    found = AddressSpace()
    for mapping in mappings:
        found.add(mapping)
    return found


@pytest.mark.parametrize(("address", "path"), [
    (0x0, None), (0xFFF, None), (0x1000, "/a"), (0x1FFF, "/a"), (0x2000, None),
    (0x2FFF, None), (0x3000, "/b"), (0x3FFF, "/b"), (0x4000, None), ((1 << 64) - 1, None),
])
def test_find(address: int, path: str | None) -> None:
    for order in ((A, B), (B, A)):
        found = space(*order).find(address)
        assert (found.path if found else None) == path


@pytest.mark.parametrize(("new", "left"), [
    pytest.param(Mapping(0x1800, 0x3800, 0, "/c"), ["/c"], id="overlaps-both"),
    pytest.param(Mapping(0x2000, 0x3000, 0, "/c"), ["/a", "/c", "/b"], id="fills-the-gap"),
    pytest.param(Mapping(0x1000, 0x2000, 0, "/a2"), ["/a2", "/b"], id="same-range"),
    pytest.param(Mapping(0x1400, 0x1800, 0, "/c"), ["/c", "/b"], id="inside-one"),
    pytest.param(Mapping(0x0, 0x10000, 0, "/c"), ["/c"], id="covers-all"),
])
def test_a_new_mapping_replaces_what_it_overlaps(new: Mapping, left: list[str]) -> None:
    found = space(A, B, new)
    assert len(found) == len(left)
    assert [m.path for m in found._mappings] == left
    assert found.find(new.start) == new and found.find(new.end - 1) == new


def test_a_copy_is_independent() -> None:
    original = space(A)
    copy = original.copy()
    copy.add(B)
    assert len(original) == 1 and original.find(0x3000) is None
    assert copy.find(0x3000) == B


def test_this_process_maps() -> None:
    """Executable mappings only, [vsyscall] never; the interpreter is one of them."""
    mappings = read_executable_maps(os.getpid())
    assert mappings
    assert all(m.start < m.end and m.path != "[vsyscall]" for m in mappings)
    executable = os.path.realpath(f"/proc/{os.getpid()}/exe")
    assert any(os.path.realpath(m.path) == executable for m in mappings if m.path[0] == "/")
    found = space(*mappings)
    assert found.find(0) is None  # address 0 is never mapped
