"""Finding separate debug files, the way gdb and binutils do.

Order: /usr/lib/debug/.build-id/xx/yyyy.debug (by NT_GNU_BUILD_ID), then .gnu_debuglink next to
the binary, in its .debug/ subdirectory, and under each debug root mirrored by directory.
A candidate counts only if its build id matches, or failing that its CRC32 does.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence

from .elf import ElfError, ElfFile

DEFAULT_DEBUG_ROOTS = ("/usr/lib/debug",)


def default_debug_roots() -> list[str]:
    env = os.environ.get("RSPROF_DEBUG_ROOTS")
    if env:
        return [p for p in env.split(os.pathsep) if p]
    return list(DEFAULT_DEBUG_ROOTS)


def _crc32(path: str) -> int | None:
    crc = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                crc = zlib.crc32(chunk, crc)
    except OSError:
        return None
    return crc & 0xFFFFFFFF


def _open_debug(path: str) -> ElfFile | None:
    try:
        elf = ElfFile(path)
    except (OSError, ValueError, ElfError):
        return None
    return elf if elf.has_dwarf() else None


def build_id_candidates(build_id: str, roots: Sequence[str]) -> list[str]:
    if len(build_id) < 3:
        return []
    return [os.path.join(root, ".build-id", build_id[:2], build_id[2:] + ".debug")
            for root in roots]


def debuglink_candidates(binary: str, link: str, roots: Sequence[str]) -> list[str]:
    directory = os.path.dirname(os.path.realpath(binary))
    out = [os.path.join(directory, link), os.path.join(directory, ".debug", link)]
    out += [os.path.join(root + directory, link) for root in roots]
    return out


def find_debug_file(binary: str, elf: ElfFile, roots: Sequence[str]) -> str | None:
    """Path of a separate file holding `elf`'s DWARF, without opening DWARF or reading CRCs
    unless a build id cannot decide."""
    found = open_debug_file(binary, elf, roots, verify_crc=False)
    return found.path if found is not None else None


def open_debug_file(binary: str, elf: ElfFile, roots: Sequence[str],
                    verify_crc: bool = True) -> ElfFile | None:
    build_id = elf.build_id()
    if build_id:
        for path in build_id_candidates(build_id, roots):
            if os.path.isfile(path):
                debug = _open_debug(path)
                if debug is not None and debug.build_id() == build_id:
                    return debug
    link = elf.debuglink()
    if link is None:
        return None
    name, crc = link
    try:
        own = os.path.realpath(binary)
    except OSError:  # e.g. /proc/PID/root/... of a target that has exited meanwhile
        own = binary
    for path in debuglink_candidates(binary, name, roots):
        try:
            if not os.path.isfile(path) or os.path.realpath(path) == own:
                continue
        except OSError:
            continue
        debug = _open_debug(path)
        if debug is None:
            continue
        other_id = debug.build_id()
        if build_id and other_id:
            if other_id == build_id:
                return debug
            continue
        if not verify_crc or _crc32(path) == crc:
            return debug
    return None
