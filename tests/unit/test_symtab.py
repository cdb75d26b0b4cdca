"""rsprof.collector.symbols.symtab: which symbol names an address (aliases, size-0 symbols,
nested symbols, noise), and PLT stub decoding."""

from __future__ import annotations

import struct

import pytest
from rsprof.collector.symbols.elf import RawSymbol
from rsprof.collector.symbols.symtab import (
    STB_GLOBAL,
    STB_LOCAL,
    STB_WEAK,
    STT_FUNC,
    STT_GNU_IFUNC,
    STT_NOTYPE,
    SymbolTable,
    _plt_slot,
)

TEXT = 1  # the code section's index; it ends at 0x3000
DATA = 2


def sym(name: str, value: int, size: int = 0, type: int = STT_FUNC, bind: int = STB_GLOBAL,
        shndx: int = TEXT) -> RawSymbol:
    return RawSymbol(name, value, size, type, bind, shndx)


TABLE = SymbolTable([
    sym("small", 0x1000, 0x10),
    sym("big", 0x1100, 0x400),
    sym("nested", 0x1200, 0x20),  # inside big
    sym("__alias_weak", 0x1600, 0x40, bind=STB_WEAK),
    sym("alias_global", 0x1600, 0x40),
    sym("alias_local", 0x1600, 0x40, bind=STB_LOCAL),
    sym("unsized_alias", 0x1600),
    sym("asm_label", 0x1700, type=STT_NOTYPE),  # size 0: up to the next symbol
    sym("ifunc", 0x1800, 0x10, type=STT_GNU_IFUNC),
    sym("$x", 0x1900, type=STT_NOTYPE),  # ARM mapping symbol: noise
    sym(".Llocal", 0x1A00, type=STT_NOTYPE),
    sym("data_object", 0x1B00, 0x10, type=1),  # STT_OBJECT
    sym("untyped_in_data", 0x2000, type=STT_NOTYPE, shndx=DATA),  # not a code section
    sym("undefined", 0x2100, shndx=0),
    sym("absolute", 0x2200, shndx=0xFFF1),
    sym("at_zero", 0),
    sym("last_unsized", 0x2800),  # up to its section's end
], {TEXT: 0x3000})


@pytest.mark.parametrize(("address", "name"), [
    (0xFFF, None),
    (0x1000, "small"), (0x100F, "small"), (0x1010, None),
    (0x1100, "big"), (0x1200, "nested"), (0x121F, "nested"),
    (0x1220, "big"),  # past the nested symbol: the enclosing one again
    (0x14FF, "big"), (0x1500, None),
    (0x1600, "alias_global"),  # sized, typed, global, then shortest
    (0x1700, "asm_label"), (0x17FF, "asm_label"),
    (0x1800, "ifunc"), (0x1810, None),
    (0x1900, None), (0x1A00, None), (0x1B00, None), (0x2000, None), (0x2100, None),
    (0x2200, None), (0x0, None),
    (0x2800, "last_unsized"), (0x2FFF, "last_unsized"), (0x3000, None),
])
def test_lookup(address: int, name: str | None) -> None:
    assert TABLE.lookup(address) == name


ENTRIES = [
    sym("small", 0x1000, 0x10), sym("big", 0x1100, 0x400), sym("nested", 0x1200, 0x20),
    sym("__alias_weak", 0x1600, 0x40, bind=STB_WEAK), sym("alias_global", 0x1600, 0x40),
    sym("unsized_alias", 0x1600), sym("asm_label", 0x1700, type=STT_NOTYPE),
    sym("$x", 0x1900, type=STT_NOTYPE), sym(".Llocal", 0x1A00, type=STT_NOTYPE),
    sym("data_object", 0x1B00, 0x10, type=1), sym("undefined", 0x2100, shndx=0),
    sym("absolute", 0x2200, shndx=0xFFF1), sym("at_zero", 0), sym("last_unsized", 0x2800),
    # two names of equal preference and length in characters, not in bytes: the first wins
    sym("f\u00e9e", 0x2900, 0x10), sym("fez", 0x2900, 0x10),
]


def _section(symbols: list[RawSymbol], is64: bool, big: bool) -> tuple[bytes, bytes]:
    """An ELF symbol section and its string table holding `symbols` (entry 0 is the null
    symbol, skipped as every nameless entry is)."""
    names, entries = b"\0", [b"\0" * (24 if is64 else 16)]
    fmt = (">" if big else "<") + ("IBBHQQ" if is64 else "IIIBBH")
    for s in symbols:
        offset = len(names)
        names += s.name.encode() + b"\0"
        info = s.bind << 4 | s.type
        entries.append(struct.pack(fmt, offset, info, 0, s.shndx, s.value, s.size) if is64
                       else struct.pack(fmt, offset, s.value, s.size, info, 0, s.shndx))
    return b"".join(entries) + b"\x01\x02", names  # and a partial entry, ignored


@pytest.mark.parametrize(("is64", "big"), [(True, False), (False, False), (True, True),
                                           (False, True)],
                         ids=["elf64-le", "elf32-le", "elf64-be", "elf32-be"])
def test_symbol_sections_read_in_c_name_as_the_symbols_do(is64: bool, big: bool) -> None:
    """native/symtab.c reads ELF symbol sections of either class and byte order; the table is
    the one the same symbols given one by one make."""
    entries, names = _section(ENTRIES, is64, big)
    from_section = SymbolTable.__new__(SymbolTable)
    from_section._build([(entries, names, is64, big)], {TEXT: 0x3000})
    from_list = SymbolTable(ENTRIES, {TEXT: 0x3000})
    assert (list(from_section.starts), list(from_section.ends), from_section.names) == (
        list(from_list.starts), list(from_list.ends), from_list.names)
    assert from_list.lookup(0x1600) == "alias_global"
    assert from_list.lookup(0x2900) == "f\u00e9e"
    # the noise between is dropped: the label runs up to the next symbol
    assert from_list.lookup(0x1900) == "asm_label" and from_list.lookup(0x28FF) == "last_unsized"


def test_a_name_past_its_string_table_is_empty_and_sizes_past_the_end_stop_there() -> None:
    entries, names = _section([sym("x", 0x1000, 0x10)], True, False)
    broken = bytearray(entries)
    struct.pack_into("<I", broken, 24, 10_000)  # the name's offset, past the table
    struct.pack_into("<Q", broken, 24 + 16, (1 << 64) - 0x800)  # a size past 2**64
    table = SymbolTable.__new__(SymbolTable)
    table._build([(bytes(broken), names, True, False)], {TEXT: 0x3000})
    assert table.names == [""] and list(table.ends) == [(1 << 64) - 1]


def test_an_unsized_symbol_covers_at_least_its_own_address() -> None:
    table = SymbolTable([sym("a", 0x10), sym("b", 0x10 + 1)], {TEXT: 0x10})  # section "ends" early
    assert table.lookup(0x10) == "a"
    assert table.lookup(0x11) == "b"
    assert len(table) == 2


def test_nesting_is_looked_back_a_bounded_way() -> None:
    """A symbol enclosing more than _MAX_BACKTRACK (8) nested ones is not found past them:
    lookups stay O(log n)."""
    nested = [sym(f"n{i}", 0x1010 + 0x10 * i, 4) for i in range(10)]
    table = SymbolTable([sym("outer", 0x1000, 0x1000), *nested], {TEXT: 0x3000})
    assert table.lookup(0x1004) == "outer"
    assert table.lookup(0x1010 + 0x10 * 9 + 8) is None  # ten symbols back: given up


def _stub(prefix: bytes, disp: int, size: int = 16) -> bytes:
    return (prefix + struct.pack("<i", disp)).ljust(size, b"\x90")


@pytest.mark.parametrize(("code", "slot"), [
    pytest.param(_stub(b"\xff\x25", 0x100), 0x4000 + 6 + 0x100, id="plt"),
    pytest.param(_stub(b"\xf2\xff\x25", 0x100), 0x4000 + 7 + 0x100, id="bnd"),
    pytest.param(_stub(b"\xf3\x0f\x1e\xfa\xff\x25", -0x10), 0x4000 + 10 - 0x10, id="endbr64"),
    pytest.param(_stub(b"\xf3\x0f\x1e\xfa\xf2\xff\x25", 8), 0x4000 + 11 + 8, id="endbr64-bnd"),
    pytest.param(_stub(b"\xff\x35", 0x100), None, id="plt0-push"),
    pytest.param(_stub(b"\xf3\x0f\x1e\xfa\x68", 0), None, id="ibt-lazy-push"),
    pytest.param(b"\xff\x25\x00", None, id="cut-short"),
])
def test_plt_stub_slots(code: bytes, slot: int | None) -> None:
    assert _plt_slot(code, 0, 0x4000) == slot
