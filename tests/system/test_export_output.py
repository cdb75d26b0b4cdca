"""rsprof/export.py's output file: where an export may write and where it must not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_rsprof

NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link needs root")
def test_link_owned_by_another_user_is_not_followed(split_cpu_profile: Path,
                                                     tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "cpu.folded"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)  # as if another user planted it in a shared folder
    result = run_rsprof("export", str(split_cpu_profile), "-f", "folded", "-o", str(link))
    assert result.returncode == 1, result.stderr
    assert "symbolic link owned by another user" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert victim.read_text() == "precious\n"
    assert link.is_symlink()


def test_own_link_is_followed_and_kept(split_cpu_profile: Path, tmp_path: Path) -> None:
    real = tmp_path / "real.folded"
    real.write_text("old\n")
    link = tmp_path / "cpu.folded"
    link.symlink_to(real)
    result = run_rsprof("export", str(split_cpu_profile), "-f", "folded", "-o", str(link))
    assert result.returncode == 0, result.stderr
    assert link.is_symlink()
    assert "work" in real.read_text()
