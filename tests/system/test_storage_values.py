"""Values real programs produce that once ended a recording: unsigned 64-bit addresses and
offsets (>= 2^63), and GCC clones that share a function's source lines."""

from __future__ import annotations

from pathlib import Path

from conftest import build_target, run_rsprof, top_json


def test_recording_a_program_with_gcc_clones(tmp_path: Path) -> None:
    """gcc -O3 turns work() into work.constprop.0 and work.constprop.1, both on work's
    lines: the recording keeps every sample (it once ended with a UNIQUE failure)."""
    binary = build_target("clones.c", ("-O3",))
    out = tmp_path / "clones.db"
    result = run_rsprof(
        "run",
        "-q",
        "--no-heap",
        "--cpu-freq",
        "999",
        "-o",
        str(out),
        "--",
        str(binary),
        "1",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = top_json(out, "cpu")
    work = [row for row in rows if row["function"] == "work"]
    assert len(work) == 1, rows
    total = sum(int(str(row["self"])) for row in rows)
    assert total >= 50, f"too few samples to judge ({total}) on a busy machine"
    assert int(str(work[0]["self"])) / total > 0.5
