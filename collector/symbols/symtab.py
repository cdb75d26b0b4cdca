"""Function lookup from ELF symbol tables (.symtab and .dynsym): sorted arrays and bisect."""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Iterable

from rsprof._native import symtab_build

from .elf import SHF_EXECINSTR, SHT_NOBITS, ElfFile, RawSymbol

STT_NOTYPE, STT_FUNC, STT_GNU_IFUNC = 0, 2, 10
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SHN_LORESERVE = 0xFF00
EM_X86_64 = 62
SHT_RELA = 4
R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_IRELATIVE = 6, 7, 37
# Where an x86-64 PLT entry's `jmp *slot(%rip)` (ff 25 disp32) starts: plain (.plt, .plt.got),
# after `bnd` (f2), after `endbr64` (.plt.sec and IBT .plt.got), after both.
_PLT_JMP_AT = ((0, b"\xff\x25"), (0, b"\xf2\xff\x25"), (4, b"\xff\x25"), (4, b"\xf2\xff\x25"))
# How far back to look for a sized symbol that encloses the address when the nearest one
# does not (a small symbol nested inside a bigger one). Bounded, so lookups stay O(log n).
_MAX_BACKTRACK = 8


def _preference(sym: RawSymbol) -> tuple[int, int, int, int]:
    """Among aliases at one address, the name to show: sized, function, global, then shortest."""
    bind_rank = {STB_GLOBAL: 0, STB_WEAK: 1}.get(sym.bind, 2)
    return (0 if sym.size else 1, 0 if sym.type != STT_NOTYPE else 1, bind_rank, len(sym.name))


class SymbolTable:
    """Maps an address to the function symbol that covers it.

    Which symbols count: functions, and untyped labels inside executable sections (not local
    `.L` labels nor ARM mapping symbols `$x`, `$d`), defined in a section and not at 0. Among
    aliases at one address, the name shown is the sized one, then typed, global, weak, then
    the shortest (`_preference`). Symbols of size 0 (hand-written assembly, some
    linker-made symbols) cover the space up to the next symbol or the end of their
    section, whichever comes first. The rule runs in C (native/symtab.c: libpython3.13's
    12.5 k entries in 1-2 ms, against 36-46 ms decoded into objects here).
    """

    def __init__(self, symbols: Iterable[RawSymbol], section_ends: dict[int, int]) -> None:
        self._build([[(s.name, s.value, s.size, s.type, s.bind, s.shndx) for s in symbols]],
                    section_ends)

    def _build(self, sources: list[tuple[memoryview | bytes, bytes, bool, bool]
                                  | list[tuple[str, int, int, int, int, int]]],
               section_ends: dict[int, int]) -> None:
        starts, ends, names = symtab_build(sources, section_ends)
        self.starts = array("Q", starts)
        self.ends = array("Q", ends)
        self.names: list[str] = names

    @classmethod
    def from_elf(cls, *files: ElfFile) -> SymbolTable:
        """Symbols of every given file (a binary and its separate debug file) merged."""
        sources: list[tuple[memoryview | bytes, bytes, bool, bool]
                      | list[tuple[str, int, int, int, int, int]]] = []
        exec_ends: dict[int, int] = {}
        for elf in files:
            for index, sec in enumerate(elf.sections):
                if sec.flags & SHF_EXECINSTR:
                    exec_ends.setdefault(index, sec.addr + sec.size)
            sources.extend(elf.symbol_sections())
            sources.append([(s.name, s.value, s.size, s.type, s.bind, s.shndx)
                            for s in plt_symbols(elf)])
        table = cls.__new__(cls)
        table._build(sources, exec_ends)
        return table

    def __len__(self) -> int:
        return len(self.starts)

    def lookup(self, addr: int) -> str | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        for j in range(i, max(i - _MAX_BACKTRACK, -1), -1):
            if addr < self.ends[j]:
                return self.names[j]
        return None


def plt_symbols(elf: ElfFile) -> list[RawSymbol]:
    """`name@plt` for each PLT stub of an x86-64 file (.plt, .plt.sec, .plt.got), as
    binutils and perf name them: the stub's `jmp *slot(%rip)` is decoded and the GOT slot
    it jumps through is matched with its relocation (JUMP_SLOT, or GLOB_DAT for .plt.got)
    and that relocation's dynamic symbol. Local and sized, so a real symbol at the same
    address wins. Other machines, and stubs without such a jump (PLT0, IBT's lazy .plt), get
    none."""
    if not elf.is64 or not elf.little_endian or elf.machine != EM_X86_64:
        return []
    slots = _got_slot_names(elf)
    if not slots:
        return []
    out: list[RawSymbol] = []
    for index, sec in enumerate(elf.sections):
        if not sec.name.startswith(".plt") or not sec.flags & SHF_EXECINSTR:
            continue
        code = bytes(elf.section_data(sec))
        step = sec.entsize if 8 <= sec.entsize <= 64 else 16
        for start in range(0, len(code) - step + 1, step):
            slot = _plt_slot(code, start, sec.addr + start)
            name = slots.get(slot) if slot is not None else None
            if name:
                out.append(RawSymbol(f"{name}@plt", sec.addr + start, step, STT_FUNC,
                                     STB_LOCAL, index))
    return out


def _plt_slot(code: bytes, start: int, address: int) -> int | None:
    """The GOT slot the stub at code[start:] jumps through, if it starts with a known form."""
    for skip, jmp in _PLT_JMP_AT:
        if skip and code[start:start + 4] != b"\xf3\x0f\x1e\xfa":  # endbr64
            continue
        at = start + skip
        if code[at:at + len(jmp)] == jmp and at + len(jmp) + 4 <= len(code):
            end = at + len(jmp) + 4
            (disp,) = struct.unpack_from("<i", code, end - 4)
            return address + (end - start) + disp
    return None


def _got_slot_names(elf: ElfFile) -> dict[int, str]:
    """GOT slot address -> dynamic symbol name, from the RELA sections' JUMP_SLOT and
    GLOB_DAT relocations. An IRELATIVE slot (libc's own calls to memcpy and friends) has no
    symbol, only its resolver's address: named after the ifunc symbol there (`memcpy`),
    else `*ABS*+0x<resolver>` as binutils prints it."""
    out: dict[int, str] = {}
    ifuncs: dict[int, str] | None = None
    for sec in elf.sections:
        if sec.type != SHT_RELA or not 0 < sec.link < len(elf.sections):
            continue
        symtab = elf.sections[sec.link]
        if symtab.type == SHT_NOBITS or not 0 < symtab.link < len(elf.sections):
            continue
        syms = elf.section_data(symtab)
        names = bytes(elf.section_data(elf.sections[symtab.link]))
        data = elf.section_data(sec)
        for offset, info, addend in struct.iter_unpack("<QQq",
                                                       data[:len(data) - len(data) % 24]):
            kind = info & 0xFFFFFFFF
            if kind == R_X86_64_IRELATIVE:
                if ifuncs is None:
                    ifuncs = {}
                    for sym in sorted(elf.symbols(), key=_preference, reverse=True):
                        if sym.type in (STT_GNU_IFUNC, STT_FUNC) and sym.value:
                            ifuncs[sym.value] = sym.name
                out[offset] = ifuncs.get(addend) or f"*ABS*+0x{addend:x}"
                continue
            if kind not in (R_X86_64_JUMP_SLOT, R_X86_64_GLOB_DAT):
                continue
            entry = (info >> 32) * 24
            if entry == 0 or entry + 24 > len(syms):
                continue
            (name_off,) = struct.unpack_from("<I", syms, entry)
            end = names.find(b"\0", name_off)
            name = names[name_off:end if end >= 0 else None].decode("utf-8", "replace")
            if name:
                out[offset] = name
    return out
