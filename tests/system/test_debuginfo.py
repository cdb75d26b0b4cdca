"""Separate debug files found by .gnu_debuglink (collector/symbols/debuginfo.py): the link
is a plain file name looked up in gdb's three folders only, and a huge candidate's CRC is
neither read whole nor able to hold up a recording. Real binaries whose links are made
with objcopy; every file lives in the test's temporary folder."""

from __future__ import annotations

import os
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest
from conftest import run_rsprof
from rsprof.collector.symbols import Symbolizer, debuginfo
from rsprof.collector.symbols.elf import ElfFile

SOURCE = r"""
#include <time.h>
__attribute__((noinline)) long linked_fn(long n) {
    volatile long x = 0;
    for (long i = 0; i < n; i++) x += i;
    return x;
}
int main(int argc, char **argv) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        linked_fn(1000000);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (argc > 1 && now.tv_sec - start.tv_sec < 3);
    return 0;
}
"""


def _debuglink_section(name: bytes, crc: int) -> bytes:
    padded = name + b"\0" * (4 - len(name) % 4)
    return padded + struct.pack("<I", crc)


def _split(folder: Path) -> tuple[Path, Path]:
    """A program without build id (so only the link's CRC can match a debug file) and its
    DWARF in a separate file `app.debug`; the program keeps no link yet."""
    source = folder / "app.c"
    source.write_text(SOURCE)
    full = folder / "full"
    subprocess.run(["gcc", "-O1", "-g", "-Wl,--build-id=none", "-o", str(full), str(source)],
                   check=True)
    debug = folder / "app.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(full), str(debug)], check=True)
    app = folder / "app"
    subprocess.run(["objcopy", "--strip-debug", str(full), str(app)], check=True)
    return app, debug


def _link(app: Path, name: bytes, crc: int) -> Path:
    """`app` with a .gnu_debuglink naming `name` (any bytes: objcopy's own option takes only
    an existing file's base name)."""
    section = app.parent / "link.bin"
    section.write_bytes(_debuglink_section(name, crc))
    linked = app.parent / f"{app.name}.linked"
    subprocess.run(["objcopy", "--add-section", f".gnu_debuglink={section}", str(app),
                    str(linked)], check=True)
    return linked


def _crc(path: Path) -> int:
    return zlib.crc32(path.read_bytes()) & 0xFFFFFFFF


def _vaddr(binary: Path, symbol: str) -> int:
    for line in subprocess.run(["nm", str(binary)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split()
        if parts[-1] == symbol:
            return int(parts[0], 16)
    raise AssertionError(f"{symbol} not in {binary}")


def test_link_names_rule() -> None:
    roots = ["/usr/lib/debug"]
    assert debuginfo.debuglink_candidates("/opt/app/bin/x", "x.debug", roots) == [
        "/opt/app/bin/x.debug", "/opt/app/bin/.debug/x.debug", "/usr/lib/debug/opt/app/bin/x.debug"]
    for bad in ("/etc/shadow", "../x.debug", "a/b.debug", "..", ".", "", "x\0y"):
        assert debuginfo.debuglink_candidates("/opt/app/bin/x", bad, roots) == [], bad
        assert not debuginfo.valid_link_name(bad)


def test_good_link_still_found(tmp_path: Path) -> None:
    app, debug = _split(tmp_path)
    linked = _link(app, b"app.debug", _crc(debug))
    found = debuginfo.open_debug_file(str(linked), ElfFile(str(linked)), [])
    assert found is not None and found.path == str(debug)
    module = Symbolizer(disk_cache=False).module(str(linked))
    assert module is not None
    frame = module.symbolize([_vaddr(linked, "linked_fn")])[0][0]
    assert frame.function == "linked_fn" and frame.file.endswith("app.c") and frame.line > 0


@pytest.mark.parametrize("form", ["absolute", "dotdot"])
def test_link_out_of_its_folders_is_not_read(tmp_path: Path, form: str) -> None:
    """A link naming a file elsewhere (absolute, or ../): not opened, said once (before:
    os.path.join took it as it was, and root read whatever file a user's binary named)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    app, debug = _split(tmp_path)
    secret = elsewhere / "secret.debug"
    debug.rename(secret)
    home = tmp_path / "bin"
    home.mkdir()
    name = str(secret).encode() if form == "absolute" else b"../elsewhere/secret.debug"
    linked = _link(app, name, _crc(secret))
    moved = home / "app"
    linked.rename(moved)
    warnings: list[str] = []
    found = debuginfo.open_debug_file(str(moved), ElfFile(str(moved)), [],
                                      warn=warnings.append)
    assert found is None
    assert len(warnings) == 1 and "not a plain file name" in warnings[0]
    module = Symbolizer(disk_cache=False).module(str(moved))
    assert module is not None
    frame = module.symbolize([_vaddr(moved, "linked_fn")])[0][0]
    assert frame.function == "linked_fn" and frame.file == ""  # symbols only, no DWARF


def _sparse_debug(debug: Path, size: int) -> None:
    """`debug` (a real debug file: it opens as ELF with DWARF) grown to `size` with a hole:
    the CRC no longer matches and only reading it all can tell."""
    with open(debug, "r+b") as out:
        out.truncate(size)


def test_huge_candidate_refused_without_reading(tmp_path: Path) -> None:
    app, debug = _split(tmp_path)
    linked = _link(app, b"app.debug", _crc(debug))
    _sparse_debug(debug, 20 << 30)
    warnings: list[str] = []
    started = time.monotonic()
    found = debuginfo.open_debug_file(str(linked), ElfFile(str(linked)), [],
                                      warn=warnings.append)
    elapsed = time.monotonic() - started
    assert found is None
    assert len(warnings) == 1 and "whose CRC is checked" in warnings[0]
    assert elapsed < 1.0, elapsed  # before: the 20 GiB were read (~10-40 s here)


def test_crc_read_stops_when_cancelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the cap, the CRC is read in chunks and gives up as soon as the recording is
    asked to stop."""
    app, debug = _split(tmp_path)
    linked = _link(app, b"app.debug", _crc(debug))
    _sparse_debug(debug, 1 << 30)
    calls = 0

    def cancelled() -> bool:
        nonlocal calls
        calls += 1
        return calls > 3

    reads = []
    real_preadv = os.preadv

    def counting_preadv(fd: int, buffers: list[bytearray], offset: int) -> int:
        reads.append(offset)
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(debuginfo.os, "preadv", counting_preadv)
    found = debuginfo.open_debug_file(str(linked), ElfFile(str(linked)), [],
                                      cancelled=cancelled)
    assert found is None
    assert len(reads) == 3  # 12 MiB of the 1 GiB, not all of it


def test_recording_with_a_huge_debug_file_is_not_held_up(tmp_path: Path) -> None:
    """A real recording of a program whose debug link names a 20 GiB sparse file: the
    recording ends on time, with a warning (before: 13.8 s to the first checkpoint)."""
    app, debug = _split(tmp_path)
    linked = _link(app, b"app.debug", _crc(debug))
    linked.chmod(0o755)
    _sparse_debug(debug, 20 << 30)
    out = tmp_path / "p.db"
    started = time.monotonic()
    result = run_rsprof("run", "-q", "-d", "1s", "--cpu-freq", "499", "-o", str(out), "--",
                        str(linked), "spin")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "whose CRC is checked" in result.stderr
    assert elapsed < 8, elapsed
