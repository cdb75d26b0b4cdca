"""The TUI in a real terminal: `rsprof view FILE` inside tmux, read with capture-pane."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_rsprof


def _cli_available() -> bool:
    try:
        return importlib.util.find_spec("rsprof.cli") is not None
    except ImportError:
        return False


pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
    pytest.mark.skipif(not _cli_available(), reason="needs the rsprof CLI (rsprof.cli)"),
]


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_view_in_tmux(tmp_path: Path) -> None:
    # A profile recorded from a real target: the bundled demo, CPU and heap.
    profile = tmp_path / "recorded.db"
    recorded = run_rsprof("demo", "-q", "-d", "3s", "-o", str(profile), cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    exit_file = tmp_path / "exit"
    session = f"rsprof-tui-test-{os.getpid()}"
    # The rsprof this test imports: the installed one under plain `pytest`, the source tree
    # under `python -m pytest`. tmux may start the command with another server's environment.
    spec = importlib.util.find_spec("rsprof")
    assert spec is not None and spec.origin is not None
    pythonpath = str(Path(spec.origin).resolve().parent.parent)
    command = (
        f"cd {shlex.quote(str(tmp_path))} && "
        f"PYTHONPATH={shlex.quote(pythonpath)} "
        f"{shlex.quote(sys.executable)} -P -m rsprof view {shlex.quote(str(profile))}; "
        f"echo EXIT:$? > {shlex.quote(str(exit_file))}"
    )

    def screen() -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", session],
            capture_output=True,
            text=True,
            check=False,
        ).stdout

    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", command],
        check=True,
    )
    try:
        assert wait_for(lambda: "spin_for" in screen()), screen()
        text = screen()
        assert "VIEW" in text and "recorded.db" in text and "rsprof-demo" in text
        assert "Total %" in text and "demo.c:" in text
        subprocess.run(["tmux", "send-keys", "-t", session, "2"], check=True)
        assert wait_for(lambda: "remember_request" in screen()), screen()
        assert "load_config" in screen() and "Allocated" in screen()
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        assert wait_for(exit_file.exists), screen()
        assert wait_for(lambda: exit_file.read_text().strip() != "")
        assert exit_file.read_text().strip() == "EXIT:0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
