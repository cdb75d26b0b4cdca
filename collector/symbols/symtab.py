"""Function lookup from ELF symbol tables (.symtab and .dynsym): sorted arrays and bisect."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from .elf import SHF_EXECINSTR, ElfFile, RawSymbol

STT_NOTYPE, STT_FUNC, STT_GNU_IFUNC = 0, 2, 10
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SHN_LORESERVE = 0xFF00
# How far back to look for a sized symbol that encloses the address when the nearest one
# does not (a small symbol nested inside a bigger one). Bounded, so lookups stay O(log n).
_MAX_BACKTRACK = 8


def _preference(sym: RawSymbol) -> tuple[int, int, int, int]:
    """Among aliases at one address, the name to show: sized, function, global, then shortest."""
    bind_rank = {STB_GLOBAL: 0, STB_WEAK: 1}.get(sym.bind, 2)
    return (0 if sym.size else 1, 0 if sym.type != STT_NOTYPE else 1, bind_rank, len(sym.name))


class SymbolTable:
    """Maps an address to the function symbol that covers it.

    Symbols of size 0 (hand-written assembly, some linker-made symbols) cover the space up to
    the next symbol or the end of their section, whichever comes first.
    """

    def __init__(self, symbols: Iterable[RawSymbol], section_ends: dict[int, int]) -> None:
        best: dict[int, RawSymbol] = {}
        for sym in symbols:
            if sym.shndx == 0 or sym.shndx >= SHN_LORESERVE or sym.value == 0:
                continue
            if sym.type not in (STT_FUNC, STT_GNU_IFUNC):
                # Untyped symbols count only inside code sections (assembly labels); local
                # labels and ARM mapping symbols ($x, $d) are noise.
                if sym.type != STT_NOTYPE or sym.shndx not in section_ends:
                    continue
                if sym.name.startswith(("$", ".L")):
                    continue
            cur = best.get(sym.value)
            if cur is None or _preference(sym) < _preference(cur):
                best[sym.value] = sym
        ordered = sorted(best.values(), key=lambda s: s.value)
        self.starts: list[int] = [s.value for s in ordered]
        self.ends: list[int] = []
        self.names: list[str] = [s.name for s in ordered]
        for i, sym in enumerate(ordered):
            if sym.size:
                self.ends.append(sym.value + sym.size)
                continue
            limit = section_ends.get(sym.shndx, sym.value + 1)
            nxt = ordered[i + 1].value if i + 1 < len(ordered) else limit
            self.ends.append(max(min(nxt, limit), sym.value + 1))

    @classmethod
    def from_elf(cls, *files: ElfFile) -> SymbolTable:
        """Symbols of every given file (a binary and its separate debug file) merged."""
        symbols: list[RawSymbol] = []
        exec_ends: dict[int, int] = {}
        for elf in files:
            for index, sec in enumerate(elf.sections):
                if sec.flags & SHF_EXECINSTR:
                    exec_ends.setdefault(index, sec.addr + sec.size)
            symbols.extend(elf.symbols())
        return cls(symbols, exec_ends)

    def __len__(self) -> int:
        return len(self.starts)

    def lookup(self, addr: int) -> str | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        for j in range(i, max(i - _MAX_BACKTRACK, -1), -1):
            if addr < self.ends[j]:
                return self.names[j]
        return None
