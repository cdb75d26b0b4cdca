"""Kernel time: a sample taken in a system call is a [kernel] frame on top of the user
stack that made the call (when sampling kernel mode is allowed, as for root here)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import run_rsprof

STAT_LOOP = "import os\nfor i in range(300000): os.stat('/')\n"


@pytest.mark.parametrize("stack_bytes", ["16384", "0"], ids=["cfi", "frame-pointers"])
def test_system_call_time_is_a_kernel_frame_under_its_caller(
    stack_bytes: str, tmp_path: Path
) -> None:
    out = tmp_path / "kernel.db"
    result = run_rsprof("run", "-q", "--no-heap", "--cpu-freq", "999", "--stack-bytes",
                        stack_bytes, "-o", str(out), "--", "/usr/bin/python3", "-c", STAT_LOOP)
    assert result.returncode == 0, result.stderr
    db = sqlite3.connect(out)
    assert db.execute("SELECT value FROM meta WHERE key = 'kernel_sampled'").fetchone() == ("1",)
    rows = {r["function"]: r for r in json.loads(
        run_rsprof("top", "cpu", str(out), "--json", "-n", "0").stdout)}
    # stat(2) is most of the loop's time, and it is spent in the kernel.
    assert rows["[kernel]"]["self_pct"] > 20, rows["[kernel]"]
    assert rows["[kernel]"]["total"] == rows["[kernel]"]["self"]  # always a leaf
    traces = json.loads(run_rsprof("traces", str(out), "--json").stdout)
    kernel = [t for t in traces if t["stack"][0] == "[kernel]"]
    # Under it, the libc wrapper that entered the kernel.
    assert any("fstatat" in t["stack"][1] for t in kernel), kernel[:3]
    assert "not sampled" not in result.stderr
