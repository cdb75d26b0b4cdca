"""Call-site rules: runtime frames are skipped by module and exact symbol, never substring."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import build_target, run_rsprof


def test_stl_allocations_charged_to_the_user_function(tmp_path: Path) -> None:
    binary = build_target("heap_stl.cc", ("-O2",))
    out = tmp_path / "stl.db"
    result = run_rsprof("run", "-q", "-o", str(out), "--", str(binary), "1000")
    assert result.returncode == 0, result.stderr
    rows = json.loads(run_rsprof("top", "heap", str(out), "--json", "-n", "0").stdout)
    # C++ names are demangled with their parameters: keep_strings(int).
    sites = {row["function"].split("(")[0]: row for row in rows}
    # std::string(100, c) allocates 101 bytes, inside keep_strings (inlined constructor).
    assert sites["keep_strings"]["live_bytes"] == 1000 * 101, sites.keys()
    assert sites["keep_strings"]["alloc_count"] == 1000
    assert not any(name.startswith("std::") for name in sites), sites.keys()
    assert sites["fill_vector"]["live_bytes"] == 1024 * 4
