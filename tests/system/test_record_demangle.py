"""Names users can read: C++ and Rust targets recorded through the CLI come out demangled."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import BUILD_DIR, build_target, run_rsprof, top_json


def _functions(profile: Path) -> dict[str, dict[str, Any]]:
    return {str(row["function"]): row for row in top_json(profile, "cpu")}


def test_cpp_template_method_is_demangled(tmp_path: Path) -> None:
    out = tmp_path / "cpp.db"
    result = run_rsprof("run", "-q", "--cpu-freq", "499", "-o", str(out), "--",
                        str(build_target("demangle.cc")), "1.5")
    assert result.returncode == 0, result.stderr
    functions = _functions(out)
    name = "geometry::Mesh<long>::refine(int)"
    assert name in functions, sorted(functions)[:20]
    assert functions[name]["self_pct"] > 80
    system = run_rsprof("query", str(out),
                        f"SELECT system_name FROM locations WHERE function = '{name}' LIMIT 1")
    assert system.stdout.splitlines()[1].startswith("_ZN8geometry4MeshIlE6refineEi")


@pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc is not installed")
@pytest.mark.parametrize("mangling", ["legacy", "v0"])
def test_rust_function_is_demangled(tmp_path: Path, mangling: str) -> None:
    source = Path(__file__).parent.parent / "targets" / "rustspin.rs"
    binary = BUILD_DIR / f"rustspin-{mangling}"
    flags = ["-C", "symbol-mangling-version=v0"] if mangling == "v0" else []
    subprocess.run(["rustc", "-g", "-C", "opt-level=1", "-C", "force-frame-pointers=yes",
                    *flags, "-o", str(binary), str(source)], check=True, capture_output=True)
    out = tmp_path / f"rust-{mangling}.db"
    result = run_rsprof("run", "-q", "--cpu-freq", "499", "-o", str(out), "--",
                        str(binary), "1.5")
    assert result.returncode == 0, result.stderr
    functions = _functions(out)
    hot = [name for name in functions if name.endswith("physics::integrate_orbits")]
    assert hot, sorted(functions)[:30]
    assert functions[hot[0]]["total_pct"] > 80
    assert not any("17h" in name and name.endswith("E") for name in functions)
    # Rust's standard library frames come out demangled too (a frameless leaf hides its
    # direct caller from the frame-pointer walk, so main itself may not be on the stack).
    assert "std::rt::lang_start_internal" in functions
