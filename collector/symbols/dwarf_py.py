"""Pure-Python stand-in for `rsprof._native.DwarfReader`, on pyelftools.

Used only when the C extension is not built (never in an install) or for a big-endian
file: same methods, same results, but orders of magnitude slower (pyelftools needs seconds
for a large unit). pyelftools is not a dependency of rsprof: it comes with the `test` extra,
where it is the oracle tests/system/test_symbols.py compares the C reader with, or the
`pure-dwarf` extra; without it such a file is named by its symbol tables alone.
"""

from __future__ import annotations

import bisect
import struct
from typing import Any

from elftools.dwarf.enums import ENUM_DW_TAG
from elftools.elf.elffile import ELFFile

_END = 0xFFFFFFFF
_SCOPE_TAGS = ("DW_TAG_subprogram", "DW_TAG_inlined_subroutine", "DW_TAG_entry_point")
_LINKAGE = ("DW_AT_linkage_name", "DW_AT_MIPS_linkage_name")

Frame = tuple[str | None, str | None, int, int, int | None]


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _join(comp_dir: str | None, directory: str | None, name: str | None) -> str | None:
    """dir/file as binutils joins them (see join_path in native/dwarf.c)."""
    if name is None:
        return None
    if name.startswith("/"):
        return name
    parts = []
    if directory:
        if not directory.startswith("/") and comp_dir:
            parts.append(comp_dir)
        parts.append(directory)
    elif comp_dir:
        parts.append(comp_dir)
    parts.append(name)
    out = parts[0]
    for part in parts[1:]:
        out = out + part if out.endswith("/") else f"{out}/{part}"
    return out


class PyDwarfReader:
    def __init__(self, path: str) -> None:
        self._file = open(path, "rb")  # stays open: pyelftools reads lazily from it
        self._elf = ELFFile(self._file)
        self._info = self._elf.get_dwarf_info(relocate_dwarf_sections=False)
        self._trees: dict[int, tuple[dict[int, int | None], dict[int, list[int]]]] = {}
        self._cus = {cu.cu_offset: cu for cu in self._info.iter_CUs()
                     if cu.header.get("unit_type", "DW_UT_compile") in
                     ("DW_UT_compile", "DW_UT_partial")}

    def close(self) -> None:
        self._file.close()

    # -- single DIEs (as DwarfReader.die / .children in native/dwarf.c) --------------------

    def _tree(self, offset: int) -> tuple[dict[int, int | None], dict[int, list[int]]]:
        """Parents and children of every DIE of the unit holding `offset`."""
        unit = max((u for u in self._cus if u <= offset), default=None)
        if unit is None:
            raise KeyError(offset)
        cache = self._trees.get(unit)
        if cache is None:
            parents: dict[int, int | None] = {}
            children: dict[int, list[int]] = {}

            def walk(die: Any, parent: int | None) -> None:
                parents[die.offset] = parent
                children[die.offset] = []
                if parent is not None:
                    children[parent].append(die.offset)
                for child in die.iter_children():
                    walk(child, die.offset)

            walk(self._cus[unit].get_top_DIE(), None)
            cache = self._trees[unit] = (parents, children)
        if offset not in cache[0]:
            raise KeyError(offset)
        return cache

    def die(self, offset: int) -> tuple[Any, ...]:
        parents, _ = self._tree(offset)
        die = self._info.get_DIE_from_refaddr(offset)
        attrs = die.attributes

        def ref(*keys: str) -> int | None:
            for key in keys:
                if key in attrs:
                    try:
                        return int(die.get_DIE_from_attribute(key).offset)
                    except Exception:
                        return None
            return None

        def value(key: str) -> Any:
            return attrs[key].value if key in attrs else None

        linkage = next((_text(attrs[k].value) for k in _LINKAGE if k in attrs), None)
        tag = die.tag if isinstance(die.tag, int) else ENUM_DW_TAG.get(str(die.tag), 0)
        return (tag, _text(value("DW_AT_name")), linkage, parents[offset],
                ref("DW_AT_type"), ref("DW_AT_abstract_origin", "DW_AT_specification"),
                value("DW_AT_decl_line") or 0, value("DW_AT_decl_column") or 0,
                int(bool(value("DW_AT_artificial"))), value("DW_AT_language") or 0,
                _text(value("DW_AT_producer")))

    def children(self, offset: int) -> list[int]:
        return list(self._tree(offset)[1][offset])

    def units(self) -> list[int]:
        return sorted(self._cus)

    def aranges(self) -> list[tuple[int, int, int]]:
        ar = self._info.get_aranges()
        if ar is None:
            return []
        return [(e.begin_addr, e.begin_addr + e.length, e.info_offset)
                for e in ar.entries if e.length]

    def _die_ranges(self, cu: Any, die: Any) -> list[tuple[int, int]]:
        attrs = die.attributes
        if "DW_AT_ranges" in attrs:
            rl = self._info.range_lists()
            if rl is None or attrs["DW_AT_ranges"].form == "DW_FORM_rnglistx":
                return []
            top = cu.get_top_DIE().attributes
            base = top["DW_AT_low_pc"].value if "DW_AT_low_pc" in top else 0
            out = []
            entry: Any
            for entry in rl.get_range_list_at_offset(attrs["DW_AT_ranges"].value, cu=cu):
                if hasattr(entry, "base_address"):  # BaseAddressEntry
                    base = entry.base_address
                    continue
                lo, hi = entry.begin_offset, entry.end_offset
                if not entry.is_absolute:
                    lo, hi = lo + base, hi + base
                if hi > lo:
                    out.append((lo, hi))
            return out
        if "DW_AT_low_pc" in attrs and "DW_AT_high_pc" in attrs:
            lo = attrs["DW_AT_low_pc"].value
            high = attrs["DW_AT_high_pc"]
            hi = high.value if high.form in ("DW_FORM_addr", "DW_FORM_addrx") else lo + high.value
            return [(lo, hi)] if hi > lo else []
        return []

    def unit_ranges(self, unit: int) -> list[tuple[int, int]]:
        cu = self._cus[unit]
        return self._die_ranges(cu, cu.get_top_DIE())

    def line_table(self, unit: int) -> tuple[bytes, bytes, bytes, list[str | None]] | None:
        cu = self._cus[unit]
        lp = self._info.line_program_for_CU(cu)
        if lp is None:
            return None
        top = cu.get_top_DIE().attributes
        comp_dir = _text(top["DW_AT_comp_dir"].value) if "DW_AT_comp_dir" in top else None
        cu_name = _text(top["DW_AT_name"].value) if "DW_AT_name" in top else None
        version = lp.header["version"]
        dirs = [_text(d) for d in lp.header["include_directory"]]
        if version < 5:
            dirs = [comp_dir, *dirs]
        names: list[str | None] = [] if version >= 5 else [_join(comp_dir, None, cu_name)]
        for entry in lp.header["file_entry"]:
            d = entry.dir_index
            names.append(_join(comp_dir, dirs[d] if d < len(dirs) else None, _text(entry.name)))
        seqs: list[list[tuple[int, int, int]]] = []
        rows: list[tuple[int, int, int]] = []
        for entry in lp.get_entries():
            if entry.command == 3 and entry.is_extended and version < 5:  # DW_LNE_define_file
                arg: Any = entry.args[0]
                d = arg.dir_index
                names.append(_join(comp_dir, dirs[d] if d < len(dirs) else None, _text(arg.name)))
            st = entry.state
            if st is None:
                continue
            if st.end_sequence:
                rows.append((st.address, _END, st.line))
                seqs.append(rows)
                rows = []
            elif rows and rows[-1][0] == st.address:
                rows[-1] = (st.address, st.file, st.line)  # the last row at an address wins
            else:
                rows.append((st.address, st.file, st.line))
        seqs.sort(key=lambda s: s[0][0])
        out: list[tuple[int, int, int]] = []
        covered = 0
        for seq in seqs:
            lo, hi = seq[0][0], seq[-1][0]
            if len(seq) < 2 or hi <= lo or (out and lo < covered) or lo == 0:
                continue
            covered = hi
            out.extend(seq)
        return (struct.pack(f"{len(out)}Q", *(r[0] for r in out)),
                struct.pack(f"{len(out)}I", *(r[1] for r in out)),
                struct.pack(f"{len(out)}I", *(r[2] for r in out)), names)

    def _names(self, die: Any) -> tuple[str | None, str | None, int | None]:
        name = linkage = name_die = None
        for _ in range(16):
            attrs = die.attributes
            if name is None and "DW_AT_name" in attrs:
                name = _text(attrs["DW_AT_name"].value)
                name_die = die.offset if name is not None else None
            if linkage is None:
                for key in _LINKAGE:
                    if key in attrs:
                        linkage = _text(attrs[key].value)
                        break
            if name is not None and linkage is not None:
                break
            nxt = next((k for k in ("DW_AT_abstract_origin", "DW_AT_specification")
                        if k in attrs), None)
            if nxt is None:
                break
            try:
                die = die.get_DIE_from_attribute(nxt)
            except Exception:  # references pyelftools cannot follow (ref_sig8, alt files)
                break
        return name, linkage, name_die

    def inline_chains(self, unit: int, addrs: list[int]) -> list[tuple[Frame, ...]]:
        cu = self._cus[unit]
        deepest: list[list[Any]] = [[] for _ in addrs]

        def walk(die: Any, chain: list[Any]) -> None:
            for child in die.iter_children():
                here = chain
                if child.tag in _SCOPE_TAGS:
                    matched = False
                    for lo, hi in self._die_ranges(cu, child):
                        j = bisect.bisect_left(addrs, lo)
                        while j < len(addrs) and addrs[j] < hi:
                            matched = True
                            deepest[j] = [*chain, child]
                            j += 1
                    if matched:
                        here = [*chain, child]
                if child.has_children:
                    walk(child, here)

        walk(cu.get_top_DIE(), [])
        out: list[tuple[Frame, ...]] = []
        for scopes in deepest:
            frames: list[Frame] = []
            for die in reversed(scopes):
                name, linkage, name_die = self._names(die)
                attrs = die.attributes
                frames.append((name, linkage,
                               attrs["DW_AT_call_file"].value if "DW_AT_call_file" in attrs else 0,
                               attrs["DW_AT_call_line"].value if "DW_AT_call_line" in attrs else 0,
                               name_die))
                if die.tag != "DW_TAG_inlined_subroutine":
                    break
            out.append(tuple(frames))
        return out

