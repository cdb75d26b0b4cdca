"""Headless recording says what it does (rsprof/session.py ProgressLine): at once, what is
recorded and how to stop it; on a terminal, a progress line rewritten at each checkpoint;
with -qq, only the summary. As py-spy record does."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import read_pty, rsprof_env, run_rsprof


def _first_line(proc: subprocess.Popen[bytes], timeout: float) -> tuple[str, float]:
    """The first line proc writes on stderr, and how long after `started` it came."""
    assert proc.stderr is not None
    started = time.monotonic()
    data = b""
    while b"\n" not in data:
        left = timeout - (time.monotonic() - started)
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, left))
        assert ready, f"no line on stderr within {timeout} s: {data!r}"
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, f"stderr closed: {data!r}"
        data += chunk
    return data.split(b"\n")[0].decode(), time.monotonic() - started


@pytest.mark.parametrize("heap", ["", "--no-heap"])
def test_attach_says_what_it_records_and_how_to_stop(heap: str, spinner: subprocess.Popen[str],
                                                     tmp_path: Path) -> None:
    """`rsprof -p PID -q` prints its start line as soon as sampling runs (the time from the
    command is printed: the goal is 1 s, Python start-up and the attach included), then the
    summary when Ctrl-C stops it. The heap shim is being loaded into the process then (on by
    default when attaching), unless --no-heap."""
    out = tmp_path / "attach.db"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "rsprof", "-p", str(spinner.pid), "-q", "-o", str(out),
         *([heap] if heap else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=rsprof_env())
    try:
        line, _ = _first_line(proc, timeout=30)
        took = time.monotonic() - started
        print(f"start line {took:.2f} s after the command")
        kinds = "CPU" if heap else "CPU, heap attaching,"
        assert line == (f"rsprof: recording split-main (pid {spinner.pid}): {kinds} at 99 Hz"
                        f" into {out}; Ctrl-C to stop"), line
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, rest
    # Not a terminal: no progress lines.
    summary = rest.decode().strip().splitlines()[-1]
    assert summary.startswith("rsprof: recorded ") and "(stopped: interrupted)" in summary
    if heap == "--no-heap":  # nothing loaded, nothing said of the heap
        assert "heap" not in rest.decode() and len(rest.decode().splitlines()) == 1


def test_attach_progress_says_attaching_then_since(spinner: subprocess.Popen[str],
                                                    tmp_path: Path) -> None:
    """On a terminal, attached: ", attaching heap" while the shim is being loaded, then
    ", heap live N since HH:MM:SS" (the heap is known since the attach, issue 22 item 2);
    the summary says the same time."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "rsprof", "-p", str(spinner.pid), "-q", "-i", "100ms",
         "-d", "4s", "-o", str(tmp_path / "tty.db")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=secondary,
        env=rsprof_env())
    os.close(secondary)
    try:
        said = read_pty(primary)
    finally:
        os.close(primary)
        proc.wait(timeout=60)
    assert proc.returncode == 0, said
    text = said.decode()
    progress = [part for part in text.split("\r\x1b[K") if part.startswith("rsprof: ")
                and " samples" in part and "recorded" not in part]
    attached = [part for part in progress if "heap live " in part]
    assert attached, text
    since = re.search(r" since (\d\d:\d\d:\d\d)", attached[-1])
    assert since is not None, attached[-1]
    first = progress.index(attached[0])
    assert all(part.endswith(", attaching heap") for part in progress[:first]), progress
    assert all(since.group(0) in part for part in progress[first:]), progress
    assert f"heap since attach at {since.group(1)}" in text, text


def test_quieter_says_only_the_summary(tmp_path: Path) -> None:
    result = run_rsprof("run", "-qq", "-d", "300ms", "-o", str(tmp_path / "qq.db"), "--",
                        "sleep", "5")
    assert result.returncode == 0, result.stderr
    [summary] = result.stderr.strip().splitlines()
    assert summary.startswith("rsprof: recorded ") and "(stopped: duration)" in summary
    said = run_rsprof("run", "-q", "-d", "300ms", "-o", str(tmp_path / "q.db"), "--",
                      "sleep", "5")
    start, summary = said.stderr.strip().splitlines()
    assert start.startswith("rsprof: running sleep 5 (pid ") and "for 0.3 s" in start, start
    assert "Ctrl-C stops it and the program" in start and summary.startswith("rsprof: recorded")


def test_progress_on_a_terminal_is_rewritten_in_place(tmp_path: Path) -> None:
    """On a terminal (stderr a pty): a progress line per checkpoint, each starting with
    "\\r" and an erase, the heap's live bytes included under `run`; the summary starts on a
    cleared line."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "rsprof", "run", "-q", "-i", "100ms", "-d", "1s",
         "-o", str(tmp_path / "tty.db"), "--", "sleep", "5"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=secondary,
        env=rsprof_env())
    os.close(secondary)
    try:
        said = read_pty(primary)
    finally:
        os.close(primary)
        proc.wait(timeout=60)
    assert proc.returncode == 0, said
    text = said.decode()
    progress = [part for part in text.split("\r\x1b[K") if part.startswith("rsprof: ")
                and " samples" in part and "recorded" not in part]
    assert len(progress) >= 3, text
    assert all("heap live " in part for part in progress), progress
    assert "\r\x1b[Krsprof: recorded " in text, text
