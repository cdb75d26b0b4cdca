"""rsprof's inclusive shares against `perf record --call-graph dwarf` on the same targets
(issue 12, must-have 8): the C, C++ and Rust targets of test_cfi_targets.py, built -O2
without frame pointers. perf copies the stack of every sample (4 KiB here: these stacks
are shallow, and perf script's offline unwinding with libdw is what makes this file slow on
a busy machine); rsprof unwinds a 16 KiB copy in the collector with its own tables. For
every user function, the share of samples whose stack holds it must agree within sampling
error.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import build_target, start_rsprof
from test_cfi_stacks import NO_FP, _assert_no_junk, _stacks
from test_cfi_targets import build_rust, holds

SECONDS = "0.5"  # of the target's CPU time, for each tool
FRAME = re.compile(r"^\s+[0-9a-f]+ (.+?)(?: \(inlined\))?$")

TARGETS = {
    "c-qsort": ("cfi_qsort.c", ["main", "heavy", "light", "sort_copy", "slow_cmp"]),
    "cpp-sort": ("cfi_sort.cc", ["main", "Heavy::run", "Light::run", "sort_copy", "slow_less"]),
    "rust": ("rust_split.rs", ["rust_split::main", "rust_split::heavy", "rust_split::light",
                               "rust_split::sort_copy", "rust_split::slow_cmp"]),
}


def perf_stacks(script_output: str) -> list[list[str]]:
    """Function names of every sample's stack, leaf first, as `perf script -F ip,sym` prints
    them (inlined frames included: they carry the names of the function they were inlined in)."""
    stacks: list[list[str]] = []
    for block in script_output.split("\n\n"):
        names = [m.group(1) for line in block.splitlines() if (m := FRAME.match(line))]
        if names:
            stacks.append(names)
    return stacks


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str | None]]:
    """Every target under rsprof and under perf, all at once: on a busy machine six
    processes get more of the CPUs than one at a time, and this file stays short."""
    if shutil.which("perf") is None:
        pytest.skip("perf is not installed")
    tmp = tmp_path_factory.mktemp("vs-perf")
    binaries = {}
    for name, (source, _) in TARGETS.items():
        if source.endswith(".rs"):
            if shutil.which("rustc") is not None:
                binaries[name] = build_rust(source)
        else:
            binaries[name] = build_target(source, NO_FP)
    ours = {name: start_rsprof("run", "-q", "--no-heap", "--cpu-freq", "999",
                               "-o", str(tmp / f"{name}.db"), "--", str(binary), SECONDS)
            for name, binary in binaries.items()}
    theirs = {name: subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", "999", "--call-graph", "dwarf,4096",
         "-o", str(tmp / f"{name}.data"), "--", str(binary), SECONDS],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for name, binary in binaries.items()}
    for proc in ours.values():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    recorded = {}
    for name, proc in theirs.items():
        proc.communicate(timeout=120)
        recorded[name] = proc.returncode == 0  # not permitted here: no oracle
    scripts = {name: subprocess.Popen(
        ["perf", "script", "-i", str(tmp / f"{name}.data"), "-F", "ip,sym"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for name in binaries if recorded[name]}
    result: dict[str, tuple[Path, str | None]] = {}
    for name in binaries:
        output = scripts[name].communicate(timeout=120)[0] if name in scripts else None
        result[name] = (tmp / f"{name}.db", output)
    return result


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_inclusive_shares_agree_with_perf_dwarf(
    recordings: dict[str, tuple[Path, str | None]], target: str
) -> None:
    if target not in recordings:
        pytest.skip("rustc is not installed")
    profile, script = recordings[target]
    if script is None:
        pytest.skip("perf record --call-graph dwarf is not permitted here")
    ours = _stacks(profile)
    _assert_no_junk(ours)
    theirs = perf_stacks(script)
    n_ours = sum(n for n, _ in ours)
    n_theirs = len(theirs)
    assert n_ours >= 200 and n_theirs >= 200, (n_ours, n_theirs)
    for function in TARGETS[target][1]:
        p_ours = sum(n for n, frames in ours if holds(frames, function)) / n_ours
        p_theirs = sum(
            1 for names in theirs if any(f == function or f.startswith(function + "(")
                                         for f in names)
        ) / n_theirs
        # two independent samples of the same share: four standard deviations of their
        # difference, never tighter than 0.04
        p = (p_ours + p_theirs) / 2
        tolerance = max(0.04, 4 * math.sqrt(p * (1 - p) * (1 / n_ours + 1 / n_theirs)))
        assert abs(p_ours - p_theirs) <= tolerance, (
            f"{function}: rsprof {p_ours:.3f} of {n_ours}, perf dwarf {p_theirs:.3f} of "
            f"{n_theirs} (tolerance {tolerance:.3f})")
