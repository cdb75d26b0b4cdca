"""Bad input: one clear line on stderr, rsprof's exit code, never a traceback."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from conftest import build_target, run_rsprof


def _one_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_missing_pid() -> None:
    _one_line(run_rsprof("-p", str(_dead_pid()), "-q", "-d", "1s"), 3, "no process with PID")


def test_kernel_thread() -> None:
    _one_line(run_rsprof("-p", "2", "-q", "-d", "1s"), 1, "kernel thread")


def test_process_name_without_match() -> None:
    _one_line(run_rsprof("-P", "no-such-process-xyz", "-q", "-d", "1s"), 3, "no process")


def test_process_name_with_several_matches() -> None:
    binary = build_target("split.c")
    procs = [subprocess.Popen([str(binary), "20"], stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        time.sleep(0.3)  # the targets name themselves split-main once started
        result = run_rsprof("-P", "split-main", "-q", "-d", "1s")
        # "N processes match": other split-main processes (another test run on a shared
        # machine) may add to the two started here.
        _one_line(result, 3, "processes match", str(procs[0].pid), str(procs[1].pid))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_not_a_profile(tmp_path: Path) -> None:
    text = tmp_path / "notes.db"
    text.write_text("hello, not sqlite\n" * 100)
    _one_line(run_rsprof("top", "cpu", str(text)), 6, "not an rsprof profile")
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)")
    _one_line(run_rsprof("query", str(other), "SELECT 1"), 6, "not an rsprof profile")


def test_missing_file(tmp_path: Path) -> None:
    _one_line(run_rsprof("top", "cpu", str(tmp_path / "nope.db")), 6, "no such file")
    _one_line(run_rsprof("view", str(tmp_path / "nope.db")), 6, "no such file")


@pytest.mark.parametrize("duration", ["10x", "-5s", "0s", "abc"])
def test_bad_duration(duration: str) -> None:
    _one_line(run_rsprof("-p", str(os.getpid()), "-q", "-d", duration), 2, "duration")


def test_unknown_top_kind(tmp_path: Path) -> None:
    _one_line(run_rsprof("top", "disk", str(tmp_path / "x.db")), 2, "unknown kind")


def test_frequency_above_kernel_limit() -> None:
    _one_line(run_rsprof("-p", str(os.getpid()), "-q", "--cpu-freq", "100001"), 2)


def test_existing_output_is_not_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "exists.db"
    out.write_bytes(b"precious")
    binary = build_target("split.c")
    proc = subprocess.Popen([str(binary), "10"], stdout=subprocess.DEVNULL)
    try:
        _one_line(run_rsprof("-p", str(proc.pid), "-q", "-d", "1s", "-o", str(out)), 6,
                  "already exists")
    finally:
        proc.kill()
        proc.wait()
    assert out.read_bytes() == b"precious"
