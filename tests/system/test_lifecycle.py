"""Stopping: every way a recording ends leaves a finished, readable file that says why."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from conftest import (
    build_target,
    checkpoint_count,
    profile_meta,
    run_rsprof,
    start_rsprof,
    start_target,
    wait_for_checkpoints,
)


def test_target_exiting_mid_recording_finalizes(tmp_path: Path) -> None:
    out = tmp_path / "exit.db"
    # Long enough to outlast rsprof's own start-up on a loaded machine, well short of -d.
    target = start_target(build_target("split.c"), "5", "100000")
    result = run_rsprof("-p", str(target.pid), "-q", "-d", "30s", "-o", str(out))
    target.wait()
    assert result.returncode == 0, result.stderr
    assert "stopped: target-exited" in result.stderr
    meta = profile_meta(out)
    assert meta["state"] == "finished" and meta["stop_reason"] == "target-exited"
    top = run_rsprof("top", "cpu", str(out), "--json")
    assert "heavy" in top.stdout


def test_sigterm_and_sigint_finalize(tmp_path: Path) -> None:
    target = start_target(build_target("split.c"), "30", "100000")
    try:
        for sig, reason in ((signal.SIGTERM, "terminated"), (signal.SIGINT, "interrupted")):
            out = tmp_path / f"{reason}.db"
            recorder = start_rsprof("-p", str(target.pid), "-q", "-o", str(out))
            wait_for_checkpoints(out, 2)
            recorder.send_signal(sig)
            _, stderr = recorder.communicate(timeout=20)
            assert recorder.returncode == 0, stderr
            assert f"stopped: {reason}" in stderr
            assert profile_meta(out)["stop_reason"] == reason
    finally:
        target.kill()
        target.wait()


def test_recorder_killed_with_sigkill_leaves_readable_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "killed.db"
    target = start_target(build_target("split.c"), "30", "100000")
    try:
        recorder = start_rsprof("-p", str(target.pid), "-q", "-o", str(out), "-i", "500ms")
        wait_for_checkpoints(out, 3)
        recorder.send_signal(signal.SIGKILL)
        recorder.wait(timeout=10)
    finally:
        target.kill()
        target.wait()
    survived = checkpoint_count(out)
    assert survived >= 3
    # never finalized, yet every checkpoint is there
    assert profile_meta(out)["state"] == "recording"
    top = run_rsprof("top", "cpu", str(out), "--json")
    assert top.returncode == 0, top.stderr
    assert "heavy" in top.stdout
    samples = run_rsprof("query", str(out), "SELECT SUM(count) FROM cpu_samples")
    assert int(samples.stdout.splitlines()[1]) > 0


def test_run_launches_and_reports_exit_code(tmp_path: Path) -> None:
    out = tmp_path / "run.db"
    result = run_rsprof("run", "-q", "-o", str(out), "--", str(build_target("split.c")), "1.5",
                        "100000")
    assert result.returncode == 0, result.stderr
    assert "target exited with code 0" in result.stderr
    meta = profile_meta(out)
    assert meta["stop_reason"] == "target-exited" and meta["target_exit_code"] == "0"
    assert "heavy" in run_rsprof("top", "cpu", str(out), "--json").stdout


def test_run_duration_stops_a_long_command(tmp_path: Path) -> None:
    out = tmp_path / "long.db"
    started = time.monotonic()
    result = run_rsprof("run", "-q", "-d", "1500ms", "-o", str(out), "--",
                        str(build_target("split.c")), "60", "100000")
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    assert profile_meta(out)["stop_reason"] == "duration"


def test_run_missing_command(tmp_path: Path) -> None:
    result = run_rsprof("run", "-q", "-o", str(tmp_path / "x.db"), "--", "/nonexistent/cmd")
    assert result.returncode == 1
    assert result.stderr.strip() == "rsprof: error: /nonexistent/cmd: command not found"

