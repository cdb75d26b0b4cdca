"""Hostile conditions: no permission, a full disk. Real kernel answers, no mocks."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import build_target, rsprof_env, start_rsprof, wait_for_checkpoints

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop capabilities")


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) missing")
def test_permission_denied_exit_code_and_hint() -> None:
    binary = build_target("split.c")
    os.chmod(binary, 0o755)
    target = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(binary), "20"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert target.stdout is not None and target.stdout.readline().startswith("ready")
        # root with every capability dropped may not look into another user's process.
        result = subprocess.run(
            ["setpriv", "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-P", "-m",
             "rsprof", "-p", str(target.pid), "-q", "-d", "1s", "-o", "/tmp/rsprof-denied.db"],
            capture_output=True, text=True, env=rsprof_env(), timeout=60,
        )
    finally:
        target.kill()
        target.wait()
    assert result.returncode == 4, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "permission denied" in lines[0]
    assert "Traceback" not in result.stderr


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr!r}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@needs_root
def test_full_disk_keeps_what_was_written(tiny_disk: Path) -> None:
    out = tiny_disk / "full.db"
    target = subprocess.Popen([str(build_target("split.c")), "60", "100000"],
                              stdout=subprocess.DEVNULL)
    try:
        recorder = start_rsprof("-p", str(target.pid), "-q", "-i", "200ms", "-o", str(out))
        wait_for_checkpoints(out, 3)
        # Fill the disk to the last byte.
        filler = os.open(tiny_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(filler, b"\0" * 4096) > 0:
                pass
        except OSError:
            pass  # ENOSPC: the disk is full
        finally:
            os.close(filler)
        _, stderr = recorder.communicate(timeout=30)
    finally:
        target.kill()
        target.wait()
    assert recorder.returncode == 6, stderr
    assert "disk is full" in stderr and "Traceback" not in stderr
    (tiny_disk / "filler").unlink()
    db = sqlite3.connect(out)
    assert db.execute("SELECT count(*) FROM checkpoints").fetchone()[0] >= 3
    assert db.execute("SELECT SUM(count) FROM cpu_samples").fetchone()[0] > 0
