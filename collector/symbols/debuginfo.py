"""Finding separate debug files, the way gdb and binutils do.

Order: /usr/lib/debug/.build-id/xx/yyyy.debug (by NT_GNU_BUILD_ID), then .gnu_debuglink next to
the binary, in its .debug/ subdirectory, and under each debug root mirrored by directory.
A candidate counts only if its build id matches, or failing that its CRC32 does.

The link's name comes from the binary, which anyone may have built: it is a plain file name
(no '/', not '.' or '..'), so it names a file in those three folders only, never one
elsewhere that root would read. Candidates are opened without blocking (a FIFO) and must be
regular files; the CRC is read only from files up to MAX_CRC_BYTES, in chunks, and stops
as soon as `cancelled()` says so (the recorder was asked to stop): a 100 GB sparse file
named by a link used to hold the recording for 51 s after Ctrl-C.
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Callable, Sequence

from .elf import ElfError, ElfFile

DEFAULT_DEBUG_ROOTS = ("/usr/lib/debug",)
# The largest file whose CRC32 is computed: libxul's debug file is ~1.5 GiB. Larger ones
# are refused with a warning (reading 2 GiB takes ~0.5 s here, more on a slow disk).
MAX_CRC_BYTES = 2 << 30
_CRC_CHUNK = 4 << 20


def _never() -> bool:
    return False


def default_debug_roots() -> list[str]:
    env = os.environ.get("RSPROF_DEBUG_ROOTS")
    if env:
        return [p for p in env.split(os.pathsep) if p]
    return list(DEFAULT_DEBUG_ROOTS)


def _crc32(fd: int, cancelled: Callable[[], bool]) -> int | None:
    """CRC32 of the whole file, or None if reading failed or was cancelled."""
    crc = 0
    buffer = bytearray(_CRC_CHUNK)  # readinto: no new bytes object per chunk (4x faster)
    view = memoryview(buffer)
    offset = 0
    try:
        while True:
            if cancelled():
                return None
            got = os.preadv(fd, [buffer], offset)
            if got <= 0:
                break
            crc = zlib.crc32(view[:got], crc)
            offset += got
    except OSError:
        return None
    return crc & 0xFFFFFFFF


def _open_candidate(path: str) -> tuple[int, os.stat_result] | None:
    """A descriptor on a regular file (never blocking on a FIFO or device), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    return fd, info


def _open_debug(path: str, fd: int | None = None) -> ElfFile | None:
    """The ELF file at `path` (through `fd` when given: the file checked above, not
    whatever the name holds by now), if it has DWARF."""
    try:
        elf = ElfFile(path if fd is None else f"/proc/self/fd/{fd}")
    except (OSError, ValueError, ElfError):
        return None
    elf.path = path
    return elf if elf.has_dwarf() else None


def valid_link_name(name: str) -> bool:
    """A .gnu_debuglink name is a file name, as gdb takes it: no folder in it."""
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def build_id_candidates(build_id: str, roots: Sequence[str]) -> list[str]:
    if len(build_id) < 3:
        return []
    return [os.path.join(root, ".build-id", build_id[:2], build_id[2:] + ".debug")
            for root in roots]


def debuglink_candidates(binary: str, link: str, roots: Sequence[str]) -> list[str]:
    """Where gdb looks for `link`: the binary's folder, its .debug/ subfolder and each
    debug root mirroring the folder. [] for a name that is not a plain file name."""
    if not valid_link_name(link):
        return []
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
                    verify_crc: bool = True, warn: Callable[[str], None] | None = None,
                    cancelled: Callable[[], bool] = _never) -> ElfFile | None:
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
    if not valid_link_name(name):
        if warn is not None:
            warn(f"{binary}: .gnu_debuglink {name!r} is not a plain file name; ignored")
        return None
    try:
        own = os.path.realpath(binary)
    except OSError:  # e.g. /proc/PID/root/... of a target that has exited meanwhile
        own = binary
    for path in debuglink_candidates(binary, name, roots):
        try:
            if os.path.realpath(path) == own:
                continue
        except OSError:
            continue
        opened = _open_candidate(path)
        if opened is None:
            continue
        fd, info = opened
        try:
            debug = _open_debug(path, fd)
            if debug is None:
                continue
            other_id = debug.build_id()
            if build_id and other_id:
                if other_id == build_id:
                    return debug
                continue
            if not verify_crc:
                return debug
            if info.st_size > MAX_CRC_BYTES:
                if warn is not None:
                    warn(f"{path}: debug file of {info.st_size >> 20} MiB, over the"
                         f" {MAX_CRC_BYTES >> 20} MiB whose CRC is checked; ignored")
                continue
            if _crc32(fd, cancelled) == crc:
                return debug
        finally:
            os.close(fd)
    return None
