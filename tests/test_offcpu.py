"""Off-CPU and wall-clock time (issue 23): a real process built from a small C program,
recorded with `rsprof run`, against the program's own measure of where its time went; and
the read model on synthetic stacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rsprof.storage.samples import Frame, Line, offcpu_stack

DUTY = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + t.tv_nsec * 1e-9; }
__attribute__((noinline)) void compute(double ms) {
    double end = now() + ms / 1000; volatile unsigned long x = 0; while (now() < end) x++; }
__attribute__((noinline)) void sleepy(int ms) { usleep(ms * 1000); }
int main(int argc, char **argv) {
    int n = atoi(argv[1]); double in_compute = 0, in_sleep = 0, start = now();
    for (int i = 0; i < n; i++) {
        double a = now(); compute(5); double b = now(); sleepy(15); double c = now();
        in_compute += b - a; in_sleep += c - b;
    }
    double all = now() - start;
    FILE *f = fopen(argv[2], "w");
    fprintf(f, "%f %f\n", 100 * in_compute / all, 100 * in_sleep / all);
    fclose(f);
    return 0;
}
"""


def _line(function: str) -> tuple[Line, ...]:
    return (Line(1, function, function, "", 0),)


def test_offcpu_stack_replaces_the_kernel_leaf_by_the_state() -> None:
    kernel = Frame(1, 1, "", 0, None, _line("[kernel]"))
    user = Frame(2, 0x1000, "/bin/x", 0x1000, None, _line("read"))
    stack = offcpu_stack((kernel, user), "S")
    assert [f.lines[0].function for f in stack] == ["[sleeping]", "read"]
    assert offcpu_stack((user,), "R")[0].lines[0].function == "[preempted]"
    assert offcpu_stack((kernel, user), "D")[0].lines[0].function == "[uninterruptible wait]"


def _rsprof(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "rsprof", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="sched:sched_switch needs root")
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_wall_shares_of_a_compute_and_sleep_loop(tmp_path: Path) -> None:
    (tmp_path / "duty.c").write_text(DUTY)
    subprocess.run(["gcc", "-O1", "-g", "-o", str(tmp_path / "duty"), str(tmp_path / "duty.c")],
                   check=True)
    done = _rsprof("run", "-q", "-F", "999", "-o", "d.db", "--", "./duty", "150", "truth.txt",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    compute_pct, sleep_pct = map(float, (tmp_path / "truth.txt").read_text().split())
    top = _rsprof("top", "wall", "d.db", "-n", "0", "--json", cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    rows = {row["function"]: row for row in json.loads(top.stdout)}
    # The program's own clock is the truth (under load compute() takes longer than 5 ms:
    # its preempted time is wall time in compute, as rsprof charges it).
    assert abs(rows["compute"]["total_pct"] - compute_pct) <= 3, (rows["compute"], compute_pct)
    assert abs(rows["sleepy"]["total_pct"] - sleep_pct) <= 3, (rows["sleepy"], sleep_pct)
    assert rows["[sleeping]"]["self_pct"] > 40
    off = _rsprof("top", "offcpu", "d.db", "--json", cwd=tmp_path)
    assert "[sleeping]" in {row["function"] for row in json.loads(off.stdout)}
    pprof = _rsprof("export", "d.db", "--kind", "wall", "-o", "w.pb.gz", cwd=tmp_path)
    assert pprof.returncode == 0, pprof.stderr
    if shutil.which("go"):
        text = subprocess.run(["go", "tool", "pprof", "-top", str(tmp_path / "w.pb.gz")],
                              capture_output=True, text=True, timeout=120, check=True).stdout
        assert "Type: wall" in text and "[sleeping]" in text
