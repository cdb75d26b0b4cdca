"""LEB128 decoding (native/leb128.h), shared by the CFI interpreter (native/cfi_eval.h, in the
extension and the heap shim) and the DWARF reader (native/dwarf.c).

Sign extension shifted a signed 1 by 63 for a 9-byte negative number (undefined behaviour):
the C cases run under -fsanitize=undefined, which ends the program at such a shift. The DWARF
reader's decoder is reached from Python, through DIE attributes of hand-made sections."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rsprof._native import DwarfReader

ROOT = Path(__file__).parents[2]
U64 = (1 << 64) - 1


def _run_sanitized(tmp_path: Path, target: str, says: str) -> None:
    """Builds tests/targets/TARGET.c against native/ with the address and undefined-behaviour
    sanitizers (any report ends it with an error), runs it, and expects it to say `says`.
    Built here, not by build_target, whose cache key is the target's source, not the headers
    it includes."""
    binary = tmp_path / target
    subprocess.run(
        ["gcc", "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-I", str(ROOT / "native"), "-o", str(binary),
         str(ROOT / "tests" / "targets" / f"{target}.c")],
        check=True,
    )
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == says


def test_edge_cases_decode_without_undefined_behaviour(tmp_path: Path) -> None:
    """tests/targets/leb128_cases.c: values, bytes used and the cursor's state for 0x7f (-1),
    64-bit minimum and maximum, 9- and 10-byte numbers, overlong and truncated input.
    Before the fix: "left shift of 1 by 63 places cannot be represented"."""
    _run_sanitized(tmp_path, "leb128_cases", "leb128 ok")


def test_factored_offsets_that_overflow_are_defined(tmp_path: Path) -> None:
    """tests/targets/cfi_scale_cases.c: CFA programs whose factor times data alignment
    overflows 64 bits (offset, offset_extended(_sf), def_cfa(_offset)_sf,
    GNU_negative_offset_extended) give the product modulo 2^64, under
    -fsanitize=undefined. Before: "signed integer overflow" at the first of them."""
    _run_sanitized(tmp_path, "cfi_scale_cases", "cfi scale ok")


def _uleb(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# (encoding, value the reader reports: the number's 64 bits, unsigned)
SDATA = [
    (b"\x00", 0),
    (b"\x7f", U64),  # -1
    (b"\x40", -64 & U64),
    (b"\xff\x00", 127),
    (b"\x80\x7f", -128 & U64),
    (b"\x80" * 8 + b"\x40", -(1 << 62) & U64),  # 9 bytes: the sign from bit 62
    (b"\xff" * 8 + b"\x7f", U64),  # -1 in 9 bytes
    (b"\xff" * 9 + b"\x00", (1 << 63) - 1),  # int64 max, 10 bytes
    (b"\x80" * 9 + b"\x7f", 1 << 63),  # int64 min, 10 bytes
    (b"\xff" * 10 + b"\x7f", U64),  # -1 in 11 bytes: overlong
    (b"\x85" + b"\x80" * 11 + b"\x00", 5),  # 5 in 13 bytes
]
UDATA = [
    (b"\x7f", 127),
    (b"\xe5\x8e\x26", 624485),
    (b"\xff" * 9 + b"\x01", U64),
    (b"\xff" * 9 + b"\x7f", U64),  # bits past the 64th dropped
    (b"\x80" * 10 + b"\x00", 0),
]
IMPLICIT = [(b"\x7f", U64), (b"\x80" * 8 + b"\x40", -(1 << 62) & U64)]

DW_TAG_compile_unit, DW_TAG_variable = 0x11, 0x34
DW_AT_name, DW_AT_decl_line = 0x03, 0x3B
DW_FORM_udata, DW_FORM_sdata, DW_FORM_strx1, DW_FORM_implicit_const = 0x0F, 0x0D, 0x25, 0x21


def _sections() -> tuple[bytes, bytes, list[tuple[int, int]], int, int]:
    """One DWARF 4 unit whose children each hold a decl_line: sdata, udata, implicit_const
    (read from the abbreviation), then a DW_AT_name by strx1 without a .debug_str_offsets
    (a missing section), then a truncated sdata at the unit's end. Returns .debug_info,
    .debug_abbrev, (DIE offset, expected decl_line) pairs, the strx DIE's and the truncated
    DIE's offsets."""
    abbrev = bytearray()
    abbrev += _uleb(1) + _uleb(DW_TAG_compile_unit) + b"\x01" + b"\x00\x00"
    abbrev += _uleb(2) + _uleb(DW_TAG_variable) + b"\x00"
    abbrev += _uleb(DW_AT_decl_line) + _uleb(DW_FORM_sdata) + b"\x00\x00"
    abbrev += _uleb(3) + _uleb(DW_TAG_variable) + b"\x00"
    abbrev += _uleb(DW_AT_decl_line) + _uleb(DW_FORM_udata) + b"\x00\x00"
    abbrev += _uleb(4) + _uleb(DW_TAG_variable) + b"\x00"
    abbrev += _uleb(DW_AT_name) + _uleb(DW_FORM_strx1) + b"\x00\x00"
    for k, (encoded, _) in enumerate(IMPLICIT):
        abbrev += _uleb(5 + k) + _uleb(DW_TAG_variable) + b"\x00"
        abbrev += _uleb(DW_AT_decl_line) + _uleb(DW_FORM_implicit_const) + encoded + b"\x00\x00"
    abbrev += b"\x00"

    header = 4 + 2 + 4 + 1  # unit_length, version, debug_abbrev_offset, address_size
    body = bytearray(_uleb(1))
    expected: list[tuple[int, int]] = []
    for code, cases in ((2, SDATA), (3, UDATA)):
        for encoded, value in cases:
            expected.append((header + len(body), value))
            body += _uleb(code) + encoded
    for k, (_, value) in enumerate(IMPLICIT):
        expected.append((header + len(body), value))
        body += _uleb(5 + k)
    strx = header + len(body)
    body += _uleb(4) + b"\x00"
    truncated = header + len(body)
    body += _uleb(2) + b"\xff\xff\xff"  # no last byte: the unit ends inside the number
    info = (len(body) + 7).to_bytes(4, "little") + (4).to_bytes(2, "little")
    info += (0).to_bytes(4, "little") + b"\x08" + body
    return info, bytes(abbrev), expected, strx, truncated


def test_dwarf_reader_numbers() -> None:
    """DW_FORM_sdata, udata and implicit_const through DwarfReader.die(): the same edge
    cases, decoded by dwarf.c's rd_sleb/rd_uleb (native/leb128.h since the fix)."""
    info, abbrev, expected, strx, truncated = _sections()
    reader = DwarfReader({"info": info, "abbrev": abbrev})
    assert reader.units() == [0]
    for offset, value in expected:
        die = reader.die(offset)
        assert die[0] == DW_TAG_variable
        assert die[6] == value, (offset, hex(die[6]), hex(value))
    # strx1 with no .debug_str_offsets: a reader over a missing section, no name.
    assert reader.die(strx)[1] is None
    # The truncated number ends the unit's DIEs before it.
    with pytest.raises(KeyError):
        reader.die(truncated)
    assert reader.children(11) == [offset for offset, _ in expected] + [strx]
