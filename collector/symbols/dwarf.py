"""DWARF lookups for one ELF file: address -> compile unit -> (file:line, inline chain).

The decoding itself is in C (native/dwarf.c, `rsprof._native.DwarfReader`), or, if the extension
is not built, in the much slower pyelftools-based dwarf_py.PyDwarfReader with the same methods.
This module picks which compile units a query needs, keeps their decoded line tables, and turns
results into plain tuples. Only the units that contain queried addresses are ever decoded.
"""

from __future__ import annotations

import bisect
import sys
from array import array
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .demangle import demangle
from .elf import ElfFile

_NativeReader: type[_native.DwarfReader] | None
try:
    from rsprof import _native

    _NativeReader = _native.DwarfReader
except ImportError:  # extension not built: symbol tables only (see Module)
    _NativeReader = None

_SECTIONS = {
    "info": ".debug_info", "abbrev": ".debug_abbrev", "line": ".debug_line",
    "str": ".debug_str", "line_str": ".debug_line_str", "ranges": ".debug_ranges",
    "rnglists": ".debug_rnglists", "addr": ".debug_addr", "str_offsets": ".debug_str_offsets",
    "aranges": ".debug_aranges",
}
_END_OF_SEQUENCE = 0xFFFFFFFF

# (name, linkage_name, call_file, call_line) of one scope, innermost first (see dwarf.c);
# for C++ without a linkage name, name is qualified from the DIE parents (CxxNames).
Scope = tuple[str | None, str | None, int, int]

# DWARF tags and languages CxxNames looks at.
_CLASS_TYPE, _ENUM_TYPE, _PARAMETER, _LEXICAL_BLOCK = 0x02, 0x04, 0x05, 0x0B
_POINTER, _REFERENCE = 0x0F, 0x10
_COMPILE_UNIT, _STRUCT_TYPE, _TYPEDEF, _UNION_TYPE, _BASE_TYPE = 0x11, 0x13, 0x16, 0x17, 0x24
_CONST, _SUBPROGRAM, _VOLATILE, _NAMESPACE, _UNSPECIFIED_TYPE = 0x26, 0x2E, 0x35, 0x39, 0x3B
_PARTIAL_UNIT, _RVALUE_REFERENCE = 0x3C, 0x42
_TYPE_TAGS = (_CLASS_TYPE, _STRUCT_TYPE, _UNION_TYPE, _ENUM_TYPE)
_UNIT_TAGS = (_COMPILE_UNIT, _PARTIAL_UNIT)
_CXX_LANGUAGES = frozenset({0x04, 0x19, 0x1A, 0x21, 0x2A, 0x2B})


@dataclass(frozen=True, slots=True)
class LineTable:
    addrs: array  # uint64, sorted; one row per address range
    files: array  # uint32 file numbers, _END_OF_SEQUENCE on rows that end a sequence
    lines: array  # uint32
    names: list[str | None]

    def lookup(self, addr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.addrs, addr) - 1
        if i < 0 or self.files[i] == _END_OF_SEQUENCE:
            return None
        return self.file_name(self.files[i]), self.lines[i]

    def file_name(self, number: int) -> str:
        if 0 <= number < len(self.names):
            return self.names[number] or ""
        return ""


@dataclass(frozen=True, slots=True)
class DwarfResult:
    line: tuple[str, int] | None  # file:line from the line table
    scopes: tuple[Scope, ...]     # inline chain, innermost first, ending at the subprogram
    unit_files: LineTable | None  # to name the call_file numbers of scopes


def native_available() -> bool:
    return _NativeReader is not None and sys.byteorder == "little"


class CxxNames:
    """Qualified names of C++ functions that have no linkage name in DWARF (GCC omits it for
    anything involving a local type: `std::sort<..., main()::<lambda(int, int)> >` is
    `sort<...>` alone), built from the DIE parents: namespaces, classes, and the enclosing
    function of a local class. An unnamed class with an `operator()` is a lambda, named as
    c++filt prints it, `main::{lambda(int, int)#2}`: the parameters of its operator() and its
    number among the lambdas of its enclosing function, in source order (GCC before 14
    numbers all of them, later GCC and the Itanium ABI those of the same signature), so two
    lambdas are never one name."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self._dies: dict[int, tuple[Any, ...]] = {}
        self._names: dict[int, str] = {}
        self._cxx_units: dict[int, bool] = {}
        self._producers: dict[int, str] = {}

    def _die(self, offset: int) -> tuple[Any, ...]:
        found = self._dies.get(offset)
        if found is None:
            found = self._dies[offset] = tuple(self._reader.die(offset))
        return found

    def _unit_of(self, offset: int) -> int:
        for _ in range(256):
            parent = self._die(offset)[3]
            if parent is None:
                return offset
            offset = parent
        return offset

    def is_cxx(self, offset: int) -> bool:
        unit = self._unit_of(offset)
        found = self._cxx_units.get(unit)
        if found is None:
            top = self._die(unit)
            found = self._cxx_units[unit] = top[9] in _CXX_LANGUAGES
            self._producers[unit] = top[10] or ""
        return found

    def qualified(self, offset: int) -> str:
        """The name of the DIE at `offset` with its enclosing scopes."""
        found = self._names.get(offset)
        if found is None:
            tag, name, _, parent, *_ = self._die(offset)
            own = name or self._anonymous(offset, tag)
            prefix = self._prefix(parent)
            found = self._names[offset] = f"{prefix}::{own}" if prefix else own
        return found

    def _prefix(self, offset: int | None) -> str:
        for _ in range(256):
            if offset is None:
                return ""
            tag, _, _, parent, *_ = self._die(offset)
            if tag in _UNIT_TAGS:
                return ""
            if tag == _NAMESPACE or tag in _TYPE_TAGS:
                return self.qualified(offset)
            if tag == _SUBPROGRAM:
                return self._function(offset)
            offset = parent  # a lexical block, or anything else that names no scope
        return ""

    def _function(self, offset: int) -> str:
        """An enclosing function as c++filt prints it in a local name: demangled with its
        parameters when it has a linkage name (`Pool::Pool(int)`), else qualified."""
        name_die = offset
        for _ in range(16):
            _, name, linkage, _, _, origin, *_ = self._die(offset)
            if linkage:
                return demangle(linkage)
            if name:
                name_die = offset
            if origin is None:
                break
            offset = origin
        return self.qualified(name_die)

    def _anonymous(self, offset: int, tag: int) -> str:
        if tag == _NAMESPACE:
            return "(anonymous namespace)"
        if tag in _TYPE_TAGS:
            call = self._call_operator(offset)
            if call is not None:
                return self._lambda(offset, call)
            return "{unnamed type#1}"
        return "?"

    def _call_operator(self, offset: int) -> int | None:
        for child in self._reader.children(offset):
            tag, name, *_ = self._die(child)
            if tag == _SUBPROGRAM and name == "operator()":
                return int(child)
        return None

    def _signature(self, call: int) -> str:
        params = []
        for child in self._reader.children(call):
            tag, _, _, _, type_ref, _, _, _, artificial, *_ = self._die(child)
            if tag == _PARAMETER and not artificial:
                params.append(self._type_name(type_ref))
        return ", ".join(params)

    def _lambda(self, offset: int, call: int) -> str:
        signature = self._signature(call)
        scope = self._die(offset)[3]
        while scope is not None and self._die(scope)[0] == _LEXICAL_BLOCK:
            scope = self._die(scope)[3]
        closures = sorted(self._closures(scope) if scope is not None else [offset],
                          key=lambda c: (self._die(c)[6], self._die(c)[7], c))
        if self._per_signature(offset):
            closures = [c for c in closures
                        if (found := self._call_operator(c)) is not None
                        and self._signature(found) == signature]
        number = closures.index(offset) + 1 if offset in closures else 1
        return f"{{lambda({signature})#{number}}}"

    def _closures(self, scope: int) -> list[int]:
        """The lambdas of one enclosing scope, through its lexical blocks."""
        out: list[int] = []
        pending = [scope]
        while pending and len(out) < 4096:
            for child in self._reader.children(pending.pop()):
                tag, name, *_ = self._die(child)
                if tag == _LEXICAL_BLOCK:
                    pending.append(child)
                elif tag in _TYPE_TAGS and not name and self._call_operator(child) is not None:
                    out.append(int(child))
        return out

    def _per_signature(self, offset: int) -> bool:
        """Whether lambdas are numbered per signature (the Itanium ABI; GCC 14 and later),
        not all together (GCC up to 13)."""
        self.is_cxx(offset)
        producer = self._producers.get(self._unit_of(offset), "")
        if not producer.startswith("GNU "):
            return True
        for word in producer.split():
            major = word.split(".")[0]
            if "." in word and major.isdigit():
                return int(major) >= 14 or "-fabi-version=18" in producer
        return False

    def _type_name(self, offset: int | None, depth: int = 0) -> str:
        """A parameter type as c++filt prints it (`char const*`, `std::vector<int>&`)."""
        if offset is None:
            return "void"
        if depth > 32:
            return "?"
        tag, name, _, _, target, *_ = self._die(offset)
        suffix = {_POINTER: "*", _REFERENCE: "&", _RVALUE_REFERENCE: "&&", _CONST: " const",
                  _VOLATILE: " volatile"}.get(tag)
        if suffix is not None:
            return self._type_name(target, depth + 1) + suffix
        if tag == _TYPEDEF and target is not None:
            return self._type_name(target, depth + 1)  # c++filt shows what it names
        if tag in _TYPE_TAGS:
            return self.qualified(offset)
        if tag == _UNSPECIFIED_TYPE and name == "decltype(nullptr)":
            return "decltype(nullptr)"
        return name or "?"


class DwarfIndex:
    """Lazily decoded DWARF of one file. `parse_units` is the only place that decodes DIEs."""

    def __init__(self, elf: ElfFile, native: bool | None = None) -> None:
        if native is None:
            native = native_available() and elf.little_endian
        self._elf = elf  # keeps the mapping alive while the reader holds views of it
        self._reader: Any
        if native:
            assert _NativeReader is not None
            sections: dict[str, Any] = {}
            for key, name in _SECTIONS.items():
                data = elf.data_of(name)
                if data is not None:
                    sections[key] = data
            self._reader = _NativeReader(sections)
        else:
            from .dwarf_py import PyDwarfReader  # imports pyelftools: only when needed

            self._reader = PyDwarfReader(elf.path)
        self._lines: dict[int, LineTable | None] = {}
        self._cxx = CxxNames(self._reader)
        self._unit_lo: list[int] = []
        self._unit_hi: list[int] = []
        self._unit_off: list[int] = []
        self._build_unit_map()

    def _build_unit_map(self) -> None:
        """Sorted address ranges -> unit offset: .debug_aranges first (no DIE decoding), then
        the unit DIEs' own ranges for units aranges does not list (clang omits aranges)."""
        units = list(self._reader.units())
        known = set(units)
        # Every offset aranges gives is checked against the real units: corrupt aranges
        # pointing outside .debug_info lose their entries, not the module.
        entries = [(lo, hi, unit) for lo, hi, unit in self._reader.aranges()
                   if unit in known and lo < hi]
        listed = {unit for _, _, unit in entries}
        for unit in units:
            if unit not in listed:
                try:
                    ranges = list(self._reader.unit_ranges(unit))
                except Exception:  # one undecodable unit: its addresses stay unknown
                    continue
                entries.extend((lo, hi, unit) for lo, hi in ranges if lo < hi)
        entries.sort()
        for lo, hi, unit in entries:
            if self._unit_hi and lo < self._unit_hi[-1]:
                if hi <= self._unit_hi[-1]:
                    continue  # nested or duplicate range: the first unit keeps it
                lo = self._unit_hi[-1]
            self._unit_lo.append(lo)
            self._unit_hi.append(hi)
            self._unit_off.append(unit)

    def unit_for(self, addr: int) -> int | None:
        i = bisect.bisect_right(self._unit_lo, addr) - 1
        if i >= 0 and addr < self._unit_hi[i]:
            return self._unit_off[i]
        return None

    def line_table(self, unit: int) -> LineTable | None:
        if unit not in self._lines:
            try:
                raw = self._reader.line_table(unit)
            except Exception:  # a corrupt line program: this unit has no lines
                raw = None
            table = None
            if raw is not None:
                addrs, files, lines = array("Q"), array("I"), array("I")
                addrs.frombytes(raw[0])
                files.frombytes(raw[1])
                lines.frombytes(raw[2])
                table = LineTable(addrs, files, lines, raw[3])
            self._lines[unit] = table
        return self._lines[unit]

    def parse_units(self, by_unit: dict[int, list[int]]) -> dict[int, tuple[Scope, ...]]:
        """Inline chains for sorted addresses grouped by unit: one DIE-tree walk per unit."""
        out: dict[int, tuple[Scope, ...]] = {}
        for unit, addrs in by_unit.items():
            try:
                chains = list(self._reader.inline_chains(unit, addrs))
            except Exception:  # a corrupt DIE tree: this unit's addresses get no scopes
                continue
            for addr, chain in zip(addrs, chains, strict=False):
                out[addr] = tuple(self._scope(scope) for scope in chain)
        return out

    def _scope(self, raw: tuple[Any, ...]) -> Scope:
        """A reader's scope (name, linkage, call_file, call_line, name_die) as a Scope: a C++
        name without linkage name is qualified from its DIE's parents."""
        name, linkage, call_file, call_line, name_die = raw
        if linkage is None and name_die is not None:
            try:
                if self._cxx.is_cxx(name_die):
                    name = self._cxx.qualified(name_die)
            except (KeyError, ValueError, IndexError, TypeError):
                pass  # corrupt DWARF: the plain DW_AT_name
        return (name, linkage, call_file, call_line)

    def lookup(self, addrs: Sequence[int]) -> dict[int, DwarfResult]:
        by_unit: dict[int, list[int]] = defaultdict(list)
        for addr in sorted(set(addrs)):
            unit = self.unit_for(addr)
            if unit is not None:
                by_unit[unit].append(addr)
        chains = self.parse_units(by_unit)
        out: dict[int, DwarfResult] = {}
        for unit, unit_addrs in by_unit.items():
            table = self.line_table(unit)
            for addr in unit_addrs:
                line = table.lookup(addr) if table is not None else None
                out[addr] = DwarfResult(line, chains.get(addr, ()), table)
        return out
