"""Frame lines equal addr2line's: a CPU sample's leaf is looked up at the interrupted
instruction, every caller (and a heap stack's first frame, a return address into malloc's
caller) at its return address - 1, even when one address is both a leaf and a return
address (collector/frames.py, storage/writer.py)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import build_target, run_rsprof, top_json
from rsprof.storage.intern import LocationKey
from rsprof.storage.writer import ProfileWriter

pytestmark = pytest.mark.skipif(shutil.which("addr2line") is None,
                                reason="binutils addr2line is not installed")


def _addr2line(binary: Path, vaddrs: list[int]) -> dict[int, tuple[str, int]]:
    """(file basename, line) of each address, as `addr2line -e BINARY ADDR` says."""
    out = subprocess.run(["addr2line", "-e", str(binary), *(f"{a:x}" for a in vaddrs)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    found = {}
    for vaddr, text in zip(vaddrs, out, strict=True):
        place = text.split(" (discriminator")[0]
        file, _, line = place.rpartition(":")
        found[vaddr] = ("" if file == "??" else Path(file).name,
                        int(line) if line.isdigit() else 0)
    return found


def _frames_of_binary(profile: Path, binary: Path, table: str) -> set[tuple[int, bool, str, int]]:
    """(vaddr, is_leaf, file basename, line) of every frame of `binary` in the stacks of
    `table`; the line is the innermost (depth 0) location's. A frame right under a
    `[kernel]` leaf counts as a leaf: the binary makes no system call itself, so the kernel
    interrupted it there (an interrupt, a fault) and the address is no return address."""
    db = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT DISTINCT f.module_offset, sf.position = 0 OR (sf.position = 1 AND"
            "  (SELECT k.address FROM stack_frames ks JOIN frames k ON k.id = ks.frame_id"
            "   WHERE ks.stack_id = sf.stack_id AND ks.position = 0) = 1), l.file, l.line"
            f" FROM {table} s JOIN stack_frames sf ON sf.stack_id = s.stack_id"
            " JOIN frames f ON f.id = sf.frame_id JOIN modules m ON m.id = f.module_id"
            " JOIN frame_locations fl ON fl.frame_id = f.id AND fl.inline_depth = 0"
            " JOIN locations l ON l.id = fl.location_id WHERE m.path = ?", (str(binary),)
        ).fetchall()
    finally:
        db.close()
    return {(int(vaddr), bool(leaf), Path(file).name, int(line))
            for vaddr, leaf, file, line in rows}


def test_leaf_and_caller_lines_equal_addr2line(tmp_path: Path) -> None:
    binary = build_target("frames_lines.c", ("-O2",))
    out = tmp_path / "lines.db"
    result = run_rsprof("run", "-q", "--cpu-freq", "4999", "-o", str(out), "--",
                        str(binary), "2", timeout=180)
    assert result.returncode == 0, result.stderr

    cpu = _frames_of_binary(out, binary, "cpu_stack_samples")
    leaf_addresses = {vaddr for vaddr, leaf, _, _ in cpu if leaf}
    caller_addresses = {vaddr for vaddr, leaf, _, _ in cpu if not leaf}
    truth_leaf = _addr2line(binary, sorted(leaf_addresses))
    truth_call = _addr2line(binary, sorted(a - 1 for a in caller_addresses))
    wrong = [(hex(vaddr), leaf, (file, line))
             for vaddr, leaf, file, line in cpu
             if (file, line) != (truth_leaf[vaddr] if leaf else truth_call[vaddr - 1])]
    assert not wrong, f"frames whose line is not addr2line's: {wrong[:10]}"
    # The case this is about: step's return address in spin, sampled as a leaf too, is
    # two frames: the leaf at the line after the call, the caller at the call's line.
    both = [vaddr for vaddr in leaf_addresses & caller_addresses
            if truth_leaf[vaddr] != truth_call[vaddr - 1]]
    assert both, "no address was both a leaf and a return address on another line"
    lines = {(leaf, line) for vaddr, leaf, _, line in cpu if vaddr == both[0]}
    assert len(lines) == 2, lines

    # The heap site of grab() is the line of its malloc call, not the line after it.
    heap = _frames_of_binary(out, binary, "heap_stack_samples")
    assert heap, "no heap stack through the target"
    truth_heap = _addr2line(binary, sorted(vaddr - 1 for vaddr, _, _, _ in heap))
    wrong_heap = [(hex(vaddr), file, line) for vaddr, _, file, line in heap
                  if (file, line) != truth_heap[vaddr - 1]]
    assert not wrong_heap, f"heap frames whose line is not addr2line's at the call: {wrong_heap}"
    source = (Path(__file__).parent.parent / "targets" / "frames_lines.c").read_text().splitlines()
    malloc_line = next(n for n, text in enumerate(source, 1) if "void *p = malloc(n);" in text)
    sites = [row for row in top_json(out, "heap") if row["function"] == "grab"]
    assert sites and all(row["line"] == malloc_line for row in sites), sites


def test_one_address_two_lookups_are_two_frames(tmp_path: Path) -> None:
    """The writer keeps a leaf and a return site at one address apart when they resolve to
    different lines, also after reopening the file to append; the same chain is one frame."""
    path = tmp_path / "p.db"
    writer = ProfileWriter(path)
    module = writer.ids.module_id("/bin/prog", None)
    leaf = [LocationKey("spin", "a.c", 23, module)]
    call = [LocationKey("spin", "a.c", 22, module)]
    leaf_id = writer.ids.frame_id(0x12CD, module, 0x12CD, leaf)
    call_id = writer.ids.frame_id(0x12CD, module, 0x12CD, call)
    assert leaf_id != call_id
    assert writer.ids.frame_id(0x12CD, module, 0x12CD, leaf) == leaf_id
    writer.close()
    again = ProfileWriter(path, append=True)
    assert again.ids.frame_id(0x12CD, module, 0x12CD, call) == call_id
    assert again.ids.frame_id(0x12CD, module, 0x12CD, leaf) == leaf_id
    assert again.ids.has_frame(0x12CD, module)
    again.close()
