"""Minimal ELF reader: headers, sections, notes, program headers and raw symbol tables.

Plain `struct` over an mmap instead of pyelftools: importing pyelftools alone costs ~40 ms and its
per-symbol objects ~100 ms for libpython's .symtab, which would eat the whole budget of a cached
lookup. Sections are returned as zero-copy memoryviews of the mapping.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

SHT_NOBITS = 8
SHT_SYMTAB = 2
SHT_DYNSYM = 11
SHF_EXECINSTR = 0x4
SHF_COMPRESSED = 0x800
PT_LOAD = 1
PT_NOTE = 4
NT_GNU_BUILD_ID = 3
ELFCOMPRESS_ZLIB = 1
# A compressed section never inflates past this (a 0.5 MB zlib bomb made 512 MiB): the
# section is then treated as absent and the module keeps its symbol-table names.
MAX_DECOMPRESSED = 256 << 20


class ElfError(Exception):
    """The file is not an ELF file this reader understands."""


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True, slots=True)
class Segment:
    type: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


@dataclass(frozen=True, slots=True)
class RawSymbol:
    name: str
    value: int
    size: int
    type: int  # STT_*
    bind: int  # STB_*
    shndx: int


class ElfFile:
    """One ELF file mapped read-only. Keep it alive while section views are in use."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 64:
                raise ElfError(f"{path}: too small for ELF")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.data = memoryview(self._map)
        ident = bytes(self.data[:16])
        if ident[:4] != b"\x7fELF":
            raise ElfError(f"{path}: not an ELF file")
        if ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ElfError(f"{path}: unknown ELF class or byte order")
        self.is64 = ident[4] == 2
        self.little_endian = ident[5] == 1
        self._e = "<" if self.little_endian else ">"
        e = self._e
        if self.is64:
            fields = struct.unpack_from(e + "HHIQQQIHHHHHH", self.data, 16)
        else:
            fields = struct.unpack_from(e + "HHIIIIIHHHHHH", self.data, 16)
        (self.type, self.machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
         shstrndx) = fields
        self.segments = self._read_segments(phoff, phentsize, phnum)
        self.sections = self._read_sections(shoff, shentsize, shnum, shstrndx)
        self._by_name = {s.name: s for s in self.sections}

    def _read_segments(self, off: int, entsize: int, num: int) -> list[Segment]:
        out = []
        fmt = self._e + ("IIQQQQQQ" if self.is64 else "IIIIIIII")
        for i in range(num):
            start = off + i * entsize
            if start + struct.calcsize(fmt) > len(self.data):
                raise ElfError(f"{self.path}: truncated program headers")
            if self.is64:
                p_type, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from(
                    fmt, self.data, start)
            else:
                p_type, p_offset, p_vaddr, _, p_filesz, p_memsz, _, _ = struct.unpack_from(
                    fmt, self.data, start)
            out.append(Segment(p_type, p_offset, p_vaddr, p_filesz, p_memsz))
        return out

    def _read_sections(self, off: int, entsize: int, num: int, strndx: int) -> list[Section]:
        fmt = self._e + ("IIQQQQIIQQ" if self.is64 else "IIIIIIIIII")
        if off == 0 or num == 0:
            return []
        if off + num * entsize > len(self.data):
            raise ElfError(f"{self.path}: truncated section headers")
        raw = [struct.unpack_from(fmt, self.data, off + i * entsize) for i in range(num)]
        names = b""
        if 0 < strndx < num:
            _, _, _, _, s_off, s_size, *_ = raw[strndx]
            names = bytes(self.data[s_off:s_off + s_size])
        out = []
        for name_off, typ, flags, addr, offset, size, link, _, _, entsz in raw:
            end = names.find(b"\0", name_off)
            name = names[name_off:end if end >= 0 else None].decode("utf-8", "replace")
            out.append(Section(name, typ, flags, addr, offset, size, link, entsz))
        return out

    def section(self, name: str) -> Section | None:
        return self._by_name.get(name)

    def section_data(self, sec: Section) -> memoryview | bytes:
        """Contents of a section (decompressed if SHF_COMPRESSED); empty for NOBITS."""
        if sec.type == SHT_NOBITS or sec.offset + sec.size > len(self.data):
            return b""
        view = self.data[sec.offset:sec.offset + sec.size]
        if not sec.flags & SHF_COMPRESSED:
            return view
        hdr_fmt = self._e + ("IIQQ" if self.is64 else "III")
        hdr_size = struct.calcsize(hdr_fmt)
        if len(view) < hdr_size:
            return b""  # truncated compression header: the section is unusable
        ch_type, *_, ch_size, _ = struct.unpack_from(hdr_fmt, view)
        if ch_type != ELFCOMPRESS_ZLIB:
            return b""  # zstd needs a module Python 3.11 lacks: treat as absent
        if ch_size > MAX_DECOMPRESSED:
            return b""
        try:
            inflater = zlib.decompressobj()
            out = inflater.decompress(view[hdr_size:], MAX_DECOMPRESSED)
        except zlib.error:
            return b""
        if inflater.unconsumed_tail:
            return b""  # would inflate past the cap
        return out

    def data_of(self, name: str) -> memoryview | bytes | None:
        sec = self._by_name.get(name)
        if sec is None or sec.type == SHT_NOBITS:
            return None
        data = self.section_data(sec)
        return data if len(data) else None

    def notes(self) -> Iterator[tuple[bytes, int, bytes]]:
        """(owner, type, descriptor) of every note, from note sections or PT_NOTE segments."""
        spans = [(s.offset, s.size) for s in self.sections if s.type == 7]  # SHT_NOTE
        if not spans:
            spans = [(p.offset, p.filesz) for p in self.segments if p.type == PT_NOTE]
        for off, size in spans:
            pos, end = off, min(off + size, len(self.data))
            while pos + 12 <= end:
                namesz, descsz, ntype = struct.unpack_from(self._e + "III", self.data, pos)
                pos += 12
                name = bytes(self.data[pos:pos + namesz]).rstrip(b"\0")
                pos += (namesz + 3) & ~3
                desc = bytes(self.data[pos:pos + descsz])
                pos += (descsz + 3) & ~3
                yield name, ntype, desc

    def build_id(self) -> str | None:
        for owner, ntype, desc in self.notes():
            if owner == b"GNU" and ntype == NT_GNU_BUILD_ID and desc:
                return desc.hex()
        return None

    def debuglink(self) -> tuple[str, int] | None:
        """(file name, CRC32) from .gnu_debuglink."""
        data = self.data_of(".gnu_debuglink")
        if data is None:
            return None
        raw = bytes(data)
        end = raw.find(b"\0")
        if end <= 0:
            return None
        crc_off = (end + 4) & ~3
        if crc_off + 4 > len(raw):
            return None
        (crc,) = struct.unpack_from(self._e + "I", raw, crc_off)
        return raw[:end].decode("utf-8", "replace"), crc

    def has_dwarf(self) -> bool:
        sec = self._by_name.get(".debug_info")
        return sec is not None and sec.type != SHT_NOBITS and sec.size > 0

    def symbol_sections(self, dynamic_only: bool = False
                        ) -> list[tuple[memoryview | bytes, bytes, bool, bool]]:
        """(entries, string table, is64, big endian) of .symtab and .dynsym (both: a stripped
        file keeps only .dynsym), or of .dynsym alone, in section order: what `symbols`
        decodes, and what native symtab_build reads without decoding every entry."""
        out: list[tuple[memoryview | bytes, bytes, bool, bool]] = []
        kinds = (SHT_DYNSYM,) if dynamic_only else (SHT_SYMTAB, SHT_DYNSYM)
        for sec in self.sections:
            if sec.type not in kinds or not 0 < sec.link < len(self.sections):
                continue
            strtab = self.sections[sec.link]
            out.append((self.section_data(sec), bytes(self.section_data(strtab)), self.is64,
                        not self.little_endian))
        return out

    def symbols(self, dynamic_only: bool = False) -> list[RawSymbol]:
        """Entries of .symtab and .dynsym (both: a stripped file keeps only .dynsym), or of
        .dynsym alone (the exported names: a tenth of libpython's, read in a tenth of the
        time)."""
        out: list[RawSymbol] = []
        for data, names, is64, _ in self.symbol_sections(dynamic_only):
            fmt = self._e + ("IBBHQQ" if is64 else "IIIBBH")
            entsize = struct.calcsize(fmt)
            usable = len(data) - len(data) % entsize
            for entry in struct.iter_unpack(fmt, data[:usable]):
                if is64:
                    name_off, info, _, shndx, value, size = entry
                else:
                    name_off, value, size, info, _, shndx = entry
                if name_off == 0:
                    continue
                end = names.find(b"\0", name_off)
                name = names[name_off:end if end >= 0 else None].decode("utf-8", "replace")
                out.append(RawSymbol(name, value, size, info & 0xF, info >> 4, shndx))
        return out

    def file_offset_to_vaddr(self, offset: int) -> int:
        loads = [p for p in self.segments if p.type == PT_LOAD]
        for p in loads:
            if p.offset <= offset < p.offset + max(p.filesz, 1):
                return offset - p.offset + p.vaddr
        # Past every segment's file data (or no PT_LOAD): use the nearest preceding segment.
        best = max((p for p in loads if p.offset <= offset), key=lambda p: p.offset, default=None)
        return offset if best is None else offset - best.offset + best.vaddr

    def vaddr_to_file_offset(self, vaddr: int) -> int:
        for p in self.segments:
            if p.type == PT_LOAD and p.vaddr <= vaddr < p.vaddr + max(p.memsz, 1):
                return vaddr - p.vaddr + p.offset
        return vaddr
