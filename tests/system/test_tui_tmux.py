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
from functools import partial
from pathlib import Path

import pytest
from conftest import profile_meta, run_rsprof


def _cli_available() -> bool:
    try:
        return importlib.util.find_spec("rsprof.cli") is not None
    except ImportError:
        return False


pytestmark = [
    pytest.mark.slow,  # a real terminal per test
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


def _command(tmp_path: Path, args: str, exit_file: Path) -> str:
    # The rsprof this test imports: the installed one under plain `pytest`, the source tree
    # under `python -m pytest`. tmux may start the command with another server's environment.
    spec = importlib.util.find_spec("rsprof")
    assert spec is not None and spec.origin is not None
    pythonpath = str(Path(spec.origin).resolve().parent.parent)
    return (
        f"cd {shlex.quote(str(tmp_path))} && "
        f"PYTHONPATH={shlex.quote(pythonpath)} "
        f"{shlex.quote(sys.executable)} -P -m rsprof {args}; "
        f"echo EXIT:$? > {shlex.quote(str(exit_file))}"
    )


class Pane:
    def __init__(self, session: str) -> None:
        self.session = session

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.session],
            capture_output=True,
            text=True,
            check=False,
        ).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.session, *keys], check=True)


def test_view_in_tmux(tmp_path: Path) -> None:
    """The first screen of a profile recorded from the real demo, at 80x24: the demo's own
    functions show (sorted by Total %), and the header does not wrap."""
    profile = tmp_path / "rsprof.rsprof-demo.261123101530.db"
    recorded = run_rsprof("demo", "-q", "-d", "3s", "-o", str(profile), cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    exit_file = tmp_path / "exit"
    session = f"rsprof-tui-test-{os.getpid()}"
    command = _command(tmp_path, f"view {shlex.quote(str(profile))}", exit_file)
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command],
        check=True,
    )
    pane = Pane(session)
    try:
        assert wait_for(lambda: "spin_for" in pane.screen()), pane.screen()
        lines = pane.screen().splitlines()
        assert "VIEW" in lines[0] and "samples" in lines[0]
        assert "1 CPU" in lines[1] and "2 Memory" in lines[1] and "thread all" in lines[1]
        assert "Self %" in lines[2] and "Total %" in lines[2] and "Live %" in lines[2]
        first_screen = "\n".join(lines[:23])
        for name in ("compute_hashes", "multiply_matrices", "parse_requests"):
            assert name in first_screen, first_screen
        assert "demo.c:" in first_screen
        pane.keys("f")  # the call tree: main above parse_requests
        assert wait_for(lambda: "Function (call tree)" in pane.screen()), pane.screen()
        pane.keys("f", "2")
        assert wait_for(lambda: "remember_request" in pane.screen()), pane.screen()
        assert "load_config" in pane.screen() and "peak" in pane.screen()
        pane.keys("q")
        assert wait_for(exit_file.exists), pane.screen()
        assert wait_for(lambda: exit_file.read_text().strip() != "")
        assert exit_file.read_text().strip() == "EXIT:0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)


def _tui_processes(recorder_marker: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if "rsprof.tui" in line and recorder_marker in line]


def test_live_tui_in_its_own_process_and_sighup_finalizes(tmp_path: Path) -> None:
    """`rsprof demo` with its TUI: the TUI runs in a process of its own; closing the
    terminal (tmux kill-session: SIGHUP) leaves a finished file, never "recording"."""
    out = tmp_path / "rsprof.rsprof-demo.261123101531.db"
    exit_file = tmp_path / "exit"
    session = f"rsprof-tui-hup-{os.getpid()}"
    command = _command(tmp_path, f"demo -o {shlex.quote(str(out))}", exit_file)
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command],
        check=True,
    )
    pane = Pane(session)
    try:
        assert wait_for(lambda: "RECORDING" in pane.screen() and "spin_for" in pane.screen())
        assert _tui_processes(out.name), "the TUI is not a process of its own"
        pane.keys("j", "k")
        assert profile_meta(out)["state"] == "recording"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
    assert wait_for(lambda: profile_meta(out).get("state") == "finished", 20), profile_meta(out)
    # The terminal's SIGHUP reaches the demo too: whichever the recorder sees first, the
    # file is finalized.
    assert profile_meta(out)["stop_reason"] in ("hangup", "target-exited")
    assert wait_for(lambda: not _tui_processes(out.name), 10)


def test_live_ctrl_c_stops_the_recording(tmp_path: Path) -> None:
    # Run from a folder holding an `rsprof` package that is not rsprof (a checkout of its
    # source, say): the TUI's process must still import the installed one.
    decoy = tmp_path / "rsprof"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy rsprof was imported')\n")
    out = tmp_path / "rsprof.rsprof-demo.261123101532.db"
    exit_file = tmp_path / "exit"
    session = f"rsprof-tui-int-{os.getpid()}"
    command = _command(tmp_path, f"demo -o {shlex.quote(str(out))}", exit_file)
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command],
        check=True,
    )
    pane = Pane(session)
    try:
        assert wait_for(lambda: "RECORDING" in pane.screen() and "spin_for" in pane.screen())
        pane.keys("C-c")
        assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip() != ""), (
            pane.screen())
        assert profile_meta(out)["state"] == "finished"
        assert profile_meta(out)["stop_reason"] == "interrupted"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)


def test_run_keeps_the_programs_output_off_the_tui(tmp_path: Path) -> None:
    """`rsprof run` with the TUI, stderr redirected to a file, a program printing on both
    streams every 0.2 s: the TUI is on the terminal (not in the file), no program line is
    drawn over it, every line is saved in the profile, and when the TUI ends the last lines
    are printed, each on its own stream."""
    out = tmp_path / "talk.db"
    err = tmp_path / "err.log"
    exit_file = tmp_path / "exit"
    script = ("i=0; while [ $i -lt 15 ]; do echo out $i; echo err $i >&2; i=$((i+1));"
              " sleep 0.2; done")
    session = f"rsprof-tui-out-{os.getpid()}"
    command = _command(tmp_path, f"run -o {shlex.quote(str(out))} -- sh -c"
                                 f" {shlex.quote(script)} 2>{shlex.quote(str(err))}", exit_file)
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", command],
        check=True,
    )
    # The pane stays after rsprof exits, to read what it printed last.
    subprocess.run(["tmux", "set-option", "-t", session, "remain-on-exit", "on"], check=True)
    pane = Pane(session)
    try:
        assert wait_for(lambda: "RECORDING" in pane.screen() or "STOPPED" in pane.screen())
        assert wait_for(lambda: "target exited" in pane.screen()), pane.screen()
        assert "out " not in pane.screen(), pane.screen()  # nothing drawn over the TUI
        pane.keys("q")
        assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip() != ""), (
            pane.screen())
        screen = pane.screen()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
    assert exit_file.read_text().strip() == "EXIT:0"
    assert "out 14" in screen and "out 10" in screen, screen  # stdout's last lines, after
    logged = err.read_text(errors="replace")
    assert "err 14" in logged and "\x1b[" not in logged, logged[:500]  # no TUI in the file
    import sqlite3

    db = sqlite3.connect(f"file:{out}?mode=ro", uri=True)
    rows = db.execute("SELECT stream, data FROM target_output ORDER BY id").fetchall()
    db.close()
    text = {stream: b"".join(d for s, d in rows if s == stream).decode() for stream, _ in rows}
    assert text["stdout"] == "".join(f"out {i}\n" for i in range(15))
    assert text["stderr"] == "".join(f"err {i}\n" for i in range(15))


def test_output_pane_shows_the_program_live(tmp_path: Path) -> None:
    """`o` under `rsprof run` with stderr redirected to a file, a program printing on both
    streams every 0.2 s: the pane shows its lines while it runs (later ones keep coming),
    stderr's too, and the TUI is still not in the file."""
    out = tmp_path / "live.db"
    err = tmp_path / "err.log"
    exit_file = tmp_path / "exit"
    script = ("i=0; while [ $i -lt 400 ]; do echo out $i; echo err $i >&2; i=$((i+1));"
              " sleep 0.2; done")
    session = f"rsprof-tui-pane-{os.getpid()}"
    command = _command(tmp_path, f"run -o {shlex.quote(str(out))} -- sh -c"
                                 f" {shlex.quote(script)} 2>{shlex.quote(str(err))}", exit_file)
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", command],
        check=True,
    )
    pane = Pane(session)

    def newest(prefix: str) -> int:
        numbers = [int(word.split()[1]) for word in pane.screen().splitlines()
                   for word in [word.strip().strip("│").strip()]
                   if word.startswith(prefix + " ") and word.split()[1].isdigit()]
        return max(numbers, default=-1)

    try:
        assert wait_for(lambda: "RECORDING" in pane.screen(), 60), pane.screen()
        pane.keys("o")
        assert wait_for(lambda: newest("out") >= 0 and newest("err") >= 0, 60), pane.screen()
        first = newest("out")
        assert wait_for(lambda: newest("out") >= first + 5, 60), pane.screen()  # live
        pane.keys("q")
        assert wait_for(lambda: "y/n" in pane.screen(), 30), pane.screen()
        pane.keys("y")
        assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip() != ""), (
            pane.screen())
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
    logged = err.read_text(errors="replace")
    assert "\x1b[" not in logged, logged[:500]  # the TUI is not in the file


THREE_FUNCTIONS = """\
import os
def alpha():
    return sum(i * i for i in range(20_000))
def bravo():
    return sum(i * i for i in range(20_000))
def charlie():
    for _ in range(300):
        os.stat("/")
def main():
    alpha(); bravo(); charlie()
while True:  # some time in <module> itself: its row and main's never tie
    main()
    sum(i * i for i in range(5_000))
"""


def _target_pid(out: Path) -> int:
    return int(profile_meta(out)["pid"])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_stray_keys_never_end_the_program_and_its_code_comes_first(tmp_path: Path) -> None:
    """Issue 24 items 1, 3 and 5 in a real terminal at 80x24, under `rsprof run` of a Python
    program whose main calls three functions: its functions are on the first screen (the
    interpreter folded out); f, F, e then Esc steps back one view at a time (the flame to
    the tree it was opened from); an Esc too many, and Ctrl-Q, only ask, and `n` keeps the
    program running; the callers panel takes the focus with Tab and scrolls with the keys to
    main's third callee; q then y ends the program."""
    script = tmp_path / "three.py"
    script.write_text(THREE_FUNCTIONS)
    out = tmp_path / "three.db"
    exit_file = tmp_path / "exit"
    session = f"rsprof-tui-keys-{os.getpid()}"
    command = _command(tmp_path, f"run -F 499 --no-heap -o {shlex.quote(str(out))} --"
                                 f" /usr/bin/python3 {shlex.quote(str(script))}", exit_file)
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command],
        check=True,
    )
    pane = Pane(session)
    try:
        names = ("alpha", "bravo", "charlie", "main")
        assert wait_for(lambda: all(n in pane.screen() for n in names), 60), pane.screen()
        pid = _target_pid(out)
        assert "RECORDING" in pane.screen()
        pane.keys("f")
        assert wait_for(lambda: "Function (call tree)" in pane.screen()), pane.screen()
        pane.keys("F")
        assert wait_for(lambda: "Function (call tree)" not in pane.screen()), pane.screen()
        pane.keys("Escape")  # the flame goes back to the tree it was opened from
        assert wait_for(lambda: "Function (call tree)" in pane.screen()), pane.screen()
        pane.keys("Escape")  # then the tree to the table
        assert wait_for(lambda: "Self %" in pane.screen()
                        and "call tree" not in pane.screen()), pane.screen()
        for key in ("Escape", "C-q"):
            pane.keys(key)  # nothing is open: it asks, and n keeps the program
            assert wait_for(lambda: "Stop recording and end" in pane.screen()), pane.screen()
            assert "y/n" in pane.screen() and f"PID {pid}" in pane.screen()
            pane.keys("n")
            assert wait_for(lambda: "y/n" not in pane.screen()), pane.screen()
            time.sleep(0.5)
            assert _alive(pid) and "RECORDING" in pane.screen(), pane.screen()
            assert profile_meta(out)["state"] == "recording"

        # The callers panel of main: Tab focuses it, the arrows scroll it to all three.
        pane.keys("e")
        assert wait_for(lambda: "callees" in pane.screen()), pane.screen()

        def panel() -> list[str]:
            """The callers panel's lines: below its border, above the footer."""
            lines = pane.screen().splitlines()
            border = max((i for i, line in enumerate(lines) if line.startswith("────")),
                         default=-1)
            return lines[border + 1:-1] if border >= 0 else []

        def subject() -> str:
            """The function the panel is about (its title, until the panel scrolls)."""
            words = (panel() or [""])[0].split()
            return words[0] if len(words) > 1 and words[1] == "self" else ""

        # The table's cursor down to main's row; the panel follows it a moment later, so
        # each `j` waits for the panel to show another function first (CI, beside four
        # hogs, once took over 1.5 s: a second `j` went to alpha while the panel still
        # showed main).
        shown = ""
        for _ in range(8):
            assert wait_for(partial(lambda last: subject() not in ("", last), shown)), \
                pane.screen()
            shown = subject()
            if shown == "main":
                break
            pane.keys("j")
        assert subject() == "main", pane.screen()
        pane.keys("Tab")
        seen: set[str] = set()
        for _ in range(12):
            seen |= {n for n in ("alpha", "bravo", "charlie")
                     for line in panel() if n in line}
            if len(seen) == 3:
                break
            before = panel()
            pane.keys("Down")
            wait_for(partial(lambda last: panel() != last, before), 3)  # scrolled
        assert seen == {"alpha", "bravo", "charlie"}, pane.screen()

        pane.keys("q")
        assert wait_for(lambda: "Stop recording and end" in pane.screen()), pane.screen()
        pane.keys("y")
        assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip() != ""), (
            pane.screen())
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
    assert wait_for(lambda: not _alive(pid), 10)
    meta = profile_meta(out)
    assert meta["state"] == "finished" and meta["stop_reason"] == "user-quit", meta
