"""No junk frames: on Debian's own programs (built -O2 without frame pointers, stripped) a
frame-pointer walk reads garbage; an address outside every mapping ends the stack at a
`[truncated]` root instead of being reported as a function."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import run_rsprof, top_json
from rsprof.collector.shimframes import ENTRY_ADDRESS_BASE


@pytest.mark.skipif(shutil.which("xz") is None, reason="xz is not installed")
def test_no_frame_outside_the_mappings_on_stock_xz(tmp_path: Path) -> None:
    out = tmp_path / "xz.db"
    data = tmp_path / "data"
    data.write_bytes(Path("/usr/bin/xz").read_bytes() * 4)
    result = run_rsprof(
        "run",
        "-q",
        "--cpu-freq",
        "999",
        "-o",
        str(out),
        "--",
        "xz",
        "-9",
        "-k",
        "-f",
        str(data),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    db = sqlite3.connect(f"file:{out}?mode=ro", uri=True)
    try:
        outside = [address & (1 << 64) - 1 for (address,) in db.execute(
            "SELECT f.address FROM frames f JOIN stack_frames sf ON sf.frame_id = f.id"
            " WHERE f.module_id IS NULL AND f.address != 0 AND sf.position > 0")]
    finally:
        db.close()
    # The allocator the program called, under a sample in the heap shim's own work
    # ([rsprof heap tracking] -> malloc): a named pseudo-frame of no module, as [kernel] is
    # (collector/shimframes.py). Any other frame of no module is junk.
    junk = [hex(a) for a in outside if a >> 48 != ENTRY_ADDRESS_BASE >> 48]
    assert not junk, f"{len(junk)} caller frames outside every mapping: {junk}"
    rows = top_json(out, "cpu")
    total = sum(int(str(row["self"])) for row in rows)
    assert total >= 20, f"too few samples to judge ({total}) on a busy machine"
    for row in rows:
        name = str(row["function"])
        assert not name.startswith("0x"), f"junk frame reported as a function: {row}"
