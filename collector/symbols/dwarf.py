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

# (name, linkage_name, call_file, call_line) of one scope, innermost first (see dwarf.c)
Scope = tuple[str | None, str | None, int, int]


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
                out[addr] = chain
        return out

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
